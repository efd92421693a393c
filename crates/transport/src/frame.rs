//! The wire format: every message between two Gyre nodes is one frame.
//!
//! ```text
//! +--------+---------+------+-------+----------+-------------+-----------+--------------+
//! | magic  | version | kind | flags | reserved | payload len | crc32     | payload ...  |
//! | 4 B    | 1 B     | 1 B  | 1 B   | 1 B      | 4 B (LE)    | 4 B (LE)  | len bytes    |
//! +--------+---------+------+-------+----------+-------------+-----------+--------------+
//! ```
//!
//! The header is validated before any payload byte is trusted: a wrong magic,
//! version, kind, an oversized length or a checksum mismatch is a protocol
//! error that closes the connection (see [`FrameError`]). Stream frames start
//! their payload with a [`StreamKey`]; control frames have fixed payload sizes
//! that are checked exactly.
//!
//! End of stream is not a frame of its own: it is the [`FLAG_LAST`] bit on the
//! stream's final data frame (whose body may be empty), so it can never
//! overtake the stream's data.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::fmt;

/// `GYRE` in ASCII.
pub const MAGIC: [u8; 4] = *b"GYRE";
/// Bumped whenever the frame layout or a payload layout changes.
pub const VERSION: u8 = 3;
/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 16;
/// Largest payload a peer may send; larger frames are rejected before allocation.
pub const MAX_PAYLOAD: usize = 256 * 1024 * 1024;

/// Data frame flag: this is the last message of its stream.
pub const FLAG_LAST: u8 = 1;
/// End-of-turn flag: the sender still has queued data for this receiver.
pub const FLAG_MORE: u8 = 2;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Handshake, dialer -> acceptor: node id, receive window, nonce.
    Hello = 1,
    /// Handshake, acceptor -> dialer: node id, receive window, nonce, proof.
    Challenge = 2,
    /// Handshake, dialer -> acceptor: proof.
    Proof = 3,
    /// Handshake, acceptor -> dialer: the connection is accepted.
    Welcome = 4,
    /// One message of a stream (an Arrow IPC message); may carry [`FLAG_LAST`].
    Data = 8,
    /// The sender of a stream failed; payload carries the error text.
    Error = 9,
    /// The receiver grants the sender more messages on a stream.
    Credit = 10,
    /// Phased schedule: the sender has data queued for the receiver.
    Ready = 11,
    /// Phased schedule: the receiver gives the sender a turn.
    Grant = 12,
    /// Phased schedule: the sender ends its turn (may carry [`FLAG_MORE`]).
    EndTurn = 13,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Challenge,
            3 => Self::Proof,
            4 => Self::Welcome,
            8 => Self::Data,
            9 => Self::Error,
            10 => Self::Credit,
            11 => Self::Ready,
            12 => Self::Grant,
            13 => Self::EndTurn,
            _ => return None,
        })
    }
}

/// Why a frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    BadMagic([u8; 4]),
    BadVersion(u8),
    BadKind(u8),
    TooLarge(usize),
    BadChecksum {
        expected: u32,
        actual: u32,
    },
    /// The payload length does not fit the frame kind.
    BadLength {
        kind: FrameKind,
        len: usize,
    },
    /// A field of the payload holds a value its frame kind does not allow.
    BadField {
        kind: FrameKind,
        field: &'static str,
        value: u64,
        allowed: &'static str,
    },
    /// The connection ended inside a frame.
    Truncated {
        what: &'static str,
        got: usize,
        want: usize,
    },
    /// A frame that is not allowed at this point of the protocol.
    Unexpected(FrameKind),
    /// On a sealed link: a frame that does not open under the link's key and next nonce.
    Unauthentic,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadMagic(m) => write!(f, "bad frame magic {m:02x?} (expected \"GYRE\")"),
            Self::BadVersion(v) => {
                write!(
                    f,
                    "unsupported frame version {v} (this node speaks {VERSION})"
                )
            }
            Self::BadKind(k) => write!(f, "unknown frame kind {k}"),
            Self::TooLarge(n) => {
                write!(
                    f,
                    "frame payload of {n} bytes exceeds the maximum of {MAX_PAYLOAD}"
                )
            }
            Self::BadChecksum { expected, actual } => write!(
                f,
                "frame checksum mismatch (header says {expected:08x}, payload has {actual:08x})"
            ),
            Self::BadLength { kind, len } => {
                write!(f, "{kind:?} frame with a payload of {len} bytes")
            }
            Self::BadField {
                kind,
                field,
                value,
                allowed,
            } => write!(
                f,
                "{kind:?} frame with {field} {value} (allowed: {allowed})"
            ),
            Self::Truncated { what, got, want } => write!(
                f,
                "truncated frame: connection closed after {got} of {want} bytes of the {what}"
            ),
            Self::Unexpected(k) => write!(f, "unexpected {k:?} frame"),
            Self::Unauthentic => write!(
                f,
                "frame failed authentication on a sealed link (altered, replayed, \
                 reordered or injected)"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub flags: u8,
    pub len: usize,
    pub crc: u32,
}

impl FrameHeader {
    /// Parses and validates a header; the payload is checked later against `crc`.
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let magic = [buf[0], buf[1], buf[2], buf[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if buf[4] != VERSION {
            return Err(FrameError::BadVersion(buf[4]));
        }
        let kind = FrameKind::from_u8(buf[5]).ok_or(FrameError::BadKind(buf[5]))?;
        let len = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        let crc = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
        Ok(Self {
            kind,
            flags: buf[6],
            len,
            crc,
        })
    }

    /// Checks a payload checksum against the header's.
    pub fn verify_crc(&self, actual: u32) -> Result<(), FrameError> {
        if actual != self.crc {
            return Err(FrameError::BadChecksum {
                expected: self.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Encodes a header.
    pub fn encode(kind: FrameKind, flags: u8, len: usize, crc: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = kind as u8;
        h[6] = flags;
        h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        h[12..16].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// Encodes a header for a payload held in one slice.
pub fn encode_header(kind: FrameKind, flags: u8, payload: &[u8]) -> [u8; HEADER_LEN] {
    FrameHeader::encode(kind, flags, payload.len(), crc32fast::hash(payload))
}

/// A whole frame, header then payload, in one buffer (the multiplexer writes the two
/// apart; this is for handshakes written by hand, tests and fuzzing seeds).
pub fn encode_frame(kind: FrameKind, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = encode_header(kind, flags, payload).to_vec();
    f.extend_from_slice(payload);
    f
}

/// CRC32 of `key ++ body` from the key and a body checksum computed earlier
/// (the body's is computed once by the producing thread, shared by every copy).
pub fn data_crc(key: &[u8; StreamKey::LEN], body_crc: u32, body_len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(key);
    h.combine(&crc32fast::Hasher::new_with_initial_len(
        body_crc,
        body_len as u64,
    ));
    h.finalize()
}

/// Identifies one stream of messages: a (query, exchange, sender slot, receiving node).
///
/// A sender slot is the producing partition; `to` is the node that consumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    pub query: u64,
    pub exchange: u32,
    pub from: u32,
    pub to: u32,
}

impl StreamKey {
    pub const LEN: usize = 20;

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.query.to_le_bytes());
        b[8..12].copy_from_slice(&self.exchange.to_le_bytes());
        b[12..16].copy_from_slice(&self.from.to_le_bytes());
        b[16..20].copy_from_slice(&self.to.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Self {
            query: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            exchange: u32_at(8),
            from: u32_at(12),
            to: u32_at(16),
        }
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query {} exchange {} (slot {} -> node {})",
            self.query, self.exchange, self.from, self.to
        )
    }
}

/// A frame other than a data frame (whose body travels without being copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Error(StreamKey, String),
    Credit(StreamKey, u32),
    Ready,
    Grant { phase: u32 },
    EndTurn { more: bool },
}

impl Control {
    /// Serialises into (kind, flags, payload).
    pub fn encode(&self) -> (FrameKind, u8, Bytes) {
        let mut buf = BytesMut::new();
        match self {
            Self::Error(k, msg) => {
                buf.put_slice(&k.to_bytes());
                buf.put_slice(msg.as_bytes());
                (FrameKind::Error, 0, buf.freeze())
            }
            Self::Credit(k, n) => {
                buf.put_slice(&k.to_bytes());
                buf.put_u32_le(*n);
                (FrameKind::Credit, 0, buf.freeze())
            }
            Self::Ready => (FrameKind::Ready, 0, Bytes::new()),
            Self::Grant { phase } => {
                buf.put_u32_le(*phase);
                (FrameKind::Grant, 0, buf.freeze())
            }
            Self::EndTurn { more } => (
                FrameKind::EndTurn,
                if *more { FLAG_MORE } else { 0 },
                Bytes::new(),
            ),
        }
    }

    /// Parses a control frame, checking its payload length exactly.
    pub fn decode(kind: FrameKind, flags: u8, mut payload: Bytes) -> Result<Self, FrameError> {
        let len = payload.len();
        let bad = || FrameError::BadLength { kind, len };
        let key = |p: &mut Bytes| -> Result<StreamKey, FrameError> {
            if p.len() < StreamKey::LEN {
                return Err(bad());
            }
            let mut k = [0u8; StreamKey::LEN];
            p.copy_to_slice(&mut k);
            Ok(StreamKey::from_bytes(&k))
        };
        Ok(match kind {
            FrameKind::Error => {
                let k = key(&mut payload)?;
                Self::Error(k, String::from_utf8_lossy(&payload).into_owned())
            }
            FrameKind::Credit => {
                if len != StreamKey::LEN + 4 {
                    return Err(bad());
                }
                let k = key(&mut payload)?;
                Self::Credit(k, payload.get_u32_le())
            }
            FrameKind::Ready => {
                if len != 0 {
                    return Err(bad());
                }
                Self::Ready
            }
            FrameKind::Grant => {
                if len != 4 {
                    return Err(bad());
                }
                Self::Grant {
                    phase: payload.get_u32_le(),
                }
            }
            FrameKind::EndTurn => {
                if len != 0 {
                    return Err(bad());
                }
                Self::EndTurn {
                    more: flags & FLAG_MORE != 0,
                }
            }
            other => return Err(FrameError::Unexpected(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StreamKey {
        StreamKey {
            query: 7,
            exchange: 3,
            from: 1,
            to: 2,
        }
    }

    #[test]
    fn header_round_trip_and_validation() {
        let payload = b"hello world";
        let h = encode_header(FrameKind::Data, FLAG_LAST, payload);
        let parsed = FrameHeader::decode(&h).unwrap();
        assert_eq!(parsed.kind, FrameKind::Data);
        assert_eq!(parsed.flags, FLAG_LAST);
        assert_eq!(parsed.len, payload.len());
        parsed.verify_crc(crc32fast::hash(payload)).unwrap();
        assert!(matches!(
            parsed.verify_crc(crc32fast::hash(b"hello worle")),
            Err(FrameError::BadChecksum { .. })
        ));

        let mut bad = h;
        bad[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&bad),
            Err(FrameError::BadMagic(_))
        ));
        let mut bad = h;
        bad[4] = 99;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameError::BadVersion(99)));
        let mut bad = h;
        bad[5] = 42;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameError::BadKind(42)));
        let mut bad = h;
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&bad),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn data_crc_equals_crc_of_concatenation() {
        let body = vec![7u8; 100_000];
        let k = key().to_bytes();
        let mut whole = k.to_vec();
        whole.extend_from_slice(&body);
        assert_eq!(
            data_crc(&k, crc32fast::hash(&body), body.len()),
            crc32fast::hash(&whole)
        );
        assert_eq!(StreamKey::from_bytes(&k), key());
    }

    #[test]
    fn control_frames_round_trip_and_lengths_are_exact() {
        for c in [
            Control::Error(key(), "boom".into()),
            Control::Credit(key(), 5),
            Control::Ready,
            Control::Grant { phase: 3 },
            Control::EndTurn { more: true },
            Control::EndTurn { more: false },
        ] {
            let (kind, flags, payload) = c.encode();
            assert_eq!(Control::decode(kind, flags, payload).unwrap(), c);
        }
        assert!(matches!(
            Control::decode(FrameKind::Credit, 0, Bytes::from_static(b"short")),
            Err(FrameError::BadLength { .. })
        ));
        assert!(matches!(
            Control::decode(FrameKind::Grant, 0, Bytes::from_static(b"12345")),
            Err(FrameError::BadLength { .. })
        ));
        assert!(matches!(
            Control::decode(FrameKind::Hello, 0, Bytes::new()),
            Err(FrameError::Unexpected(FrameKind::Hello))
        ));
    }
}
