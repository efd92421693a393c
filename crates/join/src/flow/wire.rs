//! Message formats of Flow-Join, little-endian.
//!
//! Tuple messages: an 8-byte header (kind, 3 zero bytes, a 32-bit `aux` such as the
//! detection iteration) followed by tuples of `key, payload[, id]` (ids only when the
//! join type tracks matches, see [`super::JoinType::needs_ids`]).
//!
//! Control messages carry detection reports (node -> coordinator) and heavy-hitter
//! announcements (coordinator -> all).

use super::FlowError;

pub const HEADER: usize = 8;

/// A tuple in flight: its key, payload and cluster-wide id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tup {
    pub key: u64,
    pub payload: u64,
    pub id: u64,
}

/// Kinds of tuple messages.
pub mod kind {
    /// R tuple sent to the owner of its key.
    pub const R_PART: u8 = 1;
    /// S tuple sent to the owner of its key: probed once there.
    pub const S_PART: u8 = 2;
    /// S tuple of a key heavy in R, sent to every node (a replicated copy).
    pub const S_BCAST: u8 = 3;
    /// R tuples of keys heavy in S, broadcast by their owner; `aux` = iteration.
    pub const R_BCAST: u8 = 4;
    /// End of one owner's broadcast for iteration `aux`.
    pub const R_BCAST_END: u8 = 5;
    /// Symmetric Fragment Replicate copies.
    pub const SFR_R: u8 = 6;
    pub const SFR_S: u8 = 7;
    /// Fetch on demand: keys requested (payload unused), batch `aux`.
    pub const FETCH_REQ: u8 = 8;
    /// The owner's R tuples for batch `aux`, then the end of that batch.
    pub const FETCH_DATA: u8 = 9;
    pub const FETCH_END: u8 = 10;
    /// Replicated copies reported for outer/semi/anti joins (R copies, S copies);
    /// `aux` = 1 when the copies in the message found a partner, else 0.
    pub const DANGLE_R: u8 = 11;
    pub const DANGLE_S: u8 = 12;
}

/// Bytes per tuple on the wire.
pub fn tuple_width(ids: bool) -> usize {
    if ids { 24 } else { 16 }
}

/// Appends a tuple message to `out`.
pub fn encode(out: &mut Vec<u8>, kind: u8, aux: u32, tuples: &[Tup], ids: bool) {
    out.reserve(HEADER + tuples.len() * tuple_width(ids));
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&aux.to_le_bytes());
    for t in tuples {
        out.extend_from_slice(&t.key.to_le_bytes());
        out.extend_from_slice(&t.payload.to_le_bytes());
        if ids {
            out.extend_from_slice(&t.id.to_le_bytes());
        }
    }
}

#[inline(always)]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Kind and aux of a tuple message.
pub fn header(data: &[u8]) -> Result<(u8, u32), FlowError> {
    if data.len() < HEADER {
        return Err(FlowError::Protocol(format!(
            "tuple message of {} bytes is shorter than its header",
            data.len()
        )));
    }
    Ok((
        data[0],
        u32::from_le_bytes(data[4..8].try_into().expect("4 bytes")),
    ))
}

/// Decodes the tuples of a message into `out` (cleared first).
pub fn decode_into(data: &[u8], ids: bool, out: &mut Vec<Tup>) -> Result<(), FlowError> {
    out.clear();
    let w = tuple_width(ids);
    let body = &data[HEADER.min(data.len())..];
    if data.len() < HEADER || !body.len().is_multiple_of(w) {
        return Err(FlowError::Protocol(format!(
            "tuple message of {} bytes is not a header plus {w}-byte tuples",
            data.len()
        )));
    }
    out.reserve(body.len() / w);
    for c in body.chunks_exact(w) {
        out.push(Tup {
            key: u64_at(c, 0),
            payload: u64_at(c, 8),
            id: if ids { u64_at(c, 16) } else { 0 },
        });
    }
    Ok(())
}

/// Which input a detection message is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Build,
    Probe,
}

/// Control messages of the global consensus.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// A node's candidates for one detection iteration: `window` tuples were counted
    /// in it; the node's input has `total` tuples; `(key, guaranteed count)` pairs.
    Report {
        side: Side,
        iteration: u32,
        window: u64,
        total: u64,
        candidates: Vec<(u64, u64)>,
    },
    /// The node has routed all its build tuples.
    BuildDone,
    /// New global heavy hitters of one iteration, with estimated global frequencies.
    Announce {
        side: Side,
        iteration: u32,
        keys: Vec<(u64, u64)>,
    },
    /// The build side's heavy-hitter list is final (every node routed its R).
    BuildFinal,
}

impl Control {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let side = |s: &Side| match s {
            Side::Build => 0u8,
            Side::Probe => 1u8,
        };
        let pairs = |out: &mut Vec<u8>, v: &[(u64, u64)]| {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            for (a, b) in v {
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
            }
        };
        match self {
            Control::Report {
                side: s,
                iteration,
                window,
                total,
                candidates,
            } => {
                out.extend_from_slice(&[1, side(s)]);
                out.extend_from_slice(&iteration.to_le_bytes());
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&total.to_le_bytes());
                pairs(&mut out, candidates);
            }
            Control::BuildDone => out.extend_from_slice(&[2, 0]),
            Control::Announce {
                side: s,
                iteration,
                keys,
            } => {
                out.extend_from_slice(&[3, side(s)]);
                out.extend_from_slice(&iteration.to_le_bytes());
                pairs(&mut out, keys);
            }
            Control::BuildFinal => out.extend_from_slice(&[4, 0]),
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Control, FlowError> {
        let bad = || FlowError::Protocol(format!("malformed control message of {} bytes", b.len()));
        let need = |n: usize| if b.len() < n { Err(bad()) } else { Ok(()) };
        need(2)?;
        let side = match b[1] {
            0 => Side::Build,
            1 => Side::Probe,
            _ => return Err(bad()),
        };
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let pairs = |at: usize| -> Result<Vec<(u64, u64)>, FlowError> {
            need(at + 4)?;
            let n = u32_at(at) as usize;
            if b.len() != at + 4 + 16 * n {
                return Err(bad());
            }
            Ok((0..n)
                .map(|i| (u64_at(b, at + 4 + 16 * i), u64_at(b, at + 12 + 16 * i)))
                .collect())
        };
        match b[0] {
            1 => {
                need(22)?;
                Ok(Control::Report {
                    side,
                    iteration: u32_at(2),
                    window: u64_at(b, 6),
                    total: u64_at(b, 14),
                    candidates: pairs(22)?,
                })
            }
            2 if b.len() == 2 => Ok(Control::BuildDone),
            3 => {
                need(6)?;
                Ok(Control::Announce {
                    side,
                    iteration: u32_at(2),
                    keys: pairs(6)?,
                })
            }
            4 if b.len() == 2 => Ok(Control::BuildFinal),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_round_trip_with_and_without_ids() {
        let t = vec![
            Tup {
                key: 1,
                payload: u64::MAX,
                id: 7,
            },
            Tup {
                key: u64::MAX,
                payload: 0,
                id: 9,
            },
        ];
        for ids in [false, true] {
            let mut b = Vec::new();
            encode(&mut b, kind::S_PART, 42, &t, ids);
            assert_eq!(header(&b).unwrap(), (kind::S_PART, 42));
            let mut out = Vec::new();
            decode_into(&b, ids, &mut out).unwrap();
            assert_eq!(out.len(), 2);
            assert_eq!(out[1].key, u64::MAX);
            assert_eq!(out[0].id, if ids { 7 } else { 0 });
            b.push(0);
            assert!(decode_into(&b, ids, &mut out).is_err());
        }
    }

    #[test]
    fn control_round_trips_and_rejects_garbage() {
        let msgs = [
            Control::Report {
                side: Side::Probe,
                iteration: 3,
                window: 100,
                total: 1000,
                candidates: vec![(5, 50), (6, 20)],
            },
            Control::BuildDone,
            Control::Announce {
                side: Side::Build,
                iteration: 0,
                keys: vec![(9, 99)],
            },
            Control::BuildFinal,
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Control::decode(&b).unwrap(), m);
            assert!(Control::decode(&b[..b.len() - 1]).is_err());
        }
        assert!(Control::decode(&[9, 0]).is_err());
    }
}
