//! Log segments: the file format, and reading it back without trusting it.
//!
//! A segment is a header (`GYREREDO`, format version) followed by group frames:
//!
//! ```text
//! magic u32 | compressed u32 | raw u32 | first_lsn u64 | count u32 | crc32 u32 | LZ4 block
//! ```
//!
//! The CRC covers the five fields before it and the block. `compressed` with its top
//! bit set ([`STORED`]) says the block is the raw bytes as they are: LZ4 would not
//! have made them smaller (a few short logical entries). The block holds `count`
//! entries, each a u32 length and its postcard encoding, with LSNs `first_lsn`,
//! `first_lsn + 1`, ... Every field is checked before anything is allocated from it.
//!
//! A group is written with one `write` and made durable with one fsync before the next
//! starts, and a segment is complete before the next is created; so only the end of the
//! last segment can hold a torn group (a crash during its write). Recovery cuts that off.
//! A bad frame anywhere else is corruption and recovery stops with an error naming the
//! file and offset, rather than lose acknowledged transactions silently.

use super::Entry;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Version 2: table definitions carry their placement.
pub const HEADER: &[u8; 16] = b"GYREREDO\x02\0\0\0\0\0\0\0";
const FRAME_MAGIC: u32 = 0x4759_4752;
/// The bit of a frame's `compressed` size that marks a block stored without LZ4 (sizes
/// are at most [`MAX_GROUP_BYTES`], far below it).
pub const STORED: u32 = 1 << 31;
pub const FRAME_HEADER: usize = 28;
/// The largest group, uncompressed (and so the largest transaction's entry): larger
/// groups are split by the writer.
pub const MAX_GROUP_BYTES: usize = 256 << 20;

/// A segment's file name: its first LSN, zero-padded so that names sort by LSN.
pub fn file_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}.redo")
}

/// The first LSN a segment file name stands for, if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".redo")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The segments of a log directory, by first LSN.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "list", e))?;
        if let Some(lsn) = entry.file_name().to_str().and_then(parse_name) {
            segments.push((lsn, entry.path()));
        }
    }
    segments.sort();
    Ok(segments)
}

/// Encodes one entry into a group's raw bytes.
pub fn encode_entry(raw: &mut Vec<u8>, entry: &Entry) {
    let at = raw.len();
    raw.extend_from_slice(&[0; 4]);
    // postcard into a Vec cannot fail for these types (no maps with non-string keys,
    // no sequences of unknown length).
    let raw_taken = std::mem::take(raw);
    let mut out = postcard::to_extend(entry, raw_taken).expect("log entries always encode");
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    *raw = out;
}

/// One group frame around `raw` (the concatenated entries): LZ4-compressed, or stored
/// as it is when LZ4 would not make it smaller.
pub fn encode_frame(first_lsn: u64, count: u32, raw: &[u8]) -> Vec<u8> {
    let lz4 = lz4_flex::block::compress(raw);
    let (block, size) = if lz4.len() < raw.len() {
        (&lz4[..], lz4.len() as u32)
    } else {
        (raw, raw.len() as u32 | STORED)
    };
    let mut frame = Vec::with_capacity(FRAME_HEADER + block.len());
    frame.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame.extend_from_slice(&size.to_le_bytes());
    frame.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    frame.extend_from_slice(&first_lsn.to_le_bytes());
    frame.extend_from_slice(&count.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&frame);
    crc.update(block);
    frame.extend_from_slice(&crc.finalize().to_le_bytes());
    frame.extend_from_slice(block);
    frame
}

/// What reading one segment found.
#[derive(Debug)]
pub struct Scan {
    /// The entries of every valid group, with their LSNs.
    pub entries: Vec<(u64, Entry)>,
    /// Bytes up to the end of the last valid group.
    pub valid_len: u64,
    /// Bytes after it that did not form a valid group (a torn tail).
    pub torn_bytes: u64,
}

/// Reads a segment. `last` says whether it is the log's last segment, the only one that
/// may end in a torn group; in any other an invalid group is an error.
pub fn scan(path: &Path, bytes: &[u8], last: bool) -> Result<Scan> {
    let mut scan = Scan {
        entries: Vec::new(),
        valid_len: 0,
        torn_bytes: 0,
    };
    if bytes.len() < HEADER.len() || &bytes[..HEADER.len()] != HEADER {
        if last && (bytes.len() < HEADER.len() && HEADER.starts_with(bytes)) {
            // Created, then the crash came before its header was written.
            scan.torn_bytes = bytes.len() as u64;
            return Ok(scan);
        }
        if bytes.len() >= HEADER.len() && bytes[..8] == HEADER[..8] {
            return Err(Error::corrupt(
                path,
                format!(
                    "a redo log segment of format version {}; this build reads version {}",
                    bytes[8], HEADER[8]
                ),
            ));
        }
        return Err(Error::corrupt(
            path,
            "not a Gyre redo log segment (bad header)",
        ));
    }
    let mut at = HEADER.len();
    scan.valid_len = at as u64;
    while at < bytes.len() {
        match frame(&bytes[at..]) {
            Ok((first_lsn, entries, len)) => {
                if let Some((prev, _)) = scan.entries.last()
                    && first_lsn != prev + 1
                {
                    return Err(Error::corrupt(
                        path,
                        format!("group at offset {at} starts at LSN {first_lsn}, after {prev}"),
                    ));
                }
                scan.entries.extend(
                    entries
                        .into_iter()
                        .enumerate()
                        .map(|(i, e)| (first_lsn + i as u64, e)),
                );
                at += len;
                scan.valid_len = at as u64;
            }
            Err(detail) if last => {
                // Only the group being written at the crash can be torn: a valid group
                // further on means this one was damaged after it was written.
                if let Some(later) = valid_frame_after(&bytes[at + 1..]) {
                    return Err(Error::corrupt(
                        path,
                        format!(
                            "offset {at}: {detail}, yet a valid group follows at offset {}",
                            at + 1 + later
                        ),
                    ));
                }
                tracing::warn!(
                    "{}: cutting off {} bytes after offset {at} ({detail}): a group torn by a crash",
                    path.display(),
                    bytes.len() - at
                );
                scan.torn_bytes = (bytes.len() - at) as u64;
                break;
            }
            Err(detail) => {
                return Err(Error::corrupt(path, format!("offset {at}: {detail}")));
            }
        }
    }
    Ok(scan)
}

/// Where the first valid group in `bytes` starts, if one does.
fn valid_frame_after(bytes: &[u8]) -> Option<usize> {
    let magic = FRAME_MAGIC.to_le_bytes();
    (0..bytes.len().saturating_sub(FRAME_HEADER - 1))
        .filter(|&i| bytes[i..i + 4] == magic)
        .find(|&i| frame(&bytes[i..]).is_ok())
}

/// Decodes the frame at the start of `bytes`: its first LSN, its entries and its length.
pub fn frame(bytes: &[u8]) -> std::result::Result<(u64, Vec<Entry>, usize), String> {
    if bytes.len() < FRAME_HEADER {
        return Err(format!("{} bytes, less than a group header", bytes.len()));
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    if u32_at(0) != FRAME_MAGIC {
        return Err("no group starts here".into());
    }
    let stored = u32_at(4) & STORED != 0;
    let compressed = (u32_at(4) & !STORED) as usize;
    let raw = u32_at(8) as usize;
    let first_lsn = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
    let count = u32_at(20) as usize;
    let crc = u32_at(24);
    if raw > MAX_GROUP_BYTES
        || compressed > lz4_flex::block::get_maximum_output_size(raw)
        || (stored && compressed != raw)
    {
        return Err(format!(
            "group sizes out of bounds ({compressed} compressed, {raw} raw)"
        ));
    }
    let end = FRAME_HEADER + compressed;
    if bytes.len() < end {
        return Err(format!(
            "group of {end} bytes, {} left in the file",
            bytes.len()
        ));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..24]);
    hasher.update(&bytes[FRAME_HEADER..end]);
    if hasher.finalize() != crc {
        return Err("checksum mismatch".into());
    }
    if first_lsn == 0
        || count == 0
        || count > raw / 5
        || first_lsn.checked_add(count as u64).is_none()
    {
        return Err(format!("group of {count} entries from LSN {first_lsn}"));
    }
    let block = &bytes[FRAME_HEADER..end];
    let data = if stored {
        std::borrow::Cow::Borrowed(block)
    } else {
        std::borrow::Cow::Owned(
            lz4_flex::block::decompress(block, raw).map_err(|e| format!("LZ4: {e}"))?,
        )
    };
    if data.len() != raw {
        return Err(format!("LZ4 gave {} bytes, not {raw}", data.len()));
    }
    let mut entries = Vec::with_capacity(count.min(4096));
    let mut at = 0;
    while at < data.len() {
        if data.len() - at < 4 {
            return Err("entry length cut off".into());
        }
        let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        at += 4;
        if data.len() - at < len {
            return Err(format!("entry of {len} bytes, {} left", data.len() - at));
        }
        let entry: Entry =
            postcard::from_bytes(&data[at..at + len]).map_err(|e| format!("entry: {e}"))?;
        entries.push(entry);
        at += len;
    }
    if entries.len() != count {
        return Err(format!(
            "{} entries, the header says {count}",
            entries.len()
        ));
    }
    Ok((first_lsn, entries, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RowOp, TableId};
    use crate::value::Value;

    fn group(first: u64, n: usize) -> (Vec<u8>, Vec<Entry>) {
        let entries: Vec<Entry> = (0..n)
            .map(|i| Entry::Physical {
                ops: vec![RowOp::Insert {
                    table: TableId(0),
                    row: vec![Value::Int(i as i64), Value::Text("x".repeat(i).into())].into(),
                }],
            })
            .collect();
        let mut raw = Vec::new();
        for e in &entries {
            encode_entry(&mut raw, e);
        }
        (encode_frame(first, n as u32, &raw), entries)
    }

    #[test]
    fn groups_round_trip_and_tails_are_cut() {
        let p = Path::new("seg");
        let (g1, e1) = group(1, 3);
        let (g2, e2) = group(4, 2);
        let mut file = HEADER.to_vec();
        file.extend_from_slice(&g1);
        file.extend_from_slice(&g2);
        let s = scan(p, &file, true).unwrap();
        let all: Vec<Entry> = e1.into_iter().chain(e2).collect();
        assert_eq!(
            s.entries.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(),
            all
        );
        assert_eq!(s.entries.last().unwrap().0, 5);
        assert_eq!(s.valid_len, file.len() as u64);
        // A damaged group followed by a valid one is corruption, not a torn tail.
        let mut damaged = file.clone();
        damaged[HEADER.len() + 30] ^= 0x01;
        assert!(scan(p, &damaged, true).is_err());
        // Every cut inside the second group leaves the first.
        for cut in HEADER.len() + g1.len() + 1..file.len() {
            let s = scan(p, &file[..cut], true).unwrap();
            assert_eq!(s.entries.len(), 3, "cut at {cut}");
            assert_eq!(s.valid_len, (HEADER.len() + g1.len()) as u64);
            // ... but is corruption in a segment that is not the last.
            assert!(scan(p, &file[..cut], false).is_err());
        }
        // A flipped bit anywhere in a group fails its checksum.
        for i in (HEADER.len() + g1.len()..file.len()).step_by(7) {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert_eq!(scan(p, &bad, true).unwrap().entries.len(), 3);
        }
        // A partly written header of a new segment is a torn tail too.
        assert!(scan(p, &HEADER[..5], true).unwrap().entries.is_empty());
        assert!(scan(p, b"something else", true).is_err());
    }

    /// A group LZ4 would not make smaller is stored as it is, and reads back; a stored
    /// block must be exactly the raw size.
    #[test]
    fn incompressible_groups_are_stored_as_they_are() {
        let entries = [Entry::Logical {
            procedure: "pay".into(),
            args: vec![Value::Int(7), Value::Int(-3)],
        }];
        let mut raw = Vec::new();
        encode_entry(&mut raw, &entries[0]);
        let f = encode_frame(9, 1, &raw);
        assert_eq!(f.len(), FRAME_HEADER + raw.len());
        let size = u32::from_le_bytes(f[4..8].try_into().unwrap());
        assert_eq!(size, raw.len() as u32 | STORED);
        let (first, read, len) = frame(&f).unwrap();
        assert_eq!((first, len), (9, f.len()));
        assert_eq!(read, entries);
        // Compressible groups still are compressed.
        let (g, _) = group(1, 40);
        assert_eq!(u32::from_le_bytes(g[4..8].try_into().unwrap()) & STORED, 0);
        assert_eq!(frame(&g).unwrap().1.len(), 40);
        // A stored block of another size than the raw one is refused.
        let mut bad = f.clone();
        bad[4..8].copy_from_slice(&((raw.len() as u32 - 1) | STORED).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bad[..24]);
        crc.update(&bad[FRAME_HEADER..]);
        bad[24..28].copy_from_slice(&crc.finalize().to_le_bytes());
        assert!(frame(&bad).unwrap_err().contains("out of bounds"));
    }

    #[test]
    fn hostile_sizes_are_refused_before_allocating() {
        let mut f = HEADER.to_vec();
        let mut h = Vec::new();
        h.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(&1u64.to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&h);
        let s = scan(Path::new("seg"), &f, true).unwrap();
        assert!(s.entries.is_empty());
        assert!(scan(Path::new("seg"), &f, false).is_err());
    }

    #[test]
    fn names_sort_by_lsn() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(parse_name("42.redo"), None);
        assert!(file_name(9) < file_name(10));
    }
}
