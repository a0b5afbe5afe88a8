//! How many WebSocket connections each API key holds, so that one key cannot take them all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The open WebSocket connections of each API key (by the key's hash), at most `max` each.
#[derive(Debug, Clone)]
pub struct OpenSockets {
    open: Arc<Mutex<HashMap<String, usize>>>,
    /// How many connections one key may hold.
    pub(super) max: usize,
}

impl OpenSockets {
    /// Counts for a gateway whose keys may each hold `max` connections.
    pub fn new(max: usize) -> OpenSockets {
        OpenSockets {
            open: Arc::default(),
            max,
        }
    }

    /// A place for one more connection of `key`, given back when dropped; none when the key holds `max`.
    pub(super) fn admit(&self, key: String) -> Option<SocketSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(key.clone()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SocketSlot {
            sockets: self.clone(),
            key,
        })
    }
}

/// One connection counted against its key.
pub(super) struct SocketSlot {
    sockets: OpenSockets,
    key: String,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut open = self
            .sockets
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_connections_and_a_closed_one_frees_its_place() {
        let sockets = OpenSockets::new(2);
        let first = sockets.admit("a".into());
        let second = sockets.admit("a".into());
        assert!(first.is_some() && second.is_some());
        assert!(sockets.admit("a".into()).is_none(), "a third one");
        assert!(
            sockets.admit("b".into()).is_some(),
            "another key has its own"
        );
        drop(first);
        assert!(
            sockets.admit("a".into()).is_some(),
            "the place of a closed one"
        );
    }
}
