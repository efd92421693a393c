//! A node's ring of fragment buffers (paper Sec. III-D): a fixed number of equally sized
//! buffers, allocated and touched once when the node joins the ring and reused for every
//! fragment, as RDMA-registered memory would be. Whole buffers move between the receiver,
//! the join entity and the transmitter; a buffer returns to the free list when the last
//! of them lets go of it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The shared state of one node's buffer ring.
#[derive(Debug)]
pub(crate) struct BufferRing {
    buffer_words: usize,
    buffers: usize,
    free: Mutex<Vec<Box<[u64]>>>,
    freed: Notify,
    in_use_high_water: AtomicUsize,
}

impl BufferRing {
    /// Allocates `buffers` buffers of `buffer_bytes` (rounded down to whole words) and
    /// touches every page, so the memory is really there before the first fragment.
    pub fn new(buffers: usize, buffer_bytes: usize) -> Arc<Self> {
        let buffer_words = buffer_bytes / 8;
        let free = (0..buffers)
            .map(|_| {
                let mut b = vec![0u64; buffer_words].into_boxed_slice();
                // Zeroed allocations are lazily mapped; write one word per 4 KiB page.
                for w in b.iter_mut().step_by(512) {
                    // SAFETY: `w` is a valid, exclusive reference into the buffer.
                    unsafe { std::ptr::write_volatile(w, 0) };
                }
                b
            })
            .collect();
        Arc::new(BufferRing {
            buffer_words,
            buffers,
            free: Mutex::new(free),
            freed: Notify::new(),
            in_use_high_water: AtomicUsize::new(0),
        })
    }

    pub fn buffer_bytes(&self) -> usize {
        self.buffer_words * 8
    }

    /// Most buffers in use at once.
    pub fn high_water(&self) -> usize {
        self.in_use_high_water.load(Ordering::Relaxed)
    }

    /// A free buffer, taken only while at least `min_free` are free (waits otherwise).
    /// Injecting a node's own fragment asks for two, receiving for one: a buffer is
    /// always left for receiving, so the ring as a whole always has room to move a
    /// fragment and cannot deadlock (bubble flow control).
    pub async fn take(&self, min_free: usize) -> Box<[u64]> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut free = self.free.lock().expect("buffer ring lock");
                if free.len() >= min_free.max(1) {
                    let b = free.pop().expect("checked");
                    let in_use = self.buffers - free.len();
                    self.in_use_high_water.fetch_max(in_use, Ordering::Relaxed);
                    return b;
                }
            }
            freed.await;
        }
    }

    fn give_back(&self, buffer: Box<[u64]>) {
        self.free.lock().expect("buffer ring lock").push(buffer);
        self.freed.notify_waiters();
    }

    /// Wraps a filled buffer holding `len` words; it returns here when dropped.
    pub fn filled(self: &Arc<Self>, buffer: Box<[u64]>, len: usize) -> Arc<FilledBuffer> {
        Arc::new(FilledBuffer {
            buffer: Some(buffer),
            len,
            ring: Arc::clone(self),
        })
    }
}

/// A buffer holding one complete fragment, shared by the join entity and the
/// transmitter; it goes back to its ring when the last holder drops it.
#[derive(Debug)]
pub(crate) struct FilledBuffer {
    buffer: Option<Box<[u64]>>,
    len: usize,
    ring: Arc<BufferRing>,
}

impl FilledBuffer {
    pub fn words(&self) -> &[u64] {
        &self.buffer.as_ref().expect("present until drop")[..self.len]
    }
}

impl Drop for FilledBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.ring.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn buffers_are_reused_and_the_last_free_one_is_kept_for_receiving() {
        let ring = BufferRing::new(2, 1024);
        assert_eq!(ring.buffer_bytes(), 1024);
        let a = ring.take(2).await;
        let a_ptr = a.as_ptr();
        // One left: an injection (needs two free) must wait, a receive (one) may take it.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), ring.take(2));
        assert!(waiting.await.is_err());
        let filled = ring.filled(a, 3);
        assert_eq!(filled.words().len(), 3);
        let shared = Arc::clone(&filled);
        drop(filled);
        let b = ring.take(1).await;
        assert_ne!(b.as_ptr(), a_ptr);
        drop(shared); // the last holder returns buffer `a`
        let again = ring.take(1).await;
        assert_eq!(again.as_ptr(), a_ptr);
        assert_eq!(ring.high_water(), 2);
    }
}
