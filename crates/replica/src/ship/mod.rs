//! Log shipping by IP multicast: each redo-log group crosses the network once, however
//! many secondaries listen.
//!
//! ScyPer (Rödiger's thesis, section 5.2.1) multicasts the redo log with PGM (RFC 3208)
//! because plain UDP loses, duplicates and reorders. This module is a PGM-like protocol
//! over UDP multicast, written for the log:
//!
//! - The [`Publisher`] cuts each message (a log group) into numbered packets (ODATA),
//!   sends them to the group once, and keeps the newest ones in a retransmit window.
//!   Every `heartbeat` it announces the lead (newest sequence number sent) and trail
//!   (oldest still retransmittable), PGM's SPM, so a receiver that lost the last
//!   packets of a burst learns of them.
//! - A [`Receiver`] delivers messages in order, exactly once. A gap in the sequence
//!   numbers (or behind an announced lead) is NAKed to the publisher after a short
//!   delay, again until repaired; the publisher multicasts the repair (RDATA), so
//!   every receiver that lost the same packet is repaired at once, and repeats a
//!   repair of one packet at most once per `repair_holdoff`. A packet already gone
//!   from the window is answered with LOST and the receiver fails with
//!   [`ShipError::Lost`]: it has to catch up from the durable log instead.
//!
//! Where multicast is not available, [`tcp`] sends the same messages over one TCP
//! connection per secondary.
//!
//! Every datagram is hostile until checked: wrong magic, sizes or fragment numbers are
//! dropped and counted, never trusted.
//!
//! States of a receiver: *waiting* (no packet of the stream yet), *in order* (nothing
//! missing), *repairing* (a gap, NAK timer running, reset whenever the gap shrinks),
//! *failed* (lost, unrepaired, or the publisher silent; every later call returns the
//! error). A receiver starts at a first transmission or a heartbeat, never at a repair.

mod packet;
mod publisher;
mod receiver;
pub mod tcp;

pub use packet::{MAX_PACKET_BYTES, Packet};
pub use publisher::{Publisher, PublisherConfig, PublisherStats};
pub use receiver::{Receiver, ReceiverConfig, ReceiverStats};

use std::net::{Ipv4Addr, SocketAddrV4};

/// Why a receiver stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShipError {
    /// Packet `needed` is no longer in the publisher's window (its trail is `trail`).
    Lost {
        needed: u64,
        trail: u64,
    },
    /// A gap stayed unrepaired (or nothing arrived) for longer than allowed.
    Timeout {
        needed: u64,
        waited_ms: u64,
    },
    /// Nothing of the stream (not even a heartbeat) for too long; `other_stream` says
    /// whether another publisher's stream was heard meanwhile (a restarted primary).
    Silent {
        waited_ms: u64,
        other_stream: bool,
    },
    /// The stream broke the protocol (fragments out of place).
    Protocol(String),
    Io(String),
}

impl std::fmt::Display for ShipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShipError::Lost { needed, trail } => write!(
                f,
                "log packet {needed} is gone from the publisher's window (oldest kept: \
                 {trail}); catch up from the durable log"
            ),
            ShipError::Timeout { needed, waited_ms } => write!(
                f,
                "log packet {needed} was not repaired within {waited_ms} ms"
            ),
            ShipError::Silent {
                waited_ms,
                other_stream,
            } => write!(
                f,
                "the log publisher has been silent for {waited_ms} ms{}",
                if *other_stream {
                    "; a new stream started (the primary restarted): catch up from the \
                     durable log"
                } else {
                    ""
                }
            ),
            ShipError::Protocol(m) => write!(f, "log stream: {m}"),
            ShipError::Io(m) => write!(f, "log stream I/O: {m}"),
        }
    }
}

impl std::error::Error for ShipError {}

impl From<std::io::Error> for ShipError {
    fn from(e: std::io::Error) -> Self {
        ShipError::Io(e.to_string())
    }
}

/// Where a stream is multicast: the group, and the local interface address to send
/// and listen on (`127.0.0.1` on one host, a bridge address on the emulated cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub group: SocketAddrV4,
    pub interface: Ipv4Addr,
}

fn multicast_socket(g: &Group, bind_port: u16) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    if !g.group.ip().is_multicast() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a multicast address", g.group.ip()),
        ));
    }
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_multicast_if_v4(&g.interface)?;
    s.set_multicast_loop_v4(true)?;
    s.set_multicast_ttl_v4(1)?;
    // Bursts of a large group arrive faster than a busy receiver reads them; a large
    // buffer turns most would-be losses into waits (the kernel caps it at rmem_max).
    let _ = s.set_recv_buffer_size(16 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&std::net::SocketAddr::from((Ipv4Addr::UNSPECIFIED, bind_port)).into())?;
    Ok(s.into())
}
