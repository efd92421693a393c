//! The local side of cyclo-join (paper Sec. IV-C, IV-D): which kernel joins a passing
//! fragment with the node's stationary part, and the setup work done once for both.
//!
//! - **Hash** (equi-join): the stationary part becomes a [`RadixHashTable`] (partitioned
//!   so a partition plus its directory fits in half the L2 cache). Each rotating fragment
//!   is grouped by the same partition bits once, at its origin, so on every node its
//!   probes walk the build partitions one after another while each is cache resident.
//! - **Sort-merge** (equality, band, inequalities): the stationary part is sorted once
//!   ([`SortedKeys`]); each fragment is sorted once at its origin and travels sorted, so
//!   every node only merges ([`merge_join_run`]).
//! - **Nested loops** (any predicate): the stationary keys are compacted once into
//!   numeric values; every fragment is compared with all of them in cache-sized blocks.
//!
//! With `prepare_rotating` off, fragments travel in row order and each node partitions
//! or sorts them again on every pass (what the paper's setup-cost discussion weighs).
//! Pairs are always `(fragment row, stationary row)`, whichever input rotates.

use std::sync::Arc;

use crate::keys::Keys;
use crate::nested_loops::nested_loops_join_values;
use crate::pairs::JoinPairs;
use crate::radix::{RadixConfig, RadixHashTable, RadixLayout, hash_key};
use crate::sort_merge::{MergePredicate, SortedKeys, merge_join, merge_join_run};
use crate::{JoinError, KeyDomain};

use super::error::{CycloError, Result};
use super::fragment::{self, ByteColumn, FragmentForm, FragmentView};
use super::join::Relation;

/// One of the two join inputs, as the user wrote the join (`left ⋈ right`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Left,
    Right,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Left => "left",
            Side::Right => "right",
        })
    }
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }
}

/// A predicate for the nested-loops join on numeric key values `(left, right)`.
#[derive(Clone)]
pub enum ThetaPredicate {
    /// Any predicate the sort-merge join knows, evaluated pair by pair.
    Merge(MergePredicate),
    /// `(left - right) mod modulus = remainder` (Euclidean remainder; modulus > 0).
    DiffMod { modulus: i64, remainder: i64 },
    /// Anything else; `name` identifies it (ring members compare names, not closures).
    Custom {
        name: String,
        pred: Arc<dyn Fn(i128, i128) -> bool + Send + Sync>,
    },
}

impl std::fmt::Debug for ThetaPredicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThetaPredicate::Merge(p) => write!(f, "Merge({p:?})"),
            ThetaPredicate::DiffMod { modulus, remainder } => {
                write!(
                    f,
                    "DiffMod {{ modulus: {modulus}, remainder: {remainder} }}"
                )
            }
            ThetaPredicate::Custom { name, .. } => write!(f, "Custom({name})"),
        }
    }
}

impl ThetaPredicate {
    /// Whether `(left, right)` satisfies the predicate.
    #[inline]
    pub fn holds(&self, left: i128, right: i128) -> bool {
        match self {
            ThetaPredicate::Merge(p) => p.holds(left, right),
            ThetaPredicate::DiffMod { modulus, remainder } => {
                let d = left - right;
                // A 64-bit remainder is one instruction, a 128-bit one a library call.
                match i64::try_from(d) {
                    Ok(d) => d.rem_euclid(*modulus) == *remainder,
                    Err(_) => d.rem_euclid(i128::from(*modulus)) == i128::from(*remainder),
                }
            }
            ThetaPredicate::Custom { pred, .. } => pred(left, right),
        }
    }
}

/// The local join algorithm and its predicate on `(left key, right key)`.
#[derive(Debug, Clone)]
pub enum CycloAlgorithm {
    /// Radix-partitioned hash equi-join.
    Hash,
    /// Sort-merge join with equality, band or inequality predicates.
    SortMerge(MergePredicate),
    /// Blocked nested loops for any predicate.
    NestedLoops(ThetaPredicate),
    /// Every pair of rows (with non-NULL keys) is a candidate and no kernel runs: each
    /// fragment goes whole to the sink ([`super::ResultSink::consume_cross`]), which
    /// applies its own condition to whole blocks of pairs. For conditions no kernel
    /// understands, evaluating them one row against a block of the other side is far
    /// cheaper than listing every pair as indices first.
    CrossProduct,
}

impl CycloAlgorithm {
    /// Whether `(left, right)` key values join (for references and checks).
    pub fn holds(&self, left: i128, right: i128) -> bool {
        match self {
            CycloAlgorithm::Hash => left == right,
            CycloAlgorithm::SortMerge(p) => p.holds(left, right),
            CycloAlgorithm::NestedLoops(t) => t.holds(left, right),
            CycloAlgorithm::CrossProduct => true,
        }
    }

    /// A short name with the predicate, e.g. `sort-merge Band { c1: 5, c2: 5 }`.
    pub fn describe(&self) -> String {
        match self {
            CycloAlgorithm::Hash => "hash".into(),
            CycloAlgorithm::SortMerge(p) => format!("sort-merge {p:?}"),
            CycloAlgorithm::NestedLoops(t) => format!("nested-loops {t:?}"),
            CycloAlgorithm::CrossProduct => "cross product".into(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if let CycloAlgorithm::NestedLoops(ThetaPredicate::DiffMod { modulus, .. }) = self
            && *modulus <= 0
        {
            return Err(CycloError::Spec(format!(
                "the modulus of a DiffMod predicate must be positive, got {modulus}"
            )));
        }
        Ok(())
    }
}

/// The predicate seen from the other side: `l p r` holds iff `r flip(p) l` holds.
pub fn flip(p: MergePredicate) -> MergePredicate {
    match p {
        MergePredicate::Eq => MergePredicate::Eq,
        MergePredicate::Band { c1, c2 } => MergePredicate::Band { c1: c2, c2: c1 },
        MergePredicate::Lt => MergePredicate::Gt,
        MergePredicate::Le => MergePredicate::Ge,
        MergePredicate::Gt => MergePredicate::Lt,
        MergePredicate::Ge => MergePredicate::Le,
    }
}

/// Key bit patterns of a domain as kernel keys (no NULLs: fragments carry none).
pub(crate) fn keys_of(bits: &[u64], domain: KeyDomain) -> Keys<'_> {
    match domain {
        KeyDomain::Unsigned => Keys::unsigned(bits),
        KeyDomain::Signed => {
            // SAFETY: i64 and u64 have the same size and alignment and every bit pattern
            // is valid for both.
            let s = unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<i64>(), bits.len()) };
            Keys::signed(s)
        }
    }
}

#[derive(Debug)]
enum Prepared {
    Hash(RadixHashTable),
    Sorted(SortedKeys),
    /// Non-NULL keys as numbers, with their rows.
    Values {
        values: Vec<i128>,
        rows: Vec<u32>,
    },
    /// The rows with non-NULL keys (cross product).
    Rows(Vec<u32>),
}

/// A node's stationary part after its setup phase, ready to join any fragment.
#[derive(Debug)]
pub struct Stationary {
    prepared: Prepared,
    domain: KeyDomain,
    rows: usize,
}

impl Stationary {
    /// Setup phase: builds the hash table (with the ring's agreed `layout`), sorts, or
    /// compacts the keys, as `algorithm` needs.
    pub fn prepare(
        keys: &Keys,
        algorithm: &CycloAlgorithm,
        layout: Option<RadixLayout>,
        threads: usize,
    ) -> Result<Self> {
        let prepared = match algorithm {
            CycloAlgorithm::Hash => {
                let layout = match layout {
                    Some(l) => l,
                    None => RadixLayout::plan(keys.valid_count(), &RadixConfig::default())?,
                };
                Prepared::Hash(RadixHashTable::build_with_layout(keys, layout, threads)?)
            }
            CycloAlgorithm::SortMerge(_) => Prepared::Sorted(SortedKeys::sort(keys, threads)?),
            CycloAlgorithm::NestedLoops(_) => {
                let (mut values, mut rows) = (
                    Vec::with_capacity(keys.valid_count()),
                    Vec::with_capacity(keys.valid_count()),
                );
                let d = keys.domain();
                keys.for_each_valid(0..keys.len(), |row, bits| {
                    values.push(d.value(bits));
                    rows.push(row as u32);
                });
                Prepared::Values { values, rows }
            }
            CycloAlgorithm::CrossProduct => {
                let mut rows = Vec::with_capacity(keys.valid_count());
                keys.for_each_valid(0..keys.len(), |row, _| rows.push(row as u32));
                Prepared::Rows(rows)
            }
        };
        Ok(Stationary {
            prepared,
            domain: keys.domain(),
            rows: keys.len(),
        })
    }

    /// Rows of the stationary input, NULLs included.
    pub fn input_rows(&self) -> usize {
        self.rows
    }

    /// The rows a cross product pairs with every fragment row (those with non-NULL
    /// keys, ascending); `None` if prepared for another algorithm.
    pub fn cross_rows(&self) -> Option<&[u32]> {
        match &self.prepared {
            Prepared::Rows(rows) => Some(rows),
            _ => None,
        }
    }

    /// Join phase for one fragment: `(fragment row, stationary row)` pairs. `rotating`
    /// says which input of the user's join the fragment belongs to (it orients
    /// asymmetric predicates).
    pub fn join(
        &self,
        fragment: &FragmentView<'_>,
        rotating: Side,
        algorithm: &CycloAlgorithm,
        threads: usize,
    ) -> Result<JoinPairs> {
        if fragment.domain() != self.domain {
            return Err(JoinError::DomainMismatch {
                left: fragment.domain(),
                right: self.domain,
            }
            .into());
        }
        let keys = fragment.keys();
        let domain = fragment.domain();
        let pairs = match (&self.prepared, algorithm) {
            (Prepared::Hash(table), CycloAlgorithm::Hash) => {
                let probe = keys_of(keys, domain);
                let mut pairs = match fragment.form() {
                    FragmentForm::Raw => table.probe(
                        &probe,
                        &RadixConfig {
                            threads,
                            ..RadixConfig::default()
                        },
                    )?,
                    // Grouped by partition at its origin: join partition by partition.
                    FragmentForm::HashPartitioned { bits }
                        if bits == table.layout().partition_bits() =>
                    {
                        let bounds = fragment.partition_bounds().expect("partitioned form");
                        table.probe_grouped(&probe, bounds, threads)?
                    }
                    // Partitioned for another layout (a node with another cache size).
                    _ => table.probe_direct(&probe, threads),
                };
                std::mem::swap(&mut pairs.left, &mut pairs.right);
                pairs
            }
            (Prepared::Sorted(sorted), CycloAlgorithm::SortMerge(p)) => {
                let p = match rotating {
                    Side::Left => *p,
                    Side::Right => flip(*p),
                };
                match fragment.form() {
                    FragmentForm::Sorted => merge_join_run(keys, domain, sorted, p, threads)?,
                    _ => {
                        let run = SortedKeys::sort(&keys_of(keys, domain), threads)?;
                        merge_join(&run, sorted, p, threads)?
                    }
                }
            }
            (Prepared::Values { values, rows }, CycloAlgorithm::NestedLoops(theta)) => {
                let mine: Vec<i128> = keys.iter().map(|&b| domain.value(b)).collect();
                let mut pairs = match rotating {
                    Side::Left => {
                        nested_loops_join_values(&mine, values, threads, |a, b| theta.holds(*a, *b))
                    }
                    Side::Right => {
                        nested_loops_join_values(&mine, values, threads, |a, b| theta.holds(*b, *a))
                    }
                };
                for r in &mut pairs.right {
                    *r = rows[*r as usize];
                }
                pairs
            }
            (Prepared::Rows(rows), CycloAlgorithm::CrossProduct) => {
                JoinPairs::cross(0..keys.len() as u32, rows)
            }
            _ => {
                return Err(CycloError::Spec(format!(
                    "the stationary side was prepared for another algorithm than {}",
                    algorithm.describe()
                )));
            }
        };
        Ok(pairs)
    }
}

/// Partition of a key under `bits` partition bits: the top bits of the radix join's hash.
#[inline]
fn partition_of(key: u64, bits: u32) -> usize {
    if bits == 0 {
        0
    } else {
        (hash_key(key) >> (64 - bits)) as usize
    }
}

/// Rows `rows` ordered by partition (stable counting sort), with the partition bounds.
fn partition_order(keys: &[u64], rows: &[u32], bits: u32) -> (Vec<u32>, Vec<u32>) {
    let fanout = 1usize << bits;
    let mut counts = vec![0u32; fanout + 1];
    for &r in rows {
        counts[partition_of(keys[r as usize], bits) + 1] += 1;
    }
    for p in 0..fanout {
        counts[p + 1] += counts[p];
    }
    let bounds = counts.clone();
    let mut out = vec![0u32; rows.len()];
    for &r in rows {
        let p = partition_of(keys[r as usize], bits);
        out[counts[p] as usize] = r;
        counts[p] += 1;
    }
    (out, bounds)
}

/// The form fragments of `algorithm` travel in.
pub fn fragment_form(
    algorithm: &CycloAlgorithm,
    layout: Option<&RadixLayout>,
    prepare: bool,
) -> FragmentForm {
    match (algorithm, prepare) {
        (CycloAlgorithm::Hash, true) => FragmentForm::HashPartitioned {
            bits: layout.map_or(0, RadixLayout::partition_bits),
        },
        (CycloAlgorithm::SortMerge(_), true) => FragmentForm::Sorted,
        _ => FragmentForm::Raw,
    }
}

/// How big a fragment may be: at most `rows` rows (0 = no limit) in at most
/// `buffer_bytes` (a ring buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentLimits {
    pub rows: usize,
    pub buffer_bytes: usize,
}

/// Cuts the rows `valid` into fragments within `limits`: rows of `row_words` words each
/// plus their byte columns' values in the heap.
fn cut_fragments<'v>(
    valid: &'v [u32],
    row_words: usize,
    bytes: &[ByteColumn<'_>],
    form: FragmentForm,
    limits: FragmentLimits,
) -> Result<Vec<&'v [u32]>> {
    let capacity = fragment::body_words(limits.buffer_bytes, form);
    let max_rows = if limits.rows == 0 {
        usize::MAX
    } else {
        limits.rows
    };
    let too_big = |heap: usize| {
        CycloError::Spec(format!(
            "a rotating row of {} bytes does not fit ring buffers of {} bytes",
            row_words * 8 + heap,
            limits.buffer_bytes
        ))
    };
    if bytes.is_empty() {
        let rows = (capacity / row_words).min(max_rows);
        if rows == 0 {
            return Err(too_big(0));
        }
        return Ok(valid.chunks(rows).collect());
    }
    let fits = |rows: usize, heap: usize| {
        rows <= max_rows && rows * row_words + heap.div_ceil(8) <= capacity
    };
    let mut out = Vec::new();
    let (mut start, mut heap) = (0, 0usize);
    for (i, &r) in valid.iter().enumerate() {
        let len: usize = bytes.iter().map(|b| b.value_len(r as usize)).sum();
        if !fits(i - start + 1, heap + len) {
            if !fits(1, len) {
                return Err(too_big(len));
            }
            out.push(&valid[start..i]);
            (start, heap) = (i, 0);
        }
        heap += len;
    }
    out.push(&valid[start..]);
    Ok(out)
}

/// Setup of the rotating part at its origin: drops NULL keys, cuts the rows into
/// fragments within `limits`, orders each as the algorithm's join phase wants it (when
/// `prepare`), and encodes it with the relation's payload and byte columns. Fragments
/// are prepared in parallel on `threads` threads.
pub fn prepare_rotating(
    rel: &Relation<'_>,
    algorithm: &CycloAlgorithm,
    layout: Option<&RadixLayout>,
    limits: FragmentLimits,
    prepare: bool,
    threads: usize,
) -> Result<Vec<Vec<u64>>> {
    let keys = &rel.keys;
    let payload = &rel.payload;
    if let Some(c) = payload.iter().position(|c| c.len() != keys.len()) {
        return Err(CycloError::Spec(format!(
            "payload column {c} has {} rows, the keys {}",
            payload[c].len(),
            keys.len()
        )));
    }
    if let Some(c) = rel.bytes.iter().position(|c| c.len() != keys.len()) {
        return Err(CycloError::Spec(format!(
            "byte column {c} has {} rows, the keys {}",
            rel.bytes[c].len(),
            keys.len()
        )));
    }
    let mut valid = Vec::with_capacity(keys.valid_count());
    keys.for_each_valid(0..keys.len(), |row, _| valid.push(row as u32));
    let form = fragment_form(algorithm, layout, prepare);
    let row_words = 1 + payload.len() + rel.bytes.len();
    let mut chunks = cut_fragments(&valid, row_words, &rel.bytes, form, limits)?;
    if chunks.is_empty() {
        // An origin without rows still sends one (empty) fragment: it marks its end.
        chunks.push(&[]);
    }
    let domain = keys.domain();
    let bits = layout.map_or(0, RadixLayout::partition_bits);
    let values = keys.values();
    let one = |rows: &[u32]| -> Result<Vec<u64>> {
        let (form, order, bounds) = match (algorithm, prepare) {
            (CycloAlgorithm::Hash, true) => {
                let (order, bounds) = partition_order(values, rows, bits);
                (FragmentForm::HashPartitioned { bits }, order, bounds)
            }
            (CycloAlgorithm::SortMerge(_), true) => {
                let chunk: Vec<u64> = rows.iter().map(|&r| values[r as usize]).collect();
                let sorted = SortedKeys::sort(&keys_of(&chunk, domain), 1)?;
                (
                    FragmentForm::Sorted,
                    sorted.rows().map(|i| rows[i as usize]).collect(),
                    vec![],
                )
            }
            _ => (FragmentForm::Raw, rows.to_vec(), vec![]),
        };
        Ok(fragment::encode_with_bytes(
            form, domain, values, payload, &rel.bytes, &order, &bounds,
        ))
    };
    let threads = crate::cache::resolve_threads(threads)
        .min(chunks.len())
        .max(1);
    if threads == 1 {
        return chunks.into_iter().map(one).collect();
    }
    let per_thread = chunks.len().div_ceil(threads);
    let parts: Vec<Result<Vec<Vec<u64>>>> = std::thread::scope(|s| {
        let hs: Vec<_> = chunks
            .chunks(per_thread)
            .map(|group| {
                let one = &one;
                s.spawn(move || group.iter().map(|rows| one(rows)).collect())
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("fragment preparation panicked"))
            .collect()
    });
    let mut out = Vec::with_capacity(chunks.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::naive_join;

    #[test]
    fn flipped_predicates_hold_on_swapped_arguments() {
        let ps = [
            MergePredicate::Eq,
            MergePredicate::Band { c1: 3, c2: -1 },
            MergePredicate::Lt,
            MergePredicate::Le,
            MergePredicate::Gt,
            MergePredicate::Ge,
        ];
        for p in ps {
            for l in -6i128..6 {
                for r in -6i128..6 {
                    assert_eq!(p.holds(l, r), flip(p).holds(r, l), "{p:?} {l} {r}");
                }
            }
        }
    }

    #[test]
    fn diff_mod_is_exact_beyond_64_bits() {
        let t = ThetaPredicate::DiffMod {
            modulus: 7,
            remainder: 3,
        };
        for (l, r) in [
            (u64::MAX as i128, -5i128),
            (-(u64::MAX as i128), 9),
            (12, 2),
            (-4, 0),
            (i64::MIN as i128, 1),
        ] {
            assert_eq!(t.holds(l, r), (l - r).rem_euclid(7) == 3, "{l} {r}");
        }
    }

    /// Every algorithm, both orientations, prepared or not: one node's join of its
    /// fragments equals the reference.
    #[test]
    fn fragments_join_like_the_reference_in_every_form() {
        let s_keys: Vec<i64> = (0..3000).map(|i| (i * 37) % 401 - 200).collect();
        let r_keys: Vec<i64> = (0..2500).map(|i| (i * 53) % 433 - 210).collect();
        let r_nulls: Vec<bool> = (0..2500).map(|i| i % 7 != 3).collect();
        let s = Keys::signed(&s_keys);
        let r = Keys::signed(&r_keys)
            .with_nulls(Some(r_nulls.clone().into()))
            .unwrap();
        let payload: Vec<u64> = (0..2500u64).map(|i| i * 10).collect();
        let algos = [
            CycloAlgorithm::Hash,
            CycloAlgorithm::SortMerge(MergePredicate::Eq),
            CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 2, c2: 1 }),
            CycloAlgorithm::SortMerge(MergePredicate::Lt),
            CycloAlgorithm::NestedLoops(ThetaPredicate::DiffMod {
                modulus: 9,
                remainder: 4,
            }),
        ];
        let rv: Vec<Option<i128>> = r_keys
            .iter()
            .zip(&r_nulls)
            .map(|(&k, &v)| v.then_some(k as i128))
            .collect();
        let sv: Vec<Option<i128>> = s_keys.iter().map(|&k| Some(k as i128)).collect();
        for algo in &algos {
            let layout = RadixLayout::new(vec![3], 4).unwrap();
            let st = Stationary::prepare(&s, algo, Some(layout.clone()), 2).unwrap();
            for rotating in [Side::Left, Side::Right] {
                let want = match rotating {
                    Side::Left => naive_join(&rv, &sv, |a, b| algo.holds(a, b)),
                    Side::Right => naive_join(&rv, &sv, |a, b| algo.holds(b, a)),
                };
                for prepare in [true, false] {
                    let rel = Relation {
                        keys: r.clone(),
                        payload: vec![&payload],
                        bytes: vec![],
                    };
                    let limits = FragmentLimits {
                        rows: 700,
                        buffer_bytes: 1 << 20,
                    };
                    let frags =
                        prepare_rotating(&rel, algo, Some(&layout), limits, prepare, 2).unwrap();
                    assert_eq!(frags.len(), (2500usize - 357).div_ceil(700));
                    let mut got = vec![];
                    for words in &frags {
                        let v = FragmentView::parse(words).unwrap();
                        let pairs = st.join(&v, rotating, algo, 2).unwrap();
                        for (fr, sr) in pairs.left.iter().zip(&pairs.right) {
                            got.push(((v.payload(0)[*fr as usize] / 10) as u32, *sr));
                        }
                    }
                    got.sort_unstable();
                    assert_eq!(got, want, "{algo:?} {rotating:?} prepare {prepare}");
                }
            }
        }
    }

    /// With byte columns, fragments are cut by size: every fragment fits its buffer,
    /// every row travels once, and a row bigger than a buffer is refused by name.
    #[test]
    fn byte_columns_cut_fragments_by_size() {
        let n = 1000usize;
        let keys: Vec<i64> = (0..n as i64).collect();
        let k = Keys::signed(&keys);
        let mut offsets = vec![0i64];
        let mut values = Vec::new();
        for i in 0..n {
            values.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, i % 97));
            offsets.push(values.len() as i64);
        }
        let ids: Vec<u64> = (0..n as u64).collect();
        let rel = Relation {
            keys: k,
            payload: vec![&ids],
            bytes: vec![ByteColumn {
                offsets: &offsets,
                values: &values,
            }],
        };
        let limits = FragmentLimits {
            rows: 0,
            buffer_bytes: 4096,
        };
        for algo in [
            CycloAlgorithm::SortMerge(MergePredicate::Lt),
            CycloAlgorithm::NestedLoops(ThetaPredicate::DiffMod {
                modulus: 2,
                remainder: 0,
            }),
        ] {
            let frags = prepare_rotating(&rel, &algo, None, limits, true, 2).unwrap();
            assert!(frags.len() > 10, "{} fragments", frags.len());
            let mut seen = vec![false; n];
            for words in &frags {
                assert!(words.len() * 8 <= 4096);
                let v = FragmentView::parse(words).unwrap();
                for r in 0..v.rows() {
                    let id = v.payload(0)[r] as usize;
                    assert!(!seen[id]);
                    seen[id] = true;
                    let want = &values[offsets[id] as usize..offsets[id + 1] as usize];
                    assert_eq!(v.byte_value(0, r), want);
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
        let tight = FragmentLimits {
            rows: 0,
            buffer_bytes: 8 * (fragment::HEADER_WORDS + 3) + 40,
        };
        let e = prepare_rotating(&rel, &CycloAlgorithm::Hash, None, tight, false, 1).unwrap_err();
        assert!(e.to_string().contains("does not fit ring buffers"), "{e}");
    }
}
