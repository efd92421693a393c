//! The single-node join every distributed result is compared with: a `BTreeMap` from
//! key to R rows, no partitioning, no hashing of our own, no replication.

use std::collections::BTreeMap;

use super::result::{JoinOutput, ResultRow};
use super::{JoinType, Rows};

/// Joins the union of all nodes' R parts with the union of all S parts.
pub fn reference_join(r_parts: &[Rows], s_parts: &[Rows], join: JoinType) -> JoinOutput {
    let mut out = JoinOutput::new(true);
    let mut by_key: BTreeMap<u64, Vec<(usize, usize)>> = BTreeMap::new();
    for (p, r) in r_parts.iter().enumerate() {
        for i in 0..r.len() {
            if let Some(k) = r.key(i) {
                by_key.entry(k).or_default().push((p, i));
            }
        }
    }
    let mut r_matched: Vec<Vec<bool>> = r_parts.iter().map(|r| vec![false; r.len()]).collect();
    for s in s_parts {
        for j in 0..s.len() {
            let key = s.key(j);
            let partners = key.and_then(|k| by_key.get(&k));
            let matched = partners.is_some_and(|v| !v.is_empty());
            if let Some(v) = partners {
                for &(p, i) in v {
                    r_matched[p][i] = true;
                    if join.emits_pairs() {
                        out.push(ResultRow {
                            build: Some((key, r_parts[p].payloads[i])),
                            probe: Some((key, s.payloads[j])),
                        });
                    }
                }
            }
            let row = Some((key, s.payloads[j]));
            match join {
                JoinType::Right | JoinType::Full if !matched => out.push(ResultRow {
                    build: None,
                    probe: row,
                }),
                JoinType::RightSemi if matched => out.push(ResultRow {
                    build: None,
                    probe: row,
                }),
                JoinType::RightAnti if !matched => out.push(ResultRow {
                    build: None,
                    probe: row,
                }),
                _ => {}
            }
        }
    }
    for (r, matched) in r_parts.iter().zip(&r_matched) {
        for (i, &matched) in matched.iter().enumerate() {
            let row = Some((r.key(i), r.payloads[i]));
            let emit = match join {
                JoinType::Left | JoinType::Full | JoinType::LeftAnti => !matched,
                JoinType::LeftSemi => matched,
                _ => false,
            };
            if emit {
                out.push(ResultRow {
                    build: row,
                    probe: None,
                });
            }
        }
    }
    out
}
