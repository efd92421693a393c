//! What both ends of a verbs design's stream agree on: the settings, the
//! primitive that carries the data, the message header and the layout of the
//! notification slots one side writes into the other's memory.

use crate::verbs::{Carrier, CarrierError, QpKind};
use crate::{NodeId, TransportError};
use std::time::Duration;

/// Bytes of the header at the start of every message.
pub const HEADER: usize = 16;
pub(super) const FLAG_LAST: u32 = 1;
pub(super) const FLAG_ERROR: u32 = 2;
/// The sender waited for credit before this message (adaptive buffers).
pub(super) const FLAG_STARVED: u32 = 4;
/// The message continues in the stream's next one (a message larger than a
/// buffer, cut into several).
pub(super) const FLAG_MORE: u32 = 8;
/// Slots are padded to cache lines, as the paper pads its credit slots.
const LINE: usize = 64;
/// Bytes of a Read stream's valid-queue entry: buffer index, bytes to read.
pub(super) const ENTRY: usize = 8;
/// A valid-queue entry naming no buffer: the sending endpoint was dropped.
pub(super) const DROPPED: u32 = u32::MAX;

/// How a design moves a message (the paper's SR, SQ and RD, WR columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// Two-sided send/receive on a reliable connection per stream (MQ/SR).
    Send,
    /// Two-sided send/receive over one datagram queue pair per endpoint (SQ/SR).
    Datagram,
    /// One-sided RDMA Read: the receiver pulls from the sender's buffers (RD).
    Read,
    /// One-sided RDMA Write with immediate into the receiver's buffers (WR,
    /// the paper's "poll completion queue" variant).
    Write,
}

/// Settings of the verbs designs' endpoints (both sides of a stream use the same).
#[derive(Debug, Clone)]
pub struct DesignConfig {
    /// Bytes of a registered message buffer, header included (the paper: 64 KiB on RC).
    pub message_size: usize,
    /// Receive buffers per stream: the credits a sender starts with.
    pub window: u32,
    /// Released buffers between two credit write-backs (the paper's f = 2).
    pub credit_every: u32,
    /// Registered buffers of a send endpoint.
    pub send_buffers: usize,
    /// How long a side waits for its peer to appear or to make progress.
    pub timeout: Duration,
    pub primitive: Primitive,
    /// Adaptive buffers (the paper's section 6.2), up to this window per
    /// stream: a receiver lends a stream one more buffer from its pool when
    /// the stream's sender has used every credit, and takes buffers back out
    /// of circulation when several messages wait at once. `None`: the window
    /// stays fixed. Send/receive designs only.
    pub adaptive: Option<u32>,
}

impl Default for DesignConfig {
    fn default() -> Self {
        Self {
            message_size: 64 * 1024,
            window: 8,
            credit_every: 2,
            send_buffers: 16,
            timeout: Duration::from_secs(10),
            primitive: Primitive::Send,
            adaptive: None,
        }
    }
}

impl DesignConfig {
    pub(super) fn check(&self) -> Result<(), TransportError> {
        let bad = |m: &str| Err(TransportError::Misuse(format!("verbs design: {m}")));
        if self.message_size <= HEADER || self.message_size > u32::MAX as usize {
            return bad("messages must be larger than their header and under 4 GiB");
        }
        if self.window == 0 || self.credit_every == 0 || self.credit_every > self.window {
            return bad("the credit write-back interval must be between 1 and the window");
        }
        if self.primitive == Primitive::Write && self.window >= u16::MAX as u32 {
            return bad("a write design's window must name its buffers in 16 bits");
        }
        if self.send_buffers == 0 || self.send_buffers >= DROPPED as usize {
            return bad("a send endpoint needs buffers");
        }
        if let Some(max) = self.adaptive {
            if !matches!(self.primitive, Primitive::Send | Primitive::Datagram) {
                return bad("adaptive buffers serve the send/receive designs");
            }
            if max < self.window || max > 1 << 16 {
                return bad("an adaptive window's limit must be between the window and 65536");
            }
        }
        Ok(())
    }

    /// What both sides of a stream must agree on, in one word: the primitive,
    /// message size, window, write-back interval and send buffers (the slots'
    /// and queues' layout follows from them).
    pub fn terms(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            self.primitive as u8,
            self.message_size,
            self.window,
            self.credit_every,
            self.send_buffers,
            self.adaptive,
        )
            .hash(&mut h);
        h.finish()
    }

    /// Bytes a message's payload may take.
    pub fn payload(&self) -> usize {
        self.message_size - HEADER
    }

    /// Whether the receiver writes credits back (all but Read, whose senders
    /// count what is in flight per stream from the receiver's read notices).
    pub(super) fn credited(&self) -> bool {
        self.primitive != Primitive::Read
    }

    /// Whether a stream's messages arrive in order (all but datagrams).
    pub(super) fn in_order(&self) -> bool {
        self.primitive != Primitive::Datagram
    }

    /// Buffers per stream at the receiver: the window plus the reserve for the
    /// end-of-stream or error marker, which needs no credit.
    pub(super) fn per_stream(&self) -> usize {
        self.window as usize + 1
    }

    /// Entries of a Read stream's valid queue: every send buffer and the reserve
    /// may be announced at once.
    pub(super) fn valid_entries(&self) -> usize {
        self.send_buffers + 1
    }

    /// Where the credit count sits in a sender's slot: after the free queue of
    /// receiver buffers (Write), or first.
    pub(super) fn count_at(&self) -> usize {
        match self.primitive {
            Primitive::Write => (4 * self.window as usize).next_multiple_of(8),
            _ => 0,
        }
    }

    /// Bytes of one stream's slot: at the sender, the credit count the receiver
    /// writes (after the free queue for Write); for Read, at the receiver, the
    /// valid queue the sender writes.
    pub(super) fn slot(&self) -> usize {
        match self.primitive {
            Primitive::Read => (ENTRY * self.valid_entries()).next_multiple_of(LINE),
            _ => (self.count_at() + 8).next_multiple_of(LINE),
        }
    }

    /// Buffer-less receives a sender keeps posted per stream for the receiver's
    /// notifications: more than the credit writes a receiver can make before the
    /// sender next reaps, or (Read) one per buffer that may be read. An adaptive
    /// receiver writes at the largest window's rate, and besides once per
    /// message at most when it lends a starved stream a buffer.
    pub(super) fn notify_recvs(&self) -> u64 {
        match (self.primitive, self.adaptive) {
            (Primitive::Read, _) => self.valid_entries() as u64 + 1,
            (_, Some(max)) => 2 * (max / self.credit_every) as u64 + 8,
            _ => (self.window / self.credit_every) as u64 + 4,
        }
    }

    /// Datagram designs' messages must fit the carrier's datagrams.
    pub(super) fn check_carrier(&self, carrier: &dyn Carrier) -> Result<(), TransportError> {
        let max = carrier.max_message(QpKind::Ud);
        if self.primitive == Primitive::Datagram && self.message_size > max {
            return Err(TransportError::Misuse(format!(
                "messages of {} bytes over datagrams of at most {max}",
                self.message_size
            )));
        }
        Ok(())
    }
}

pub(super) fn carrier_err(e: CarrierError) -> TransportError {
    match e {
        CarrierError::Peer { node, reason } => TransportError::Unreachable { peer: node, reason },
        other => TransportError::Misuse(other.to_string()),
    }
}

pub(super) fn lost(peer: NodeId, why: impl Into<String>) -> TransportError {
    TransportError::PeerLost {
        peer,
        reason: why.into(),
    }
}

/// A message's header: flags, payload length, sender slot (4 bytes reserved).
/// The same for every destination of a buffer (a NIC may read it while it goes
/// to several), so per-stream sequence numbers travel as immediates.
pub(super) fn header(flags: u32, len: usize, from: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&flags.to_le_bytes());
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..12].copy_from_slice(&from.to_le_bytes());
    h
}

pub(super) fn word(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

/// A Write stream's free-queue entry: the low 16 bits of the credit it
/// belongs to, and the receiver buffer it frees.
pub(super) fn free_entry_of(credit: u64, buffer: u32) -> u32 {
    ((credit as u32 & 0xffff) << 16) | (buffer & 0xffff)
}

/// The credit tag and buffer of a free-queue entry.
pub(super) fn free_entry(e: u32) -> (u16, u32) {
    ((e >> 16) as u16, e & 0xffff)
}

/// A Write message's immediate: the low 16 bits of its sequence number and the
/// receiver buffer it landed in.
pub(super) fn write_imm(seq: u64, buffer: u32) -> u32 {
    ((seq as u32 & 0xffff) << 16) | (buffer & 0xffff)
}
