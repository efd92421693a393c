//! Checkpoints: the whole store at one LSN, as Parquet files.
//!
//! `checkpoints/<lsn>/` holds one Parquet file per table and a `manifest.json` naming
//! them with the tables' definitions. A checkpoint is written under `<lsn>.tmp`, every
//! file fsynced, then renamed into place, so a directory without the suffix is always
//! complete; recovery loads the newest one and replays only the log after its LSN.
//!
//! The same content travels in one buffer ([`to_bytes`], [`from_bytes`]) to a secondary
//! that joins: it starts from the primary's state and replays the log after it.

use crate::columnar;
use crate::error::{Error, Result};
use crate::log::writer::sync_dir;
use crate::store::{Key, Row, Store, TableDef};
use bytes::Bytes;
use imbl::OrdMap;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Rows per record batch written.
const BATCH_ROWS: usize = 65_536;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    lsn: u64,
    next_table_id: u32,
    tables: Vec<ManifestTable>,
    /// The definitions of the tables that follow their files, by name.
    #[serde(default)]
    file_tables: std::collections::BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ManifestTable {
    def: TableDef,
    file: String,
    rows: u64,
}

fn dir_name(lsn: u64) -> String {
    format!("{lsn:020}")
}

/// The complete checkpoints under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, "list", e))? {
        let entry = entry.map_err(|e| Error::io(root, "list", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() == 20
            && name.bytes().all(|b| b.is_ascii_digit())
            && let Ok(lsn) = name.parse()
        {
            found.push((lsn, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Writes `store` (a copy taken under the lock) as the checkpoint at its LSN and
/// returns its directory.
pub fn write(root: &Path, store: &Store) -> Result<PathBuf> {
    let done = root.join(dir_name(store.lsn));
    if done.exists() {
        return Ok(done);
    }
    let tmp = root.join(format!("{}.tmp", dir_name(store.lsn)));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, "remove", e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "create", e))?;
    let mut tables = Vec::new();
    for table in store.tables() {
        let file = format!("t{}.parquet", table.def.id.0);
        let path = tmp.join(&file);
        write_table(&path, &table.def, &table.rows)?;
        tables.push(ManifestTable {
            def: (*table.def).clone(),
            file,
            rows: table.rows.len() as u64,
        });
    }
    let manifest = Manifest {
        lsn: store.lsn,
        next_table_id: store.next_table_id().0,
        tables,
        file_tables: store
            .file_tables()
            .map(|(n, d)| (n.clone(), d.to_vec()))
            .collect(),
    };
    let path = tmp.join("manifest.json");
    let json = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    std::fs::write(&path, json).map_err(|e| Error::io(&path, "write", e))?;
    File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&path, "fsync", e))?;
    sync_dir(&tmp)?;
    std::fs::rename(&tmp, &done).map_err(|e| Error::io(&done, "rename into place", e))?;
    sync_dir(root)?;
    Ok(done)
}

fn write_table(path: &Path, def: &TableDef, rows: &OrdMap<Key, Row>) -> Result<()> {
    let file = File::create(path).map_err(|e| Error::io(path, "create", e))?;
    let file = write_parquet(file, path, def, rows)?;
    file.sync_all().map_err(|e| Error::io(path, "fsync", e))
}

/// Writes a table's rows as Parquet into `out` (`path` names it in errors).
fn write_parquet<W: Write + Send>(
    out: W,
    path: &Path,
    def: &TableDef,
    rows: &OrdMap<Key, Row>,
) -> Result<W> {
    let props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .build();
    let parquet =
        |e: parquet::errors::ParquetError| Error::Parquet(format!("{}: {e}", path.display()));
    let mut writer = ArrowWriter::try_new(out, def.schema(), Some(props)).map_err(parquet)?;
    let mut chunk: Vec<&Row> = Vec::with_capacity(BATCH_ROWS);
    let flush = |chunk: &mut Vec<&Row>, writer: &mut ArrowWriter<W>| {
        let batch = columnar::to_batch(&def.columns, chunk.iter().map(|r| &r[..]));
        chunk.clear();
        writer.write(&batch).map_err(parquet)
    };
    for row in rows.values() {
        chunk.push(row);
        if chunk.len() == BATCH_ROWS {
            flush(&mut chunk, &mut writer)?;
        }
    }
    if !chunk.is_empty() {
        flush(&mut chunk, &mut writer)?;
    }
    writer.into_inner().map_err(parquet)
}

/// Loads the checkpoint in `dir` into a store at its LSN, checking every row.
pub fn load(dir: &Path) -> Result<Store> {
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, "read", e))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&path, e.to_string()))?;
    let mut store = Store::default();
    for t in manifest.tables {
        if t.file.contains('/') || t.file.contains("..") {
            return Err(Error::corrupt(&path, format!("file name {}", t.file)));
        }
        t.def
            .validate()
            .map_err(|e| Error::corrupt(&path, e.to_string()))?;
        let file_path = dir.join(&t.file);
        let rows = read_table(&file_path, &t.def)?;
        if rows.len() as u64 != t.rows {
            return Err(Error::corrupt(
                &file_path,
                format!("{} rows, the manifest says {}", rows.len(), t.rows),
            ));
        }
        store
            .restore_table(t.def, rows)
            .map_err(|e| Error::corrupt(&path, e.to_string()))?;
    }
    store.set_next_table_id(manifest.next_table_id);
    for (name, definition) in manifest.file_tables {
        store.set_file_table(name, Some(definition));
    }
    store.lsn = manifest.lsn;
    Ok(store)
}

fn read_table(path: &Path, def: &TableDef) -> Result<OrdMap<Key, Row>> {
    let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
    read_parquet(file, path, def)
}

/// Reads a table's rows from Parquet, checking each (`path` names it in errors).
fn read_parquet<R: ChunkReader + 'static>(
    input: R,
    path: &Path,
    def: &TableDef,
) -> Result<OrdMap<Key, Row>> {
    let corrupt = |e: String| Error::corrupt(path, e);
    let reader = ParquetRecordBatchReaderBuilder::try_new(input)
        .map_err(|e| corrupt(e.to_string()))?
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| corrupt(e.to_string()))?;
    let mut rows = OrdMap::new();
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(e.to_string()))?;
        for row in columnar::from_batch(def, &batch).map_err(|e| corrupt(e.to_string()))? {
            let key = def.key_of(&row);
            if rows.insert(key.clone(), Row::from(row)).is_some() {
                return Err(corrupt(format!("key {key:?} twice")));
            }
        }
    }
    Ok(rows)
}

/// What a state buffer starts with.
const STATE_MAGIC: &[u8; 8] = b"GYRESTA1";

/// `store` as one buffer: the manifest, then each table as Parquet, each part preceded
/// by its length.
pub fn to_bytes(store: &Store) -> Result<Vec<u8>> {
    let name = Path::new("(state)");
    let mut parts = Vec::new();
    let mut tables = Vec::new();
    for table in store.tables() {
        parts.push(write_parquet(Vec::new(), name, &table.def, &table.rows)?);
        tables.push(ManifestTable {
            def: (*table.def).clone(),
            file: String::new(),
            rows: table.rows.len() as u64,
        });
    }
    let manifest = Manifest {
        lsn: store.lsn,
        next_table_id: store.next_table_id().0,
        tables,
        file_tables: store
            .file_tables()
            .map(|(n, d)| (n.clone(), d.to_vec()))
            .collect(),
    };
    let json = serde_json::to_vec(&manifest).expect("manifests serialize");
    let mut out = STATE_MAGIC.to_vec();
    for part in std::iter::once(&json).chain(&parts) {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part);
    }
    Ok(out)
}

/// The store in a buffer [`to_bytes`] made, every length and row checked.
pub fn from_bytes(bytes: Bytes) -> Result<Store> {
    let name = Path::new("(state)");
    let corrupt = |e: String| Error::corrupt(name, e);
    if !bytes.starts_with(STATE_MAGIC) {
        return Err(corrupt("not a Gyre state buffer".into()));
    }
    let mut at = STATE_MAGIC.len();
    let mut next_part = || -> Result<Bytes> {
        let len = bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| corrupt(format!("cut off at byte {at}")))?;
        let start = at + 8;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| corrupt(format!("a part of {len} bytes at byte {at} overruns it")))?;
        at = end;
        Ok(bytes.slice(start..end))
    };
    let manifest: Manifest =
        serde_json::from_slice(&next_part()?).map_err(|e| corrupt(e.to_string()))?;
    let mut store = Store::default();
    for t in manifest.tables {
        t.def.validate().map_err(|e| corrupt(e.to_string()))?;
        let rows = read_parquet(next_part()?, name, &t.def)?;
        if rows.len() as u64 != t.rows {
            return Err(corrupt(format!(
                "table {}: {} rows, the manifest says {}",
                t.def.name,
                rows.len(),
                t.rows
            )));
        }
        store
            .restore_table(t.def, rows)
            .map_err(|e| corrupt(e.to_string()))?;
    }
    if at != bytes.len() {
        return Err(corrupt(format!(
            "{} bytes after the last table",
            bytes.len() - at
        )));
    }
    store.set_next_table_id(manifest.next_table_id);
    for (name, definition) in manifest.file_tables {
        store.set_file_table(name, Some(definition));
    }
    store.lsn = manifest.lsn;
    Ok(store)
}
