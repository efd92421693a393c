//! Join results as counts plus an order-independent checksum (so results joined on
//! different nodes can be compared with a single-node reference), optionally the rows.

use super::mix64;

/// One result row: the R part and the S part, each `(key, payload)`, `None` where the
/// join type puts NULLs (outer joins) or omits the side (semi and anti joins). A NULL
/// key is `None` inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResultRow {
    pub build: Option<(Option<u64>, u64)>,
    pub probe: Option<(Option<u64>, u64)>,
}

impl ResultRow {
    /// Hash of the row; the checksum is the wrapping sum over rows, so it does not
    /// depend on which node produced which row or in which order.
    pub fn hash(&self) -> u64 {
        fn part(tag: u64, p: Option<(Option<u64>, u64)>) -> u64 {
            match p {
                None => mix64(tag),
                Some((k, v)) => mix64(
                    mix64(tag ^ 0x51)
                        ^ mix64(k.map_or(0xDEAD_BEEF, |k| k.wrapping_add(1)))
                            .wrapping_add(mix64(v ^ 0x7777)),
                ),
            }
        }
        mix64(part(1, self.build).wrapping_mul(3) ^ part(2, self.probe))
    }
}

/// Result of (a node's part of) a join.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinOutput {
    pub rows: u64,
    pub checksum: u64,
    /// The rows themselves, when collection was asked for.
    pub collected: Option<Vec<ResultRow>>,
}

impl JoinOutput {
    pub fn new(collect: bool) -> Self {
        JoinOutput {
            rows: 0,
            checksum: 0,
            collected: collect.then(Vec::new),
        }
    }

    #[inline]
    pub fn push(&mut self, row: ResultRow) {
        self.rows += 1;
        self.checksum = self.checksum.wrapping_add(row.hash());
        if let Some(c) = &mut self.collected {
            c.push(row);
        }
    }

    #[inline]
    pub fn pair(&mut self, key: u64, build_payload: u64, probe_payload: u64) {
        self.push(ResultRow {
            build: Some((Some(key), build_payload)),
            probe: Some((Some(key), probe_payload)),
        });
    }

    /// Adds another part (another task's or node's).
    pub fn absorb(&mut self, other: JoinOutput) {
        self.rows += other.rows;
        self.checksum = self.checksum.wrapping_add(other.checksum);
        if let (Some(a), Some(b)) = (&mut self.collected, other.collected) {
            a.extend(b);
        }
    }
}
