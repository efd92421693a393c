//! The redo log as a secondary reads it: log groups from the primary's feed (and
//! the multicast packets that carry them), replayed into a secondary, and segments
//! as recovery reads them from disk. Groups carry a checksum, so each input is also
//! decoded with its checksum made right: mutations then reach the LZ4 block, the
//! entries' encoding and the replay of what they say.

use gyre_replica::log::Entry;
use gyre_replica::log::segment::{self, FRAME_HEADER, HEADER, STORED};
use gyre_replica::ship::Packet;
use gyre_replica::{Column, ColumnType, Placement, Procedures, RowOp, Secondary, Store};
use gyre_replica::{TableDef, TableId, Value};
use std::sync::Arc;

fn accounts() -> TableDef {
    TableDef {
        id: TableId(1),
        name: "accounts".into(),
        columns: vec![
            Column::new("id", ColumnType::Int64, false),
            Column::new("owner", ColumnType::Text, true),
            Column::new(
                "balance",
                ColumnType::Decimal {
                    precision: 12,
                    scale: 2,
                },
                false,
            ),
            Column::new(
                "opened",
                ColumnType::Timestamp {
                    digits: 6,
                    utc: true,
                },
                true,
            ),
            Column::new("items", ColumnType::IntList, true),
        ],
        key: vec![0],
        placement: Placement::Partitioned,
    }
}

fn row(id: i64) -> Vec<Value> {
    vec![
        Value::Int(id),
        Value::Text(Arc::from(format!("owner {id}"))),
        Value::Decimal(id as i128 * 1001),
        Value::Timestamp(id * 1_000_000),
        Value::IntList(vec![id, id + 1]),
    ]
}

/// The entries of one group each: every kind, as the primary logs them.
fn groups() -> Vec<Vec<Entry>> {
    let t = TableId(1);
    vec![
        vec![Entry::CreateTable {
            def: accounts(),
            rows: (1..=3).map(row).collect(),
        }],
        vec![
            Entry::Physical {
                ops: vec![
                    RowOp::Insert {
                        table: t,
                        row: row(4).into(),
                    },
                    RowOp::Update {
                        table: t,
                        row: row(1).into(),
                    },
                    RowOp::Patch {
                        table: t,
                        key: vec![Value::Int(2)],
                        columns: vec![(2, Value::Decimal(5)), (1, Value::Null)],
                    },
                    RowOp::Delete {
                        table: t,
                        key: vec![Value::Int(3)],
                    },
                ],
            },
            Entry::Snapshot,
            Entry::Logical {
                procedure: "transfer".into(),
                args: vec![Value::Int(1), Value::Int(2), Value::Float(0.5)],
            },
        ],
        vec![
            Entry::LoadBegin {
                def: TableDef {
                    id: TableId(2),
                    name: "loaded".into(),
                    ..accounts()
                },
            },
            Entry::LoadRows {
                table: TableId(2),
                rows: (10..14).map(row).collect(),
            },
            Entry::LoadEnd {
                table: TableId(2),
                commit: true,
            },
            Entry::DropTable(TableId(2)),
        ],
    ]
}

/// One frame per group, with consecutive LSNs from 1.
fn frames() -> Vec<Vec<u8>> {
    let mut lsn = 1;
    groups()
        .into_iter()
        .map(|entries| {
            let mut raw = vec![];
            for e in &entries {
                segment::encode_entry(&mut raw, e);
            }
            let frame = segment::encode_frame(lsn, entries.len() as u32, &raw);
            lsn += entries.len() as u64;
            frame
        })
        .collect()
}

/// Each group alone, the groups in a row, a segment of them, and multicast packets.
pub fn seeds() -> Vec<Vec<u8>> {
    let frames = frames();
    let mut seeds = frames.clone();
    let all = frames.concat();
    seeds.push([&HEADER[..], &all].concat());
    for packet in [
        Packet::Data {
            stream: 9,
            seq: 3,
            frag: 0,
            frags: 2,
            repair: false,
            payload: all[..all.len() / 2].to_vec(),
        },
        Packet::Heartbeat {
            stream: 9,
            next: 4,
            trail: 1,
        },
        Packet::Nak {
            stream: 9,
            ranges: vec![(1, 2), (4, 4)],
        },
        Packet::Lost {
            stream: 9,
            trail: 3,
        },
    ] {
        seeds.push(packet.encode());
    }
    seeds.push(all);
    seeds
}

/// `bytes` with the checksum of each group that starts at its front made right, as
/// far as the groups' sizes allow.
fn with_checksums(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut at = 0;
    while out.len() - at >= FRAME_HEADER {
        let u32_at = |i: usize| u32::from_le_bytes(out[i..i + 4].try_into().unwrap());
        let len = (u32_at(at + 4) & !STORED) as usize;
        let end = (at + FRAME_HEADER).saturating_add(len).min(out.len());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out[at..at + 24]);
        crc.update(&out[at + FRAME_HEADER..end]);
        out[at + 24..at + 28].copy_from_slice(&crc.finalize().to_le_bytes());
        at = end;
    }
    out
}

/// Decodes `input` as a log group (as it is, and with its checksums made right), as
/// a run of groups a secondary replays, as a segment (the last one and another) and as
/// a multicast packet. Errors are fine; panics are bugs.
pub fn run(input: &[u8]) {
    let fixed = with_checksums(input);
    for bytes in [input, &fixed[..]] {
        let _ = segment::frame(bytes);
        let mut secondary =
            Secondary::from_state(Store::default(), Procedures::new()).expect("an empty state");
        let _ = secondary.apply_frames(bytes);
        let segment = [&HEADER[..], bytes].concat();
        for last in [true, false] {
            let _ = segment::scan(std::path::Path::new("fuzzed.redo"), &segment, last);
        }
    }
    let _ = Packet::decode(input);
}
