//! Checkpoints: the whole store at one LSN, as Parquet files.
//!
//! `checkpoints/<lsn>/` holds one Parquet file per table and a `manifest.json` naming
//! them with the tables' definitions. A checkpoint is written under `<lsn>.tmp`, every
//! file fsynced, then renamed into place, so a directory without the suffix is always
//! complete; recovery loads the newest one and replays only the log after its LSN.

use crate::columnar;
use crate::error::{Error, Result};
use crate::log::writer::sync_dir;
use crate::store::{Key, Row, Store, TableDef};
use imbl::OrdMap;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Rows per record batch written.
const BATCH_ROWS: usize = 65_536;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    lsn: u64,
    next_table_id: u32,
    tables: Vec<ManifestTable>,
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
    let props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .build();
    let parquet =
        |e: parquet::errors::ParquetError| Error::Parquet(format!("{}: {e}", path.display()));
    let mut writer = ArrowWriter::try_new(file, def.schema(), Some(props)).map_err(parquet)?;
    let mut chunk: Vec<&Row> = Vec::with_capacity(BATCH_ROWS);
    let flush = |chunk: &mut Vec<&Row>, writer: &mut ArrowWriter<File>| {
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
    let file = writer.into_inner().map_err(parquet)?;
    file.sync_all().map_err(|e| Error::io(path, "fsync", e))
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
    store.lsn = manifest.lsn;
    Ok(store)
}

fn read_table(path: &Path, def: &TableDef) -> Result<OrdMap<Key, Row>> {
    let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let corrupt = |e: String| Error::corrupt(path, e);
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
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
