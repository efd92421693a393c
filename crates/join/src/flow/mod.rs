//! Flow-Join (thesis Ch. 4): a distributed hash join that detects heavy hitters while
//! the probe side streams and handles them by selective broadcast instead of sending
//! all their tuples to one node.
//!
//! The pieces, each reusable by an exchange operator:
//! - [`detect`]: per-thread SpaceSaving histograms, the detection schedule (first at ~1%
//!   of the input, then periodically), node-level merge and the coordinator that forms
//!   the global heavy-hitter list;
//! - [`sfr`]: the Symmetric Fragment Replicate grid for keys heavy on both sides;
//! - [`heavy`]: probe tuples of heavy keys kept local until their build tuples arrived;
//! - [`wire`]: the tuple and control message formats;
//! - [`exec`]: the per-node distributed join over the transport (plain partitioned hash
//!   join, Flow-Join with global consensus, Flow-Join with fetch on demand);
//! - [`bench`]: the thesis workload and the per-node benchmark driver [`bench::run_join`];
//! - [`reference`]: a single-node join the tests compare with.
//!
//! R is the build input (exchanged first, completely), S the probe input (streamed).

pub mod bench;
pub mod detect;
pub mod direct_map;
pub mod exec;
pub mod heavy;
pub mod reference;
pub mod result;
pub mod sfr;
#[cfg(test)]
mod tests;
pub mod wire;

use std::fmt;

use gyre_transport::TransportError;

pub use bench::{JoinFigures, JoinSpec, run_join};
pub use detect::DetectionConfig;
pub use exec::{FlowJoinConfig, NodeCounters, flow_join};
pub use result::{JoinOutput, ResultRow};

/// One side's rows on this node: 64-bit keys with optional validity (NULL keys never
/// match) and a 64-bit payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rows {
    pub keys: Vec<u64>,
    /// `Some(v)`: `v[i]` false means row i's key is NULL.
    pub valid: Option<Vec<bool>>,
    pub payloads: Vec<u64>,
}

impl Rows {
    /// Rows without NULL keys.
    pub fn new(keys: Vec<u64>, payloads: Vec<u64>) -> Self {
        Rows {
            keys,
            valid: None,
            payloads,
        }
    }

    /// Rows from optional keys.
    pub fn from_options(keys: &[Option<u64>], payloads: Vec<u64>) -> Self {
        Rows {
            keys: keys.iter().map(|k| k.unwrap_or(0)).collect(),
            valid: Some(keys.iter().map(Option::is_some).collect()),
            payloads,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    #[inline(always)]
    pub fn key(&self, row: usize) -> Option<u64> {
        match &self.valid {
            Some(v) if !v[row] => None,
            _ => Some(self.keys[row]),
        }
    }

    fn check(&self, side: &str) -> Result<(), FlowError> {
        if self.payloads.len() != self.keys.len() {
            return Err(FlowError::Input(format!(
                "{side}: {} keys but {} payloads",
                self.keys.len(),
                self.payloads.len()
            )));
        }
        if let Some(v) = &self.valid
            && v.len() != self.keys.len()
        {
            return Err(FlowError::Input(format!(
                "{side}: {} keys but {} validity flags",
                self.keys.len(),
                v.len()
            )));
        }
        if self.keys.len() >= 1 << ROW_BITS {
            return Err(FlowError::Input(format!(
                "{side}: {} rows on one node exceed the limit of {}",
                self.keys.len(),
                1u64 << ROW_BITS
            )));
        }
        Ok(())
    }
}

/// Tuple ids are `(node position << ROW_BITS) | row`: unique across the cluster, so
/// replicated copies of one tuple can be recognised wherever they were joined.
pub const ROW_BITS: u32 = 40;

/// The join to compute; "left" is the build side R, "right" the probe side S.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinType {
    Inner,
    /// Every R row, with NULLs where it has no partner.
    Left,
    /// Every S row, with NULLs where it has no partner.
    Right,
    Full,
    /// R rows that have a partner (each once).
    LeftSemi,
    /// R rows without a partner.
    LeftAnti,
    /// S rows that have a partner (each once).
    RightSemi,
    /// S rows without a partner.
    RightAnti,
}

impl JoinType {
    pub const ALL: [JoinType; 8] = [
        JoinType::Inner,
        JoinType::Left,
        JoinType::Right,
        JoinType::Full,
        JoinType::LeftSemi,
        JoinType::LeftAnti,
        JoinType::RightSemi,
        JoinType::RightAnti,
    ];

    /// Whether matching pairs are part of the result.
    #[inline]
    pub fn emits_pairs(self) -> bool {
        matches!(
            self,
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
        )
    }

    /// Whether it must know, per R row, if it found a partner anywhere.
    #[inline]
    pub fn tracks_build(self) -> bool {
        matches!(
            self,
            JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti
        )
    }

    /// Whether it must know, per S row, if it found a partner anywhere.
    #[inline]
    pub fn tracks_probe(self) -> bool {
        matches!(
            self,
            JoinType::Right | JoinType::Full | JoinType::RightSemi | JoinType::RightAnti
        )
    }

    /// Tuples carry their id on the wire only when some side is tracked.
    pub fn needs_ids(self) -> bool {
        self.tracks_build() || self.tracks_probe()
    }
}

impl std::str::FromStr for JoinType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(
            match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
                "inner" => JoinType::Inner,
                "left" | "leftouter" => JoinType::Left,
                "right" | "rightouter" => JoinType::Right,
                "full" | "fullouter" => JoinType::Full,
                "leftsemi" | "semi" => JoinType::LeftSemi,
                "leftanti" | "anti" => JoinType::LeftAnti,
                "rightsemi" => JoinType::RightSemi,
                "rightanti" => JoinType::RightAnti,
                other => {
                    return Err(format!(
                        "unknown join type '{other}' (inner, left, right, full, left-semi, left-anti, right-semi, right-anti)"
                    ));
                }
            },
        )
    }
}

impl fmt::Display for JoinType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JoinType::Inner => "inner",
            JoinType::Left => "left",
            JoinType::Right => "right",
            JoinType::Full => "full",
            JoinType::LeftSemi => "left-semi",
            JoinType::LeftAnti => "left-anti",
            JoinType::RightSemi => "right-semi",
            JoinType::RightAnti => "right-anti",
        })
    }
}

/// How tuples are distributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Plain partitioned hash join: every tuple goes to the owner of its key.
    Plain,
    /// Flow-Join with a global heavy-hitter list (selective broadcast, SFR).
    Broadcast,
    /// Flow-Join where each node fetches the build tuples of its own heavy hitters.
    FetchOnDemand,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(
            match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
                "plain" | "hash" | "partitioned" => Strategy::Plain,
                "flow" | "broadcast" | "flowbroadcast" | "flowjoin" => Strategy::Broadcast,
                "fetch" | "fetchondemand" | "flowfetch" => Strategy::FetchOnDemand,
                other => {
                    return Err(format!(
                        "unknown strategy '{other}' (plain, flow, fetch-on-demand)"
                    ));
                }
            },
        )
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Plain => "plain",
            Strategy::Broadcast => "flow",
            Strategy::FetchOnDemand => "fetch-on-demand",
        })
    }
}

/// Why a distributed join failed.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowError {
    Transport(TransportError),
    /// A malformed or unexpected message (names what and from whom).
    Protocol(String),
    /// Bad input rows or configuration.
    Input(String),
    Join(crate::JoinError),
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowError::Transport(e) => write!(f, "{e}"),
            FlowError::Protocol(m) => write!(f, "flow-join protocol error: {m}"),
            FlowError::Input(m) => write!(f, "bad flow-join input: {m}"),
            FlowError::Join(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FlowError {}

impl From<TransportError> for FlowError {
    fn from(e: TransportError) -> Self {
        FlowError::Transport(e)
    }
}

impl From<crate::JoinError> for FlowError {
    fn from(e: crate::JoinError) -> Self {
        FlowError::Join(e)
    }
}

/// Which node owns a key under hash partitioning: a hash independent of the radix
/// kernel's (whose partitions come from the top bits of `hash_key`), so the keys one
/// node owns still spread over all of its radix partitions.
#[inline(always)]
pub fn owner(key: u64, nodes: usize) -> usize {
    let mut h = key ^ (key >> 31);
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 29;
    ((h as u128 * nodes as u128) >> 64) as usize
}

/// A well-mixed 64-bit hash for ids and checksums (splitmix64 finaliser).
#[inline(always)]
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
