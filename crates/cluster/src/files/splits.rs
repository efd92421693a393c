//! Cutting a table's files into splits balanced by bytes over the workers.
//!
//! A split is a whole file or a byte range of one. How a file may be cut depends on its
//! format ([`Cut`]): Parquet at row-group boundaries, read from each file's footer (a
//! row group belongs to the range that holds its first page, as DataFusion's Parquet
//! reader decides); uncompressed CSV, newline-delimited JSON and Arrow IPC files
//! anywhere (their readers align a range to whole records); compressed files and
//! other formats only whole.
//!
//! The files are laid end to end in path order and the sequence is cut into
//! `workers x slots` consecutive runs of about equal bytes (fewer slots, then fewer
//! workers, when the runs would be smaller than [`MIN_RUN`]); worker `w` gets runs `w * slots .. (w + 1) *
//! slots` and reads `slots` of them at a time. A run that crosses files becomes
//! several splits. Files that can only be read whole are instead dealt out largest
//! first, each to the worker with the fewest bytes so far (and there to its lightest
//! run).

use bytes::Bytes;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::FileGroup;
use datafusion::parquet::arrow::async_reader::MetadataFetch;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::ParquetMetaDataReader;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

/// How the files of a table may be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Parquet: between row groups.
    RowGroups,
    /// Anywhere: the reader aligns ranges to records.
    Bytes,
    /// Only whole files (compressed files, JSON arrays, Arrow streams, Avro).
    WholeFiles,
}

/// The splits of every worker.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    /// Group `w` holds worker `w`'s splits, in the order of its runs.
    pub groups: Vec<FileGroup>,
    /// Files in the table.
    pub files: usize,
    /// Bytes of all files.
    pub bytes: u64,
}

/// Bytes `[start, end)` of file `file`: the smallest piece a run may hold.
#[derive(Debug, Clone, Copy)]
struct Piece {
    file: usize,
    start: u64,
    end: u64,
}

impl Piece {
    fn bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// Byte-cut runs are at least this large (a run opens its file and aligns to records).
const MIN_RUN: u64 = 1 << 20;

/// Cuts `files` into splits for `workers` workers reading `slots` splits at a time each.
/// `store` serves the files (Parquet footers are read from it).
pub async fn plan_splits(
    mut files: Vec<PartitionedFile>,
    cut: Cut,
    store: &Arc<dyn ObjectStore>,
    workers: usize,
    slots: usize,
) -> Result<SplitPlan> {
    let workers = workers.max(1);
    files.sort_by(|a, b| a.object_meta.location.cmp(&b.object_meta.location));
    files.dedup_by(|a, b| a.object_meta.location == b.object_meta.location);
    // Byte ranges are i64 in DataFusion's plans: a larger size is no real file.
    if let Some(f) = files.iter().find(|f| f.object_meta.size > i64::MAX as u64) {
        return Err(DataFusionError::Execution(format!(
            "'{}' claims a size of {} bytes",
            f.object_meta.location, f.object_meta.size
        )));
    }
    let bytes: u64 = files.iter().map(|f| f.object_meta.size).sum();
    let slots = match cut {
        Cut::Bytes => slots.clamp(1, (bytes / (workers as u64 * MIN_RUN)).max(1) as usize),
        _ => slots.max(1),
    };
    let runs = workers * slots;
    let run_pieces = match cut {
        Cut::WholeFiles => deal_whole_files(&files, workers, slots),
        // No run below MIN_RUN: a small input goes to fewer workers, whole where it
        // fits one run (its error messages then count lines from the file's start).
        Cut::Bytes => cut_bytes(&files, (bytes / MIN_RUN).clamp(1, runs as u64) as usize),
        Cut::RowGroups => {
            let starts = row_group_starts(&files, store).await?;
            let pieces = files
                .iter()
                .zip(&starts)
                .enumerate()
                .flat_map(|(i, (f, starts))| row_group_pieces(i, starts, f.object_meta.size))
                .collect::<Vec<_>>();
            cut_runs(&pieces, runs)
        }
    };
    let mut groups = vec![Vec::new(); workers];
    for (run, pieces) in run_pieces.into_iter().enumerate() {
        let group = &mut groups[run / slots];
        for (file, start, end) in merge_pieces(&pieces) {
            let f = &files[file];
            let split = if start == 0 && end == f.object_meta.size {
                f.clone()
            } else {
                // Statistics describe the whole file, not this range.
                let mut part = f.clone().with_range(start as i64, end as i64);
                part.statistics = None;
                part
            };
            group.push(split);
        }
    }
    Ok(SplitPlan {
        groups: groups.into_iter().map(FileGroup::new).collect(),
        files: files.len(),
        bytes,
    })
}

/// Files laid end to end, cut into `runs` runs of equal bytes (each run's pieces are
/// the parts of the files it overlaps). An empty file goes to the run its position
/// falls in.
fn cut_bytes(files: &[PartitionedFile], runs: usize) -> Vec<Vec<Piece>> {
    let total: u128 = files.iter().map(|f| f.object_meta.size as u128).sum();
    let bound = |r: usize| (total * r as u128 / runs as u128) as u64;
    let mut out = vec![Vec::new(); runs];
    let mut at = 0u64; // global offset of the current file's first byte
    let mut run = 0;
    for (i, f) in files.iter().enumerate() {
        let size = f.object_meta.size;
        let end = at + size;
        let mut from = at;
        loop {
            // The run holding byte `from` (for an empty file, its position).
            while run + 1 < runs && bound(run + 1) <= from {
                run += 1;
            }
            let upto = if run + 1 < runs {
                bound(run + 1).min(end)
            } else {
                end
            };
            out[run].push(Piece {
                file: i,
                start: from - at,
                end: upto - at,
            });
            from = upto;
            if from >= end {
                break;
            }
        }
        at = end;
    }
    out
}

/// A Parquet file cut between row groups: the first piece starts at 0 (it holds the
/// magic bytes), the last ends at the file's end (the footer is read from there anyway).
fn row_group_pieces(file: usize, starts: &[u64], size: u64) -> Vec<Piece> {
    if starts.is_empty() {
        return vec![Piece {
            file,
            start: 0,
            end: size,
        }];
    }
    let mut bounds: Vec<u64> = starts.to_vec();
    bounds[0] = 0;
    bounds.push(size);
    bounds
        .windows(2)
        .map(|w| Piece {
            file,
            start: w[0],
            end: w[1],
        })
        .collect()
}

/// Where each row group of each Parquet file starts: the offset of its first column's
/// first page, the position DataFusion's reader assigns a row group to a range by.
async fn row_group_starts(
    files: &[PartitionedFile],
    store: &Arc<dyn ObjectStore>,
) -> Result<Vec<Vec<u64>>> {
    let files: Vec<(Path, u64)> = files
        .iter()
        .map(|f| (f.object_meta.location.clone(), f.object_meta.size))
        .collect();
    futures::stream::iter(files.into_iter().map(|(location, size)| {
        let store = Arc::clone(store);
        async move {
            let fetch = StoreFetch {
                store,
                path: location.clone(),
            };
            let metadata = ParquetMetaDataReader::new()
                .load_and_finish(fetch, size)
                .await
                .map_err(|e| {
                    DataFusionError::Execution(format!(
                        "cannot read the Parquet footer of '{location}': {e}"
                    ))
                })?;
            let mut starts = BTreeSet::new();
            for rg in metadata.row_groups() {
                if rg.num_columns() == 0 {
                    continue;
                }
                let col = rg.column(0);
                let start = col
                    .dictionary_page_offset()
                    .unwrap_or_else(|| col.data_page_offset());
                let start = u64::try_from(start)
                    .ok()
                    .filter(|s| *s < size)
                    .ok_or_else(|| {
                        DataFusionError::Execution(format!(
                            "corrupt Parquet file '{location}': a row group starts at byte {start} \
                         of a {size}-byte file"
                        ))
                    })?;
                starts.insert(start);
            }
            Ok::<_, DataFusionError>(starts.into_iter().collect::<Vec<_>>())
        }
    }))
    .buffered(16)
    .try_collect()
    .await
}

/// Reads byte ranges of a Parquet file's footer from its object store.
struct StoreFetch {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl MetadataFetch for StoreFetch {
    fn fetch(
        &mut self,
        range: Range<u64>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }
}

/// Cuts a sequence of pieces into `runs` consecutive runs of about equal bytes: run `r`
/// ends at the first piece boundary at or past `(r + 1) / runs` of the bytes.
fn cut_runs(pieces: &[Piece], runs: usize) -> Vec<Vec<Piece>> {
    let total: u64 = pieces.iter().map(Piece::bytes).sum();
    let mut out = vec![Vec::new(); runs];
    let mut done = 0u64;
    for p in pieces {
        // The run whose share of the bytes holds the piece's middle: each run ends
        // within half a piece of its share. (Moving on only once a run had reached
        // its share let a run overshoot by a whole row group: 3 of 8 equal row groups
        // on one worker and 1 on another.)
        let middle = done as u128 + p.bytes() as u128 / 2;
        let run = (middle * runs as u128)
            .checked_div(total as u128)
            .unwrap_or(0)
            .min(runs as u128 - 1) as usize;
        out[run].push(*p);
        done += p.bytes();
    }
    out
}

/// Whole files dealt out largest first, each to the worker with the fewest bytes so
/// far, and there to its run with the fewest.
fn deal_whole_files(files: &[PartitionedFile], workers: usize, slots: usize) -> Vec<Vec<Piece>> {
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(files[i].object_meta.size));
    let mut load = vec![0u64; workers * slots];
    let mut out = vec![Vec::new(); workers * slots];
    for i in order {
        let size = files[i].object_meta.size;
        let worker_load = |w: usize| load[w * slots..(w + 1) * slots].iter().sum::<u64>();
        let w = (0..workers)
            .min_by_key(|&w| (worker_load(w), w))
            .unwrap_or(0);
        let run = (w * slots..(w + 1) * slots)
            .min_by_key(|&r| (load[r], r))
            .unwrap_or(0);
        load[run] += size;
        out[run].push(Piece {
            file: i,
            start: 0,
            end: size,
        });
    }
    for run in &mut out {
        run.sort_by_key(|p| p.file);
    }
    out
}

/// Adjacent pieces of the same file as one `(file, start, end)` split.
fn merge_pieces(pieces: &[Piece]) -> Vec<(usize, u64, u64)> {
    let mut out: Vec<(usize, u64, u64)> = vec![];
    for p in pieces {
        match out.last_mut() {
            Some((file, _, end)) if *file == p.file && *end == p.start => *end = p.end,
            _ => out.push((p.file, p.start, p.end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> PartitionedFile {
        PartitionedFile::new(path.to_string(), size)
    }

    /// Every byte of every file is in exactly one split.
    fn assert_covers(plan: &SplitPlan, files: &[(&str, u64)]) {
        for (path, size) in files {
            let mut ranges: Vec<(u64, u64)> = plan
                .groups
                .iter()
                .flat_map(|g| g.iter())
                .filter(|f| f.object_meta.location.as_ref() == *path)
                .map(|f| match &f.range {
                    Some(r) => (r.start as u64, r.end as u64),
                    None => (0, *size),
                })
                .collect();
            ranges.sort();
            let mut at = 0;
            for (s, e) in ranges {
                assert_eq!(s, at, "{path}: gap or overlap at {at}");
                at = e;
            }
            assert_eq!(at, *size, "{path} not covered to its end");
        }
    }

    fn group_bytes(plan: &SplitPlan) -> Vec<u64> {
        plan.groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| match &f.range {
                        Some(r) => (r.end - r.start) as u64,
                        None => f.object_meta.size,
                    })
                    .sum()
            })
            .collect()
    }

    #[tokio::test]
    async fn byte_cut_files_are_balanced_to_the_byte() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let sizes = [("a", 100 << 20), ("b", 7 << 20), ("c", 0), ("d", 33 << 20)];
        let files = sizes.iter().map(|(p, s)| file(p, *s)).collect();
        let plan = plan_splits(files, Cut::Bytes, &store, 3, 2).await.unwrap();
        assert_eq!(plan.files, 4);
        assert_covers(&plan, &sizes);
        let mean = plan.bytes / 3;
        for b in group_bytes(&plan) {
            assert!(b.abs_diff(mean) <= 1, "{b} vs mean {mean}");
        }
        // The empty file is a split too (every file is read, and counted as done).
        assert!(
            plan.groups
                .iter()
                .flat_map(|g| g.iter())
                .any(|f| f.object_meta.size == 0)
        );
    }

    #[tokio::test]
    async fn a_small_input_stays_whole_and_huge_sizes_are_refused() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let plan = plan_splits(vec![file("a", 3000)], Cut::Bytes, &store, 3, 8)
            .await
            .unwrap();
        assert_eq!(
            plan.groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [1, 0, 0]
        );
        assert!(plan.groups[0][0].range.is_none());
        let e = plan_splits(vec![file("huge", u64::MAX)], Cut::Bytes, &store, 3, 8)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("'huge' claims a size"), "{e}");
    }

    #[tokio::test]
    async fn whole_files_go_largest_first_to_the_lightest_run() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let sizes = [("a", 10), ("b", 9), ("c", 8), ("d", 3), ("e", 2), ("f", 1)];
        let files = sizes.iter().map(|(p, s)| file(p, *s)).collect();
        let plan = plan_splits(files, Cut::WholeFiles, &store, 3, 1)
            .await
            .unwrap();
        assert_covers(&plan, &sizes);
        assert!(
            plan.groups
                .iter()
                .flat_map(|g| g.iter())
                .all(|f| f.range.is_none())
        );
        let mut bytes = group_bytes(&plan);
        bytes.sort();
        assert_eq!(bytes, vec![11, 11, 11]);
    }

    #[tokio::test]
    async fn more_workers_than_bytes_leaves_some_without_splits() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let sizes = [("only", 10)];
        let plan = plan_splits(vec![file("only", 10)], Cut::Bytes, &store, 4, 2)
            .await
            .unwrap();
        assert_covers(&plan, &sizes);
        assert_eq!(plan.groups.iter().filter(|g| !g.is_empty()).count(), 1);
    }

    #[test]
    fn row_group_pieces_cover_the_file() {
        let p = row_group_pieces(0, &[4, 1000, 5000], 6000);
        let bounds: Vec<_> = p.iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(bounds, vec![(0, 1000), (1000, 5000), (5000, 6000)]);
        // A range [1000, 5000) holds the row group starting at 1000 only.
        assert_eq!(row_group_pieces(0, &[], 77)[0].end, 77);
    }

    /// Four files of two row groups each, of slightly different sizes, over four
    /// runs: two row groups per run. Moving on only once a run had its share put the
    /// third row group on the first run (its first two fell 7 bytes short).
    #[test]
    fn row_groups_go_to_the_run_their_middle_falls_in() {
        let sizes = [(1_000, 990), (1_010, 1_000), (1_000, 1_000), (1_000, 990)];
        let pieces: Vec<Piece> = sizes
            .iter()
            .enumerate()
            .flat_map(|(file, &(a, b))| {
                [(0, a), (a, a + b)].map(|(start, end)| Piece { file, start, end })
            })
            .collect();
        let runs = cut_runs(&pieces, 4);
        let counts: Vec<usize> = runs.iter().map(Vec::len).collect();
        assert_eq!(counts, vec![2, 2, 2, 2]);
        // Consecutive: each run's pieces follow the previous run's.
        let order: Vec<(usize, u64)> = runs.iter().flatten().map(|p| (p.file, p.start)).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
        // One piece larger than a share: the other runs stay empty, nothing is lost.
        let one = cut_runs(&pieces[..1], 4);
        assert_eq!(one.iter().map(Vec::len).sum::<usize>(), 1);
        assert!(cut_runs(&[], 3).iter().all(Vec::is_empty));
    }
}
