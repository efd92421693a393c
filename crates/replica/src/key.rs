//! Primary keys as order-preserving bytes, held inside the row store's tree nodes.
//!
//! A [`Key`] is its values encoded so that comparing the bytes compares the values as
//! [`Value`]'s order does (by type rank, then by value; a shorter key first when it is
//! a prefix of the other). A B-tree node's binary search then compares bytes within
//! the node: with keys as shared slices of values, every comparison followed a pointer
//! to another cache line and matched values one by one, a fifth of a TPC-C
//! transaction's time. Keys of up to [`INLINE`] bytes (TPC-C's primary keys take 4 to
//! 12) are held in the key itself, so making or cloning one allocates nothing.
//!
//! Each value's encoding is prefix-free (its first byte says how long it is, or it
//! ends with a terminator that cannot occur inside it), so a key's values start with a
//! prefix of values exactly when its bytes start with the prefix's bytes, and a
//! prefix scan is a range of bytes: from the prefix to the prefix followed by `0xFF`,
//! a byte no value's encoding starts with.
//!
//! | value | bytes |
//! |---|---|
//! | NULL | `01` |
//! | false, true | `02`, `03` |
//! | integer | `0C` for zero; `0C+n` and the n big-endian bytes of a positive one; `0C-n` and the n bytes of the complement of a negative one's magnitude |
//! | float | `15`, the bits (sign flipped if positive, all flipped if negative: `total_cmp`'s order) |
//! | decimal, date, timestamp | `16`, `17`, `18`, then the big-endian bytes, sign bit flipped |
//! | text | `19`, the bytes with each `00` written `00 FF`, then `00 01` |
//! | integer list | `1A`, each element as `01` and 8 bytes, then `00` |

use crate::value::Value;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Keys up to this many bytes live inside the [`Key`] (48 bytes in all).
pub const INLINE: usize = 46;

const NULL: u8 = 0x01;
const FALSE: u8 = 0x02;
const TRUE: u8 = 0x03;
const INT_ZERO: u8 = 0x0C;
const FLOAT: u8 = 0x15;
const DECIMAL: u8 = 0x16;
const DATE: u8 = 0x17;
const TIMESTAMP: u8 = 0x18;
const TEXT: u8 = 0x19;
const INT_LIST: u8 = 0x1A;
/// Greater than every value's first byte: `prefix ++ [END]` bounds a prefix scan.
const END: u8 = 0xFF;

/// A primary key (or a prefix of one, or a bound of a range) as order-preserving bytes.
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline(u8, [u8; INLINE]),
    Heap(Arc<[u8]>),
}

impl Key {
    /// The key of these values, in order.
    pub fn encode(values: &[Value]) -> Key {
        Writer::of(values).finish()
    }

    /// The key of the values at `columns` of `row`.
    pub fn encode_columns(row: &[Value], columns: &[usize]) -> Key {
        Writer::of(columns.iter().map(|&c| &row[c])).finish()
    }

    /// The least key greater than every key starting with `prefix`'s values: the
    /// exclusive end of a prefix scan.
    pub fn prefix_end(prefix: &[Value]) -> Key {
        let mut w = Writer::of(prefix);
        w.push(END);
        w.finish()
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline(len, bytes) => &bytes[..*len as usize],
            Repr::Heap(bytes) => bytes,
        }
    }

    /// The values it was made of.
    pub fn values(&self) -> Vec<Value> {
        decode(self.as_bytes()).expect("a key holds the encoding of its values")
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::Inline(la, a), Repr::Inline(lb, b)) => la == lb && a == b,
            _ => self.as_bytes() == other.as_bytes(),
        }
    }
}

impl Eq for Key {}

/// As the bytes compare. Two inline keys compare a word at a time: past its length
/// an inline key's bytes are zero, and a byte of the longer key there is at least
/// zero, so the zero-padded arrays order as the bytes do, ties going to the shorter.
/// The B-tree's binary search spends most of a lookup here, and a call to `memcmp`
/// for a dozen bytes cost more than the comparison.
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        match (&self.0, &other.0) {
            (Repr::Inline(la, a), Repr::Inline(lb, b)) => {
                let upto = usize::from(*la.max(lb));
                let mut i = 0;
                while i < upto {
                    let (x, y) = (word(a, i), word(b, i));
                    if x != y {
                        return x.cmp(&y);
                    }
                    i += 8;
                }
                la.cmp(lb)
            }
            _ => self.as_bytes().cmp(other.as_bytes()),
        }
    }
}

/// The 8 bytes of an inline key from `at` as a big-endian word, zero past the end.
#[inline]
fn word(bytes: &[u8; INLINE], at: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(w) => u64::from_be_bytes(w.try_into().expect("8 bytes")),
        None => {
            let mut w = [0; 8];
            w[..INLINE - at].copy_from_slice(&bytes[at..]);
            u64::from_be_bytes(w)
        }
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// As the bytes hash: equal keys hash alike whatever lies past an inline key's end.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match decode(self.as_bytes()) {
            Some(values) => f.debug_list().entries(values).finish(),
            None => write!(f, "Key({:02x?})", self.as_bytes()),
        }
    }
}

/// Builds a key's bytes inline, moving them to the heap when they outgrow [`INLINE`].
struct Writer {
    inline: [u8; INLINE],
    len: usize,
    heap: Option<Vec<u8>>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            inline: [0; INLINE],
            len: 0,
            heap: None,
        }
    }
}

impl Writer {
    /// The encoding of these values, in order, to go on with.
    fn of<'v>(values: impl IntoIterator<Item = &'v Value>) -> Writer {
        let mut w = Writer::default();
        for v in values {
            w.value(v);
        }
        w
    }

    fn extend(&mut self, bytes: &[u8]) {
        if let Some(heap) = &mut self.heap {
            heap.extend_from_slice(bytes);
        } else if self.len + bytes.len() <= INLINE {
            self.inline[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            let mut heap = Vec::with_capacity(2 * INLINE + bytes.len());
            heap.extend_from_slice(&self.inline[..self.len]);
            heap.extend_from_slice(bytes);
            self.heap = Some(heap);
        }
    }

    fn push(&mut self, byte: u8) {
        self.extend(&[byte]);
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.push(NULL),
            Value::Bool(false) => self.push(FALSE),
            Value::Bool(true) => self.push(TRUE),
            Value::Int(i) => self.int(*i),
            Value::Float(f) => {
                let bits = f.to_bits();
                let ordered = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits ^ (1 << 63)
                };
                self.push(FLOAT);
                self.extend(&ordered.to_be_bytes());
            }
            Value::Decimal(d) => {
                self.push(DECIMAL);
                self.extend(&((*d as u128) ^ (1 << 127)).to_be_bytes());
            }
            Value::Date(d) => {
                self.push(DATE);
                self.extend(&((*d as u32) ^ (1 << 31)).to_be_bytes());
            }
            Value::Timestamp(t) => {
                self.push(TIMESTAMP);
                self.extend(&((*t as u64) ^ (1 << 63)).to_be_bytes());
            }
            Value::Text(s) => {
                self.push(TEXT);
                let mut rest = s.as_bytes();
                while let Some(zero) = rest.iter().position(|&b| b == 0) {
                    self.extend(&rest[..zero]);
                    self.extend(&[0x00, 0xFF]);
                    rest = &rest[zero + 1..];
                }
                self.extend(rest);
                self.extend(&[0x00, 0x01]);
            }
            Value::IntList(list) => {
                self.push(INT_LIST);
                for &i in list {
                    self.push(0x01);
                    self.extend(&((i as u64) ^ (1 << 63)).to_be_bytes());
                }
                self.push(0x00);
            }
        }
    }

    /// The fewest bytes that hold the magnitude, behind a tag that orders by sign and
    /// length first.
    fn int(&mut self, i: i64) {
        let magnitude = i.unsigned_abs();
        let n = (8 - magnitude.leading_zeros() / 8) as usize;
        let (tag, bytes) = if i >= 0 {
            (INT_ZERO + n as u8, magnitude.to_be_bytes())
        } else {
            (INT_ZERO - n as u8, (!magnitude).to_be_bytes())
        };
        self.push(tag);
        self.extend(&bytes[8 - n..]);
    }

    fn finish(self) -> Key {
        match self.heap {
            Some(heap) => Key(Repr::Heap(heap.into())),
            None => Key(Repr::Inline(self.len as u8, self.inline)),
        }
    }
}

/// The values of an encoding, or `None` if the bytes are not one.
fn decode(mut bytes: &[u8]) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    while let Some((&tag, rest)) = bytes.split_first() {
        bytes = rest;
        let value = match tag {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            t if (INT_ZERO - 8..=INT_ZERO + 8).contains(&t) => {
                let n = t.abs_diff(INT_ZERO) as usize;
                let mut be = [0u8; 8];
                be[8 - n..].copy_from_slice(take(&mut bytes, n)?);
                let raw = u64::from_be_bytes(be);
                if t >= INT_ZERO {
                    Value::Int(i64::try_from(raw).ok()?)
                } else {
                    // The complement was taken over the n bytes written.
                    let magnitude = !raw & mask(n);
                    Value::Int(0i64.checked_sub_unsigned(magnitude)?)
                }
            }
            FLOAT => {
                let ordered = u64::from_be_bytes(take(&mut bytes, 8)?.try_into().ok()?);
                let bits = if ordered >> 63 == 1 {
                    ordered ^ (1 << 63)
                } else {
                    !ordered
                };
                Value::Float(f64::from_bits(bits))
            }
            DECIMAL => {
                let raw = u128::from_be_bytes(take(&mut bytes, 16)?.try_into().ok()?);
                Value::Decimal((raw ^ (1 << 127)) as i128)
            }
            DATE => {
                let raw = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?);
                Value::Date((raw ^ (1 << 31)) as i32)
            }
            TIMESTAMP => {
                let raw = u64::from_be_bytes(take(&mut bytes, 8)?.try_into().ok()?);
                Value::Timestamp((raw ^ (1 << 63)) as i64)
            }
            TEXT => {
                let mut text = Vec::new();
                loop {
                    let zero = bytes.iter().position(|&b| b == 0)?;
                    text.extend_from_slice(&bytes[..zero]);
                    match bytes.get(zero + 1)? {
                        0xFF => text.push(0),
                        0x01 => {
                            bytes = &bytes[zero + 2..];
                            break;
                        }
                        _ => return None,
                    }
                    bytes = &bytes[zero + 2..];
                }
                Value::Text(String::from_utf8(text).ok()?.into())
            }
            INT_LIST => {
                let mut list = Vec::new();
                loop {
                    match take(&mut bytes, 1)?[0] {
                        0x00 => break,
                        0x01 => {
                            let raw = u64::from_be_bytes(take(&mut bytes, 8)?.try_into().ok()?);
                            list.push((raw ^ (1 << 63)) as i64);
                        }
                        _ => return None,
                    }
                }
                Value::IntList(list)
            }
            _ => return None,
        };
        values.push(value);
    }
    Some(values)
}

/// The low `n` bytes of a `u64` set.
fn mask(n: usize) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    }
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if bytes.len() < n {
        return None;
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Value> {
        let mut v = vec![Value::Null, Value::Bool(false), Value::Bool(true)];
        for i in [
            i64::MIN,
            i64::MIN + 1,
            -(1 << 40),
            -65536,
            -65535,
            -256,
            -255,
            -1,
            0,
            1,
            255,
            256,
            65535,
            1 << 40,
            i64::MAX - 1,
            i64::MAX,
        ] {
            v.push(Value::Int(i));
        }
        for f in [
            f64::NEG_INFINITY,
            -1.5,
            -0.0,
            0.0,
            1e-300,
            2.5,
            f64::INFINITY,
            f64::NAN,
        ] {
            v.push(Value::Float(f));
        }
        for d in [i128::MIN, -5, 0, 7, i128::MAX] {
            v.push(Value::Decimal(d));
        }
        for d in [i32::MIN, -1, 0, 19_000, i32::MAX] {
            v.push(Value::Date(d));
        }
        for t in [i64::MIN, -1, 0, 1_750_000_000_000_000, i64::MAX] {
            v.push(Value::Timestamp(t));
        }
        for s in [
            "", "\0", "\0\0", "\0a", "a", "a\0", "a\0b", "a\x01", "ab", "b", "é",
        ] {
            v.push(Value::Text(s.into()));
        }
        for l in [
            vec![],
            vec![i64::MIN],
            vec![-1, 2],
            vec![0],
            vec![0, 0],
            vec![1],
        ] {
            v.push(Value::IntList(l));
        }
        v
    }

    /// Bytes compare as the values do, one value or several, and decode back.
    #[test]
    fn bytes_order_as_values_do_and_decode_back() {
        let values = samples();
        let mut keys: Vec<Vec<Value>> = values.iter().map(|v| vec![v.clone()]).collect();
        for a in values.iter().step_by(3) {
            for b in values.iter().step_by(2) {
                keys.push(vec![a.clone(), b.clone()]);
                keys.push(vec![a.clone(), b.clone(), Value::Int(3)]);
            }
        }
        keys.push(vec![]);
        keys.push(vec![Value::Text("x".repeat(100).into()), Value::Int(1)]);
        // Inline keys whose last word is partial (43 to 46 bytes of 46).
        for t in [-1, 0, 1, 256] {
            for last in [None, Some(Value::Bool(true)), Some(Value::Int(2))] {
                let mut k = vec![Value::Decimal(1), Value::Decimal(-2), Value::Timestamp(t)];
                k.extend(last.clone());
                assert!(matches!(Key::encode(&k).0, Repr::Inline(43..=46, _)));
                keys.push(k);
            }
        }
        for a in &keys {
            let ka = Key::encode(a);
            let back = ka.values();
            assert_eq!(back.len(), a.len());
            for (x, y) in back.iter().zip(a) {
                // Floats by their bits: NaN and -0.0 come back as they were.
                assert_eq!(x, y, "{a:?} decodes as {back:?}");
            }
            for b in &keys {
                let kb = Key::encode(b);
                assert_eq!(ka.cmp(&kb), a[..].cmp(&b[..]), "{a:?} against {b:?}");
                assert_eq!(ka.cmp(&kb), ka.as_bytes().cmp(kb.as_bytes()));
                assert_eq!(ka == kb, ka.as_bytes() == kb.as_bytes());
                assert_eq!(
                    kb.as_bytes().starts_with(ka.as_bytes()),
                    b.starts_with(a),
                    "{b:?} starts with {a:?}"
                );
            }
        }
    }

    /// Every key starting with a prefix lies in `[prefix, prefix_end)` and no other.
    #[test]
    fn a_prefix_scan_is_a_byte_range() {
        let values = samples();
        for p in values.iter() {
            let lo = Key::encode(std::slice::from_ref(p));
            let hi = Key::prefix_end(std::slice::from_ref(p));
            for a in values.iter() {
                for b in values.iter().step_by(5) {
                    let k = Key::encode(&[a.clone(), b.clone()]);
                    let inside = lo <= k && k < hi;
                    assert_eq!(inside, a == p, "{a:?},{b:?} against prefix {p:?}");
                }
            }
        }
    }

    #[test]
    fn short_keys_are_inline_and_long_ones_are_not() {
        let tpcc = Key::encode(&[
            Value::Int(1),
            Value::Int(10),
            Value::Int(3000),
            Value::Int(15),
        ]);
        assert!(matches!(tpcc.0, Repr::Inline(9, _)));
        assert_eq!(std::mem::size_of::<Key>(), 48);
        let long = Key::encode(&[Value::Text("x".repeat(INLINE).into())]);
        assert!(matches!(long.0, Repr::Heap(_)));
        assert_eq!(long.values(), vec![Value::Text("x".repeat(INLINE).into())]);
    }

    #[test]
    fn bytes_that_are_no_key_decode_to_none() {
        for bad in [
            &[0x00][..],
            &[0xFF],
            &[0x0E, 1],
            &[TEXT, b'a'],
            &[TEXT, 0, 2],
            &[TEXT, 0xC3, 0, 1],
            &[INT_LIST, 2],
            &[FLOAT, 1, 2],
        ] {
            assert_eq!(decode(bad), None, "{bad:02x?}");
        }
    }
}
