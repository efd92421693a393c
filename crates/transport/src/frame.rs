//! The wire format: every message between two Gyre nodes is one frame.
//!
//! ```text
//! +--------+---------+------+----------+-------------+-----------+----------------+
//! | magic  | version | kind | reserved | payload len | crc32     | payload ...    |
//! | 4 B    | 1 B     | 1 B  | 2 B      | 4 B (LE)    | 4 B (LE)  | len bytes      |
//! +--------+---------+------+----------+-------------+-----------+----------------+
//! ```
//!
//! The header is validated before any payload byte is trusted: a wrong magic,
//! version, kind, an oversized length or a checksum mismatch is a protocol
//! error that closes the connection (see [`FrameError`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::fmt;

/// `GYRE` in ASCII.
pub const MAGIC: [u8; 4] = *b"GYRE";
/// Bumped whenever the frame layout or a payload layout changes.
pub const VERSION: u8 = 1;
/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 16;
/// Largest payload a peer may send; larger frames are rejected before allocation.
pub const MAX_PAYLOAD: usize = 256 * 1024 * 1024;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Connection handshake: node id and cluster-secret proof.
    Hello = 1,
    /// One message of a data stream (an Arrow IPC message).
    Data = 2,
    /// The sender of a stream has sent everything.
    End = 3,
    /// The sender of a stream failed; payload carries the error text.
    Error = 4,
    /// The receiver grants the sender more messages on a stream.
    Credit = 5,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Data,
            3 => Self::End,
            4 => Self::Error,
            5 => Self::Credit,
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
    BadChecksum { expected: u32, actual: u32 },
    Truncated(&'static str),
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
            Self::Truncated(what) => write!(f, "truncated frame: {what}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub len: usize,
    pub crc: u32,
}

impl FrameHeader {
    /// Parses and validates a header; the payload is checked later with [`FrameHeader::verify`].
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
        Ok(Self { kind, len, crc })
    }

    /// Checks the payload against the header's checksum.
    pub fn verify(&self, payload: &[u8]) -> Result<(), FrameError> {
        let actual = crc32fast::hash(payload);
        if actual != self.crc {
            return Err(FrameError::BadChecksum {
                expected: self.crc,
                actual,
            });
        }
        Ok(())
    }
}

/// Encodes a header for `payload`.
pub fn encode_header(kind: FrameKind, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = kind as u8;
    h[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[12..16].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    h
}

/// Identifies one stream of messages: a (query, exchange, sender slot, receiver slot).
///
/// A sender slot is the producing partition; a receiver slot the consuming one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    pub query: u64,
    pub exchange: u32,
    pub from: u32,
    pub to: u32,
}

impl StreamKey {
    pub const LEN: usize = 20;

    pub fn put(&self, buf: &mut BytesMut) {
        buf.put_u64_le(self.query);
        buf.put_u32_le(self.exchange);
        buf.put_u32_le(self.from);
        buf.put_u32_le(self.to);
    }

    pub fn get(buf: &mut Bytes) -> Result<Self, FrameError> {
        if buf.len() < Self::LEN {
            return Err(FrameError::Truncated("stream key"));
        }
        Ok(Self {
            query: buf.get_u64_le(),
            exchange: buf.get_u32_le(),
            from: buf.get_u32_le(),
            to: buf.get_u32_le(),
        })
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query {} exchange {} ({} -> {})",
            self.query, self.exchange, self.from, self.to
        )
    }
}

/// A decoded frame that belongs to a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamFrame {
    Data(StreamKey, Bytes),
    End(StreamKey),
    Error(StreamKey, String),
    Credit(StreamKey, u32),
}

impl StreamFrame {
    /// Serialises into (kind, payload).
    pub fn encode(&self) -> (FrameKind, Bytes) {
        let mut buf = BytesMut::new();
        match self {
            Self::Data(k, body) => {
                buf.reserve(StreamKey::LEN + body.len());
                k.put(&mut buf);
                buf.put_slice(body);
                (FrameKind::Data, buf.freeze())
            }
            Self::End(k) => {
                k.put(&mut buf);
                (FrameKind::End, buf.freeze())
            }
            Self::Error(k, msg) => {
                k.put(&mut buf);
                buf.put_slice(msg.as_bytes());
                (FrameKind::Error, buf.freeze())
            }
            Self::Credit(k, n) => {
                k.put(&mut buf);
                buf.put_u32_le(*n);
                (FrameKind::Credit, buf.freeze())
            }
        }
    }

    /// Parses a stream frame payload of the given kind.
    pub fn decode(kind: FrameKind, mut payload: Bytes) -> Result<Self, FrameError> {
        let key = StreamKey::get(&mut payload)?;
        Ok(match kind {
            FrameKind::Data => Self::Data(key, payload),
            FrameKind::End => Self::End(key),
            FrameKind::Error => Self::Error(key, String::from_utf8_lossy(&payload).into_owned()),
            FrameKind::Credit => {
                if payload.len() < 4 {
                    return Err(FrameError::Truncated("credit count"));
                }
                Self::Credit(key, payload.get_u32_le())
            }
            FrameKind::Hello => return Err(FrameError::BadKind(kind as u8)),
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
        let h = encode_header(FrameKind::Data, payload);
        let parsed = FrameHeader::decode(&h).unwrap();
        assert_eq!(parsed.kind, FrameKind::Data);
        assert_eq!(parsed.len, payload.len());
        parsed.verify(payload).unwrap();
        assert!(matches!(
            parsed.verify(b"hello worle"),
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
    fn stream_frames_round_trip() {
        for f in [
            StreamFrame::Data(key(), Bytes::from_static(b"abc")),
            StreamFrame::End(key()),
            StreamFrame::Error(key(), "boom".into()),
            StreamFrame::Credit(key(), 5),
        ] {
            let (kind, payload) = f.encode();
            assert_eq!(StreamFrame::decode(kind, payload).unwrap(), f);
        }
        assert!(StreamFrame::decode(FrameKind::End, Bytes::from_static(b"short")).is_err());
    }
}
