//! What a testkit server keeps of what it received: the latest ones, so that one under load (a bench, the demo)
//! holds a bounded record instead of every request it ever answered.

use std::collections::VecDeque;

/// How many received requests a server keeps by default: far more than a test sends between resets.
pub const DEFAULT_KEPT: usize = 10_000;

/// The latest `limit` items received, and how many were received in all (since the last clear).
#[derive(Debug)]
pub(crate) struct Kept<T> {
    items: VecDeque<T>,
    limit: usize,
    received: usize,
}

impl<T> Kept<T> {
    pub(crate) fn new(limit: usize) -> Kept<T> {
        Kept {
            items: VecDeque::new(),
            limit,
            received: 0,
        }
    }

    /// Keeps `item`, letting the oldest go when `limit` are kept already (nothing is kept with a limit of 0).
    pub(crate) fn push(&mut self, item: T) {
        self.received += 1;
        if self.limit == 0 {
            return;
        }
        if self.items.len() == self.limit {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// How many were received since the last clear, kept or not.
    pub(crate) fn received(&self) -> usize {
        self.received
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    pub(crate) fn clear(&mut self) {
        self.items.clear();
        self.received = 0;
    }
}

impl<T> Default for Kept<T> {
    fn default() -> Kept<T> {
        Kept::new(DEFAULT_KEPT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_are_kept_and_every_one_is_counted() {
        let mut kept = Kept::new(3);
        for n in 0..5 {
            kept.push(n);
        }
        assert_eq!(kept.iter().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(kept.received(), 5);
        let mut none = Kept::new(0);
        none.push(1);
        assert_eq!((none.iter().count(), none.received()), (0, 1));
        kept.clear();
        assert_eq!((kept.iter().count(), kept.received()), (0, 0));
    }
}
