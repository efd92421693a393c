//! A node's shared-memory segment: one file (in a directory on tmpfs, normally
//! under `/dev/shm`) that its process creates and every peer process of the
//! host maps. It holds what a NIC would hold for the node: the table of
//! registered regions, the queue pairs' receive queues, the completion queues,
//! a doorbell, and the data arena the regions are cut from.
//!
//! Layout (every offset 64-byte aligned): a 4 KiB header, the region table,
//! the queue-pair slots, the completion-queue slots, the arena. The header
//! records the sizes; a peer recomputes the layout from them and checks that it
//! fits the file before touching anything else, and every key, index, offset
//! and length it later reads from the segment is checked against those bounds.
//! Peers are processes of the same user on the same host (the file is mode
//! 0600 in a directory of mode 0700): a broken peer can spoil the data it is
//! sent, never make this process read or write outside a mapping.
//!
//! A segment appears under its final name only once its header and tables are
//! written (it is created under a temporary name and renamed).

use super::ring::Ring;
use crate::NodeId;
use crate::verbs::CarrierError;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"GYRESHM1");
const VERSION: u64 = 1;
const HEADER: usize = 4096;
/// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_NODE: usize = 2;
const H_INCARNATION: usize = 3;
const H_PID: usize = 4;
const H_CLOSED: usize = 5;
const H_SIZE: usize = 6;
const H_MAX_REGIONS: usize = 7;
const H_MAX_QPS: usize = 8;
const H_MAX_CQS: usize = 9;
const H_RECV_DEPTH: usize = 10;
const H_CQ_DEPTH: usize = 11;
const H_ARENA: usize = 12;
/// Byte offsets of the doorbell (a futex word) and its waiter count.
const DOORBELL: usize = 1024;
const WAITERS: usize = 1088;

/// Words of a region-table entry: key (0 = free), offset in the arena, length.
const REGION_WORDS: usize = 3;
/// Payload words of a posted receive: id, key | has-buffer << 32, offset, length.
pub(crate) const RECV_WORDS: usize = 4;
/// Payload words of a completion: id, status | op << 32, bytes | imm << 32,
/// flags | source node << 32 (flags: 1 = has imm, 2 = has source), source qpn.
pub(crate) const CQE_WORDS: usize = 5;
/// Bytes of a slot's state line before its ring.
const SLOT_HEAD: usize = 64;

/// Queue-pair slot states.
pub(crate) const QP_FREE: u64 = 0;
pub(crate) const QP_RC: u64 = 1;
pub(crate) const QP_UD: u64 = 2;
pub(crate) const QP_ERROR: u64 = 3;
/// Queue-pair slot words: state, receive CQ index, peer (node << 32 | qpn, or
/// `NO_PEER`), peer incarnation.
pub(crate) const QW_STATE: usize = 0;
pub(crate) const QW_RECV_CQ: usize = 1;
pub(crate) const QW_PEER: usize = 2;
pub(crate) const QW_PEER_INC: usize = 3;
pub(crate) const NO_PEER: u64 = u64::MAX;
/// Completion-queue slot words: in use, completions added so far.
const CW_USED: usize = 0;
const CW_EVENTS: usize = 1;

/// The sizes of a segment; every node of a host may choose its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmParams {
    pub max_regions: u32,
    pub max_qps: u32,
    pub max_cqs: u32,
    /// Receive requests a queue pair holds (a power of two).
    pub recv_depth: u32,
    /// Entries of a completion queue (a power of two).
    pub cq_depth: u32,
    /// Bytes of registered memory the node may hold (the file is sparse: pages
    /// take memory once written).
    pub arena: u64,
}

impl Default for ShmParams {
    fn default() -> Self {
        Self {
            max_regions: 4096,
            max_qps: 512,
            max_cqs: 64,
            recv_depth: 256,
            cq_depth: 4096,
            arena: 1 << 30,
        }
    }
}

impl ShmParams {
    /// Room for a query's exchanges: every node opens a send and a receive
    /// endpoint per exchange, each with its queues, and several queries run
    /// at once. The file is sparse: unused room costs address space only.
    pub fn for_queries() -> Self {
        Self {
            max_regions: 16_384,
            max_qps: 8192,
            max_cqs: 2048,
            recv_depth: 2048,
            cq_depth: 4096,
            arena: 4 << 30,
        }
    }
}

fn align64(x: usize) -> usize {
    x.div_ceil(64) * 64
}

/// Where everything is, computed from the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub params: ShmParams,
    regions: usize,
    qps: usize,
    qp_stride: usize,
    cqs: usize,
    cq_stride: usize,
    pub data: usize,
    pub size: usize,
}

impl Layout {
    pub(crate) fn new(p: ShmParams) -> Result<Self, CarrierError> {
        let bad = |m: &str| Err(CarrierError::Invalid(format!("shared-memory sizes: {m}")));
        if p.max_regions == 0 || p.max_regions > 65_000 {
            return bad("between 1 and 65,000 regions");
        }
        if p.max_qps == 0 || p.max_qps > 65_536 || p.max_cqs == 0 || p.max_cqs > 65_536 {
            return bad("between 1 and 65,536 queue pairs and completion queues");
        }
        if !p.recv_depth.is_power_of_two() || p.recv_depth > 1 << 16 {
            return bad("the receive depth must be a power of two up to 65,536");
        }
        if !p.cq_depth.is_power_of_two() || p.cq_depth > 1 << 20 {
            return bad("the completion queue depth must be a power of two up to 1 Mi");
        }
        if p.arena > 1 << 40 {
            return bad("at most 1 TiB of arena");
        }
        let regions = HEADER;
        let qps = align64(regions + p.max_regions as usize * REGION_WORDS * 8);
        let qp_stride = align64(SLOT_HEAD + Ring::<RECV_WORDS>::bytes(p.recv_depth as usize));
        let cqs = qps + p.max_qps as usize * qp_stride;
        let cq_stride = align64(SLOT_HEAD + Ring::<CQE_WORDS>::bytes(p.cq_depth as usize));
        let data = align64(cqs + p.max_cqs as usize * cq_stride);
        let size = data + p.arena as usize;
        Ok(Self {
            params: p,
            regions,
            qps,
            qp_stride,
            cqs,
            cq_stride,
            data,
            size,
        })
    }
}

/// A mapped segment, this node's or a peer's.
pub(crate) struct Segment {
    base: *mut u8,
    pub layout: Layout,
    pub node: NodeId,
    pub incarnation: u64,
    pub path: PathBuf,
    owned: bool,
}

// SAFETY: the mapping is shared memory accessed only through atomics and raw
// copies whose exclusivity the protocols above guarantee.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

fn sys(what: &str, path: &Path, e: std::io::Error) -> CarrierError {
    CarrierError::System(format!("{what} {}: {e}", path.display()))
}

/// The file of `node`'s segment in `dir`.
pub(crate) fn segment_path(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node-{node}"))
}

fn pid_alive(pid: u64) -> bool {
    if pid == 0 || pid > i32::MAX as u64 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as i32, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Segment {
    fn map(file: &std::fs::File, size: usize, path: &Path) -> Result<*mut u8, CarrierError> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we hold open, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mapping", path, std::io::Error::last_os_error()));
        }
        Ok(p as *mut u8)
    }

    /// Creates this node's segment in `dir`. A segment left by a dead process of the
    /// same node id is replaced; one of a live process is an error.
    pub(crate) fn create(
        dir: &Path,
        node: NodeId,
        params: ShmParams,
    ) -> Result<Self, CarrierError> {
        let layout = Layout::new(params)?;
        std::fs::create_dir_all(dir).map_err(|e| sys("creating", dir, e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        let path = segment_path(dir, node);
        if let Ok(old) = Self::open(dir, node)
            && old.is_alive()
        {
            return Err(CarrierError::Invalid(format!(
                "{} already has a live shared-memory segment at {} (process {})",
                crate::node_name(node),
                path.display(),
                old.header(H_PID).load(Ordering::Relaxed)
            )));
        }
        let tmp = dir.join(format!("node-{node}.{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| sys("creating", &tmp, e))?;
        file.set_len(layout.size as u64)
            .map_err(|e| sys("sizing", &tmp, e))?;
        let base = Self::map(&file, layout.size, &tmp)?;
        let incarnation = rand::random::<u64>() | 1;
        let seg = Self {
            base,
            layout,
            node,
            incarnation,
            path: path.clone(),
            owned: true,
        };
        let h = |w| seg.header(w);
        h(H_VERSION).store(VERSION, Ordering::Relaxed);
        h(H_NODE).store(node as u64, Ordering::Relaxed);
        h(H_INCARNATION).store(incarnation, Ordering::Relaxed);
        h(H_PID).store(std::process::id() as u64, Ordering::Relaxed);
        h(H_SIZE).store(layout.size as u64, Ordering::Relaxed);
        h(H_MAX_REGIONS).store(params.max_regions as u64, Ordering::Relaxed);
        h(H_MAX_QPS).store(params.max_qps as u64, Ordering::Relaxed);
        h(H_MAX_CQS).store(params.max_cqs as u64, Ordering::Relaxed);
        h(H_RECV_DEPTH).store(params.recv_depth as u64, Ordering::Relaxed);
        h(H_CQ_DEPTH).store(params.cq_depth as u64, Ordering::Relaxed);
        h(H_ARENA).store(params.arena, Ordering::Relaxed);
        h(H_MAGIC).store(MAGIC, Ordering::Release);
        std::fs::rename(&tmp, &path).map_err(|e| sys("publishing", &path, e))?;
        Ok(seg)
    }

    /// Maps `node`'s segment in `dir`, checking its header against the file.
    pub(crate) fn open(dir: &Path, node: NodeId) -> Result<Self, CarrierError> {
        let path = segment_path(dir, node);
        let peer = |reason: String| CarrierError::Peer { node, reason };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                peer(format!(
                    "no shared-memory segment at {}: {e}",
                    path.display()
                ))
            })?;
        let len = file.metadata().map_err(|e| sys("reading", &path, e))?.len() as usize;
        if len < HEADER {
            return Err(peer(format!("segment {} is too short", path.display())));
        }
        let base = Self::map(&file, HEADER, &path)?;
        let word = |w: usize| {
            // SAFETY: inside the header mapping, 8-aligned.
            unsafe { (*(base.add(w * 8) as *const AtomicU64)).load(Ordering::Acquire) }
        };
        let (magic, version, hnode, inc, size) = (
            word(H_MAGIC),
            word(H_VERSION),
            word(H_NODE),
            word(H_INCARNATION),
            word(H_SIZE),
        );
        let params = ShmParams {
            max_regions: word(H_MAX_REGIONS).min(u32::MAX as u64) as u32,
            max_qps: word(H_MAX_QPS).min(u32::MAX as u64) as u32,
            max_cqs: word(H_MAX_CQS).min(u32::MAX as u64) as u32,
            recv_depth: word(H_RECV_DEPTH).min(u32::MAX as u64) as u32,
            cq_depth: word(H_CQ_DEPTH).min(u32::MAX as u64) as u32,
            arena: word(H_ARENA),
        };
        // SAFETY: the header mapping made above.
        unsafe { libc::munmap(base as *mut libc::c_void, HEADER) };
        if magic != MAGIC || version != VERSION {
            return Err(peer(format!(
                "{} is not a Gyre shared-memory segment of version {VERSION}",
                path.display()
            )));
        }
        if hnode != node as u64 {
            return Err(peer(format!("{} belongs to node {hnode}", path.display())));
        }
        let layout = Layout::new(params).map_err(|e| peer(e.to_string()))?;
        if layout.size != size as usize || layout.size > len {
            return Err(peer(format!(
                "segment {} declares {size} bytes but its sizes need {} and the file has {len}",
                path.display(),
                layout.size
            )));
        }
        let base = Self::map(&file, layout.size, &path)?;
        Ok(Self {
            base,
            layout,
            node,
            incarnation: inc,
            path,
            owned: false,
        })
    }

    fn word(&self, byte: usize) -> &AtomicU64 {
        debug_assert!(byte + 8 <= self.layout.size && byte.is_multiple_of(8));
        // SAFETY: callers pass offsets inside the mapping (checked by the layout).
        unsafe { &*(self.base.add(byte) as *const AtomicU64) }
    }

    fn header(&self, w: usize) -> &AtomicU64 {
        self.word(w * 8)
    }

    pub(crate) fn doorbell(&self) -> &AtomicU32 {
        // SAFETY: inside the header, 4-aligned.
        unsafe { &*(self.base.add(DOORBELL) as *const AtomicU32) }
    }

    pub(crate) fn waiters(&self) -> &AtomicU32 {
        // SAFETY: inside the header, 4-aligned.
        unsafe { &*(self.base.add(WAITERS) as *const AtomicU32) }
    }

    /// Whether the owning process is still there and has not closed the segment.
    pub(crate) fn is_alive(&self) -> bool {
        self.header(H_CLOSED).load(Ordering::Acquire) == 0
            && self.header(H_INCARNATION).load(Ordering::Acquire) == self.incarnation
            && pid_alive(self.header(H_PID).load(Ordering::Relaxed))
    }

    /// Marks the segment closed (peers stop using it).
    pub(crate) fn close(&self) {
        self.header(H_CLOSED).store(1, Ordering::Release);
    }

    /// Rings the doorbell: wakes the owner's progress thread if it sleeps.
    pub(crate) fn ring(&self) {
        self.doorbell().fetch_add(1, Ordering::SeqCst);
        if self.waiters().load(Ordering::SeqCst) > 0 {
            futex_wake(self.doorbell());
        }
    }

    // ---- regions ----

    fn region_word(&self, index: usize, w: usize) -> &AtomicU64 {
        self.word(self.layout.regions + (index * REGION_WORDS + w) * 8)
    }

    /// Publishes region `index` with `key` at arena bytes `offset..offset + len`.
    pub(crate) fn set_region(&self, index: usize, key: u32, offset: usize, len: usize) {
        self.region_word(index, 1)
            .store(offset as u64, Ordering::Relaxed);
        self.region_word(index, 2)
            .store(len as u64, Ordering::Relaxed);
        self.region_word(index, 0)
            .store(key as u64, Ordering::Release);
    }

    pub(crate) fn clear_region(&self, index: usize) {
        self.region_word(index, 0).store(0, Ordering::Release);
    }

    /// Resolves bytes `offset..offset + len` of the region with `key` to a pointer,
    /// or None if the key is not registered or the bytes lie outside it.
    pub(crate) fn resolve(&self, key: u32, offset: u64, len: u64) -> Option<*mut u8> {
        let index = (key & 0xffff) as usize;
        if key == 0 || index == 0 || index > self.layout.params.max_regions as usize {
            return None;
        }
        let i = index - 1;
        if self.region_word(i, 0).load(Ordering::Acquire) != key as u64 {
            return None;
        }
        let r_off = self.region_word(i, 1).load(Ordering::Relaxed);
        let r_len = self.region_word(i, 2).load(Ordering::Relaxed);
        let end = offset.checked_add(len)?;
        if end > r_len {
            return None;
        }
        let start = r_off.checked_add(offset)?;
        if r_off.checked_add(r_len)? > self.layout.params.arena {
            return None;
        }
        // SAFETY: start + len <= arena, checked above.
        Some(unsafe { self.base.add(self.layout.data + start as usize) })
    }

    /// Pointer to the arena's byte `offset` (this node's own allocations).
    pub(crate) fn arena_ptr(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.layout.params.arena as usize);
        // SAFETY: inside the mapping.
        unsafe { self.base.add(self.layout.data + offset) }
    }

    // ---- queue pairs ----

    /// Word `w` of queue-pair slot `qpn`, or None outside the table.
    pub(crate) fn qp_word(&self, qpn: u32, w: usize) -> Option<&AtomicU64> {
        (qpn < self.layout.params.max_qps)
            .then(|| self.word(self.layout.qps + qpn as usize * self.layout.qp_stride + w * 8))
    }

    /// The receive queue of slot `qpn`, or None outside the table.
    pub(crate) fn recv_ring(&self, qpn: u32) -> Option<Ring<RECV_WORDS>> {
        (qpn < self.layout.params.max_qps).then(|| {
            let at = self.layout.qps + qpn as usize * self.layout.qp_stride + SLOT_HEAD;
            // SAFETY: the slot's ring lies inside the mapping (layout).
            unsafe { Ring::at(self.base.add(at), self.layout.params.recv_depth as usize) }
        })
    }

    // ---- completion queues ----

    fn cq_word(&self, cq: u32, w: usize) -> Option<&AtomicU64> {
        (cq < self.layout.params.max_cqs)
            .then(|| self.word(self.layout.cqs + cq as usize * self.layout.cq_stride + w * 8))
    }

    pub(crate) fn cq_ring(&self, cq: u32) -> Option<Ring<CQE_WORDS>> {
        (cq < self.layout.params.max_cqs).then(|| {
            let at = self.layout.cqs + cq as usize * self.layout.cq_stride + SLOT_HEAD;
            // SAFETY: the slot's ring lies inside the mapping (layout).
            unsafe { Ring::at(self.base.add(at), self.layout.params.cq_depth as usize) }
        })
    }

    pub(crate) fn cq_set_used(&self, cq: u32, used: bool) {
        if let Some(w) = self.cq_word(cq, CW_USED) {
            w.store(used as u64, Ordering::Release);
        }
    }

    pub(crate) fn cq_used(&self, cq: u32) -> bool {
        self.cq_word(cq, CW_USED)
            .is_some_and(|w| w.load(Ordering::Acquire) == 1)
    }

    /// Completions added to `cq` so far.
    pub(crate) fn cq_events(&self, cq: u32) -> u64 {
        self.cq_word(cq, CW_EVENTS)
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    pub(crate) fn cq_bump(&self, cq: u32) {
        if let Some(w) = self.cq_word(cq, CW_EVENTS) {
            w.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owned {
            self.close();
            self.ring();
            let _ = std::fs::remove_file(&self.path);
        }
        // SAFETY: the mapping made in `create` or `open`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.layout.size) };
    }
}

/// Sleeps while `word` holds `seen`, at most `timeout` (shared, not process-private).
pub(crate) fn futex_wait(word: &AtomicU32, seen: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid 4-aligned word of a shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every process sleeping on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid word.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
