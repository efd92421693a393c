//! [`CycloJoinExec`]: one cyclo-join revolution per worker, as a DataFusion operator.
//!
//! Partition `i` runs on worker `i`. It reads its partition of both children (each input
//! stays partitioned as it comes, no shuffle), keeps the stationary input in place and
//! injects its part of the rotating input into the Data Roundabout; every fragment
//! passing the worker is joined with the stationary part by the kernel the planner chose
//! ([`CycloKernel`]), the matching rows are gathered into Arrow batches (stationary
//! columns with `take`, rotating columns from the fragment's words), the join's full
//! filter is applied, and the batches stream out while the ring keeps turning. After one
//! revolution every worker has emitted its share of the inner join.
//!
//! Outer, semi and anti joins ([`CycloJoinType`]) preserve or filter the *stationary*
//! input: every stationary row meets every rotating row exactly once, on its own worker,
//! so after the revolution the worker knows which of its rows matched (after the full
//! condition) and emits the unmatched ones (outer, anti) or the matched ones (semi).
//! A full outer join also needs the rotating rows no worker matched: the rotating rows
//! carry their row number around the ring, every worker marks the ones it matched per
//! origin, and after the revolution the marks go back to each origin (one message per
//! pair of workers), which emits its unmatched rotating rows.
//!
//! The ring uses [`EXCHANGES_PER_CYCLO_JOIN`] consecutive exchange ids, assigned by the
//! planner so that every worker opens the same streams.

use crate::context::{ExchangeId, QueryContext};
use crate::cyclo::kernel::CycloKernel;
use crate::cyclo::words::{RotatingLayout, key_array, key_type_supported, travels};
use crate::join_filter::holds;
use crate::memory::collect_counted;
use crate::network::{InputsAt, NetworkOperator};
use arrow::array::{
    ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array, new_null_array,
};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{concat_batches, take, take_record_batch};
use arrow::datatypes::{FieldRef, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{
    DataFusionError, JoinSide, JoinType, Result, ScalarValue, internal_datafusion_err,
    internal_err, plan_err,
};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::utils::{JoinFilter, build_join_schema};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_join::JoinPairs;
use gyre_join::Keys;
use gyre_join::cyclo::{
    CycloError, CycloOptions, FragmentView, PreparedCycloJoin, Relation, ResultSink, RingSpec,
    Rotate, agree, for_each_cross_chunk, scatter,
};
use gyre_transport::node_name;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Exchange ids one cyclo-join uses, from its first: the ring, the size agreement,
/// abort notices, a first size agreement that sizes fragments, and the full outer
/// join's matched rotating rows going back to their origins.
pub const EXCHANGES_PER_CYCLO_JOIN: u32 = 5;
/// Offset of the size agreement.
const AGREEMENT_EXCHANGE: u32 = 1;
/// Offset of the first size agreement, which sizes fragments of exploding kernels.
const SIZING_EXCHANGE: u32 = 3;
/// Offset of the exchange that returns matched rotating rows to their origins.
const MATCHES_EXCHANGE: u32 = 4;

/// All-NULL columns of `rows` rows for `fields` (the missing side of an outer join's row).
fn null_columns(fields: &[FieldRef], rows: usize) -> Vec<ArrayRef> {
    fields
        .iter()
        .map(|f| new_null_array(f.data_type(), rows))
        .collect()
}

/// Result pairs per fragment the inequality and all-pairs kernels are sized for: a
/// fragment holds at most this many rows divided by the largest stationary part.
const PAIRS_PER_FRAGMENT: u64 = 1 << 22;
/// Fragments never get smaller than this (so tiny fragments do not dominate).
const MIN_FRAGMENT_ROWS: usize = 64;
/// Rows per output batch.
const BATCH_ROWS: usize = 8192;
/// Output batches buffered between the join entity and the consumer.
const OUTPUT_QUEUE: usize = 16;

/// Which input of the join travels the ring: the join crate's input side, the one
/// enum for it.
pub use gyre_join::cyclo::Side as CycloSide;

/// What a cyclo-join returns. Outer, semi and anti joins preserve or filter the
/// stationary input (the rotating input's rows meet a different worker's rows at every
/// stop, so no worker alone can tell whether one of them matched); a full outer join
/// preserves both, its rotating side by returning matches to the rows' origins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CycloJoinType {
    /// Every matching pair.
    Inner,
    /// Every matching pair, plus each unmatched stationary row with NULLs.
    Outer,
    /// The stationary rows with at least one match (stationary columns only).
    Semi,
    /// The stationary rows without a match (stationary columns only).
    Anti,
    /// Every matching pair, plus each unmatched row of either input with NULLs.
    Full,
}

impl CycloJoinType {
    /// The cyclo-join for DataFusion's `join_type`, and the input that must rotate
    /// (`None`: either may); `None` if the join type cannot run on the ring (mark and
    /// null-aware joins).
    pub fn of(join_type: JoinType) -> Option<(Self, Option<CycloSide>)> {
        use CycloSide::{Left, Right};
        Some(match join_type {
            JoinType::Inner => (Self::Inner, None),
            JoinType::Left => (Self::Outer, Some(Right)),
            JoinType::LeftSemi => (Self::Semi, Some(Right)),
            JoinType::LeftAnti => (Self::Anti, Some(Right)),
            JoinType::Right => (Self::Outer, Some(Left)),
            JoinType::RightSemi => (Self::Semi, Some(Left)),
            JoinType::RightAnti => (Self::Anti, Some(Left)),
            JoinType::Full => (Self::Full, None),
            _ => return None,
        })
    }

    /// DataFusion's join type of this cyclo-join when `rotating` travels.
    pub fn join_type(self, rotating: CycloSide) -> JoinType {
        let stationary_left = rotating == CycloSide::Right;
        match (self, stationary_left) {
            (Self::Inner, _) => JoinType::Inner,
            (Self::Full, _) => JoinType::Full,
            (Self::Outer, true) => JoinType::Left,
            (Self::Outer, false) => JoinType::Right,
            (Self::Semi, true) => JoinType::LeftSemi,
            (Self::Semi, false) => JoinType::RightSemi,
            (Self::Anti, true) => JoinType::LeftAnti,
            (Self::Anti, false) => JoinType::RightAnti,
        }
    }

    /// Whether matching pairs are part of the output.
    fn emits_pairs(self) -> bool {
        matches!(self, Self::Inner | Self::Outer | Self::Full)
    }

    /// Whether unmatched stationary rows are part of the output (with NULLs).
    fn preserves_stationary(self) -> bool {
        matches!(self, Self::Outer | Self::Full)
    }

    /// Whether unmatched rotating rows are part of the output (with NULLs).
    fn preserves_rotating(self) -> bool {
        self == Self::Full
    }
}

/// A join run as a cyclo-join over all workers of the query.
#[derive(Debug)]
pub struct CycloJoinExec {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    /// Key column of each input (unused by [`CycloKernel::AllPairs`]).
    left_key: usize,
    right_key: usize,
    kernel: CycloKernel,
    /// The join's condition, applied to every pair the kernel found.
    filter: Option<JoinFilter>,
    rotating: CycloSide,
    join_type: CycloJoinType,
    /// First of the [`EXCHANGES_PER_CYCLO_JOIN`] exchange ids (set by the stage splitter).
    exchange: Option<ExchangeId>,
    unsigned_keys: bool,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CycloJoinExec {
    /// Checks that the inputs suit the kernel: integer keys of one domain, a rotating
    /// input whose columns can travel the ring, equal partition counts.
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        left_key: usize,
        right_key: usize,
        kernel: CycloKernel,
        filter: Option<JoinFilter>,
        rotating: CycloSide,
        join_type: CycloJoinType,
        exchange: Option<ExchangeId>,
    ) -> Result<Self> {
        let (ls, rs) = (left.schema(), right.schema());
        let mut unsigned_keys = false;
        if kernel.uses_keys() {
            let (Some(lf), Some(rf)) = (ls.fields().get(left_key), rs.fields().get(right_key))
            else {
                return plan_err!("cyclo-join key column out of range");
            };
            let (lu, ru) = (
                key_type_supported(lf.data_type()),
                key_type_supported(rf.data_type()),
            );
            match (lu, ru) {
                (Some(a), Some(b)) if a == b => unsigned_keys = a,
                _ => {
                    return plan_err!(
                        "cyclo-join cannot join keys of types {} and {}",
                        lf.data_type(),
                        rf.data_type()
                    );
                }
            }
        }
        let rot_schema = match rotating {
            CycloSide::Left => &ls,
            CycloSide::Right => &rs,
        };
        if let Some(f) = rot_schema.fields().iter().find(|f| !travels(f.data_type())) {
            return plan_err!(
                "the rotating input of a cyclo-join cannot carry column {} of type {}",
                f.name(),
                f.data_type()
            );
        }
        let n = left.output_partitioning().partition_count();
        if right.output_partitioning().partition_count() != n {
            return plan_err!(
                "cyclo-join inputs have {} and {} partitions",
                n,
                right.output_partitioning().partition_count()
            );
        }
        let schema = Arc::new(build_join_schema(&ls, &rs, &join_type.join_type(rotating)).0);
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            left,
            right,
            left_key,
            right_key,
            kernel,
            filter,
            rotating,
            join_type,
            exchange,
            unsigned_keys,
            schema,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The same join on the ring whose first exchange id is `exchange`.
    pub fn with_exchange(&self, exchange: ExchangeId) -> Result<Self> {
        Self::try_new(
            Arc::clone(&self.left),
            Arc::clone(&self.right),
            self.left_key,
            self.right_key,
            self.kernel,
            self.filter.clone(),
            self.rotating,
            self.join_type,
            Some(exchange),
        )
    }

    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        &self.left
    }
    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        &self.right
    }
    pub fn keys(&self) -> (usize, usize) {
        (self.left_key, self.right_key)
    }
    pub fn kernel(&self) -> CycloKernel {
        self.kernel
    }
    pub fn filter(&self) -> Option<&JoinFilter> {
        self.filter.as_ref()
    }
    pub fn rotating(&self) -> CycloSide {
        self.rotating
    }
    pub fn join_type(&self) -> CycloJoinType {
        self.join_type
    }
    pub fn exchange(&self) -> Option<ExchangeId> {
        self.exchange
    }
}

impl DisplayAs for CycloJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "CycloJoinExec: kernel={}", self.kernel)?;
        if self.join_type != CycloJoinType::Inner {
            write!(f, ", join_type={}", self.join_type.join_type(self.rotating))?;
        }
        if self.kernel.uses_keys() {
            write!(
                f,
                ", on=({}, {})",
                self.left.schema().field(self.left_key).name(),
                self.right.schema().field(self.right_key).name()
            )?;
        }
        if let Some(filter) = &self.filter {
            write!(f, ", filter={filter}")?;
        }
        write!(f, ", rotating={} input", self.rotating)?;
        if let Some(e) = self.exchange {
            write!(
                f,
                ", ring exchanges={e}..{}",
                e + EXCHANGES_PER_CYCLO_JOIN - 1
            )?;
        }
        Ok(())
    }
}

struct CycloMetrics {
    setup: Time,
    join: Time,
    sync: Time,
    ring: Time,
    transmit_wait: Time,
    fragments_joined: Count,
    rotating_rows: Count,
    stationary_rows: Count,
    bytes_sent: Count,
    output_rows: Count,
}

impl CycloMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let m = || MetricBuilder::new(set);
        Self {
            setup: m().subset_time("setup_time", partition),
            join: m().subset_time("join_time", partition),
            sync: m().subset_time("sync_time", partition),
            ring: m().subset_time("ring_time", partition),
            transmit_wait: m().subset_time("transmit_wait", partition),
            fragments_joined: m().counter("fragments_joined", partition),
            rotating_rows: m().counter("rotating_rows", partition),
            stationary_rows: m().counter("stationary_rows", partition),
            bytes_sent: m().counter("ring_bytes_sent", partition),
            output_rows: m().output_rows(partition),
        }
    }
}

fn cyclo_err(me: gyre_transport::NodeId) -> impl Fn(CycloError) -> DataFusionError {
    move |e| DataFusionError::Execution(format!("cyclo-join on {}: {e}", node_name(me)))
}

/// One input, whole, in one batch; its memory counted against the worker's pool as it
/// arrives (a query whose input does not fit fails with "Resources exhausted" naming
/// the cyclo-join, instead of the process running out of memory).
async fn collect(
    mut stream: SendableRecordBatchStream,
    reservation: &MemoryReservation,
) -> Result<RecordBatch> {
    let schema = stream.schema();
    let before = reservation.size();
    let batches = collect_counted(&mut stream, reservation).await?;
    let pieces = reservation.size() - before;
    let whole = concat_batches(&schema, &batches)?;
    // The copy is held beside the pieces until they go.
    reservation.try_grow(whole.get_array_memory_size())?;
    drop(batches);
    reservation.shrink(pieces);
    Ok(whole)
}

/// What one partition's task needs.
struct Job {
    left_key: usize,
    right_key: usize,
    kernel: CycloKernel,
    filter: Option<JoinFilter>,
    rotating: CycloSide,
    join_type: CycloJoinType,
    exchange: ExchangeId,
    unsigned_keys: bool,
    schema: SchemaRef,
    /// What the partition holds, counted against the worker's memory pool.
    memory: MemoryReservation,
}

impl Job {
    fn keys_of(&self, batch: &RecordBatch, column: usize) -> Result<ArrayRef> {
        if self.kernel.uses_keys() {
            key_array(batch.column(column), self.unsigned_keys)
        } else {
            // All pairs: one key for every row, none NULL.
            Ok(Arc::new(UInt64Array::from(vec![0u64; batch.num_rows()])))
        }
    }

    async fn run(
        self,
        partition: usize,
        qc: Arc<QueryContext>,
        left: SendableRecordBatchStream,
        right: SendableRecordBatchStream,
        tx: mpsc::Sender<Result<RecordBatch>>,
        metrics: CycloMetrics,
    ) -> Result<()> {
        let memory = &self.memory;
        let me = qc.me();
        if qc.workers.get(partition) != Some(&me) {
            return internal_err!(
                "cyclo-join partition {partition} runs on {}, not on its worker",
                node_name(me)
            );
        }
        let err = cyclo_err(me);
        let (left_memory, right_memory) = (memory.new_empty(), memory.new_empty());
        let (left, right) =
            futures::try_join!(collect(left, &left_memory), collect(right, &right_memory))?;
        let (rot, stat, rot_key, stat_key) = match self.rotating {
            CycloSide::Left => (left, right, self.left_key, self.right_key),
            CycloSide::Right => (right, left, self.right_key, self.left_key),
        };
        let rot_key_array = self.keys_of(&rot, rot_key)?;
        let stat_key_array = self.keys_of(&stat, stat_key)?;
        let key_err = |e: gyre_join::JoinError| err(CycloError::Join(e));
        let layout = RotatingLayout::new(rot.schema().fields())?;
        let mut encoded = layout.encode(&rot)?;
        // The rotating rows' words, held until the revolution ends.
        memory.try_grow(encoded.words.iter().map(|w| w.len() * 8).sum())?;
        if self.join_type.preserves_rotating() {
            // The row numbers travel with the rows, to report matches to the origin.
            encoded.words.push((0..rot.num_rows() as u64).collect());
        }
        let rot_rel = Relation {
            keys: Keys::from_array(rot_key_array.as_ref()).map_err(key_err)?,
            payload: encoded.words.iter().map(Vec::as_slice).collect(),
            bytes: encoded.byte_columns(),
        };
        let stat_rel = Relation {
            keys: Keys::from_array(stat_key_array.as_ref()).map_err(key_err)?,
            payload: vec![],
            bytes: vec![],
        };
        let (left_rel, right_rel, rotate) = match self.rotating {
            CycloSide::Left => (&rot_rel, &stat_rel, Rotate::Left),
            CycloSide::Right => (&stat_rel, &rot_rel, Rotate::Right),
        };
        let algorithm = self.kernel.algorithm();
        let mut options = CycloOptions {
            rotate,
            ..CycloOptions::default()
        };
        let ring = RingSpec {
            nodes: qc.workers.clone(),
            index: partition,
            query: qc.query_id,
            exchange: self.exchange,
        };
        let t = qc.transport.as_ref();
        if self.kernel.may_explode() {
            // Size fragments so that one fragment's result stays bounded on every worker.
            let sizing = self.exchange + SIZING_EXCHANGE;
            let probe = agree(t, &ring, sizing, left_rel, right_rel, &algorithm, &options)
                .await
                .map_err(&err)?;
            options.max_fragment_rows = ((PAIRS_PER_FRAGMENT / probe.largest_stationary.max(1))
                as usize)
                .max(MIN_FRAGMENT_ROWS);
        }
        let agreement = self.exchange + AGREEMENT_EXCHANGE;
        let plan = agree(
            t, &ring, agreement, left_rel, right_rel, &algorithm, &options,
        )
        .await
        .map_err(&err)?;
        let prepared = PreparedCycloJoin::prepare(&plan, left_rel, right_rel, &algorithm, &options)
            .map_err(&err)?;
        metrics.stationary_rows.add(stat.num_rows());
        metrics.rotating_rows.add(rot.num_rows());
        let matched =
            (self.join_type != CycloJoinType::Inner).then(|| vec![false; stat.num_rows()]);
        let sink = BatchSink {
            tx,
            layout,
            rotating_matched: self
                .join_type
                .preserves_rotating()
                .then(|| vec![Vec::new(); ring.len()]),
            stationary: stat,
            rotating: self.rotating,
            join_type: self.join_type,
            schema: self.schema,
            filter: self.filter,
            matched,
            consumer_gone: false,
            output_rows: metrics.output_rows.clone(),
        };
        let (figures, mut sink) = prepared.run(t, &ring, sink).await.map_err(&err)?;
        let rotating_matched = match sink.rotating_matched.take() {
            // Before emitting anything, so that no peer waits on this node's consumer.
            Some(marks) => Some(
                scatter(t, &ring, self.exchange + MATCHES_EXCHANGE, marks)
                    .await
                    .map_err(&err)?,
            ),
            None => None,
        };
        if sink.finish().await?
            && let Some(marks) = rotating_matched
        {
            sink.finish_rotating(&rot, &marks).await?;
        }
        metrics.setup.add_duration(figures.setup.total());
        metrics.join.add_duration(figures.ring.join);
        metrics.sync.add_duration(figures.ring.sync);
        metrics.ring.add_duration(figures.ring.elapsed);
        metrics
            .transmit_wait
            .add_duration(figures.ring.transmit_wait);
        metrics
            .fragments_joined
            .add(figures.ring.fragments_joined as usize);
        metrics.bytes_sent.add(figures.ring.bytes_sent as usize);
        Ok(())
    }
}

/// Turns a worker's result pairs into output batches on the join entity's thread.
struct BatchSink {
    tx: mpsc::Sender<Result<RecordBatch>>,
    /// Where the rotating columns are in a fragment.
    layout: RotatingLayout,
    stationary: RecordBatch,
    rotating: CycloSide,
    join_type: CycloJoinType,
    schema: SchemaRef,
    filter: Option<JoinFilter>,
    /// Which stationary rows matched (outer, semi and anti joins).
    matched: Option<Vec<bool>>,
    /// Full outer joins: per origin, a bitmap of its rotating rows matched here.
    rotating_matched: Option<Vec<Vec<u64>>>,
    /// The consumer stopped reading (it had enough rows, a LIMIT): nothing more is
    /// built, but the ring still needs this worker to forward fragments and, on a
    /// full outer join, to report which rotating rows it matched.
    consumer_gone: bool,
    output_rows: Count,
}

impl BatchSink {
    /// Whether nothing more needs doing for passing fragments: the consumer left and no
    /// peer waits for this worker's matches of rotating rows.
    fn idle(&self) -> bool {
        self.consumer_gone && self.rotating_matched.is_none()
    }

    /// The pairs of one result chunk that satisfy the join's condition (evaluated on the
    /// condition's columns only, so that only passing pairs are gathered in full).
    fn keep(
        &self,
        fragment: &FragmentView<'_>,
        fragment_rows: &[u32],
        stationary_rows: &[u32],
    ) -> Result<Option<(Vec<u32>, Vec<u32>)>> {
        let Some(f) = &self.filter else {
            return Ok(None);
        };
        let mask = self.filter_mask(f, fragment, fragment_rows, stationary_rows)?;
        Ok(Some(
            mask.set_indices()
                .map(|i| (fragment_rows[i], stationary_rows[i]))
                .unzip(),
        ))
    }

    /// Result pairs `(f_rows[i], s_rows[i])` that satisfy the whole condition: marks
    /// their stationary (and rotating) rows as matched and sends their output rows.
    fn accept(
        &mut self,
        fragment: &FragmentView<'_>,
        f_rows: &[u32],
        s_rows: &[u32],
    ) -> Result<()> {
        if let Some(matched) = &mut self.matched {
            for &s in s_rows {
                matched[s as usize] = true;
            }
        }
        if let Some(marks) = &mut self.rotating_matched {
            let Some(bits) = marks.get_mut(fragment.origin() as usize) else {
                return internal_err!("a fragment from ring position {}", fragment.origin());
            };
            let ids = fragment.payload(self.layout.payload_words());
            for &f in f_rows {
                let id = ids[f as usize] as usize;
                if id >= gyre_join::MAX_ROWS {
                    return internal_err!(
                        "a fragment from ring position {} names row {id}",
                        fragment.origin()
                    );
                }
                if bits.len() <= id / 64 {
                    bits.resize(id / 64 + 1, 0);
                }
                bits[id / 64] |= 1 << (id % 64);
            }
        }
        if f_rows.is_empty() || !self.join_type.emits_pairs() || self.consumer_gone {
            return Ok(());
        }
        let batch = self.build(fragment, f_rows, s_rows)?;
        self.output_rows.add(batch.num_rows());
        if self.tx.blocking_send(Ok(batch)).is_err() {
            self.consumer_gone = true;
        }
        Ok(())
    }

    /// Checks that a fragment has the rotating layout's words.
    fn check(&self, fragment: &FragmentView<'_>) -> Result<()> {
        self.layout
            .check(fragment, usize::from(self.rotating_matched.is_some()))
    }

    /// Every fragment row with every stationary row `stationary`: the condition is
    /// evaluated one row of the smaller side against all rows of the other (that row's
    /// values repeated), as DataFusion's nested-loop join does, instead of first listing
    /// and gathering every pair. Returns the pairs kept.
    fn cross(&mut self, fragment: &FragmentView<'_>, stationary: &[u32]) -> Result<u64> {
        self.check(fragment)?;
        let Some(filter) = self.filter.clone() else {
            // No condition: every pair is a result.
            for_each_cross_chunk(fragment.rows(), stationary, BATCH_ROWS, |pairs| {
                self.accept(fragment, &pairs.left, &pairs.right)
            })?;
            return Ok((fragment.rows() * stationary.len()) as u64);
        };
        let all_fragment_rows: Vec<u32> = (0..fragment.rows() as u32).collect();
        let rotating_side = self.rotating_side();
        // The condition's columns over all rows of their side.
        let stationary_idx = (stationary.len() != self.stationary.num_rows())
            .then(|| UInt32Array::from(stationary.to_vec()));
        let columns = filter
            .column_indices()
            .iter()
            .map(|ci| match ci.side {
                JoinSide::None => internal_err!("a join filter column of neither input"),
                side if side == rotating_side => Ok((
                    true,
                    self.layout.decode(fragment, ci.index, &all_fragment_rows)?,
                )),
                _ => {
                    let c = self.stationary.column(ci.index);
                    Ok((
                        false,
                        match &stationary_idx {
                            Some(idx) => take(c.as_ref(), idx, None)?,
                            None => Arc::clone(c),
                        },
                    ))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let outer_rotating = fragment.rows() <= stationary.len();
        let (outer, inner) = match outer_rotating {
            true => (fragment.rows(), stationary.len()),
            false => (stationary.len(), fragment.rows()),
        };
        let (mut f_rows, mut s_rows) = (Vec::new(), Vec::new());
        let mut kept = 0u64;
        for o in 0..outer {
            if self.idle() {
                break;
            }
            let arrays = columns
                .iter()
                .map(|(rotating, a)| match *rotating == outer_rotating {
                    true => ScalarValue::try_from_array(a, o)?.to_array_of_size(inner),
                    false => Ok(Arc::clone(a)),
                })
                .collect::<Result<Vec<_>>>()?;
            for i in holds(&filter, arrays, inner)?.set_indices() {
                let (f, s) = if outer_rotating { (o, i) } else { (i, o) };
                f_rows.push(f as u32);
                s_rows.push(stationary[s]);
            }
            if f_rows.len() >= BATCH_ROWS {
                kept += f_rows.len() as u64;
                self.accept(fragment, &f_rows, &s_rows)?;
                f_rows.clear();
                s_rows.clear();
            }
        }
        kept += f_rows.len() as u64;
        self.accept(fragment, &f_rows, &s_rows)?;
        Ok(kept)
    }

    fn rotating_side(&self) -> JoinSide {
        match self.rotating {
            CycloSide::Left => JoinSide::Left,
            CycloSide::Right => JoinSide::Right,
        }
    }

    /// Where `filter` holds on the pairs `(fragment_rows[i], stationary_rows[i])`.
    fn filter_mask(
        &self,
        filter: &JoinFilter,
        fragment: &FragmentView<'_>,
        fragment_rows: &[u32],
        stationary_rows: &[u32],
    ) -> Result<BooleanBuffer> {
        let rotating = self.rotating_side();
        let idx = UInt32Array::from(stationary_rows.to_vec());
        let columns = filter
            .column_indices()
            .iter()
            .map(|ci| match ci.side {
                JoinSide::None => internal_err!("a join filter column of neither input"),
                side if side == rotating => self.layout.decode(fragment, ci.index, fragment_rows),
                _ => Ok(take(self.stationary.column(ci.index).as_ref(), &idx, None)?),
            })
            .collect::<Result<Vec<_>>>()?;
        holds(filter, columns, fragment_rows.len())
    }

    /// After the revolution: the unmatched stationary rows with NULLs (outer), the
    /// matched ones (semi) or the unmatched ones (anti). False if the consumer went
    /// away (nothing more to emit).
    async fn finish(&self) -> Result<bool> {
        if self.consumer_gone {
            return Ok(false);
        }
        let Some(matched) = &self.matched else {
            return Ok(true);
        };
        let want = self.join_type == CycloJoinType::Semi;
        let rows: Vec<u32> = (0..matched.len() as u32)
            .filter(|&r| matched[r as usize] == want)
            .collect();
        for chunk in rows.chunks(BATCH_ROWS) {
            // Semi and anti joins return the stationary columns only.
            let rotating: Vec<ArrayRef> = if self.join_type.preserves_stationary() {
                null_columns(self.layout.fields(), chunk.len())
            } else {
                vec![]
            };
            let batch = self.assemble(rotating, chunk)?;
            if !self.emit(batch).await {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// After the revolution, on a full outer join: this worker's rotating rows (`rot`,
    /// its own part) that no worker matched, with NULLs. `marks[w]` is the bitmap of
    /// the rows worker `w` matched.
    async fn finish_rotating(&self, rot: &RecordBatch, marks: &[Vec<u64>]) -> Result<()> {
        let rows = rot.num_rows();
        let mut matched = vec![0u64; rows.div_ceil(64)];
        for bits in marks {
            if bits.len() > matched.len() {
                return internal_err!(
                    "matches reported for {} rotating rows, this worker has {rows}",
                    bits.len() * 64
                );
            }
            matched.iter_mut().zip(bits).for_each(|(m, b)| *m |= b);
        }
        let unmatched: Vec<u32> = (0..rows as u32)
            .filter(|&r| matched[r as usize / 64] & (1 << (r % 64)) == 0)
            .collect();
        for chunk in unmatched.chunks(BATCH_ROWS) {
            let rotating = take_record_batch(rot, &UInt32Array::from(chunk.to_vec()))?;
            let stationary = null_columns(self.stationary.schema().fields(), chunk.len());
            let batch = self.combine(rotating.columns().to_vec(), stationary, chunk.len())?;
            if !self.emit(batch).await {
                break;
            }
        }
        Ok(())
    }

    /// Sends an output batch; false if the consumer went away.
    async fn emit(&self, batch: RecordBatch) -> bool {
        self.output_rows.add(batch.num_rows());
        self.tx.send(Ok(batch)).await.is_ok()
    }

    /// The output batch of the pairs `(fragment_rows[i], stationary_rows[i])`.
    fn build(
        &self,
        fragment: &FragmentView<'_>,
        fragment_rows: &[u32],
        stationary_rows: &[u32],
    ) -> Result<RecordBatch> {
        let rotating = (0..self.layout.fields().len())
            .map(|c| self.layout.decode(fragment, c, fragment_rows))
            .collect::<Result<Vec<_>>>()?;
        self.assemble(rotating, stationary_rows)
    }

    /// An output batch: `rotating` columns next to the stationary rows `rows`, in the
    /// join's column order (an outer join's other input is nullable: same arrays).
    fn assemble(&self, rotating: Vec<ArrayRef>, rows: &[u32]) -> Result<RecordBatch> {
        let idx = UInt32Array::from(rows.to_vec());
        let stationary = self
            .stationary
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.combine(rotating, stationary, rows.len())
    }

    /// An output batch of `rows` rows from both inputs' columns, in the join's order.
    fn combine(
        &self,
        rotating: Vec<ArrayRef>,
        stationary: Vec<ArrayRef>,
        rows: usize,
    ) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = match self.rotating {
            CycloSide::Left => rotating.into_iter().chain(stationary).collect(),
            CycloSide::Right => stationary.into_iter().chain(rotating).collect(),
        };
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}

impl ResultSink for BatchSink {
    fn consume(
        &mut self,
        fragment: &FragmentView<'_>,
        pairs: &JoinPairs,
    ) -> std::result::Result<(), CycloError> {
        if self.idle() {
            return Ok(());
        }
        let sink_err = |e: DataFusionError| CycloError::Sink(e.to_string());
        self.check(fragment).map_err(sink_err)?;
        for (f_rows, s_rows) in pairs
            .left
            .chunks(BATCH_ROWS)
            .zip(pairs.right.chunks(BATCH_ROWS))
        {
            let kept = self.keep(fragment, f_rows, s_rows).map_err(sink_err)?;
            let (f, s) = match &kept {
                Some((f, s)) => (f.as_slice(), s.as_slice()),
                None => (f_rows, s_rows),
            };
            self.accept(fragment, f, s).map_err(sink_err)?;
        }
        Ok(())
    }

    fn consume_cross(
        &mut self,
        fragment: &FragmentView<'_>,
        stationary: &[u32],
    ) -> std::result::Result<u64, CycloError> {
        if self.idle() {
            return Ok(0);
        }
        self.cross(fragment, stationary)
            .map_err(|e| CycloError::Sink(e.to_string()))
    }
}

impl NetworkOperator for CycloJoinExec {
    fn exchanges(&self) -> u32 {
        EXCHANGES_PER_CYCLO_JOIN
    }

    /// Both inputs stay where they are, partition `i` on worker `i`; the ring moves one.
    fn inputs_at(&self) -> InputsAt {
        InputsAt::PlacedOnWorkers
    }

    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_exchange(first)?))
    }
}

impl ExecutionPlan for CycloJoinExec {
    fn name(&self) -> &'static str {
        "CycloJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left, &self.right]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        match &self.filter {
            Some(filter) => f(filter.expression()),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [left, right] = <[_; 2]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a cyclo-join has two children"))?;
        Ok(Arc::new(Self::try_new(
            left,
            right,
            self.left_key,
            self.right_key,
            self.kernel,
            self.filter.clone(),
            self.rotating,
            self.join_type,
            self.exchange,
        )?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let qc = QueryContext::of(&context)?;
        let Some(exchange) = self.exchange else {
            return internal_err!("a cyclo-join ran without ring exchange ids");
        };
        let context_pool = Arc::clone(context.memory_pool());
        let left = self.left.execute(partition, Arc::clone(&context))?;
        let right = self.right.execute(partition, context)?;
        let job = Job {
            left_key: self.left_key,
            right_key: self.right_key,
            kernel: self.kernel,
            filter: self.filter.clone(),
            rotating: self.rotating,
            join_type: self.join_type,
            exchange,
            unsigned_keys: self.unsigned_keys,
            schema: Arc::clone(&self.schema),
            memory: MemoryConsumer::new(format!("CycloJoinExec[{partition}]"))
                .register(&context_pool),
        };
        let metrics = CycloMetrics::new(&self.metrics, partition);
        let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
        let task = tokio::spawn({
            let tx = tx.clone();
            async move {
                if let Err(e) = job
                    .run(partition, qc, left, right, tx.clone(), metrics)
                    .await
                {
                    let _ = tx.send(Err(e)).await;
                }
            }
        });
        drop(tx);
        // Not aborted when the stream is dropped: a consumer that has enough rows (a
        // LIMIT) stops reading, but the other workers' fragments still have to pass
        // through this one. The task ends with its revolution, or when the query is
        // released (the transport then fails its endpoints).
        drop(task);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            ReceiverStream::new(rx),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
