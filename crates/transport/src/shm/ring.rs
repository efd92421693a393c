//! A bounded multi-producer multi-consumer queue laid out in shared memory
//! (Vyukov's sequence-numbered cells), used for receive queues and completion
//! queues that processes of one host push to and pop from without locks.
//!
//! Layout at the ring's base: the enqueue counter and the dequeue counter on
//! cache lines of their own, then `cap` cells of one sequence word and `W`
//! payload words. A cell is free for the producer at position `p` when its
//! sequence is `p`, holds data for the consumer at `p` when it is `p + 1`.
//! Counters only grow, so a consumer that lost a race reads a cell it then
//! fails to claim and drops what it read. Nothing here trusts the memory: a
//! peer that scribbled over a ring can make it look full or empty, never make
//! this code index outside it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes before the first cell.
pub(crate) const RING_HEADER: usize = 128;

/// A ring of `cap` cells of `W` payload words at `base`.
pub(crate) struct Ring<const W: usize> {
    base: *mut u8,
    cap: u64,
}

impl<const W: usize> Ring<W> {
    /// Bytes a ring of `cap` cells takes.
    pub(crate) const fn bytes(cap: usize) -> usize {
        RING_HEADER + cap * (W + 1) * 8
    }

    /// # Safety
    /// `base` must be 64-byte aligned and point at [`Self::bytes`]`(cap)` mapped bytes
    /// that stay mapped while the ring is used; `cap` a power of two.
    pub(crate) unsafe fn at(base: *mut u8, cap: usize) -> Self {
        debug_assert!(cap.is_power_of_two());
        Self {
            base,
            cap: cap as u64,
        }
    }

    fn word(&self, byte: usize) -> &AtomicU64 {
        // SAFETY: every offset passed is inside the ring's bytes and 8-aligned.
        unsafe { &*(self.base.add(byte) as *const AtomicU64) }
    }

    fn enq(&self) -> &AtomicU64 {
        self.word(0)
    }

    fn deq(&self) -> &AtomicU64 {
        self.word(64)
    }

    fn cell(&self, pos: u64, word: usize) -> &AtomicU64 {
        let i = (pos & (self.cap - 1)) as usize;
        self.word(RING_HEADER + (i * (W + 1) + word) * 8)
    }

    /// Makes the ring empty (only before anyone else can see it).
    pub(crate) fn init(&self) {
        self.enq().store(0, Ordering::Relaxed);
        self.deq().store(0, Ordering::Relaxed);
        for i in 0..self.cap {
            self.cell(i, 0).store(i, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::Release);
    }

    /// Appends `payload`; false when the ring is full.
    pub(crate) fn push(&self, payload: [u64; W]) -> bool {
        let mut pos = self.enq().load(Ordering::Relaxed);
        loop {
            let seq = self.cell(pos, 0).load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                match self.enq().compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = self.enq().load(Ordering::Relaxed);
            }
        }
        for (w, v) in payload.iter().enumerate() {
            self.cell(pos, w + 1).store(*v, Ordering::Relaxed);
        }
        self.cell(pos, 0)
            .store(pos.wrapping_add(1), Ordering::Release);
        true
    }

    /// Takes the oldest payload, if any.
    pub(crate) fn pop(&self) -> Option<[u64; W]> {
        let mut pos = self.deq().load(Ordering::Relaxed);
        loop {
            let seq = self.cell(pos, 0).load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos.wrapping_add(1)) as i64;
            if dif == 0 {
                let mut out = [0u64; W];
                for (w, v) in out.iter_mut().enumerate() {
                    *v = self.cell(pos, w + 1).load(Ordering::Relaxed);
                }
                match self.deq().compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.cell(pos, 0)
                            .store(pos.wrapping_add(self.cap), Ordering::Release);
                        return Some(out);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = self.deq().load(Ordering::Relaxed);
            }
        }
    }

    /// Entries in the ring (a snapshot).
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        let e = self.enq().load(Ordering::Acquire);
        let d = self.deq().load(Ordering::Acquire);
        e.saturating_sub(d).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[repr(align(64))]
    struct Mem([u8; Ring::<2>::bytes(8)]);

    #[test]
    fn fifo_full_and_empty() {
        let mut mem = Box::new(Mem([0; Ring::<2>::bytes(8)]));
        let r = unsafe { Ring::<2>::at(mem.0.as_mut_ptr(), 8) };
        r.init();
        assert_eq!(r.pop(), None);
        for i in 0..8 {
            assert!(r.push([i, i * 10]));
        }
        assert!(!r.push([99, 99]), "full at capacity");
        assert_eq!(r.len(), 8);
        for i in 0..8 {
            assert_eq!(r.pop(), Some([i, i * 10]));
        }
        assert_eq!(r.pop(), None);
        // Wraps around.
        for round in 0..100u64 {
            assert!(r.push([round, 1]));
            assert_eq!(r.pop(), Some([round, 1]));
        }
    }

    #[test]
    fn many_producers_and_consumers_lose_nothing() {
        const CAP: usize = 64;
        let layout = std::alloc::Layout::from_size_align(Ring::<1>::bytes(CAP), 64).unwrap();
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        struct P(*mut u8);
        unsafe impl Send for P {}
        unsafe impl Sync for P {}
        let p = Arc::new(P(ptr));
        unsafe { Ring::<1>::at(ptr, CAP) }.init();
        let per = 20_000u64;
        let mut handles = vec![];
        for t in 0..3u64 {
            let p = Arc::clone(&p);
            handles.push(std::thread::spawn(move || {
                let r = unsafe { Ring::<1>::at(p.0, CAP) };
                for i in 0..per {
                    while !r.push([t * per + i + 1]) {
                        std::thread::yield_now();
                    }
                }
                0u64
            }));
        }
        for _ in 0..2 {
            let p = Arc::clone(&p);
            handles.push(std::thread::spawn(move || {
                let r = unsafe { Ring::<1>::at(p.0, CAP) };
                let mut sum = 0u64;
                let mut n = 0;
                while n < 3 * per / 2 {
                    match r.pop() {
                        Some([v]) => {
                            sum += v;
                            n += 1;
                        }
                        None => std::thread::yield_now(),
                    }
                }
                sum
            }));
        }
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let n = 3 * per;
        assert_eq!(total, n * (n + 1) / 2);
        unsafe { std::alloc::dealloc(ptr, layout) };
    }
}
