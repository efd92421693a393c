//! Message buffers, allocated when the node starts and reused, as registered
//! RDMA memory would be.
//!
//! A buffer moves through three states (the shuffle paper's Wait, Populate,
//! Transmit/Consume):
//!
//! - *free*: in the pool's free list;
//! - *leased*: taken by [`BufferPool::acquire`] (send side, may wait) or
//!   [`BufferPool::take`] (receive side, never waits), being filled, queued,
//!   written, or waiting for its consumer; a leased buffer counts against the
//!   pool;
//! - *detached*: its lease ended (every destination wrote it, every receiver
//!   released it) but somebody still holds a reference to its bytes, typically
//!   Arrow arrays decoded from it without copying. A detached buffer no longer
//!   counts against the pool: when the free list is empty the pool allocates a
//!   replacement (counted in [`PoolStats::allocated`]), and the detached buffer
//!   is freed, or put back if the pool is short, when its last reference drops.
//!
//! So an operator that keeps every batch it receives (a hash join's build
//! side, a sort) never starves the pool; it owns that memory like any other
//! allocation, and the pool's own footprint stays at most `capacity` free plus
//! `capacity` leased buffers. Messages filling less than a quarter of a buffer
//! are handed to consumers as copies ([`Message::bytes`]; received ones are
//! read into exact-size allocations to begin with), so kept data pins at most
//! four times its size.
//!
//! A message larger than the buffer grows its buffer (the encoder writes into
//! a `Vec`); that message is counted in [`PoolStats::oversize`] and its grown
//! buffer is freed instead of being put back, so the pool's memory stays
//! bounded.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Figures of one buffer pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Size of each buffer in bytes.
    pub message_size: usize,
    /// Buffers allocated up front (and the most that may be leased at once on the send side).
    pub capacity: usize,
    /// Buffers leased now.
    pub in_use: usize,
    /// Most buffers leased at once.
    pub high_water: usize,
    /// Buffers allocated after start because the free list was empty (replacing detached
    /// buffers, oversize buffers, or, on the receive side, demand beyond the capacity).
    pub allocated: u64,
    /// Messages that did not fit one buffer.
    pub oversize: u64,
    /// Nanoseconds callers waited in [`BufferPool::acquire`].
    pub acquire_wait_ns: u64,
}

struct PoolInner {
    message_size: usize,
    capacity: usize,
    permits: Arc<Semaphore>,
    free: Mutex<Vec<Vec<u8>>>,
    leased: AtomicUsize,
    high_water: AtomicUsize,
    allocated: AtomicU64,
    oversize: AtomicU64,
    acquire_wait_ns: AtomicU64,
}

impl PoolInner {
    fn lease(self: &Arc<Self>, permit: Option<OwnedSemaphorePermit>) -> Lease {
        let n = self.leased.fetch_add(1, Ordering::AcqRel) + 1;
        self.high_water.fetch_max(n, Ordering::AcqRel);
        Lease {
            pool: Arc::clone(self),
            _permit: permit,
        }
    }

    fn buffer(&self) -> Vec<u8> {
        if let Some(b) = self.free.lock().pop() {
            return b;
        }
        self.allocated.fetch_add(1, Ordering::Relaxed);
        Vec::with_capacity(self.message_size)
    }

    fn give_back(&self, mut data: Vec<u8>) {
        if data.capacity() != self.message_size {
            return; // grown by an oversize message: free it
        }
        data.clear();
        let mut free = self.free.lock();
        if free.len() + self.leased.load(Ordering::Acquire) < self.capacity {
            free.push(data);
        }
    }
}

/// The pool's claim on one buffer; dropping it ends the lease.
struct Lease {
    pool: Arc<PoolInner>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.leased.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A fixed set of equally sized message buffers.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("message_size", &self.inner.message_size)
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

impl BufferPool {
    /// Allocates `capacity` buffers of `message_size` bytes and touches every page, so
    /// the memory is really there before the first message.
    pub fn new(message_size: usize, capacity: usize) -> Self {
        let message_size = message_size.max(1);
        let free = (0..capacity)
            .map(|_| {
                let mut b = vec![0u8; message_size];
                b.clear();
                b
            })
            .collect();
        Self {
            inner: Arc::new(PoolInner {
                message_size,
                capacity,
                permits: Arc::new(Semaphore::new(capacity)),
                free: Mutex::new(free),
                leased: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                allocated: AtomicU64::new(0),
                oversize: AtomicU64::new(0),
                acquire_wait_ns: AtomicU64::new(0),
            }),
        }
    }

    pub fn message_size(&self) -> usize {
        self.inner.message_size
    }

    /// A free buffer, waiting while `capacity` buffers are leased (send side).
    pub async fn acquire(&self) -> PoolBuffer {
        let permit = match Arc::clone(&self.inner.permits).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let t = Instant::now();
                let p = Arc::clone(&self.inner.permits)
                    .acquire_owned()
                    .await
                    .expect("pool semaphore is never closed");
                self.inner
                    .acquire_wait_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                p
            }
        };
        let lease = self.inner.lease(Some(permit));
        PoolBuffer {
            data: self.inner.buffer(),
            pool: Some(Arc::clone(&self.inner)),
            lease: Some(lease),
        }
    }

    /// A buffer without waiting (receive side: the reader of a connection must never
    /// block on consumers; credits bound how many messages can be buffered).
    pub fn take(&self) -> PoolBuffer {
        let lease = self.inner.lease(None);
        PoolBuffer {
            data: self.inner.buffer(),
            pool: Some(Arc::clone(&self.inner)),
            lease: Some(lease),
        }
    }

    /// Counts a message that was too large for one buffer.
    pub fn count_oversize(&self) {
        self.inner.oversize.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            message_size: i.message_size,
            capacity: i.capacity,
            in_use: i.leased.load(Ordering::Acquire),
            high_water: i.high_water.load(Ordering::Acquire),
            allocated: i.allocated.load(Ordering::Relaxed),
            oversize: i.oversize.load(Ordering::Relaxed),
            acquire_wait_ns: i.acquire_wait_ns.load(Ordering::Relaxed),
        }
    }
}

/// A leased buffer being filled. Writing past the buffer size grows it (an oversize
/// message); dropping it unused gives it back.
pub struct PoolBuffer {
    data: Vec<u8>,
    pool: Option<Arc<PoolInner>>,
    lease: Option<Lease>,
}

impl std::fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("len", &self.data.len())
            .finish()
    }
}

impl PoolBuffer {
    /// A buffer outside any pool (small or oversize received messages, tests).
    pub fn unpooled(capacity: usize) -> Self {
        Self {
            data: Vec::with_capacity(capacity),
            pool: None,
            lease: None,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The buffer's size: what fits without growing it.
    pub fn capacity(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(self.data.capacity(), |p| p.message_size)
    }

    /// The bytes written so far; append with `extend_from_slice` or `std::io::Write`.
    pub fn vec_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.data
    }

    /// Whether the content outgrew the buffer.
    pub fn is_oversize(&self) -> bool {
        self.pool
            .as_ref()
            .is_some_and(|p| self.data.len() > p.message_size)
    }

    /// Makes the buffer an immutable, shareable message with the CRC32 of its content if
    /// known; `on_release` runs when every hold on it is gone.
    pub(crate) fn freeze(
        mut self,
        crc: Option<u32>,
        on_release: Option<Arc<dyn Fn() + Send + Sync>>,
    ) -> Message {
        if self.is_oversize()
            && let Some(p) = &self.pool
        {
            p.oversize.fetch_add(1, Ordering::Relaxed);
        }
        let data = std::mem::take(&mut self.data);
        Message(Arc::new(MessageInner {
            data,
            crc,
            pool: self.pool.take(),
            lease: Mutex::new(self.lease.take()),
            holds: AtomicUsize::new(0),
            released: false.into(),
            on_release,
        }))
    }
}

impl std::io::Write for PoolBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        self.lease.take();
        if let Some(p) = &self.pool {
            p.give_back(std::mem::take(&mut self.data));
        }
    }
}

struct MessageInner {
    data: Vec<u8>,
    crc: Option<u32>,
    pool: Option<Arc<PoolInner>>,
    lease: Mutex<Option<Lease>>,
    holds: AtomicUsize,
    released: std::sync::atomic::AtomicBool,
    on_release: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl MessageInner {
    /// Ends the lease and reports the release, once.
    fn release(&self) {
        self.lease.lock().take();
        if !self.released.swap(true, Ordering::AcqRel)
            && let Some(f) = &self.on_release
        {
            f();
        }
    }
}

impl Drop for MessageInner {
    fn drop(&mut self) {
        self.release();
        if let Some(p) = &self.pool {
            p.give_back(std::mem::take(&mut self.data));
        }
    }
}

/// An immutable message in a (possibly pooled) buffer, shared by reference count: a
/// broadcast puts one message to every peer. Clones share the bytes; the buffer goes
/// back to its pool when the last clone drops.
#[derive(Clone)]
pub struct Message(Arc<MessageInner>);

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("len", &self.0.data.len())
            .finish()
    }
}

impl Message {
    pub fn len(&self) -> usize {
        self.0.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.data.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.0.data
    }

    /// CRC32 of the content, if the producer computed it (once, for every destination).
    pub fn crc(&self) -> Option<u32> {
        self.0.crc
    }

    /// The content as `Bytes`. Without copying if the message fills at least a quarter
    /// of its pool buffer: the buffer then stays alive (detached from the pool once
    /// released) while the `Bytes` or anything sliced from it lives. A smaller message
    /// is copied out, so that data kept by a consumer never pins a mostly empty buffer
    /// (at most 4 bytes of buffer per byte kept).
    pub fn bytes(&self) -> bytes::Bytes {
        match &self.0.pool {
            Some(p) if self.len() < p.message_size / 4 => {
                bytes::Bytes::copy_from_slice(self.as_slice())
            }
            _ => bytes::Bytes::from_owner(self.clone()),
        }
    }

    /// A hold keeps the buffer leased; the lease ends when the last hold drops.
    pub(crate) fn hold(&self) -> Held {
        self.0.holds.fetch_add(1, Ordering::AcqRel);
        Held {
            msg: self.clone(),
            leased: true,
        }
    }

    /// A claim on the bytes alone, for a destination on this node: it keeps them alive
    /// until its consumer releases them but not the buffer's lease, which ends with the
    /// holds of the remote destinations ([`Message::end_lease`] when there are none).
    ///
    /// The send pool is shared by every exchange of the node. Were a message to stay
    /// leased until a local consumer reads it, consumers that wait for something else
    /// first (a hash join reads its build side before its probe side) would keep send
    /// buffers, and with a few such streams (8 credits each against 32 buffers) every
    /// sender of the node would wait for a buffer, including the ones those consumers
    /// wait for. Locally queued messages are bounded by their streams' credits, as
    /// received ones are.
    pub(crate) fn local_hold(&self) -> Held {
        Held {
            msg: self.clone(),
            leased: false,
        }
    }

    /// Ends the lease now if no hold keeps it (a message put only to this node).
    pub(crate) fn end_lease(&self) {
        if self.0.holds.load(Ordering::Acquire) == 0 {
            self.0.release();
        }
    }
}

impl AsRef<[u8]> for Message {
    fn as_ref(&self) -> &[u8] {
        &self.0.data
    }
}

/// One party's claim on a message while the transport still needs it: one per
/// destination of a put (dropped once written or, locally, once released) and one
/// per received message (dropped when its receiver releases it). Only the claims of
/// remote destinations keep the buffer leased ([`Message::local_hold`]).
pub(crate) struct Held {
    msg: Message,
    leased: bool,
}

impl Held {
    pub(crate) fn message(&self) -> &Message {
        &self.msg
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.msg.fmt(f)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let inner = &self.msg.0;
        if self.leased && inner.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            inner.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[tokio::test]
    async fn acquire_waits_when_every_buffer_is_leased_and_reuses_buffers() {
        let pool = BufferPool::new(1024, 2);
        let a = pool.acquire().await;
        let b = pool.acquire().await;
        assert_eq!(pool.stats().in_use, 2);
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.acquire().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "a third buffer must wait");
        drop(a);
        let c = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        drop((b, c));
        let s = pool.stats();
        assert_eq!((s.in_use, s.high_water, s.allocated), (0, 2, 0));
        assert!(s.acquire_wait_ns > 0);
    }

    #[tokio::test]
    async fn a_message_is_released_after_its_last_hold_and_shared_by_all() {
        let pool = BufferPool::new(64, 1);
        let mut buf = pool.acquire().await;
        buf.write_all(b"shared by three peers").unwrap();
        let released = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&released);
        let msg = buf.freeze(
            None,
            Some(Arc::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            })),
        );
        let holds: Vec<Held> = (0..3).map(|_| msg.hold()).collect();
        drop(msg);
        let ptrs: Vec<*const u8> = holds
            .iter()
            .map(|h| h.message().as_slice().as_ptr())
            .collect();
        assert!(
            ptrs.windows(2).all(|w| w[0] == w[1]),
            "one buffer, no copies"
        );
        let mut holds = holds.into_iter();
        holds.next();
        holds.next();
        assert_eq!(pool.stats().in_use, 1);
        holds.next();
        assert_eq!(pool.stats().in_use, 0);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // The buffer went back and is reused, no new allocation.
        let again = pool.acquire().await;
        assert!(again.is_empty());
        assert_eq!(pool.stats().allocated, 0);
    }

    #[tokio::test]
    async fn consumers_that_keep_messages_detach_buffers_and_the_pool_replaces_them() {
        let pool = BufferPool::new(64, 2);
        let mut kept = vec![];
        for i in 0..10u8 {
            // Never blocks: each released message frees its lease even though its bytes
            // are still referenced (like a hash join's build side keeping batches).
            let mut buf = tokio::time::timeout(Duration::from_secs(1), pool.acquire())
                .await
                .unwrap();
            buf.vec_mut().extend_from_slice(&[i; 64]);
            let msg = buf.freeze(None, None);
            let held = msg.hold();
            kept.push(msg.bytes());
            assert_eq!(
                kept.last().unwrap().as_ptr(),
                msg.as_slice().as_ptr(),
                "no copy"
            );
            drop((held, msg));
        }
        let s = pool.stats();
        assert_eq!(s.in_use, 0);
        assert_eq!(s.allocated, 8, "two initial buffers, eight replacements");
        assert_eq!(
            kept.iter().map(|b| b[0]).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        drop(kept);
        // Detached buffers come back only up to the capacity.
        assert_eq!(pool.inner.free.lock().len(), 2);
    }

    #[tokio::test]
    async fn small_messages_are_handed_out_as_copies_so_kept_data_pins_no_buffer() {
        let pool = BufferPool::new(64, 1);
        let mut buf = pool.acquire().await;
        buf.vec_mut().extend_from_slice(&[9; 15]);
        let msg = buf.freeze(None, None);
        let kept = msg.bytes();
        assert_ne!(kept.as_ptr(), msg.as_slice().as_ptr());
        drop(msg);
        assert_eq!(&kept[..], &[9; 15]);
        assert_eq!(pool.inner.free.lock().len(), 1, "the buffer is back");
    }

    #[tokio::test]
    async fn oversize_messages_are_counted_and_their_buffers_not_kept() {
        let pool = BufferPool::new(16, 1);
        let mut buf = pool.acquire().await;
        buf.write_all(&[1u8; 100]).unwrap();
        assert!(buf.is_oversize());
        let msg = buf.freeze(None, None);
        assert_eq!(msg.len(), 100);
        drop(msg);
        let s = pool.stats();
        assert_eq!((s.oversize, s.in_use), (1, 0));
        assert!(pool.inner.free.lock().is_empty());
        let again = pool.acquire().await;
        assert_eq!(again.capacity(), 16);
        assert_eq!(pool.stats().allocated, 1);
    }

    #[test]
    fn receive_side_take_never_waits_and_counts_beyond_capacity() {
        let pool = BufferPool::new(8, 1);
        let a = pool.take();
        let b = pool.take();
        let s = pool.stats();
        assert_eq!((s.in_use, s.high_water, s.allocated), (2, 2, 1));
        drop((a, b));
        assert_eq!(pool.stats().in_use, 0);
    }
}
