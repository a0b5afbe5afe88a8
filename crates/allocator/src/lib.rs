//! The gateway's memory allocator and its upkeep. jemalloc serves every allocation of a process that links this
//! crate: glibc's `malloc` spent 10-14 % of the request path in its free lists and arena locks. An allocator
//! keeps what the program freed for the next allocations, so after a burst (a thousand streams open at once) the
//! process would stay at its peak: these calls let the gateway see how much it holds that is not in use, and give
//! it back to the system.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The global allocator of every binary that links the gateway.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// What the allocator holds, in bytes, as of one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// In live allocations.
    pub allocated: usize,
    /// In pages of physical memory the allocator has mapped and touched (live allocations, the free space
    /// between them, its own metadata, and freed pages not yet given back).
    pub resident: usize,
}

impl Usage {
    /// Held in memory without anything allocated in it.
    pub fn free(&self) -> usize {
        self.resident.saturating_sub(self.allocated)
    }
}

/// What the allocator holds now; `None` when its statistics cannot be read.
pub fn usage() -> Option<Usage> {
    // The statistics are a snapshot taken at each epoch: advance it to read the current figures.
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    Some(Usage {
        allocated: tikv_jemalloc_ctl::stats::allocated::read().ok()?,
        resident: tikv_jemalloc_ctl::stats::resident::read().ok()?,
    })
}

/// Bytes the allocator holds in memory without anything allocated in them (resident minus allocated, both as
/// of now); `None` when its statistics cannot be read.
pub fn free_bytes() -> Option<usize> {
    usage().map(|usage| usage.free())
}

/// Gives the unused pages of every arena back to the system, keeping every live allocation where it is; whether
/// the allocator did it.
pub fn give_back() -> bool {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena.
    control(b"arena.4096.purge\0")
}

/// How many times the threads were asked to flush their caches (see [`flush_if_asked`]).
static FLUSHES_ASKED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last of [`FLUSHES_ASKED`] this thread has answered.
    static FLUSHES_DONE: Cell<u64> = const { Cell::new(0) };
}

/// Asks every thread that calls [`flush_if_asked`] when it goes idle to flush its cache once, the next time.
///
/// Each thread keeps a cache of the blocks it freed last, for its next allocations. After a burst they stay there
/// while the thread is idle, and each keeps a page of the arena in use that could otherwise be given back.
pub fn ask_threads_to_flush() {
    FLUSHES_ASKED.fetch_add(1, Ordering::Relaxed);
}

/// Flushes this thread's cache of freed blocks back to the arenas if it was asked to since it last did; cheap
/// otherwise (two loads). For a thread that is about to go idle, such as the runtime's `on_thread_park`.
pub fn flush_if_asked() {
    let asked = FLUSHES_ASKED.load(Ordering::Relaxed);
    FLUSHES_DONE.with(|done| {
        if done.get() != asked {
            done.set(asked);
            control(b"thread.tcache.flush\0");
        }
    });
}

/// Runs a control that reads and writes nothing; whether the allocator did it.
#[allow(unsafe_code)]
fn control(name: &[u8]) -> bool {
    debug_assert!(name.ends_with(&[0]));
    // SAFETY: the name is a NUL-terminated string naming a control that reads and writes nothing, so the null
    // pointers and zero length are what it expects; jemalloc serialises it with every other call.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    status == 0
}

#[cfg(test)]
mod tests {
    /// The tests read the allocator's process-wide figures: one at a time, so that another test's frees (or its
    /// thread's cache, flushed as the thread ends) never land between a test's two readings.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    #[test]
    fn memory_freed_in_a_burst_is_counted_free_until_it_is_given_back() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // Many small blocks with one kept past the end, so that what is freed is not one span at the top.
        let mut blocks: Vec<Vec<u8>> = (0..40_000).map(|i| vec![(i % 251) as u8; 1_000]).collect();
        let kept = blocks.pop();
        let free_before = super::free_bytes().unwrap_or(0);
        drop(blocks);
        let freed = super::free_bytes().unwrap_or(0);
        assert!(
            freed >= free_before + 20_000_000,
            "about 40 MB freed is held: {free_before} bytes before, {freed} after"
        );
        assert!(super::give_back(), "the allocator purges");
        let after = super::free_bytes().unwrap_or(usize::MAX);
        assert!(
            after + 20_000_000 <= freed,
            "giving back returns it to the system: {freed} bytes held before, {after} after"
        );
        drop(kept);
    }

    /// Bytes in every thread's cache of freed blocks, as of now.
    #[allow(unsafe_code)]
    fn cached_bytes() -> usize {
        tikv_jemalloc_ctl::epoch::advance().expect("epoch");
        // SAFETY: the name is NUL-terminated and names a `size_t` statistic.
        unsafe { tikv_jemalloc_ctl::raw::read::<usize>(b"stats.arenas.4096.tcache_bytes\0") }
            .expect("tcache_bytes")
    }

    #[test]
    fn a_thread_flushes_its_cache_once_when_asked_and_not_otherwise() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::spawn(|| {
            let fill = || {
                let blocks: Vec<Box<[u8; 256]>> = (0..200).map(|_| Box::new([1u8; 256])).collect();
                drop(blocks);
            };
            fill();
            let cached = cached_bytes();
            assert!(
                cached >= 40 * 256,
                "freed blocks are cached: {cached} bytes"
            );
            super::flush_if_asked();
            assert!(cached_bytes() >= cached, "not asked: nothing flushed");
            super::ask_threads_to_flush();
            super::flush_if_asked();
            let flushed = cached_bytes();
            assert!(
                flushed + 40 * 256 <= cached,
                "asked: the cache is flushed ({cached} bytes before, {flushed} after)"
            );
            fill();
            let refilled = cached_bytes();
            super::flush_if_asked();
            assert!(cached_bytes() >= refilled, "asked once: flushed once");
        })
        .join()
        .expect("the test thread");
    }
}
