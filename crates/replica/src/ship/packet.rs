//! The datagrams of a log stream, their encoding and their checks.

use super::ShipError;

const MAGIC: [u8; 4] = *b"GYRL";
/// The largest datagram: fits an Ethernet frame (1500 bytes) with IP and UDP headers.
pub const MAX_PACKET_BYTES: usize = 1472;
/// Magic, kind and stream id.
const HEAD: usize = 4 + 1 + 8;
const DATA_HEAD: usize = HEAD + 8 + 4 + 4;
/// The most fragments a message may have (a 256 MiB log group in 1400-byte packets).
pub(crate) const MAX_FRAGS: u32 = 1 << 18;
/// The most ranges one NAK names.
pub(crate) const MAX_NAK_RANGES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// Fragment `frag` of `frags` of a message; `repair` marks a retransmission.
    Data {
        stream: u64,
        seq: u64,
        frag: u32,
        frags: u32,
        repair: bool,
        payload: Vec<u8>,
    },
    /// The publisher's lead (next sequence number it will send) and trail (oldest it
    /// can still repair).
    Heartbeat { stream: u64, next: u64, trail: u64 },
    /// Missing sequence numbers, as inclusive ranges.
    Nak {
        stream: u64,
        ranges: Vec<(u64, u64)>,
    },
    /// What a NAK asked for before `trail` is gone.
    Lost { stream: u64, trail: u64 },
}

impl Packet {
    pub fn stream(&self) -> u64 {
        match self {
            Packet::Data { stream, .. }
            | Packet::Heartbeat { stream, .. }
            | Packet::Nak { stream, .. }
            | Packet::Lost { stream, .. } => *stream,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAX_PACKET_BYTES);
        b.extend_from_slice(&MAGIC);
        let kind = match self {
            Packet::Data { repair: false, .. } => 1,
            Packet::Data { repair: true, .. } => 2,
            Packet::Heartbeat { .. } => 3,
            Packet::Nak { .. } => 4,
            Packet::Lost { .. } => 5,
        };
        b.push(kind);
        b.extend_from_slice(&self.stream().to_le_bytes());
        match self {
            Packet::Data {
                seq,
                frag,
                frags,
                payload,
                ..
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&frag.to_le_bytes());
                b.extend_from_slice(&frags.to_le_bytes());
                b.extend_from_slice(payload);
            }
            Packet::Heartbeat { next, trail, .. } => {
                b.extend_from_slice(&next.to_le_bytes());
                b.extend_from_slice(&trail.to_le_bytes());
            }
            Packet::Nak { ranges, .. } => {
                b.extend_from_slice(&(ranges.len() as u16).to_le_bytes());
                for (from, to) in ranges {
                    b.extend_from_slice(&from.to_le_bytes());
                    b.extend_from_slice(&to.to_le_bytes());
                }
            }
            Packet::Lost { trail, .. } => b.extend_from_slice(&trail.to_le_bytes()),
        }
        b
    }

    /// A datagram's packet, or why it is not one.
    pub fn decode(b: &[u8]) -> Result<Packet, ShipError> {
        let bad = |m: &str| Err(ShipError::Protocol(m.to_string()));
        if b.len() < HEAD || b[..4] != MAGIC {
            return bad("not a log packet");
        }
        if b.len() > MAX_PACKET_BYTES {
            return bad("packet larger than a log packet can be");
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let stream = u64_at(5);
        match b[4] {
            kind @ (1 | 2) => {
                if b.len() < DATA_HEAD {
                    return bad("short data packet");
                }
                let (seq, frag, frags) = (u64_at(HEAD), u32_at(HEAD + 8), u32_at(HEAD + 12));
                if frags == 0 || frags > MAX_FRAGS || frag >= frags {
                    return bad("fragment number out of range");
                }
                if frag < frags - 1 && b.len() == DATA_HEAD {
                    return bad("empty fragment inside a message");
                }
                Ok(Packet::Data {
                    stream,
                    seq,
                    frag,
                    frags,
                    repair: kind == 2,
                    payload: b[DATA_HEAD..].to_vec(),
                })
            }
            3 if b.len() == HEAD + 16 => Ok(Packet::Heartbeat {
                stream,
                next: u64_at(HEAD),
                trail: u64_at(HEAD + 8),
            }),
            4 if b.len() >= HEAD + 2 => {
                let n = u16::from_le_bytes([b[HEAD], b[HEAD + 1]]) as usize;
                if n > MAX_NAK_RANGES || b.len() != HEAD + 2 + 16 * n {
                    return bad("NAK of a wrong size");
                }
                let ranges: Vec<(u64, u64)> = (0..n)
                    .map(|i| (u64_at(HEAD + 2 + 16 * i), u64_at(HEAD + 10 + 16 * i)))
                    .collect();
                if ranges.iter().any(|(f, t)| f > t) {
                    return bad("NAK range backwards");
                }
                Ok(Packet::Nak { stream, ranges })
            }
            5 if b.len() == HEAD + 8 => Ok(Packet::Lost {
                stream,
                trail: u64_at(HEAD),
            }),
            _ => bad("unknown packet kind or size"),
        }
    }
}

/// How much of a message one data packet carries.
pub(crate) const PAYLOAD_BYTES: usize = MAX_PACKET_BYTES - DATA_HEAD;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip() {
        for p in [
            Packet::Data {
                stream: 9,
                seq: 77,
                frag: 1,
                frags: 3,
                repair: true,
                payload: vec![1, 2, 3],
            },
            Packet::Heartbeat {
                stream: 9,
                next: 10,
                trail: 2,
            },
            Packet::Nak {
                stream: 9,
                ranges: vec![(1, 4), (8, 8)],
            },
            Packet::Lost {
                stream: 9,
                trail: 5,
            },
        ] {
            assert_eq!(Packet::decode(&p.encode()).unwrap(), p);
        }
    }

    #[test]
    fn hostile_datagrams_are_refused() {
        let good = Packet::Data {
            stream: 1,
            seq: 0,
            frag: 0,
            frags: 2,
            repair: false,
            payload: vec![0; 10],
        }
        .encode();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(Packet::decode(&b).is_err());
        let mut b = good.clone();
        b[HEAD + 8..HEAD + 12].copy_from_slice(&5u32.to_le_bytes());
        assert!(Packet::decode(&b).is_err(), "fragment past the count");
        let mut b = good.clone();
        b[HEAD + 12..HEAD + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Packet::decode(&b).is_err(), "absurd fragment count");
        assert!(Packet::decode(&good[..HEAD + 3]).is_err());
        let mut nak = Packet::Nak {
            stream: 1,
            ranges: vec![(3, 4)],
        }
        .encode();
        nak[HEAD] = 200;
        assert!(
            Packet::decode(&nak).is_err(),
            "range count past the datagram"
        );
        assert!(Packet::decode(&[]).is_err());
        for n in 0..good.len() {
            let _ = Packet::decode(&good[..n]);
        }
    }
}
