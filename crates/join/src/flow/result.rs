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
    /// depend on which node produced which row or in which order. Each side's key and
    /// payload enter through their own odd multipliers (a NULL key and an absent side
    /// through constants of their own), then one finaliser mixes the row: every result
    /// row pays for it, and seven finalisers (as before) took a tenth of a skewed
    /// join's CPU in `gyre bench join`.
    #[inline]
    pub fn hash(&self) -> u64 {
        #[inline(always)]
        fn part(p: Option<(Option<u64>, u64)>, key_m: u64, payload_m: u64, absent: u64) -> u64 {
            match p {
                None => absent,
                Some((k, v)) => k
                    .map_or(0xDEAD_BEEF_0BAD_F00D, |k| k.wrapping_mul(key_m))
                    .wrapping_add(v.wrapping_mul(payload_m)),
            }
        }
        let build = part(
            self.build,
            0x9E37_79B9_7F4A_7C15,
            0xC2B2_AE3D_27D4_EB4F,
            0x1656_67B1_9E37_79F9,
        );
        let probe = part(
            self.probe,
            0xD6E8_FEB8_6659_FD93,
            0xFF51_AFD7_ED55_8CCD,
            0x27D4_EB2F_1656_67C5,
        );
        mix64(build ^ probe.rotate_left(29))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(b: Option<(Option<u64>, u64)>, p: Option<(Option<u64>, u64)>) -> ResultRow {
        ResultRow { build: b, probe: p }
    }

    /// Rows a wrong join would produce instead of the right ones hash differently:
    /// sides or payloads swapped, a NULL key, a missing side, a different key.
    #[test]
    fn the_hash_tells_apart_what_a_wrong_join_would_mix_up() {
        let base = row(Some((Some(7), 1)), Some((Some(7), 2)));
        let others = [
            row(Some((Some(7), 2)), Some((Some(7), 1))),
            row(Some((Some(1), 7)), Some((Some(7), 2))),
            row(Some((None, 1)), Some((Some(7), 2))),
            row(None, Some((Some(7), 2))),
            row(Some((Some(7), 1)), None),
            row(Some((Some(8), 1)), Some((Some(8), 2))),
            row(Some((Some(7), 1)), Some((None, 2))),
        ];
        for o in others {
            assert_ne!(o.hash(), base.hash(), "{o:?}");
        }
        let mut hashes: Vec<u64> = others.iter().map(ResultRow::hash).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), others.len());
        // The checksum does not depend on the order of the rows.
        let mut a = JoinOutput::new(false);
        let mut b = JoinOutput::new(false);
        others.iter().for_each(|r| a.push(*r));
        others.iter().rev().for_each(|r| b.push(*r));
        assert_eq!(a, b);
    }
}
