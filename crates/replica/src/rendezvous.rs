//! Rendezvous (highest-random-weight) placement of a fragmented table's blocks.
//!
//! ScyPer's outlook (Rödiger's thesis, section 5.3) fragments a relation into blocks,
//! replicates each block `x` times and places the copies by highest-random-weight
//! hashing (Thaler and Ravishankar, "Using name-based mappings to increase hit rates"):
//! every node gets a pseudo-random weight per block, and the `x` nodes of highest
//! weight hold it. A node that joins takes from each block only the place it wins, so
//! it takes about `x / n` of the data and nothing else moves; a node that leaves hands
//! each of its blocks to the next node in that block's ranking.
//!
//! Reads need one copy of each block: the *reader* of a block among a query's nodes is
//! the one of highest weight. Since removing nodes keeps the others' order, the reader
//! among the survivors of up to `x - 1` lost holders is still a holder.

/// Blocks per fragmented table: a row's block is its key's hash modulo this, a number
/// that stays when nodes come and go (only the blocks' holders change).
pub const BLOCKS: u64 = 1024;

/// The most copies a table may ask for.
pub const MAX_REPLICAS: u8 = 16;

/// Node `node`'s weight for `block`: a 64-bit mix of both (SplitMix64's finaliser), so
/// that weights of different nodes for one block are independent.
pub fn weight(block: u64, node: u32) -> u64 {
    let mut z = block
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(node))
        .wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The nodes that hold `block`: the `replicas` of `nodes` of highest weight, best first.
pub fn holders(block: u64, nodes: &[u32], replicas: u8) -> Vec<u32> {
    let mut ranked: Vec<(u64, u32)> = nodes.iter().map(|&n| (weight(block, n), n)).collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked
        .into_iter()
        .take(usize::from(replicas.max(1)))
        .map(|(_, n)| n)
        .collect()
}

/// Whether `node` holds `block` among `nodes`: fewer than `replicas` of them weigh more.
pub fn holds(block: u64, node: u32, nodes: &[u32], replicas: u8) -> bool {
    if !nodes.contains(&node) {
        return false;
    }
    let mine = weight(block, node);
    let above = nodes
        .iter()
        .filter(|&&n| n != node && (weight(block, n), n) > (mine, node))
        .count();
    above < usize::from(replicas.max(1))
}

/// The node of `nodes` that reads `block` for a query: the one of highest weight.
pub fn reader(block: u64, nodes: &[u32]) -> Option<u32> {
    nodes.iter().copied().max_by_key(|&n| (weight(block, n), n))
}

/// For every block, whether `node` holds it among `nodes`.
pub fn held_blocks(node: u32, nodes: &[u32], replicas: u8) -> Vec<bool> {
    (0..BLOCKS)
        .map(|b| holds(b, node, nodes, replicas))
        .collect()
}

/// For every block, whether `node` reads it for a query over `nodes`.
pub fn read_blocks(node: u32, nodes: &[u32]) -> Vec<bool> {
    (0..BLOCKS)
        .map(|b| reader(b, nodes) == Some(node))
        .collect()
}

/// The block of a row whose key hashes to `hash`.
pub fn block_of(hash: u64) -> u64 {
    hash % BLOCKS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_has_its_copies_and_the_load_is_even() {
        let nodes = [1, 2, 3, 4, 5];
        for replicas in 1..=3u8 {
            let mut per_node = [0usize; 6];
            for b in 0..BLOCKS {
                let h = holders(b, &nodes, replicas);
                assert_eq!(h.len(), usize::from(replicas));
                for n in &h {
                    per_node[*n as usize] += 1;
                    assert!(holds(b, *n, &nodes, replicas));
                }
                let others = nodes.iter().filter(|n| !h.contains(n));
                for n in others {
                    assert!(!holds(b, *n, &nodes, replicas));
                }
            }
            // Each node's share within 20% of the mean.
            let mean = (BLOCKS as usize * usize::from(replicas)) / nodes.len();
            for &n in &nodes {
                let got = per_node[n as usize];
                assert!(
                    got.abs_diff(mean) * 5 < mean,
                    "node {n}: {got} of mean {mean}"
                );
            }
        }
    }

    #[test]
    fn a_joining_node_takes_only_its_share_and_nothing_else_moves() {
        let before = [1, 2, 3, 4];
        let after = [1, 2, 3, 4, 5];
        let replicas = 2;
        let mut moved = 0;
        for b in 0..BLOCKS {
            let old = holders(b, &before, replicas);
            let new = holders(b, &after, replicas);
            let gained: Vec<_> = new.iter().filter(|n| !old.contains(n)).collect();
            // Only the newcomer gains a block; an old holder never does.
            assert!(
                gained.iter().all(|&&n| n == 5),
                "block {b}: {old:?} -> {new:?}"
            );
            moved += gained.len();
        }
        // About x/n of the copies move (here 2/5 of 1024 blocks' 2 copies, i.e.
        // 1/5 of 2048 copies), all of them to the newcomer.
        let ideal = (BLOCKS as usize * usize::from(replicas)) / after.len();
        assert!(
            moved.abs_diff(ideal) * 5 < ideal,
            "{moved} copies moved, ideal {ideal}"
        );
    }

    #[test]
    fn the_reader_among_survivors_of_fewer_than_x_losses_holds_the_block() {
        let nodes = [10, 11, 12, 13, 14, 15];
        let replicas = 3;
        for lost_a in nodes {
            for lost_b in nodes {
                let survivors: Vec<u32> = nodes
                    .iter()
                    .copied()
                    .filter(|&n| n != lost_a && n != lost_b)
                    .collect();
                for b in 0..BLOCKS {
                    let r = reader(b, &survivors).unwrap();
                    assert!(holds(b, r, &nodes, replicas));
                }
                // Every block is read by exactly one survivor.
                let mut readers = vec![0u8; BLOCKS as usize];
                for &n in &survivors {
                    for (b, r) in read_blocks(n, &survivors).into_iter().enumerate() {
                        readers[b] += u8::from(r);
                    }
                }
                assert!(readers.iter().all(|&c| c == 1));
            }
        }
    }

    #[test]
    fn nobody_holds_anything_among_nodes_it_is_not_one_of() {
        assert!(!holds(3, 9, &[1, 2], 2));
        assert!(held_blocks(9, &[1, 2], 2).iter().all(|h| !h));
        assert_eq!(reader(0, &[]), None);
    }
}
