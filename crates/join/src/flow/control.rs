//! The control messages of Flow-Join's heavy-hitter detection, little-endian:
//! detection reports (every node to the detecting node), heavy-hitter announcements
//! (the detecting node to all) and, in fetch on demand, requests for the build rows of
//! the keys a node found heavy on its own (that node to every owner).

use std::fmt;

/// Which input a detection message is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Build,
    Probe,
}

/// A control message of heavy-hitter detection.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// A node's candidates for one detection iteration: `window` rows were counted
    /// in it; the node's input has `total` rows; `(hash, guaranteed count)` pairs.
    Report {
        side: Side,
        iteration: u32,
        window: u64,
        total: u64,
        candidates: Vec<(u64, u64)>,
    },
    /// New global heavy hitters of one iteration, with estimated global frequencies.
    Announce {
        side: Side,
        iteration: u32,
        keys: Vec<(u64, u64)>,
    },
    /// Fetch on demand (thesis 4.2.4): the heavy hitters one node found on its own in
    /// one iteration, with its estimates; every owner answers with its build rows of
    /// these keys, to that node only. Sent in every iteration, also without keys, so
    /// that the owners know when an iteration's requests are complete.
    Fetch {
        side: Side,
        iteration: u32,
        keys: Vec<(u64, u64)>,
    },
}

/// A control message that does not decode: its length in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed(pub usize);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed control message of {} bytes", self.0)
    }
}

impl std::error::Error for Malformed {}

const REPORT: u8 = 1;
const ANNOUNCE: u8 = 3;
const FETCH: u8 = 4;

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
                out.extend_from_slice(&[REPORT, side(s)]);
                out.extend_from_slice(&iteration.to_le_bytes());
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&total.to_le_bytes());
                pairs(&mut out, candidates);
            }
            Control::Announce {
                side: s,
                iteration,
                keys,
            }
            | Control::Fetch {
                side: s,
                iteration,
                keys,
            } => {
                let tag = match self {
                    Control::Announce { .. } => ANNOUNCE,
                    _ => FETCH,
                };
                out.extend_from_slice(&[tag, side(s)]);
                out.extend_from_slice(&iteration.to_le_bytes());
                pairs(&mut out, keys);
            }
        }
        out
    }

    /// Decodes a message from another node, checking every length first.
    pub fn decode(b: &[u8]) -> Result<Control, Malformed> {
        let bad = || Malformed(b.len());
        let need = |n: usize| if b.len() < n { Err(bad()) } else { Ok(()) };
        need(2)?;
        let side = match b[1] {
            0 => Side::Build,
            1 => Side::Probe,
            _ => return Err(bad()),
        };
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let pairs = |at: usize| -> Result<Vec<(u64, u64)>, Malformed> {
            need(at + 4)?;
            let n = u32_at(at) as usize;
            if b.len() != at + 4 + 16 * n {
                return Err(bad());
            }
            Ok((0..n)
                .map(|i| (u64_at(at + 4 + 16 * i), u64_at(at + 12 + 16 * i)))
                .collect())
        };
        match b[0] {
            REPORT => {
                need(22)?;
                Ok(Control::Report {
                    side,
                    iteration: u32_at(2),
                    window: u64_at(6),
                    total: u64_at(14),
                    candidates: pairs(22)?,
                })
            }
            ANNOUNCE => {
                need(6)?;
                Ok(Control::Announce {
                    side,
                    iteration: u32_at(2),
                    keys: pairs(6)?,
                })
            }
            FETCH => {
                need(6)?;
                Ok(Control::Fetch {
                    side,
                    iteration: u32_at(2),
                    keys: pairs(6)?,
                })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Control::Announce {
                side: Side::Build,
                iteration: 0,
                keys: vec![(9, 99)],
            },
            Control::Fetch {
                side: Side::Probe,
                iteration: 2,
                keys: vec![(7, 70), (8, 80)],
            },
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Control::decode(&b).unwrap(), m);
            assert!(Control::decode(&b[..b.len() - 1]).is_err());
        }
        assert!(Control::decode(&[9, 0]).is_err());
        assert!(Control::decode(&[REPORT, 2]).is_err());
        // A count that claims more pairs than the message holds.
        let mut b = Control::Announce {
            side: Side::Probe,
            iteration: 1,
            keys: vec![],
        }
        .encode();
        b[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Control::decode(&b), Err(Malformed(b.len())));
    }
}
