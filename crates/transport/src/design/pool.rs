//! A node's registered message buffers, shared by its receiving endpoints:
//! the pool of the RDMA-aware shuffle paper's query-aware buffer management
//! (its section 6.2). It is registered once; endpoints take their buffers from
//! it when they open, take more while their senders starve for credit, and give
//! buffers back when messages pile up or their streams end, so memory goes
//! where the query needs it instead of every stream holding a fixed window.

use super::message::carrier_err;
use crate::TransportError;
use crate::verbs::{Carrier, Region};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Registered buffers of one size, handed out by index.
pub struct BufferPool {
    /// The node whose carrier registered it.
    node: crate::NodeId,
    region: Arc<Region>,
    message_size: usize,
    /// Free buffers, lowest index last (a fresh pool hands out 0, 1, 2, ...).
    free: Mutex<Vec<u32>>,
    /// The most buffers taken at once.
    peak: AtomicUsize,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buffers", &self.capacity())
            .field("message_size", &self.message_size)
            .field("in_use", &self.in_use())
            .finish()
    }
}

impl BufferPool {
    /// Registers `buffers` buffers of `message_size` bytes on `carrier`.
    pub fn register(
        carrier: &dyn Carrier,
        buffers: usize,
        message_size: usize,
    ) -> Result<Arc<Self>, TransportError> {
        let bytes = buffers
            .checked_mul(message_size)
            .filter(|_| buffers > 0 && buffers < u32::MAX as usize && message_size > super::HEADER);
        let Some(bytes) = bytes else {
            return Err(TransportError::Misuse(format!(
                "a buffer pool of {buffers} buffers of {message_size} bytes"
            )));
        };
        let region = carrier.register(bytes).map_err(carrier_err)?;
        Ok(Arc::new(Self {
            node: carrier.node(),
            region: Arc::new(region),
            message_size,
            free: Mutex::new((0..buffers as u32).rev().collect()),
            peak: AtomicUsize::new(0),
        }))
    }

    /// The registered memory; buffer `i` starts at `i * message_size`.
    pub(super) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    pub fn node(&self) -> crate::NodeId {
        self.node
    }

    pub fn message_size(&self) -> usize {
        self.message_size
    }

    pub fn capacity(&self) -> usize {
        self.region.len() / self.message_size
    }

    /// Buffers taken and not given back.
    pub fn in_use(&self) -> usize {
        self.capacity() - self.free.lock().len()
    }

    /// The most buffers that were taken at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// `n` buffers, or none if fewer are free.
    pub(super) fn take(&self, n: usize) -> Option<Vec<u32>> {
        let mut free = self.free.lock();
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        let mut taken = free.split_off(at);
        taken.reverse();
        let in_use = self.capacity() - free.len();
        self.peak.fetch_max(in_use, Ordering::Relaxed);
        Some(taken)
    }

    /// Gives buffers back. Their owner must be sure no request still targets
    /// them: a receive posted with one must have completed or its queue pair
    /// be gone.
    pub(super) fn give(&self, buffers: impl IntoIterator<Item = u32>) {
        let mut free = self.free.lock();
        for b in buffers {
            debug_assert!((b as usize) < self.capacity() && !free.contains(&b));
            free.push(b);
        }
    }
}
