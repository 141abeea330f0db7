//! The allocator's memory, given back to the system: glibc keeps what a
//! burst of calls or a large list freed in its arenas, resident, unless it
//! is asked for it. Nothing here on other C libraries.

/// Returns the allocator's free pages (in every arena) to the system. It
/// walks the free chunks: a few milliseconds at most; run it off the
/// async workers. Called after a burst of calls, of large request bodies,
/// and after each completed list of Kubernetes objects.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim has no preconditions; it only takes the
        // allocator's own locks. 0 keeps no padding.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released != 0,
            "returned freed memory to the system"
        );
    }
}

/// Keeps large buffers (a list page's body, 0.6 MB at 500 NADs) in
/// mappings of their own, returned to the system when freed. glibc
/// otherwise raises its mmap threshold to the size of the first such
/// buffer freed and carves the next ones from the heap, between long-lived
/// allocations, where their pages stay resident.
pub fn keep_large_buffers_off_the_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's own parameter; the
    // default threshold, fixed so it no longer moves.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// At most two malloc arenas: the main one and one that every other
/// thread shares. glibc gives each thread that allocates while another
/// holds an arena one of its own, up to eight per core; a CNI call runs
/// on a thread of its own (up to 16 at once), and each such arena kept
/// what its calls freed, resident. On two cores the threads rarely
/// contend for the shared one. Call before the first thread starts.
pub fn few_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's own parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
