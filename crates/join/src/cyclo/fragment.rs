//! The unit that travels the Data Roundabout: a fragment of the rotating relation, laid
//! out as raw little-endian `u64` arrays so a node joins it straight from its ring buffer
//! without decoding.
//!
//! ```text
//! word 0   MAGIC (format and version)
//! word 1   origin ring position (low 32 bits) | flags (high 32 bits: LAST, SIGNED)
//! word 2   sequence number of the fragment at its origin (0, 1, ...)
//! word 3   rows
//! word 4   form (bits 0-7) | partition bits (8-15) | payload columns (16-31)
//!          | of which byte columns, the last ones (32-47)
//! word 5   total words (header included)
//! word 6   heap bytes
//! word 7   reserved (0)
//! then     keys[rows], payload column 0 [rows], payload column 1 [rows], ...
//! then     partitioned form only: 2^bits + 1 partition bounds (u32, padded to a word)
//! then     the heap: the values of the byte columns, padded to a word
//! ```
//!
//! Byte columns carry variable-length values (strings, binaries): their payload word is
//! the value's offset in the fragment's heap (low 32 bits) and its length (high 32
//! bits), so rows keep their place however the fragment is ordered and a node reads a
//! value in place like every other column.
//!
//! The form says how the origin prepared the rows (setup done once, where it pays, paper
//! Sec. IV-D): grouped by the radix hash join's partition bits, sorted by key, or as is.
//! NULL keys never travel: they match nothing in an inner join, so the origin drops them.

#[cfg(target_endian = "big")]
compile_error!("the cyclo-join fragment format is little-endian raw memory");

use crate::KeyDomain;

use super::error::{CycloError, Result};

/// Format tag and version ("GYRCYC" + version 1).
pub const MAGIC: u64 = 0x4759_5243_5943_0001;
/// Words before the keys.
pub const HEADER_WORDS: usize = 8;
/// Bytes before the keys.
pub const HEADER_BYTES: usize = HEADER_WORDS * 8;

const FLAG_LAST: u32 = 1;
const FLAG_SIGNED: u32 = 2;

/// How the rows of a fragment are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentForm {
    /// In the origin's row order.
    Raw,
    /// Grouped by the top `bits` bits of the radix join's key hash (partition order).
    HashPartitioned { bits: u32 },
    /// Ascending by key (in the key domain's order).
    Sorted,
}

impl FragmentForm {
    fn encode(self) -> u64 {
        match self {
            FragmentForm::Raw => 0,
            FragmentForm::HashPartitioned { bits } => 1 | (u64::from(bits) << 8),
            FragmentForm::Sorted => 2,
        }
    }

    fn decode(word: u64) -> Option<Self> {
        match word & 0xff {
            0 => Some(FragmentForm::Raw),
            1 => Some(FragmentForm::HashPartitioned {
                bits: ((word >> 8) & 0xff) as u32,
            }),
            2 => Some(FragmentForm::Sorted),
            _ => None,
        }
    }
}

/// Words of the partition bounds a fragment of `form` carries.
fn bounds_words(form: FragmentForm) -> usize {
    match form {
        FragmentForm::HashPartitioned { bits } => ((1usize << bits) + 1).div_ceil(2),
        _ => 0,
    }
}

/// Total words of a fragment of `rows` rows with `payload_columns` payload columns.
pub fn fragment_words(rows: usize, payload_columns: usize, form: FragmentForm) -> usize {
    HEADER_WORDS + rows * (1 + payload_columns) + bounds_words(form)
}

/// Words of a buffer of `buffer_bytes` left for rows and heap in a fragment of `form`.
pub fn body_words(buffer_bytes: usize, form: FragmentForm) -> usize {
    (buffer_bytes / 8).saturating_sub(HEADER_WORDS + bounds_words(form))
}

/// A variable-length payload column (strings, binaries) in Arrow's layout: row `r` is
/// `values[offsets[r]..offsets[r + 1]]`.
#[derive(Debug, Clone, Copy)]
pub struct ByteColumn<'a> {
    pub offsets: &'a [i64],
    pub values: &'a [u8],
}

impl ByteColumn<'_> {
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of row `r`'s value.
    pub fn value_len(&self, r: usize) -> usize {
        (self.offsets[r + 1] - self.offsets[r]) as usize
    }

    pub fn value(&self, r: usize) -> &[u8] {
        &self.values[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
}

/// Encodes a fragment (origin, sequence and LAST are stamped later by the roundabout):
/// the rows `order[i]` of `keys` and `payload`, in that order; `bounds` (partitioned form
/// only, `2^bits + 1` entries) delimit the partitions in that order.
pub fn encode(
    form: FragmentForm,
    domain: KeyDomain,
    keys: &[u64],
    payload: &[&[u64]],
    order: &[u32],
    bounds: &[u32],
) -> Vec<u64> {
    encode_with_bytes(form, domain, keys, payload, &[], order, bounds)
}

/// [`encode`] with byte columns after the payload columns, their values in the heap.
/// The heap must stay below 4 GiB (a fragment fits a ring buffer).
pub fn encode_with_bytes(
    form: FragmentForm,
    domain: KeyDomain,
    keys: &[u64],
    payload: &[&[u64]],
    bytes: &[ByteColumn<'_>],
    order: &[u32],
    bounds: &[u32],
) -> Vec<u64> {
    let rows = order.len();
    let want_bounds = match form {
        FragmentForm::HashPartitioned { bits } => (1usize << bits) + 1,
        _ => 0,
    };
    assert_eq!(
        bounds.len(),
        want_bounds,
        "partition bounds of a {form:?} fragment"
    );
    let heap: usize = bytes
        .iter()
        .map(|b| {
            order
                .iter()
                .map(|&r| b.value_len(r as usize))
                .sum::<usize>()
        })
        .sum();
    assert!(heap <= u32::MAX as usize, "a fragment heap of {heap} bytes");
    let columns = payload.len() + bytes.len();
    let words = fragment_words(rows, columns, form) + heap.div_ceil(8);
    let mut out = Vec::with_capacity(words);
    let flags = if domain == KeyDomain::Signed {
        FLAG_SIGNED
    } else {
        0
    };
    out.extend_from_slice(&[
        MAGIC,
        u64::from(flags) << 32,
        0,
        rows as u64,
        form.encode() | ((columns as u64) << 16) | ((bytes.len() as u64) << 32),
        words as u64,
        heap as u64,
        0,
    ]);
    out.extend(order.iter().map(|&r| keys[r as usize]));
    for col in payload {
        out.extend(order.iter().map(|&r| col[r as usize]));
    }
    let mut at = 0u64;
    for col in bytes {
        out.extend(order.iter().map(|&r| {
            let len = col.value_len(r as usize) as u64;
            let word = at | (len << 32);
            at += len;
            word
        }));
    }
    out.extend(
        bounds
            .chunks(2)
            .map(|p| u64::from(p[0]) | (u64::from(*p.get(1).unwrap_or(&0)) << 32)),
    );
    let heap_start = out.len();
    out.resize(words, 0);
    let dst = as_bytes_mut(&mut out[heap_start..]);
    let mut at = 0;
    for col in bytes {
        for &r in order {
            let v = col.value(r as usize);
            dst[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        }
    }
    out
}

/// Sets origin, sequence number and the LAST flag of an encoded fragment.
pub(crate) fn stamp(words: &mut [u64], origin: u32, seq: u64, last: bool) {
    let flags = (words[1] >> 32) as u32 & !FLAG_LAST;
    let flags = flags | if last { FLAG_LAST } else { 0 };
    words[1] = (u64::from(flags) << 32) | u64::from(origin);
    words[2] = seq;
}

/// Total words announced by a header, after checking the magic.
pub(crate) fn announced_words(header: &[u64]) -> Result<usize> {
    if header.len() < HEADER_WORDS || header[0] != MAGIC {
        return Err(CycloError::Protocol(
            "a fragment does not start with the cyclo-join header".into(),
        ));
    }
    Ok(header[5] as usize)
}

/// A fragment read in place from a ring buffer.
#[derive(Debug, Clone, Copy)]
pub struct FragmentView<'a> {
    words: &'a [u64],
    rows: usize,
    columns: usize,
    byte_columns: usize,
    heap_bytes: usize,
}

impl<'a> FragmentView<'a> {
    /// Checks the header against the words present.
    pub fn parse(words: &'a [u64]) -> Result<Self> {
        let total = announced_words(words)?;
        let rows = words[3] as usize;
        let columns = ((words[4] >> 16) & 0xffff) as usize;
        let byte_columns = ((words[4] >> 32) & 0xffff) as usize;
        let heap_bytes = words[6] as usize;
        let Some(form) = FragmentForm::decode(words[4]).filter(|f| match f {
            FragmentForm::HashPartitioned { bits } => *bits <= 16,
            _ => true,
        }) else {
            return Err(CycloError::Protocol(format!(
                "unknown fragment form {:#x}",
                words[4] & 0xffff
            )));
        };
        let want = rows
            .checked_mul(1 + columns)
            .and_then(|b| b.checked_add(HEADER_WORDS + bounds_words(form)))
            .and_then(|b| b.checked_add(heap_bytes.div_ceil(8)));
        if byte_columns > columns || want != Some(total) || total != words.len() {
            return Err(CycloError::Protocol(format!(
                "fragment announces {rows} rows with {columns} payload columns \
                 ({byte_columns} of bytes) and {heap_bytes} heap bytes in {total} words \
                 but holds {} words",
                words.len()
            )));
        }
        let view = FragmentView {
            words,
            rows,
            columns,
            byte_columns,
            heap_bytes,
        };
        for c in 0..byte_columns {
            let outside = view
                .payload(columns - byte_columns + c)
                .iter()
                .any(|&w| (w & 0xffff_ffff) + (w >> 32) > heap_bytes as u64);
            if outside {
                return Err(CycloError::Protocol(format!(
                    "byte column {c} of a fragment points outside its heap of {heap_bytes} bytes"
                )));
            }
        }
        if let Some(b) = view.partition_bounds()
            && (b[0] != 0 || b[b.len() - 1] as usize != rows || b.windows(2).any(|w| w[0] > w[1]))
        {
            return Err(CycloError::Protocol(
                "fragment partition bounds are not a partitioning of its rows".into(),
            ));
        }
        Ok(view)
    }

    /// Partition `k` of a hash-partitioned fragment is rows `b[k]..b[k + 1]`.
    pub fn partition_bounds(&self) -> Option<&'a [u32]> {
        let FragmentForm::HashPartitioned { bits } = self.form() else {
            return None;
        };
        let start = HEADER_WORDS + self.rows * (1 + self.columns);
        let words = &self.words[start..];
        // SAFETY: u32 needs less alignment than u64 and every bit pattern is valid; the
        // words hold the bounds in little-endian u32 pairs (see `encode`).
        let all =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u32>(), words.len() * 2) };
        Some(&all[..(1usize << bits) + 1])
    }

    /// Ring position of the node the fragment comes from.
    pub fn origin(&self) -> u32 {
        self.words[1] as u32
    }

    /// Position of the fragment in its origin's sequence.
    pub fn seq(&self) -> u64 {
        self.words[2]
    }

    /// Whether this is the origin's last fragment.
    pub fn is_last(&self) -> bool {
        (self.words[1] >> 32) as u32 & FLAG_LAST != 0
    }

    pub fn domain(&self) -> KeyDomain {
        if (self.words[1] >> 32) as u32 & FLAG_SIGNED != 0 {
            KeyDomain::Signed
        } else {
            KeyDomain::Unsigned
        }
    }

    pub fn form(&self) -> FragmentForm {
        FragmentForm::decode(self.words[4]).expect("checked by parse")
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Key bit patterns (interpret with [`FragmentView::domain`]).
    pub fn keys(&self) -> &'a [u64] {
        &self.words[HEADER_WORDS..HEADER_WORDS + self.rows]
    }

    pub fn payload_columns(&self) -> usize {
        self.columns
    }

    /// Payload column `c`, row-aligned with [`FragmentView::keys`].
    pub fn payload(&self, c: usize) -> &'a [u64] {
        assert!(c < self.columns, "payload column {c} of {}", self.columns);
        let start = HEADER_WORDS + self.rows * (1 + c);
        &self.words[start..start + self.rows]
    }

    /// Byte columns: the last ones of the payload columns.
    pub fn byte_columns(&self) -> usize {
        self.byte_columns
    }

    /// The fragment's heap, where the byte columns' values are.
    pub fn heap(&self) -> &'a [u8] {
        let start = self.words.len() - self.heap_bytes.div_ceil(8);
        &as_bytes(&self.words[start..])[..self.heap_bytes]
    }

    /// Row `row`'s value of byte column `c` (`0..byte_columns()`).
    pub fn byte_value(&self, c: usize, row: usize) -> &'a [u8] {
        assert!(
            c < self.byte_columns,
            "byte column {c} of {}",
            self.byte_columns
        );
        let w = self.payload(self.columns - self.byte_columns + c)[row];
        let at = (w & 0xffff_ffff) as usize;
        &self.heap()[at..at + (w >> 32) as usize]
    }

    /// Size of the fragment in bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

/// The bytes of a word slice (little-endian memory, see the module doc).
pub(crate) fn as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment requirement and every byte of a u64 is initialised,
    // so the same memory is a valid [u8] of eight times the length.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
}

/// The bytes of a word slice, writable.
pub(crate) fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every byte pattern is a valid u64, so writes through the
    // byte view cannot create invalid values, and the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_round_trip_through_their_words() {
        let keys = [10u64, (-3i64) as u64, 7];
        let p0 = [100u64, 101, 102];
        let p1 = [200u64, 201, 202];
        let mut w = encode(
            FragmentForm::HashPartitioned { bits: 5 },
            KeyDomain::Signed,
            &keys,
            &[&p0, &p1],
            &[2, 0],
            &[0; 33],
        );
        stamp(&mut w, 3, 17, true);
        // All-zero bounds do not partition 2 rows: read the words without `parse`.
        let v = FragmentView {
            words: &w,
            rows: 2,
            columns: 2,
            byte_columns: 0,
            heap_bytes: 0,
        };
        assert_eq!(
            (v.origin(), v.seq(), v.is_last(), v.rows()),
            (3, 17, true, 2)
        );
        assert_eq!(v.domain(), KeyDomain::Signed);
        assert_eq!(v.keys(), &[7, 10]);
        assert_eq!(v.payload(0), &[102, 100]);
        assert_eq!(v.payload(1), &[202, 200]);
        assert!(
            FragmentView::parse(&w).is_err(),
            "bounds end at 0, not at 2 rows"
        );
        let mut bounds = vec![2u32; 33];
        bounds[0] = 0;
        let mut w = encode(
            FragmentForm::HashPartitioned { bits: 5 },
            KeyDomain::Signed,
            &keys,
            &[&p0, &p1],
            &[2, 0],
            &bounds,
        );
        stamp(&mut w, 1, 2, false);
        let v = FragmentView::parse(&w).unwrap();
        assert!(!v.is_last() && v.domain() == KeyDomain::Signed && v.origin() == 1);
        assert_eq!(v.partition_bounds().unwrap(), &bounds[..]);
        let form = FragmentForm::HashPartitioned { bits: 5 };
        assert_eq!(
            body_words(fragment_words(2, 2, form) * 8, form),
            2 * (1 + 2)
        );
    }

    #[test]
    fn malformed_fragments_are_refused_by_name() {
        let w = encode(
            FragmentForm::Sorted,
            KeyDomain::Unsigned,
            &[1],
            &[],
            &[0],
            &[],
        );
        assert!(FragmentView::parse(&w[..w.len() - 1]).is_err());
        let mut bad = w.clone();
        bad[0] = 1;
        let e = FragmentView::parse(&bad).unwrap_err();
        assert!(e.to_string().contains("header"), "{e}");
        let mut bad = w.clone();
        bad[4] = 9;
        assert!(FragmentView::parse(&bad).is_err());
        let empty = encode(FragmentForm::Raw, KeyDomain::Unsigned, &[], &[], &[], &[]);
        assert!(FragmentView::parse(&empty).unwrap().is_empty());
    }

    #[test]
    fn byte_columns_travel_in_the_heap_whatever_the_order() {
        let values = b"alphabetagammaX";
        let offsets = [0i64, 5, 9, 9, 15];
        let names = ByteColumn {
            offsets: &offsets,
            values,
        };
        let other = ByteColumn {
            offsets: &[0, 1, 2, 3, 4],
            values: b"wxyz",
        };
        let keys = [4u64, 3, 2, 1];
        let ids = [40u64, 30, 20, 10];
        let order = [3u32, 1, 2, 0];
        let mut w = encode_with_bytes(
            FragmentForm::Sorted,
            KeyDomain::Unsigned,
            &keys,
            &[&ids],
            &[names, other],
            &order,
            &[],
        );
        stamp(&mut w, 0, 0, true);
        let v = FragmentView::parse(&w).unwrap();
        assert_eq!((v.payload_columns(), v.byte_columns()), (3, 2));
        assert_eq!(v.heap().len(), 19);
        assert_eq!(v.payload(0), &[10, 30, 20, 40]);
        let got: Vec<(&[u8], &[u8])> = (0..4)
            .map(|r| (v.byte_value(0, r), v.byte_value(1, r)))
            .collect();
        let want: Vec<(&[u8], &[u8])> = vec![
            (b"gammaX", b"z"),
            (b"beta", b"x"),
            (b"", b"y"),
            (b"alpha", b"w"),
        ];
        assert_eq!(got, want);
        // A pointer past the heap (a corrupt frame) is refused, naming the column.
        let mut bad = w.clone();
        bad[HEADER_WORDS + 4 * 2 + 1] = 17 | (5 << 32);
        let e = FragmentView::parse(&bad).unwrap_err();
        assert!(e.to_string().contains("outside its heap"), "{e}");
        let mut bad = w.clone();
        bad[6] += 8;
        assert!(
            FragmentView::parse(&bad).is_err(),
            "heap size beyond the words"
        );
    }
}
