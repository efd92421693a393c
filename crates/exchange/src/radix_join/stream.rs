//! One partition of a [`super::RadixJoinExec`]: the stream that joins it.
//!
//! States, in order:
//! - `Build`: collects the whole build partition (counted in the worker's memory pool),
//!   evaluates its key and builds the radix hash table: the keys radix-partitioned so
//!   that each partition and its bucket directory fit in half the L2 cache.
//! - `Probe`: reads probe batches into a chunk until it holds enough rows per build
//!   partition for partitioning them to pay (one batch when the table has a single
//!   partition), then joins the chunk: the kernel finds the `(build row, probe row)`
//!   pairs of equal non-NULL keys, they are put back in probe order where the join's
//!   output keeps it, the join's filter drops pairs, and the chunk's output (pairs,
//!   unmatched or matched probe rows, or probe rows with their mark, by join type) is
//!   queued in batches of the session's batch size. Build rows' matches are recorded
//!   for the join types that emit build rows by them.
//! - `Final`: after the last probe row, the build rows those join types emit
//!   (unmatched ones with NULLs, matched or unmatched ones alone, or all with their mark).
//! - `Done`.
//!
//! Queued batches are returned before the stream moves on, so at most one chunk's
//! output is held at a time.

use crate::flow::preserves_build;
use crate::join_filter::holds;
use crate::memory::collect_counted;
use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array, new_null_array,
};
use arrow::compute::{concat_batches, take};
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, JoinSide, JoinType, Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter, build_join_schema};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;
use gyre_join::radix::{RadixConfig, RadixHashTable};
use gyre_join::{JoinError, JoinPairs, Keys};
use std::collections::VecDeque;
use std::sync::Arc;

/// Probe rows a chunk should hold per build partition before it is joined: enough that
/// loading a build partition into cache (about 25K tuples with a 1 MiB L2) is paid for
/// by the probes it serves.
const PROBE_ROWS_PER_PARTITION: usize = 2048;
/// Largest probe chunk, in rows (its batches are held until it is joined).
const MAX_CHUNK_ROWS: usize = 1 << 20;
/// Pairs whose filter columns are gathered and evaluated at once.
const FILTER_PAIRS: usize = 1 << 16;

enum State {
    Build,
    Probe,
    Final,
    Done,
}

/// The prepared build partition.
struct Build {
    batch: RecordBatch,
    table: RadixHashTable,
    /// Which build rows matched (join types that emit build rows by it).
    matched: Option<Vec<bool>>,
    /// Probe rows joined at once.
    chunk_rows: usize,
}

struct Metrics {
    build_time: Time,
    join_time: Time,
    build_rows: Count,
    probe_rows: Count,
    output_rows: Count,
    partitions: Gauge,
}

/// Where an output batch's columns of one input come from.
enum Rows<'a> {
    /// Rows of `batch` by index (a NULL index gives NULLs).
    Take(&'a RecordBatch, &'a UInt32Array),
    /// No row of this input: NULLs.
    Nulls,
}

/// The output's shape and the batches queued for it.
struct Output {
    /// Output columns (after the join's projection) by input and column.
    columns: Vec<ColumnIndex>,
    schema: SchemaRef,
    batch_size: usize,
    queue: VecDeque<RecordBatch>,
}

pub(super) struct RadixJoinStream {
    state: State,
    build_input: Option<SendableRecordBatchStream>,
    probe_input: SendableRecordBatchStream,
    build_key: PhysicalExprRef,
    probe_key: PhysicalExprRef,
    join_type: JoinType,
    filter: Option<JoinFilter>,
    output: Output,
    /// Whether the output keeps the probe input's order (the hash join's does).
    ordered: bool,
    build: Option<Build>,
    chunk: Vec<RecordBatch>,
    chunk_rows: usize,
    chunk_bytes: usize,
    config: RadixConfig,
    reservation: MemoryReservation,
    metrics: Metrics,
}

fn kernel_err(e: JoinError) -> DataFusionError {
    DataFusionError::Execution(format!("radix join: {e}"))
}

impl RadixJoinStream {
    pub(super) fn start(
        hj: &HashJoinExec,
        partition: usize,
        context: Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<SendableRecordBatchStream> {
        let (left, right) = (hj.left().schema(), hj.right().schema());
        let all = build_join_schema(&left, &right, hj.join_type()).1;
        let columns = match &hj.projection {
            Some(p) => p.iter().map(|&i| all[i].clone()).collect(),
            None => all,
        };
        let m = || MetricBuilder::new(metrics);
        let (build_key, probe_key) = hj.on()[0].clone();
        let stream = RadixJoinStream {
            state: State::Build,
            build_input: Some(hj.left().execute(partition, Arc::clone(&context))?),
            probe_input: hj.right().execute(partition, Arc::clone(&context))?,
            build_key,
            probe_key,
            join_type: *hj.join_type(),
            filter: hj.filter().cloned(),
            output: Output {
                columns,
                schema: hj.schema(),
                batch_size: context.session_config().batch_size().max(1),
                queue: VecDeque::new(),
            },
            ordered: hj.properties().output_ordering().is_some(),
            build: None,
            chunk: vec![],
            chunk_rows: 0,
            chunk_bytes: 0,
            // One partition per worker runs on one thread, as DataFusion's join does.
            config: RadixConfig {
                threads: 1,
                ..RadixConfig::default()
            },
            reservation: MemoryConsumer::new(format!("RadixJoinExec[{partition}]"))
                .register(context.memory_pool()),
            metrics: Metrics {
                build_time: m().subset_time("build_time", partition),
                join_time: m().subset_time("join_time", partition),
                build_rows: m().counter("build_input_rows", partition),
                probe_rows: m().counter("input_rows", partition),
                output_rows: m().output_rows(partition),
                partitions: m().gauge("radix_partitions", partition),
            },
        };
        let schema = Arc::clone(&stream.output.schema);
        let batches = futures::stream::unfold(stream, |mut s| async move {
            match s.next_batch().await {
                Ok(Some(batch)) => Some((Ok(batch), s)),
                Ok(None) => None,
                Err(e) => {
                    s.state = State::Done;
                    s.output.queue.clear();
                    Some((Err(e), s))
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }

    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(batch) = self.output.queue.pop_front() {
                self.metrics.output_rows.add(batch.num_rows());
                return Ok(Some(batch));
            }
            match self.state {
                State::Build => {
                    self.build().await?;
                    self.state = State::Probe;
                }
                State::Probe => match self.probe_input.next().await {
                    Some(batch) => {
                        let batch = batch?;
                        if batch.num_rows() == 0 {
                            continue;
                        }
                        let bytes = batch.get_array_memory_size();
                        self.reservation.try_grow(bytes)?;
                        self.chunk_bytes += bytes;
                        self.chunk_rows += batch.num_rows();
                        self.chunk.push(batch);
                        let target = self.build.as_ref().map_or(1, |b| b.chunk_rows);
                        if self.chunk_rows >= target {
                            self.join_chunk()?;
                        }
                    }
                    None => {
                        if !self.chunk.is_empty() {
                            self.join_chunk()?;
                        }
                        self.state = State::Final;
                    }
                },
                State::Final => {
                    self.finish()?;
                    self.state = State::Done;
                }
                State::Done => return Ok(None),
            }
        }
    }

    /// Collects the build partition and builds its radix hash table.
    async fn build(&mut self) -> Result<()> {
        let Some(input) = self.build_input.take() else {
            return internal_err!("a radix join built twice");
        };
        let schema = input.schema();
        let batches = collect_counted(input, &self.reservation).await?;
        let _timer = self.metrics.build_time.timer();
        let batch = concat_batches(&schema, &batches)?;
        drop(batches);
        self.reservation.try_resize(batch.get_array_memory_size())?;
        let keys = self
            .build_key
            .evaluate(&batch)?
            .into_array(batch.num_rows())?;
        let keys = Keys::from_array(&keys).map_err(kernel_err)?;
        let table = RadixHashTable::build(&keys, &self.config).map_err(kernel_err)?;
        self.reservation.try_grow(table.memory_bytes())?;
        let partitions = 1usize << table.layout().partition_bits();
        self.metrics.build_rows.add(batch.num_rows());
        self.metrics.partitions.set(partitions);
        let chunk_rows = match partitions {
            1 => self.output.batch_size,
            p => (p * PROBE_ROWS_PER_PARTITION).clamp(self.output.batch_size, MAX_CHUNK_ROWS),
        };
        let matched = preserves_build(self.join_type).then(|| vec![false; batch.num_rows()]);
        if let Some(m) = &matched {
            self.reservation.try_grow(m.len())?;
        }
        self.build = Some(Build {
            batch,
            table,
            matched,
            chunk_rows,
        });
        Ok(())
    }

    /// Joins the buffered probe chunk and queues its output.
    fn join_chunk(&mut self) -> Result<()> {
        let _timer = self.metrics.join_time.timer();
        let chunk = std::mem::take(&mut self.chunk);
        let probe = match chunk.len() {
            1 => chunk.into_iter().next().expect("one batch"),
            _ => concat_batches(&self.probe_input.schema(), &chunk)?,
        };
        self.reservation
            .shrink(self.chunk_bytes.min(self.reservation.size()));
        self.chunk_bytes = 0;
        self.chunk_rows = 0;
        let rows = probe.num_rows();
        self.metrics.probe_rows.add(rows);
        let Some(build) = self.build.as_mut() else {
            return internal_err!("a radix join probed before it built");
        };
        let keys = self.probe_key.evaluate(&probe)?.into_array(rows)?;
        let keys = Keys::from_array(&keys).map_err(kernel_err)?;
        let mut pairs = build.table.probe(&keys, &self.config).map_err(kernel_err)?;
        drop(keys);
        let needs_order =
            self.ordered || matches!(self.join_type, JoinType::Right | JoinType::Full);
        if needs_order && !pairs.right.is_sorted() {
            pairs = sort_by_probe_row(pairs, rows);
        }
        if let Some(filter) = &self.filter {
            pairs = keep_where(filter, &build.batch, &probe, pairs)?;
        }
        if let Some(matched) = &mut build.matched {
            for &b in &pairs.left {
                matched[b as usize] = true;
            }
        }
        let build = self.build.as_ref().expect("built");
        let probe_matched = || {
            let mut m = vec![false; rows];
            for &p in &pairs.right {
                m[p as usize] = true;
            }
            m
        };
        match self.join_type {
            JoinType::Inner | JoinType::Left => {
                let (b, p) = pairs.into_arrow();
                self.output.queue_rows(
                    Rows::Take(&build.batch, &b),
                    Rows::Take(&probe, &p),
                    None,
                )?;
            }
            JoinType::Right | JoinType::Full => {
                let matched = probe_matched();
                let (b, p) = with_unmatched_probe_rows(pairs, &matched);
                self.output.queue_rows(
                    Rows::Take(&build.batch, &b),
                    Rows::Take(&probe, &p),
                    None,
                )?;
            }
            JoinType::RightSemi | JoinType::RightAnti => {
                let p = rows_where(&probe_matched(), self.join_type == JoinType::RightSemi);
                self.output
                    .queue_rows(Rows::Nulls, Rows::Take(&probe, &p), None)?;
            }
            JoinType::RightMark => {
                let mark = BooleanArray::from(probe_matched());
                let p: UInt32Array = (0..rows as u32).collect();
                self.output
                    .queue_rows(Rows::Nulls, Rows::Take(&probe, &p), Some(&mark))?;
            }
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {}
        }
        Ok(())
    }

    /// After the probe input: the build rows the join type emits by their matches.
    fn finish(&mut self) -> Result<()> {
        let Some(build) = self.build.take() else {
            return Ok(());
        };
        let Some(matched) = &build.matched else {
            return Ok(());
        };
        match self.join_type {
            JoinType::Left | JoinType::Full | JoinType::LeftAnti => {
                let b = rows_where(matched, false);
                self.output
                    .queue_rows(Rows::Take(&build.batch, &b), Rows::Nulls, None)?;
            }
            JoinType::LeftSemi => {
                let b = rows_where(matched, true);
                self.output
                    .queue_rows(Rows::Take(&build.batch, &b), Rows::Nulls, None)?;
            }
            JoinType::LeftMark => {
                let b: UInt32Array = (0..matched.len() as u32).collect();
                let mark = BooleanArray::from(matched.clone());
                self.output
                    .queue_rows(Rows::Take(&build.batch, &b), Rows::Nulls, Some(&mark))?;
            }
            _ => {}
        }
        self.reservation.free();
        Ok(())
    }
}

impl Output {
    /// Queues output rows `i` made of row `build[i]` and row `probe[i]` (and mark `i`),
    /// in batches of the batch size. Both index arrays (where given) and the mark have
    /// the output's length.
    fn queue_rows(
        &mut self,
        build: Rows<'_>,
        probe: Rows<'_>,
        mark: Option<&BooleanArray>,
    ) -> Result<()> {
        let rows = [&build, &probe]
            .iter()
            .find_map(|r| match r {
                Rows::Take(_, idx) => Some(idx.len()),
                Rows::Nulls => None,
            })
            .or(mark.map(|m| m.len()))
            .unwrap_or(0);
        let mut start = 0;
        while start < rows {
            let len = self.batch_size.min(rows - start);
            let columns = self
                .columns
                .iter()
                .enumerate()
                .map(|(out, ci)| {
                    let source = match ci.side {
                        JoinSide::Left => &build,
                        JoinSide::Right => &probe,
                        JoinSide::None => {
                            return match mark {
                                Some(m) => Ok(Arc::new(m.slice(start, len)) as ArrayRef),
                                None => internal_err!("a mark column without marks"),
                            };
                        }
                    };
                    Ok(match source {
                        Rows::Take(batch, idx) => take(
                            batch.column(ci.index).as_ref(),
                            &idx.slice(start, len),
                            None,
                        )?,
                        Rows::Nulls => new_null_array(self.schema.field(out).data_type(), len),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(len));
            self.queue.push_back(RecordBatch::try_new_with_options(
                Arc::clone(&self.schema),
                columns,
                &options,
            )?);
            start += len;
        }
        Ok(())
    }
}

/// The rows whose flag is `want`, in order.
fn rows_where(flags: &[bool], want: bool) -> UInt32Array {
    flags
        .iter()
        .enumerate()
        .filter(|(_, f)| **f == want)
        .map(|(r, _)| r as u32)
        .collect()
}

/// `pairs` ordered by probe row (a counting sort; the build rows of one probe row keep
/// their order).
fn sort_by_probe_row(pairs: JoinPairs, probe_rows: usize) -> JoinPairs {
    let mut start = vec![0u32; probe_rows + 1];
    for &p in &pairs.right {
        start[p as usize + 1] += 1;
    }
    for i in 1..start.len() {
        start[i] += start[i - 1];
    }
    let mut out = JoinPairs {
        left: vec![0; pairs.len()],
        right: vec![0; pairs.len()],
    };
    for (&b, &p) in pairs.left.iter().zip(&pairs.right) {
        let at = &mut start[p as usize];
        out.left[*at as usize] = b;
        out.right[*at as usize] = p;
        *at += 1;
    }
    out
}

/// The pairs and, for every probe row without one, that row with a NULL build index,
/// in probe order if the pairs are.
fn with_unmatched_probe_rows(pairs: JoinPairs, matched: &[bool]) -> (UInt32Array, UInt32Array) {
    let unmatched = matched.iter().filter(|m| !**m).count();
    let n = pairs.len() + unmatched;
    let mut build: Vec<Option<u32>> = Vec::with_capacity(n);
    let mut probe: Vec<u32> = Vec::with_capacity(n);
    let mut i = 0;
    for (row, &m) in matched.iter().enumerate() {
        if !m {
            build.push(None);
            probe.push(row as u32);
            continue;
        }
        while i < pairs.len() && pairs.right[i] as usize == row {
            build.push(Some(pairs.left[i]));
            probe.push(row as u32);
            i += 1;
        }
    }
    (UInt32Array::from(build), UInt32Array::from(probe))
}

/// The pairs for which the join's filter holds (NULL counts as false).
fn keep_where(
    filter: &JoinFilter,
    build: &RecordBatch,
    probe: &RecordBatch,
    pairs: JoinPairs,
) -> Result<JoinPairs> {
    let mut kept = JoinPairs::default();
    for (b, p) in pairs
        .left
        .chunks(FILTER_PAIRS)
        .zip(pairs.right.chunks(FILTER_PAIRS))
    {
        let (bi, pi) = (UInt32Array::from(b.to_vec()), UInt32Array::from(p.to_vec()));
        let columns = filter
            .column_indices()
            .iter()
            .map(|ci| match ci.side {
                JoinSide::Left => Ok(take(build.column(ci.index).as_ref(), &bi, None)?),
                JoinSide::Right => Ok(take(probe.column(ci.index).as_ref(), &pi, None)?),
                JoinSide::None => internal_err!("a join filter column of neither input"),
            })
            .collect::<Result<Vec<_>>>()?;
        for i in holds(filter, columns, b.len())?.set_indices() {
            kept.push(b[i], p[i]);
        }
    }
    Ok(kept)
}
