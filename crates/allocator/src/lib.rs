//! The gateway's memory allocator and its upkeep. jemalloc serves every allocation of a process that links this
//! crate: glibc's `malloc` spent 10-14 % of the request path in its free lists and arena locks. An allocator
//! keeps what the program freed for the next allocations, so after a burst (a thousand streams open at once) the
//! process would stay at its peak: these calls let the gateway see how much it holds that is not in use, and give
//! it back to the system.

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
#[allow(unsafe_code)]
pub fn give_back() -> bool {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena, with no value read or written.
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: the name is a NUL-terminated string naming a control that reads and writes nothing, so the null
    // pointers and zero length are what it expects; jemalloc serialises it with every other call.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
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
    #[test]
    fn memory_freed_in_a_burst_is_counted_free_until_it_is_given_back() {
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
}
