//! Radix scatter passes, shared by the hash join (partitioning by hash bits) and the
//! sort (LSD digits of the ordered key).
//!
//! Both are the same cache-conscious primitive (Manegold, Boncz, Kersten; cyclo-join
//! paper Sec. IV-C): a histogram pass, a prefix sum, and a scatter pass that writes each
//! tuple to the running cursor of its digit. Tuples are 16 bytes (key plus row index),
//! so four fill a cache line and a scatter writes whole lines over time.

use std::ops::Range;
use std::thread;

use crate::keys::Keys;

/// A key with the row it came from. 16-byte aligned so that 4 tuples fill a 64-byte
/// cache line exactly and never straddle one.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub key: u64,
    pub row: u32,
    pub pad: u32,
}

/// Below this many tuples per thread, spawning threads costs more than it saves.
pub(crate) const MIN_TUPLES_PER_THREAD: usize = 1 << 15;

/// A vector of `n` zero tuples from zeroed memory. Large allocations come straight
/// from fresh (lazily zeroed) pages, so this costs no pass over the memory, unlike
/// `vec![Tuple::default(); n]` which writes every element.
pub(crate) fn zeroed_tuples(n: usize) -> Vec<Tuple> {
    if n == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<Tuple>(n).expect("tuple buffer size overflows");
    // SAFETY: the layout is non-zero-sized; an all-zero bit pattern is a valid Tuple
    // (plain integers), and the pointer, length and capacity come from that exact
    // layout, as `Vec::from_raw_parts` requires.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<Tuple>();
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        crate::memory::advise_huge_pages(ptr, n);
        Vec::from_raw_parts(ptr, n, n)
    }
}

/// Where a scatter pass reads its tuples from.
pub(crate) trait TupleSource: Sync {
    fn len(&self) -> usize;
    /// Calls `f` for every tuple in `range` (source positions), in order.
    fn for_each(&self, range: Range<usize>, f: impl FnMut(Tuple));
}

impl TupleSource for [Tuple] {
    fn len(&self) -> usize {
        <[Tuple]>::len(self)
    }
    #[inline]
    fn for_each(&self, range: Range<usize>, mut f: impl FnMut(Tuple)) {
        for t in &self[range] {
            f(*t);
        }
    }
}

/// Tuples formed on the fly from a key column: NULL rows are skipped and each key is
/// mapped (identity for hashing, the ordered map for sorting). Fusing this into the
/// first pass saves a full copy of the input.
pub(crate) struct KeySource<'k, 'a, M> {
    pub keys: &'k Keys<'a>,
    pub map: M,
}

impl<M: Fn(u64) -> u64 + Sync> TupleSource for KeySource<'_, '_, M> {
    fn len(&self) -> usize {
        self.keys.len()
    }
    #[inline]
    fn for_each(&self, range: Range<usize>, mut f: impl FnMut(Tuple)) {
        self.keys.for_each_valid(range, |row, bits| {
            f(Tuple {
                key: (self.map)(bits),
                row: row as u32,
                pad: 0,
            })
        });
    }
}

/// Splits `0..n` into `parts` contiguous ranges of nearly equal size.
pub(crate) fn split_even(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| (n * i / parts)..(n * (i + 1) / parts))
        .collect()
}

/// Raw output pointer shared by scatter threads. Each thread writes a disjoint set of
/// positions (its own cursors, laid out by the prefix sum), so no two threads ever
/// write the same element and nobody reads during the pass.
struct SharedOut(*mut Tuple);
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    #[inline(always)]
    fn ptr(&self) -> *mut Tuple {
        self.0
    }
}

/// One global scatter pass: reorders all tuples of `src` by `digit(key)` (stable) into
/// `dst` (resized if needed) and returns the `fanout + 1` digit boundaries.
///
/// Parallel as in the classic parallel radix partitioning: every thread histograms its
/// own contiguous chunk, a prefix sum over (digit, thread) gives each thread private
/// cursors, and the threads scatter concurrently without synchronisation. Ordering the
/// prefix sum by thread within a digit keeps the pass stable, which LSD sorting needs.
pub(crate) fn scatter<S, D>(
    src: &S,
    dst: &mut Vec<Tuple>,
    fanout: usize,
    digit: D,
    threads: usize,
) -> Vec<u32>
where
    S: TupleSource + ?Sized,
    D: Fn(u64) -> usize + Sync,
{
    let n = src.len();
    let threads = threads.min(n / MIN_TUPLES_PER_THREAD).max(1);
    let chunks = split_even(n, threads);
    let histogram = |range: Range<usize>| {
        let mut h = vec![0u32; fanout];
        src.for_each(range, |t| h[digit(t.key)] += 1);
        h
    };
    let hists: Vec<Vec<u32>> = if threads == 1 {
        vec![histogram(chunks[0].clone())]
    } else {
        thread::scope(|s| {
            let handles: Vec<_> = chunks
                .iter()
                .map(|r| {
                    let r = r.clone();
                    let histogram = &histogram;
                    s.spawn(move || histogram(r))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let mut cursors = vec![vec![0u32; fanout]; threads];
    let mut bounds = vec![0u32; fanout + 1];
    let mut total = 0u32;
    for d in 0..fanout {
        bounds[d] = total;
        for t in 0..threads {
            cursors[t][d] = total;
            total += hists[t][d];
        }
    }
    bounds[fanout] = total;
    if dst.len() != total as usize {
        *dst = zeroed_tuples(total as usize);
    }
    let out = SharedOut(dst.as_mut_ptr());
    let scatter_chunk = |range: Range<usize>, mut pos: Vec<u32>| {
        let out = &out;
        src.for_each(range, |t| {
            let d = digit(t.key);
            let p = pos[d] as usize;
            debug_assert!(p < total as usize);
            // SAFETY: p lies in this thread's cursor range for digit d (prefix sum of
            // the histogram of exactly these tuples), so it is in bounds of `dst` and
            // written by no other thread.
            unsafe { out.ptr().add(p).write(t) };
            pos[d] += 1;
        });
    };
    if threads == 1 {
        scatter_chunk(chunks[0].clone(), cursors.pop().unwrap());
    } else {
        thread::scope(|s| {
            for (r, pos) in chunks.into_iter().zip(cursors) {
                let scatter_chunk = &scatter_chunk;
                s.spawn(move || scatter_chunk(r, pos));
            }
        });
    }
    bounds
}

/// Regions up to this size are cache-resident targets for [`refine`]: their output range
/// is pulled into cache by a sequential sweep before the scatter.
const WARM_LIMIT_BYTES: usize = 256 * 1024;

/// Touches one element per cache line of `out` (a write, so lines arrive owned).
/// A scatter into a cache-sized region writes its lines in random order; without this
/// each first write to a line is a demand miss, while a sequential sweep is served by
/// the hardware prefetcher.
#[inline(never)]
fn warm_for_write(out: &mut [Tuple]) {
    for t in out.iter_mut().step_by(4) {
        t.pad = 0;
    }
}

/// Groups consecutive regions into at most `threads` groups of similar tuple counts.
/// Returns group boundaries as region indices (`len = groups + 1`).
pub(crate) fn balance_regions(bounds: &[u32], threads: usize) -> Vec<usize> {
    let regions = bounds.len() - 1;
    let n = *bounds.last().unwrap() as usize;
    let threads = threads
        .min(n / MIN_TUPLES_PER_THREAD)
        .clamp(1, regions.max(1));
    let mut cuts = vec![0usize];
    let mut r = 0usize;
    for t in 1..threads {
        let target = (n * t / threads) as u32;
        while r < regions && bounds[r] < target {
            r += 1;
        }
        if r > *cuts.last().unwrap() && r < regions {
            cuts.push(r);
        }
    }
    cuts.push(regions);
    cuts
}

/// Refines every region `bounds[r]..bounds[r+1]` of `src` by `digit`, writing into the
/// same positions of `dst`, and returns the `regions * fanout + 1` new boundaries.
///
/// Each region is handled by one thread start to finish; regions at this level are
/// meant to be cache-sized, so the histogram read and the scatter hit the cache. Threads
/// take contiguous groups of regions balanced by tuple count, which lets the output be
/// split into disjoint `&mut` slices with no unsafe code.
pub(crate) fn refine<D>(
    src: &[Tuple],
    dst: &mut [Tuple],
    bounds: &[u32],
    fanout: usize,
    digit: D,
    threads: usize,
) -> Vec<u32>
where
    D: Fn(u64) -> usize + Sync,
{
    let regions = bounds.len() - 1;
    let mut new_bounds = vec![0u32; regions * fanout + 1];
    new_bounds[regions * fanout] = bounds[regions];
    let groups = balance_regions(bounds, threads);
    let work = |regs: Range<usize>, dst: &mut [Tuple], nb: &mut [u32]| {
        let base = bounds[regs.start];
        let mut hist = vec![0u32; fanout];
        for r in regs.clone() {
            let region = &src[bounds[r] as usize..bounds[r + 1] as usize];
            hist.fill(0);
            for t in region {
                hist[digit(t.key)] += 1;
            }
            let mut off = bounds[r];
            let slots = &mut nb[(r - regs.start) * fanout..(r - regs.start + 1) * fanout];
            for d in 0..fanout {
                slots[d] = off;
                let c = hist[d];
                hist[d] = off - base;
                off += c;
            }
            let out = (bounds[r] - base) as usize..(bounds[r + 1] - base) as usize;
            if out.len() * std::mem::size_of::<Tuple>() <= WARM_LIMIT_BYTES {
                warm_for_write(&mut dst[out]);
            }
            for t in region {
                let d = digit(t.key);
                dst[hist[d] as usize] = *t;
                hist[d] += 1;
            }
        }
    };
    let mut dst_rest = &mut dst[..bounds[regions] as usize];
    let mut nb_rest = &mut new_bounds[..regions * fanout];
    let mut jobs = Vec::new();
    for g in groups.windows(2) {
        let (a, b) = (g[0], g[1]);
        let len = (bounds[b] - bounds[a]) as usize;
        let (d, rest) = std::mem::take(&mut dst_rest).split_at_mut(len);
        dst_rest = rest;
        let (s, rest) = std::mem::take(&mut nb_rest).split_at_mut((b - a) * fanout);
        nb_rest = rest;
        jobs.push((a..b, d, s));
    }
    if jobs.len() == 1 {
        let (r, d, s) = jobs.pop().unwrap();
        work(r, d, s);
    } else {
        thread::scope(|sc| {
            for (r, d, s) in jobs {
                let work = &work;
                sc.spawn(move || work(r, d, s));
            }
        });
    }
    new_bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuples(keys: &[u64]) -> Vec<Tuple> {
        keys.iter()
            .enumerate()
            .map(|(i, &k)| Tuple {
                key: k,
                row: i as u32,
                pad: 0,
            })
            .collect()
    }

    #[test]
    fn scatter_is_a_stable_partition() {
        let keys: Vec<u64> = (0..100_000u64)
            .map(|i| i.wrapping_mul(2654435761) % 1000)
            .collect();
        let src = tuples(&keys);
        for threads in [1, 2, 3] {
            let mut dst = Vec::new();
            let b = scatter(&src[..], &mut dst, 16, |k| (k % 16) as usize, threads);
            assert_eq!(b.len(), 17);
            assert_eq!(b[16] as usize, src.len());
            for d in 0..16 {
                let part = &dst[b[d] as usize..b[d + 1] as usize];
                assert!(part.iter().all(|t| (t.key % 16) as usize == d));
                assert!(part.windows(2).all(|w| w[0].row < w[1].row), "stable");
            }
        }
    }

    #[test]
    fn refine_subdivides_each_region() {
        let keys: Vec<u64> = (0..200_000u64)
            .map(|i| i.wrapping_mul(0x9E3779B97F4A7C15) >> 40)
            .collect();
        let src = tuples(&keys);
        let mut a = Vec::new();
        let b1 = scatter(&src[..], &mut a, 8, |k| (k & 7) as usize, 2);
        let mut b = zeroed_tuples(a.len());
        for threads in [1, 2, 5] {
            let b2 = refine(&a, &mut b, &b1, 4, |k| ((k >> 3) & 3) as usize, threads);
            assert_eq!(b2.len(), 33);
            for g in 0..32 {
                let part = &b[b2[g] as usize..b2[g + 1] as usize];
                assert!(
                    part.iter()
                        .all(|t| (t.key & 31) as usize == (((g % 4) << 3) | (g / 4)))
                );
            }
            let mut rows: Vec<u32> = b.iter().map(|t| t.row).collect();
            rows.sort_unstable();
            assert!(rows.iter().enumerate().all(|(i, &r)| r as usize == i));
        }
    }

    #[test]
    fn balance_never_returns_empty_groups() {
        let bounds = [0u32, 0, 0, 1_000_000, 1_000_000];
        let g = balance_regions(&bounds, 4);
        assert_eq!(*g.first().unwrap(), 0);
        assert_eq!(*g.last().unwrap(), 4);
        assert!(g.windows(2).all(|w| w[0] < w[1]));
    }
}
