//! The shared-memory carrier: the [`crate::verbs`] seam between processes of
//! one host at memory speed. Each node's process creates a segment
//! ([`segment`]) in a directory every process of the cluster knows, and maps
//! its peers' segments on first use. A work request is carried out by the
//! thread that posts it, as a NIC would carry it out: a send pops the peer's
//! posted receive, copies into its buffer and pushes a completion onto the
//! peer's completion queue; a write or read copies to or from the peer's
//! registered region. So every message costs one memory copy, made by the
//! sender (or, for reads, the reader), and no system call unless the peer
//! sleeps: each segment has a doorbell (a futex word) on which a progress
//! thread of its owner sleeps, and which peers ring after adding completions;
//! the progress thread wakes the tasks waiting on the completion queues that
//! changed.
//!
//! The semantics are those of the seam: reliable connections deliver in
//! order (one poster at a time per queue pair) and fail the queue pair when no
//! receive is posted; datagrams of at most 4 KiB are dropped when none is (and
//! counted). A write lands in increasing address order, its last byte last,
//! so a receiver may poll a seal byte at a buffer's end.

pub(crate) mod ring;
pub mod segment;

use crate::NodeId;
use crate::verbs::{
    Carrier, CarrierError, Completion, CompletionQueue, QpAddr, QpKind, QueuePair, RecvWr, Region,
    RegionOwner, SendOp, SendWr, UD_MTU, WcOp, WcStatus,
};
use parking_lot::{Mutex, RwLock};
pub use segment::ShmParams;
use segment::{
    CQE_WORDS, NO_PEER, QP_ERROR, QP_FREE, QP_RC, QP_UD, QW_PEER, QW_PEER_INC, QW_RECV_CQ,
    QW_STATE, Segment, futex_wait,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// How long the progress thread sleeps before it looks again on its own.
const PROGRESS_TICK: Duration = Duration::from_millis(50);

/// Where a node's segment lives and how large it is.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// A directory shared by every process of the cluster on this host (on tmpfs).
    pub dir: PathBuf,
    pub params: ShmParams,
}

/// Where a host's segments should go: /dev/shm (tmpfs) when it has room for
/// a few GiB of buffers, else the temporary directory (a container's /dev/shm
/// is often 64 MiB, and a write past a full tmpfs kills the process).
pub fn base_dir() -> PathBuf {
    const ROOM: u64 = 2 << 30;
    let shm = std::path::Path::new("/dev/shm");
    let room = || -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(shm.as_os_str().as_bytes()).ok()?;
        // SAFETY: a valid C string and a zeroed struct the call fills.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return None;
        }
        Some(st.f_bavail as u64 * st.f_frsize as u64)
    };
    match shm.is_dir() && room().is_some_and(|r| r >= ROOM) {
        true => shm.to_path_buf(),
        false => std::env::temp_dir(),
    }
}

/// A fresh directory `<base_dir>/<prefix>-<pid>-<random>` (mode 0700) for one
/// process's segments. Directories of the same prefix left by processes that
/// are gone (killed before they could remove theirs) are removed first, so
/// that crashed runs do not fill the host's shared memory.
pub fn process_dir(prefix: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = base_dir();
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(prefix)?.strip_prefix('-'))
                .and_then(|rest| rest.split('-').next()?.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            // SAFETY: signal 0 only checks that the process exists.
            let gone = pid > 0
                && unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = base.join(format!(
        "{prefix}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// What the carrier did, for benchmarks and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShmStats {
    pub bytes_copied: u64,
    pub sends: u64,
    pub writes: u64,
    pub reads: u64,
    /// Datagrams dropped (no receive posted, no such queue pair, node gone).
    pub datagrams_dropped: u64,
    /// Reliable sends that found no receive posted.
    pub receiver_not_ready: u64,
    /// Completions lost because a completion queue was full.
    pub cq_overruns: u64,
}

#[derive(Default)]
struct Counters {
    bytes_copied: AtomicU64,
    sends: AtomicU64,
    writes: AtomicU64,
    reads: AtomicU64,
    datagrams_dropped: AtomicU64,
    receiver_not_ready: AtomicU64,
    cq_overruns: AtomicU64,
}

/// Registered regions: table slots and arena space.
#[derive(Default)]
struct Regions {
    /// Generation of each table index (keys of a reused index differ).
    generation: Vec<u16>,
    free_index: Vec<usize>,
    /// key -> (index, arena offset, length)
    live: HashMap<u32, (usize, usize, usize)>,
    /// Free arena ranges: offset -> length.
    free: BTreeMap<usize, usize>,
}

impl Regions {
    fn alloc(&mut self, len: usize) -> Option<usize> {
        let (&off, &flen) = self.free.iter().find(|(_, l)| **l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        Some(off)
    }

    fn release(&mut self, mut off: usize, mut len: usize) {
        if let Some((&p, &pl)) = self.free.range(..off).next_back()
            && p + pl == off
        {
            self.free.remove(&p);
            off = p;
            len += pl;
        }
        if let Some(&nl) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nl;
        }
        self.free.insert(off, len);
    }
}

struct Inner {
    node: NodeId,
    dir: PathBuf,
    own: Arc<Segment>,
    peers: RwLock<HashMap<NodeId, Arc<Segment>>>,
    regions: Mutex<Regions>,
    qps: Mutex<Vec<bool>>,
    cqs: Mutex<Vec<Option<Weak<ShmCq>>>>,
    counters: Counters,
}

impl Inner {
    /// The segment of `node`: this node's own, a cached peer's, or mapped now.
    fn segment(&self, node: NodeId) -> Result<Arc<Segment>, CarrierError> {
        if node == self.node {
            return Ok(Arc::clone(&self.own));
        }
        if let Some(s) = self.peers.read().get(&node)
            && s.is_alive()
        {
            return Ok(Arc::clone(s));
        }
        let seg = Arc::new(Segment::open(&self.dir, node)?);
        if !seg.is_alive() {
            return Err(CarrierError::Peer {
                node,
                reason: "its process is gone".into(),
            });
        }
        self.peers.write().insert(node, Arc::clone(&seg));
        Ok(seg)
    }

    /// Pushes a completion onto queue `cq` of `seg` and wakes its owner.
    fn complete(&self, seg: &Segment, cq: u32, c: &Completion) {
        let Some(ring) = seg.cq_ring(cq) else {
            self.counters.cq_overruns.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !seg.cq_used(cq) || !ring.push(encode_cqe(c)) {
            self.counters.cq_overruns.fetch_add(1, Ordering::Relaxed);
            return;
        }
        seg.cq_bump(cq);
        if seg.node == self.node && seg.incarnation == self.own.incarnation {
            // The table's lock is let go before the queue is upgraded: if its
            // owner dropped it meanwhile, this reference is the last, and the
            // queue's drop takes the lock.
            let q = self.cqs.lock().get(cq as usize).cloned().flatten();
            if let Some(q) = q.and_then(|q| q.upgrade()) {
                q.notify.notify_waiters();
            }
        } else {
            seg.ring();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.own.close();
        self.own.ring();
    }
}

impl RegionOwner for Inner {
    fn deregister(&self, key: u32) {
        let mut r = self.regions.lock();
        if let Some((index, off, len)) = r.live.remove(&key) {
            self.own.clear_region(index);
            r.free_index.push(index);
            r.release(off, len);
        }
    }
}

fn op_of(op: &SendOp) -> WcOp {
    match op {
        SendOp::Send { .. } => WcOp::Send,
        SendOp::Write { .. } => WcOp::Write,
        SendOp::Read { .. } => WcOp::Read,
    }
}

fn status_code(s: WcStatus) -> u64 {
    match s {
        WcStatus::Success => 0,
        WcStatus::ReceiverNotReady => 1,
        WcStatus::LocalLength => 2,
        WcStatus::RemoteAccess => 3,
        WcStatus::RemoteInvalid => 4,
        WcStatus::Flushed => 5,
    }
}

fn status_of(code: u64) -> WcStatus {
    match code {
        0 => WcStatus::Success,
        1 => WcStatus::ReceiverNotReady,
        2 => WcStatus::LocalLength,
        3 => WcStatus::RemoteAccess,
        5 => WcStatus::Flushed,
        _ => WcStatus::RemoteInvalid,
    }
}

fn op_code(op: WcOp) -> u64 {
    match op {
        WcOp::Send => 0,
        WcOp::Write => 1,
        WcOp::Read => 2,
        WcOp::Recv => 3,
        WcOp::RecvWriteImm => 4,
    }
}

fn op_from(code: u64) -> WcOp {
    match code {
        0 => WcOp::Send,
        1 => WcOp::Write,
        2 => WcOp::Read,
        4 => WcOp::RecvWriteImm,
        _ => WcOp::Recv,
    }
}

fn encode_cqe(c: &Completion) -> [u64; CQE_WORDS] {
    let flags = c.imm.is_some() as u64 | (c.src.is_some() as u64) << 1;
    let (src_node, src_qpn) = c.src.map_or((0, 0), |a| (a.node as u64, a.qpn as u64));
    [
        c.id,
        status_code(c.status) | op_code(c.op) << 32,
        c.bytes as u64 | (c.imm.unwrap_or(0) as u64) << 32,
        flags | src_node << 32,
        src_qpn,
    ]
}

fn decode_cqe(w: [u64; CQE_WORDS]) -> Completion {
    Completion {
        id: w[0],
        status: status_of(w[1] & 0xffff_ffff),
        op: op_from(w[1] >> 32),
        bytes: w[2] as u32,
        imm: (w[3] & 1 != 0).then_some((w[2] >> 32) as u32),
        src: (w[3] & 2 != 0).then_some(QpAddr {
            node: (w[3] >> 32) as u32,
            qpn: w[4] as u32,
        }),
    }
}

fn pack_addr(a: QpAddr) -> u64 {
    (a.node as u64) << 32 | a.qpn as u64
}

/// A completion queue in this node's segment.
pub struct ShmCq {
    inner: Arc<Inner>,
    index: u32,
    notify: Notify,
}

impl CompletionQueue for ShmCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(ring) = self.inner.own.cq_ring(self.index) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            match ring.pop() {
                Some(w) => {
                    out.push(decode_cqe(w));
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    fn events(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for ShmCq {
    fn drop(&mut self) {
        self.inner.own.cq_set_used(self.index, false);
        if let Some(slot) = self.inner.cqs.lock().get_mut(self.index as usize) {
            *slot = None;
        }
    }
}

fn shm_cq(cq: &Arc<dyn CompletionQueue>) -> Result<&ShmCq, CarrierError> {
    cq.as_any()
        .downcast_ref::<ShmCq>()
        .ok_or_else(|| CarrierError::Invalid("a completion queue of another carrier".into()))
}

/// A queue pair in this node's segment.
pub struct ShmQp {
    inner: Arc<Inner>,
    qpn: u32,
    kind: QpKind,
    _send_cq: Arc<dyn CompletionQueue>,
    send_cq_index: u32,
    _recv_cq: Arc<dyn CompletionQueue>,
    /// The connected peer and its segment's incarnation (RC).
    peer: Mutex<Option<(QpAddr, u64)>>,
    /// One poster at a time: requests run in the order posted.
    post: Mutex<()>,
}

impl ShmQp {
    fn state(&self) -> u64 {
        self.inner
            .own
            .qp_word(self.qpn, QW_STATE)
            .map_or(QP_ERROR, |w| w.load(Ordering::Acquire))
    }

    fn set_error(&self) {
        if let Some(w) = self.inner.own.qp_word(self.qpn, QW_STATE) {
            w.store(QP_ERROR, Ordering::Release);
        }
    }

    fn me(&self) -> QpAddr {
        QpAddr {
            node: self.inner.node,
            qpn: self.qpn,
        }
    }

    /// Pops a posted receive of queue pair `qpn` in `seg`: its id and buffer.
    fn take_recv(seg: &Segment, qpn: u32) -> Option<(u64, Option<PostedBuffer>)> {
        let w = seg.recv_ring(qpn)?.pop()?;
        let has = (w[1] >> 32) & 1 == 1;
        Some((w[0], has.then_some((w[1] as u32, w[2], w[3]))))
    }

    fn recv_cq_of(seg: &Segment, qpn: u32) -> Option<u32> {
        let cq = seg.qp_word(qpn, QW_RECV_CQ)?.load(Ordering::Acquire);
        (cq < u32::MAX as u64).then_some(cq as u32)
    }

    /// Copies `len` bytes; the last byte lands last (for a seal byte at a buffer's end).
    ///
    /// # Safety
    /// Both ranges resolved inside live mappings.
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        unsafe {
            std::ptr::copy(src, dst, len - 1);
            std::sync::atomic::fence(Ordering::Release);
            std::ptr::write_volatile(dst.add(len - 1), std::ptr::read_volatile(src.add(len - 1)));
        }
        self.inner
            .counters
            .bytes_copied
            .fetch_add(len as u64, Ordering::Relaxed);
    }

    fn run_rc(&self, wr: &SendWr, local: *mut u8) -> WcStatus {
        let Some((peer, incarnation)) = *self.peer.lock() else {
            return WcStatus::RemoteInvalid;
        };
        let Ok(seg) = self.inner.segment(peer.node) else {
            return WcStatus::RemoteInvalid;
        };
        let connected = seg.incarnation == incarnation
            && seg
                .qp_word(peer.qpn, QW_STATE)
                .is_some_and(|w| w.load(Ordering::Acquire) == QP_RC)
            && seg
                .qp_word(peer.qpn, QW_PEER)
                .is_some_and(|w| w.load(Ordering::Acquire) == pack_addr(self.me()));
        if !connected {
            return WcStatus::RemoteInvalid;
        }
        let len = wr.local.len;
        let c = &self.inner.counters;
        match wr.op {
            SendOp::Send { imm } => {
                c.sends.fetch_add(1, Ordering::Relaxed);
                let Some((id, buf)) = Self::take_recv(&seg, peer.qpn) else {
                    c.receiver_not_ready.fetch_add(1, Ordering::Relaxed);
                    return WcStatus::ReceiverNotReady;
                };
                let cq = Self::recv_cq_of(&seg, peer.qpn);
                match self.deliver(&seg, cq, (id, buf), local, len, imm) {
                    true => WcStatus::Success,
                    false => WcStatus::RemoteAccess,
                }
            }
            SendOp::Write {
                remote,
                offset,
                imm,
            } => {
                c.writes.fetch_add(1, Ordering::Relaxed);
                if remote.node != peer.node {
                    return WcStatus::RemoteAccess;
                }
                let Some(dst) = seg.resolve(remote.key, offset, len as u64) else {
                    return WcStatus::RemoteAccess;
                };
                let recv = match imm {
                    Some(_) => match Self::take_recv(&seg, peer.qpn) {
                        Some((id, _)) => Some(id),
                        None => {
                            c.receiver_not_ready.fetch_add(1, Ordering::Relaxed);
                            return WcStatus::ReceiverNotReady;
                        }
                    },
                    None => None,
                };
                // SAFETY: both ranges resolved inside their mappings.
                unsafe { self.copy(local, dst, len) };
                if let Some(id) = recv
                    && let Some(cq) = Self::recv_cq_of(&seg, peer.qpn)
                {
                    self.inner.complete(
                        &seg,
                        cq,
                        &Completion {
                            id,
                            status: WcStatus::Success,
                            op: WcOp::RecvWriteImm,
                            bytes: len as u32,
                            imm,
                            src: Some(self.me()),
                        },
                    );
                }
                WcStatus::Success
            }
            SendOp::Read { remote, offset } => {
                c.reads.fetch_add(1, Ordering::Relaxed);
                if remote.node != peer.node {
                    return WcStatus::RemoteAccess;
                }
                let Some(src) = seg.resolve(remote.key, offset, len as u64) else {
                    return WcStatus::RemoteAccess;
                };
                // SAFETY: both ranges resolved inside their mappings.
                unsafe { self.copy(src, local, len) };
                WcStatus::Success
            }
        }
    }

    fn run_ud(&self, wr: &SendWr, local: *mut u8) -> WcStatus {
        let c = &self.inner.counters;
        c.sends.fetch_add(1, Ordering::Relaxed);
        let drop = || {
            c.datagrams_dropped.fetch_add(1, Ordering::Relaxed);
            WcStatus::Success
        };
        let (Some(dest), SendOp::Send { imm }) = (wr.dest, wr.op) else {
            return WcStatus::RemoteInvalid;
        };
        let Ok(seg) = self.inner.segment(dest.node) else {
            return drop();
        };
        if seg
            .qp_word(dest.qpn, QW_STATE)
            .is_none_or(|w| w.load(Ordering::Acquire) != QP_UD)
        {
            return drop();
        }
        let Some((id, buf)) = Self::take_recv(&seg, dest.qpn) else {
            return drop();
        };
        let Some(cq) = Self::recv_cq_of(&seg, dest.qpn) else {
            return drop();
        };
        self.deliver(&seg, Some(cq), (id, buf), local, wr.local.len, imm);
        WcStatus::Success
    }

    /// Lands a send of `len` bytes from `local` in the posted receive `recv`
    /// of a peer's queue pair and completes it on the pair's queue `cq`
    /// (`LocalLength` if the receive has no buffer or too short a one).
    /// Returns whether the bytes landed.
    fn deliver(
        &self,
        seg: &Segment,
        cq: Option<u32>,
        recv: (u64, Option<PostedBuffer>),
        local: *mut u8,
        len: usize,
        imm: Option<u32>,
    ) -> bool {
        let (id, buf) = recv;
        let dst = buf.and_then(|(key, off, blen)| {
            (blen >= len as u64)
                .then(|| seg.resolve(key, off, len as u64))
                .flatten()
        });
        if let Some(dst) = dst {
            // SAFETY: both ranges resolved inside their mappings.
            unsafe { self.copy(local, dst, len) };
        }
        if let Some(cq) = cq {
            let status = match dst {
                Some(_) => WcStatus::Success,
                None => WcStatus::LocalLength,
            };
            self.inner.complete(
                seg,
                cq,
                &Completion {
                    id,
                    status,
                    op: WcOp::Recv,
                    bytes: len as u32,
                    imm,
                    src: Some(self.me()),
                },
            );
        }
        dst.is_some()
    }
}

/// A posted receive's buffer: region key, offset, length.
type PostedBuffer = (u32, u64, u64);

impl QueuePair for ShmQp {
    fn addr(&self) -> QpAddr {
        self.me()
    }

    fn kind(&self) -> QpKind {
        self.kind
    }

    fn connect(&self, remote: QpAddr) -> Result<(), CarrierError> {
        if self.kind != QpKind::Rc {
            return Err(CarrierError::Invalid(
                "only reliable queue pairs connect".into(),
            ));
        }
        let seg = self.inner.segment(remote.node)?;
        if remote.qpn >= seg.layout.params.max_qps {
            return Err(CarrierError::Invalid(format!("no {remote}")));
        }
        let own = &self.inner.own;
        if let (Some(p), Some(i)) = (
            own.qp_word(self.qpn, QW_PEER),
            own.qp_word(self.qpn, QW_PEER_INC),
        ) {
            i.store(seg.incarnation, Ordering::Relaxed);
            p.store(pack_addr(remote), Ordering::Release);
        }
        *self.peer.lock() = Some((remote, seg.incarnation));
        Ok(())
    }

    fn post_send(&self, wr: SendWr) -> Result<(), CarrierError> {
        let len = wr.local.len;
        if len > u32::MAX as usize {
            return Err(CarrierError::Invalid(format!("{len} bytes in one request")));
        }
        if self.kind == QpKind::Ud && len > UD_MTU {
            return Err(CarrierError::Invalid(format!(
                "a datagram of {len} bytes (at most {UD_MTU})"
            )));
        }
        let local = self
            .inner
            .own
            .resolve(wr.local.key, wr.local.offset as u64, len as u64)
            .ok_or_else(|| {
                CarrierError::Invalid(format!(
                    "bytes {}..{} of local key {:#x} are not registered",
                    wr.local.offset,
                    wr.local.offset + len,
                    wr.local.key
                ))
            })?;
        let _one = self.post.lock();
        let status = if self.state() == QP_ERROR {
            WcStatus::Flushed
        } else {
            match self.kind {
                QpKind::Rc => self.run_rc(&wr, local),
                QpKind::Ud => self.run_ud(&wr, local),
            }
        };
        if status != WcStatus::Success && self.kind == QpKind::Rc {
            self.set_error();
        }
        if status != WcStatus::Success || wr.signaled {
            let c = Completion {
                id: wr.id,
                status,
                op: op_of(&wr.op),
                bytes: len as u32,
                imm: None,
                src: None,
            };
            self.inner.complete(&self.inner.own, self.send_cq_index, &c);
        }
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), CarrierError> {
        let (key, off, len, has) = match wr.local {
            Some(s) => {
                if self
                    .inner
                    .own
                    .resolve(s.key, s.offset as u64, s.len as u64)
                    .is_none()
                {
                    return Err(CarrierError::Invalid(format!(
                        "receive buffer {}..{} of key {:#x} is not registered",
                        s.offset,
                        s.offset + s.len,
                        s.key
                    )));
                }
                (s.key, s.offset as u64, s.len as u64, 1u64)
            }
            None => (0, 0, 0, 0),
        };
        let ring = self
            .inner
            .own
            .recv_ring(self.qpn)
            .ok_or_else(|| CarrierError::Invalid("queue pair outside the table".into()))?;
        if !ring.push([wr.id, key as u64 | has << 32, off, len]) {
            return Err(CarrierError::Exhausted(format!(
                "the receive queue of {} is full ({} posted)",
                self.me(),
                self.inner.own.layout.params.recv_depth
            )));
        }
        Ok(())
    }
}

impl Drop for ShmQp {
    fn drop(&mut self) {
        if let Some(w) = self.inner.own.qp_word(self.qpn, QW_STATE) {
            w.store(QP_FREE, Ordering::Release);
        }
        if let Some(u) = self.inner.qps.lock().get_mut(self.qpn as usize) {
            *u = false;
        }
    }
}

/// The shared-memory carrier of one node.
#[derive(Clone)]
pub struct ShmCarrier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ShmCarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCarrier")
            .field("node", &self.inner.node)
            .field("segment", &self.inner.own.path)
            .finish()
    }
}

impl ShmCarrier {
    /// Creates `node`'s segment in `config.dir` and starts its progress thread.
    pub fn open(node: NodeId, config: &ShmConfig) -> Result<Self, CarrierError> {
        let own = Arc::new(Segment::create(&config.dir, node, config.params)?);
        let p = config.params;
        let mut regions = Regions {
            generation: vec![0; p.max_regions as usize],
            free_index: (0..p.max_regions as usize).rev().collect(),
            ..Default::default()
        };
        regions.free.insert(0, p.arena as usize);
        let inner = Arc::new(Inner {
            node,
            dir: config.dir.clone(),
            own: Arc::clone(&own),
            peers: RwLock::new(HashMap::new()),
            regions: Mutex::new(regions),
            qps: Mutex::new(vec![false; p.max_qps as usize]),
            cqs: Mutex::new((0..p.max_cqs).map(|_| None).collect()),
            counters: Counters::default(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(format!("gyre-shm-{node}"))
            .spawn(move || progress(weak, own))
            .map_err(|e| CarrierError::System(format!("starting the progress thread: {e}")))?;
        Ok(Self { inner })
    }

    /// What the carrier did so far.
    pub fn stats(&self) -> ShmStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ShmStats {
            bytes_copied: l(&c.bytes_copied),
            sends: l(&c.sends),
            writes: l(&c.writes),
            reads: l(&c.reads),
            datagrams_dropped: l(&c.datagrams_dropped),
            receiver_not_ready: l(&c.receiver_not_ready),
            cq_overruns: l(&c.cq_overruns),
        }
    }

    /// Bytes of registered memory held now.
    pub fn registered_bytes(&self) -> usize {
        self.inner.regions.lock().live.values().map(|r| r.2).sum()
    }
}

/// Wakes the tasks waiting on this node's completion queues when peers ring.
fn progress(weak: Weak<Inner>, seg: Arc<Segment>) {
    let mut seen: Vec<u64> = vec![0; seg.layout.params.max_cqs as usize];
    loop {
        let bell = seg.doorbell().load(Ordering::SeqCst);
        {
            let Some(inner) = weak.upgrade() else { break };
            let cqs: Vec<(usize, Arc<ShmCq>)> = inner
                .cqs
                .lock()
                .iter()
                .enumerate()
                .filter_map(|(i, q)| q.as_ref().and_then(Weak::upgrade).map(|q| (i, q)))
                .collect();
            for (i, q) in cqs {
                let e = seg.cq_events(i as u32);
                if e != seen[i] {
                    seen[i] = e;
                    q.notify.notify_waiters();
                }
            }
        }
        seg.waiters().fetch_add(1, Ordering::SeqCst);
        if seg.doorbell().load(Ordering::SeqCst) == bell {
            futex_wait(seg.doorbell(), bell, PROGRESS_TICK);
        }
        seg.waiters().fetch_sub(1, Ordering::SeqCst);
    }
}

impl Carrier for ShmCarrier {
    fn node(&self) -> NodeId {
        self.inner.node
    }

    fn name(&self) -> &'static str {
        "shm"
    }

    fn register(&self, len: usize) -> Result<Region, CarrierError> {
        let rounded = len.max(1).div_ceil(64) * 64;
        let (key, off) = {
            let mut r = self.inner.regions.lock();
            let Some(off) = r.alloc(rounded) else {
                return Err(CarrierError::Exhausted(format!(
                    "no {rounded} bytes free in the shared-memory arena of {} bytes",
                    self.inner.own.layout.params.arena
                )));
            };
            let Some(index) = r.free_index.pop() else {
                r.release(off, rounded);
                return Err(CarrierError::Exhausted("every region key is in use".into()));
            };
            r.generation[index] = r.generation[index].wrapping_add(1);
            let key = (r.generation[index] as u32) << 16 | (index as u32 + 1);
            r.live.insert(key, (index, off, rounded));
            self.inner.own.set_region(index, key, off, rounded);
            (key, off)
        };
        let ptr = self.inner.own.arena_ptr(off);
        let owner = Arc::clone(&self.inner) as Arc<dyn RegionOwner>;
        // SAFETY: the arena bytes stay mapped while `owner` (the segment's holder) lives.
        Ok(unsafe { Region::new(key, ptr, len, owner) })
    }

    fn create_cq(&self, depth: usize) -> Result<Arc<dyn CompletionQueue>, CarrierError> {
        let max = self.inner.own.layout.params.cq_depth as usize;
        if depth > max {
            return Err(CarrierError::Invalid(format!(
                "a completion queue of {depth} entries (this segment's are {max})"
            )));
        }
        let mut cqs = self.inner.cqs.lock();
        let Some(index) = cqs.iter().position(Option::is_none) else {
            return Err(CarrierError::Exhausted(
                "every completion queue is in use".into(),
            ));
        };
        let own = &self.inner.own;
        if let Some(ring) = own.cq_ring(index as u32) {
            ring.init();
        }
        own.cq_set_used(index as u32, true);
        let cq = Arc::new(ShmCq {
            inner: Arc::clone(&self.inner),
            index: index as u32,
            notify: Notify::new(),
        });
        cqs[index] = Some(Arc::downgrade(&cq));
        Ok(cq)
    }

    fn create_qp(
        &self,
        kind: QpKind,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
    ) -> Result<Arc<dyn QueuePair>, CarrierError> {
        let send_index = shm_cq(send_cq)?.index;
        let recv_index = shm_cq(recv_cq)?.index;
        let qpn = {
            let mut qps = self.inner.qps.lock();
            let Some(qpn) = qps.iter().position(|u| !u) else {
                return Err(CarrierError::Exhausted("every queue pair is in use".into()));
            };
            qps[qpn] = true;
            qpn as u32
        };
        let own = &self.inner.own;
        if let Some(ring) = own.recv_ring(qpn) {
            ring.init();
        }
        let w = |i| own.qp_word(qpn, i).expect("inside the table");
        w(QW_RECV_CQ).store(recv_index as u64, Ordering::Relaxed);
        w(QW_PEER).store(NO_PEER, Ordering::Relaxed);
        w(QW_PEER_INC).store(0, Ordering::Relaxed);
        w(QW_STATE).store(
            if kind == QpKind::Rc { QP_RC } else { QP_UD },
            Ordering::Release,
        );
        Ok(Arc::new(ShmQp {
            inner: Arc::clone(&self.inner),
            qpn,
            kind,
            _send_cq: Arc::clone(send_cq),
            send_cq_index: send_index,
            _recv_cq: Arc::clone(recv_cq),
            peer: Mutex::new(None),
            post: Mutex::new(()),
        }))
    }

    fn max_message(&self, kind: QpKind) -> usize {
        match kind {
            QpKind::Rc => (self.inner.own.layout.params.arena as usize).min(u32::MAX as usize),
            QpKind::Ud => UD_MTU,
        }
    }

    fn recv_depth(&self) -> usize {
        self.inner.own.layout.params.recv_depth as usize
    }

    fn is_alive(&self, node: NodeId) -> bool {
        self.inner.segment(node).is_ok_and(|s| s.is_alive())
    }
}

/// Nodes 1..=n of one host in a fresh directory, each with `arena` bytes to register.
#[cfg(test)]
pub(crate) fn test_nodes(n: u32, arena: u64) -> (tempfile::TempDir, Vec<Arc<ShmCarrier>>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = ShmConfig {
        dir: dir.path().to_path_buf(),
        params: ShmParams {
            arena,
            ..Default::default()
        },
    };
    let nodes = (1..=n)
        .map(|id| Arc::new(ShmCarrier::open(id, &config).expect("a carrier")))
        .collect();
    (dir, nodes)
}

#[cfg(test)]
mod tests;
