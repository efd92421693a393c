//! A table loaded from files follows its files.
//!
//! `CREATE EXTERNAL TABLE` loads the files into the workers' memory and Gyre answers
//! from memory; DataFusion reads the files at every query, so it sees files written
//! after the table was created. So that both give the same answers, the coordinator
//! keeps, per such table, DataFusion's listing table and the files it loaded (path,
//! size, modification time). Before a statement reads the table it lists the location
//! again ([`FileTable::list`]): files that appeared are loaded and appended; a file
//! that changed or went away makes it load the table anew ([`Change`]). An INSERT into
//! the table writes a new file, as DataFusion's does, which the next statement loads.
//!
//! The price is one listing of the location per statement and table (a directory
//! listing, or one LIST request of an object store); rows are read again only when
//! files changed.

use super::WorkerFiles;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::listing::helpers::pruned_partition_list;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use futures::TryStreamExt;
use object_store::ObjectMeta;
use object_store::path::Path;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// What identifies a version of a file: its size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    modified: i64,
}

impl Stamp {
    fn of(meta: &ObjectMeta) -> Self {
        Self {
            size: meta.size,
            modified: meta.last_modified.timestamp_nanos_opt().unwrap_or(i64::MAX),
        }
    }
}

/// Files by path.
pub type Files = BTreeMap<Path, ObjectMeta>;

/// How a table's files differ from the ones it loaded.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// Only new files: their rows are appended.
    Added(HashSet<Path>),
    /// A loaded file changed or went away: the table is loaded anew.
    Replaced,
}

/// A table loaded from files, as the coordinator keeps it to follow them.
#[derive(Debug)]
pub struct FileTable {
    /// DataFusion's listing table of the files (also the target of INSERTs).
    pub listing: Arc<dyn TableProvider>,
    on_workers: bool,
    loaded: Mutex<Files>,
    /// Held while the table is compared with its files and brought up to date.
    pub following: tokio::sync::Mutex<()>,
}

impl FileTable {
    pub fn new(listing: Arc<dyn TableProvider>, on_workers: bool) -> Self {
        Self {
            listing,
            on_workers,
            loaded: Mutex::new(Files::new()),
            following: tokio::sync::Mutex::new(()),
        }
    }

    /// A plan reading table `name`'s files (only `only`, if given), on the workers or on
    /// the coordinator as the table was created, and its source, which records the files
    /// the plan read.
    pub fn read(
        &self,
        name: &str,
        only: Option<HashSet<Path>>,
    ) -> Result<(Arc<WorkerFiles>, LogicalPlan)> {
        let mut files = WorkerFiles::new(Arc::clone(&self.listing), self.on_workers);
        if let Some(only) = only {
            files = files.only(only);
        }
        let source = Arc::new(files);
        let plan = LogicalPlanBuilder::scan(
            format!("{name}_source"),
            provider_as_source(Arc::clone(&source) as Arc<dyn TableProvider>),
            None,
        )?
        .build()?;
        Ok((source, plan))
    }

    /// The files at the table's location now, found as DataFusion's listing table finds
    /// them for a scan.
    pub async fn list(&self, state: &dyn Session) -> Result<Files> {
        let Some(listing) = self.listing.downcast_ref::<ListingTable>() else {
            return Ok(self.loaded.lock().clone());
        };
        let options = listing.options();
        let mut files = Files::new();
        for url in listing.table_paths() {
            let store = state.runtime_env().object_store(url)?;
            let found: Vec<_> = pruned_partition_list(
                state,
                store.as_ref(),
                url,
                &[],
                &options.file_extension,
                &options.table_partition_cols,
            )
            .await?
            .try_collect()
            .await?;
            for f in found {
                files.insert(f.object_meta.location.clone(), f.object_meta);
            }
        }
        Ok(files)
    }

    /// How `now` differs from the files loaded.
    pub fn change(&self, now: &Files) -> Change {
        let loaded = self.loaded.lock();
        let kept = loaded.iter().all(|(path, meta)| {
            now.get(path)
                .is_some_and(|m| Stamp::of(m) == Stamp::of(meta))
        });
        if !kept {
            return Change::Replaced;
        }
        let added: HashSet<Path> = now
            .keys()
            .filter(|p| !loaded.contains_key(*p))
            .cloned()
            .collect();
        if added.is_empty() {
            Change::None
        } else {
            Change::Added(added)
        }
    }

    /// Records files as loaded, after their rows reached the table.
    pub fn add_loaded(&self, files: Vec<ObjectMeta>) {
        let mut loaded = self.loaded.lock();
        for f in files {
            loaded.insert(f.location.clone(), f);
        }
    }

    /// Forgets every loaded file, once the table's rows are gone.
    pub fn clear_loaded(&self) {
        self.loaded.lock().clear();
    }
}

/// Whether `e` says that a file or directory does not exist.
pub fn is_not_found(e: &DataFusionError) -> bool {
    match e.find_root() {
        DataFusionError::ObjectStore(o) => matches!(**o, object_store::Error::NotFound { .. }),
        DataFusionError::IoError(io) => io.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::datasource::empty::EmptyTable;
    use std::sync::Arc;

    fn meta(path: &str, size: u64, at: i64) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(path),
            last_modified: format!("2026-01-01T00:00:{at:02}Z").parse().unwrap(),
            size,
            e_tag: None,
            version: None,
        }
    }

    fn files(list: &[ObjectMeta]) -> Files {
        list.iter()
            .map(|m| (m.location.clone(), m.clone()))
            .collect()
    }

    #[test]
    fn new_files_are_added_and_changed_or_missing_ones_reload() {
        let schema = Arc::new(arrow::datatypes::Schema::empty());
        let table = FileTable::new(Arc::new(EmptyTable::new(schema)), true);
        let a = meta("d/a.csv", 10, 1);
        let b = meta("d/b.csv", 20, 2);
        assert_eq!(table.change(&files(&[])), Change::None);
        assert_eq!(
            table.change(&files(std::slice::from_ref(&a))),
            Change::Added(HashSet::from([a.location.clone()]))
        );
        table.add_loaded(vec![a.clone()]);
        assert_eq!(table.change(&files(std::slice::from_ref(&a))), Change::None);
        assert_eq!(
            table.change(&files(&[a.clone(), b.clone()])),
            Change::Added(HashSet::from([b.location.clone()]))
        );
        // Rewritten in place: same path, another size or time.
        assert_eq!(
            table.change(&files(&[meta("d/a.csv", 11, 1)])),
            Change::Replaced
        );
        assert_eq!(
            table.change(&files(&[meta("d/a.csv", 10, 3)])),
            Change::Replaced
        );
        // Removed.
        assert_eq!(table.change(&files(&[b])), Change::Replaced);
        table.clear_loaded();
        assert_eq!(table.change(&files(&[])), Change::None);
    }
}
