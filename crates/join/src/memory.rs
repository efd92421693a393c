//! Large kernel buffers backed by transparent huge pages where the OS allows it.
//!
//! A radix scatter writes to 2^b places at once; with 4 KiB pages each open cursor needs
//! its own TLB entry, which is what limits the fan-out of one pass (Manegold et al.) and
//! forces multi-pass partitioning. With 2 MiB pages a 256 MiB relation spans only 128
//! pages, so a 2^10..2^11 fan-out pass stays within the TLB. Fresh memory is also
//! faulted in 512x less often. On Linux the buffers are marked `MADV_HUGEPAGE` before
//! their first touch (effective when THP is in `madvise` or `always` mode); elsewhere
//! this is a no-op.

/// Below this size huge pages cannot help (the aligned interior would be empty).
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the 2 MiB-aligned interior of `[ptr, ptr + len)` with huge
/// pages. Advisory only: failure is ignored, correctness never depends on it.
pub(crate) fn advise_huge_pages<T>(ptr: *const T, len: usize) {
    let bytes = len * std::mem::size_of::<T>();
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs pages of a
    // range this process owns (inside the allocation); it never changes their contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

/// A `Vec` with room for `n` elements, its untouched pages marked for huge pages.
pub(crate) fn vec_with_capacity<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    advise_huge_pages(v.as_ptr(), n);
    v
}
