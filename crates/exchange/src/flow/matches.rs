//! Joins whose preserved side's rows can be joined on several workers under Flow-Join.
//!
//! A heavy build row (probe-side skew) is broadcast and joined on every worker, and so
//! is a probe row whose key is heavy on the build side (build-side skew); Symmetric
//! Fragment Replicate sends the build and probe rows of keys heavy on both sides to
//! several workers. Whether such a row matched is known only by combining all
//! workers' joins (thesis §4.3: unmatched and semi results must be redistributed).
//! The side whose rows are preserved therefore numbers its rows (an id: the owner or
//! origin, and its row number there), and the joins that see those rows run as a
//! counterpart that reports matches instead of deciding alone:
//!
//! - build side tracked (left and full outer, left semi/anti/mark; every build row is
//!   numbered, with SFR the kept rows of build-heavy keys too, in a range of their
//!   own): left outer runs as inner and full outer as right outer, left semi, anti
//!   and mark as left semi projected to the id;
//! - probe side tracked (right and full outer, right semi/anti/mark; only the probe
//!   rows broadcast for build-heavy keys or set aside for SFR are numbered, and only
//!   the joins of those keys run as a counterpart): right outer runs as inner and full
//!   outer as left outer (the build rows there are decided locally), right semi, anti
//!   and mark as right semi projected to the id;
//! - both (full joins with SFR, in the joins of build-heavy keys): inner, carrying
//!   both ids ([`Shape::join_both_tracked`]).
//!
//! Outer joins' matched pairs (and the rows the counterpart decides itself) stream out
//! as they are found, with the id dropped. Each worker records the ids its joins
//! matched in one bitmap per owner, and sends the other owners theirs once its joins
//! are done. Each worker then emits its own tracked rows by their
//! combined state: unmatched ones padded with NULLs (outer), matched ones (semi),
//! unmatched ones (anti), or all with the match as the mark (mark).

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
    new_null_array,
};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{JoinType, Result, internal_datafusion_err};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
use std::sync::Arc;

/// Name of the row id column appended to the tracked side.
const ROW_ID: &str = "__gyre_row_id";

/// Bits of a row id below the owner's index.
const OWNER_SHIFT: u32 = 48;

/// Bit of a row number marking a build row its worker kept for being heavy on the
/// build side: those are numbered apart from the worker's build partition, since SFR
/// replicates them to other workers ([`RowIds::kept`]).
const KEPT_ROW: u64 = 1 << (OWNER_SHIFT - 1);

/// A row id's owner (worker index) and row number there.
fn split(id: u64) -> (u64, u64) {
    (id >> OWNER_SHIFT, id & ((1u64 << OWNER_SHIFT) - 1))
}

fn row_id_field() -> Field {
    Field::new(ROW_ID, DataType::UInt64, false)
}

/// The schema of the row ids workers report to the rows' owners.
pub(super) fn row_id_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![row_id_field()]))
}

/// A column of row ids, as the counterpart joins and the peers' reports carry them;
/// `what` names it in the error.
fn as_ids<'a>(array: &'a dyn Array, what: &str) -> Result<&'a UInt64Array> {
    array
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or_else(|| internal_datafusion_err!("{what} are not UInt64"))
}

/// The join input whose rows carry ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tracked {
    Build,
    Probe,
}

/// How a join type's rows of one side are decided when some of them are joined on
/// several workers; `None` when the join type does not preserve that side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tracking {
    /// Outer joins: pairs stream out, unmatched rows come at the end.
    Outer,
    /// Semi, anti and mark joins: rows come at the end by their match state.
    Rows,
}

impl Tracking {
    /// Build-preserving join types: left and full outer, left semi/anti/mark.
    pub(crate) fn of_build(join_type: JoinType) -> Option<Self> {
        match join_type {
            JoinType::Left | JoinType::Full => Some(Self::Outer),
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => Some(Self::Rows),
            _ => None,
        }
    }

    /// Probe-preserving join types: right and full outer, right semi/anti/mark.
    pub(crate) fn of_probe(join_type: JoinType) -> Option<Self> {
        match join_type {
            JoinType::Right | JoinType::Full => Some(Self::Outer),
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => Some(Self::Rows),
            _ => None,
        }
    }

    /// The join each worker runs instead: its output shows which tracked rows matched.
    /// The other side's rows in it are decided there (a full join's counterpart keeps
    /// them outer).
    fn counterpart(self, side: Tracked, join_type: JoinType) -> JoinType {
        match (self, side, join_type) {
            (Self::Outer, Tracked::Build, JoinType::Full) => JoinType::Right,
            (Self::Outer, Tracked::Probe, JoinType::Full) => JoinType::Left,
            (Self::Outer, _, _) => JoinType::Inner,
            (Self::Rows, Tracked::Build, _) => JoinType::LeftSemi,
            (Self::Rows, Tracked::Probe, _) => JoinType::RightSemi,
        }
    }
}

/// A schema with the row id appended.
pub(super) fn with_row_id(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(row_id_field()));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Numbers one worker's tracked rows from 0, in the order its batches come.
#[derive(Debug)]
pub(super) struct RowIds {
    base: u64,
    next: u64,
    /// The schema with the row id.
    schema: SchemaRef,
}

impl RowIds {
    pub(super) fn new(worker: usize, schema: SchemaRef) -> Self {
        Self {
            base: (worker as u64) << OWNER_SHIFT,
            next: 0,
            schema,
        }
    }

    /// Numbers the build rows `worker` kept for being heavy on the build side, in an id
    /// range of their own.
    pub(super) fn kept(worker: usize, schema: SchemaRef) -> Self {
        Self {
            base: ((worker as u64) << OWNER_SHIFT) | KEPT_ROW,
            next: 0,
            schema,
        }
    }

    /// `batch` with the next row ids appended.
    pub(super) fn number(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = batch.num_rows() as u64;
        let (base, next) = (self.base, self.next);
        let ids = UInt64Array::from_iter_values((next..next + rows).map(|r| base | r));
        self.next += rows;
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(ids));
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

/// Appends the row ids of `owner`'s build partition to its batches, numbering rows
/// from 0 in order.
pub(super) fn number_rows(
    owner: usize,
    batches: &[RecordBatch],
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let mut ids = RowIds::new(owner, Arc::clone(schema));
    batches.iter().map(|b| ids.number(b)).collect()
}

/// What the original join's output looks like, to shape the counterpart's rows and the
/// tracked rows emitted at the end.
#[derive(Debug)]
pub(super) struct Shape {
    side: Tracked,
    tracking: Tracking,
    join_type: JoinType,
    build_types: Vec<DataType>,
    probe_types: Vec<DataType>,
    projection: Option<Arc<[usize]>>,
    /// The original join's output schema.
    schema: SchemaRef,
}

/// `hj` as `join_type` with `projection` over `build` and `probe`, without a fetch limit
/// (a counterpart must see every match).
fn rebuilt(
    hj: &HashJoinExec,
    join_type: JoinType,
    projection: Vec<usize>,
    build: Arc<dyn ExecutionPlan>,
    probe: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    hj.builder()
        .with_type(join_type)
        .with_projection(Some(projection))
        .with_fetch(None)
        .with_new_children(vec![build, probe])?
        .build_exec()
}

fn types(schema: &SchemaRef) -> Vec<DataType> {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect()
}

impl Shape {
    /// The shape of `hj` with `side` tracked; `None` if the join does not preserve it.
    pub(super) fn of(hj: &HashJoinExec, side: Tracked) -> Option<Self> {
        let tracking = match side {
            Tracked::Build => Tracking::of_build(*hj.join_type()),
            Tracked::Probe => Tracking::of_probe(*hj.join_type()),
        }?;
        Some(Self {
            side,
            tracking,
            join_type: *hj.join_type(),
            build_types: types(&hj.left().schema()),
            probe_types: types(&hj.right().schema()),
            projection: hj.projection.clone(),
            schema: hj.schema(),
        })
    }

    /// The counterpart join over `build` and `probe`, the tracked one with row ids. It
    /// shares the original's metrics, so `EXPLAIN ANALYZE` shows its inputs there.
    pub(super) fn join(
        &self,
        hj: &HashJoinExec,
        build: Arc<dyn ExecutionPlan>,
        probe: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let join_type = self.tracking.counterpart(self.side, self.join_type);
        rebuilt(hj, join_type, self.counterpart_projection(), build, probe)
    }

    /// A full join's counterpart where rows of both sides can be joined on several
    /// workers (SFR): an inner join over inputs that both carry row ids, whose output is
    /// the original's columns, then the build row id (at [`Self::row_id_column`]), then
    /// the probe row id. Called on the build side's shape.
    pub(super) fn join_both_tracked(
        &self,
        hj: &HashJoinExec,
        build: Arc<dyn ExecutionPlan>,
        probe: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if (self.side, self.join_type) != (Tracked::Build, JoinType::Full) {
            return Err(internal_datafusion_err!(
                "both sides are tracked only in full joins, not {}",
                self.join_type
            ));
        }
        let (nl, nr) = (self.build_types.len(), self.probe_types.len());
        let mut p = self.original_columns();
        // Probe columns sit one further right, behind the build row id.
        p.iter_mut().filter(|i| **i >= nl).for_each(|i| *i += 1);
        p.extend([nl, nl + 1 + nr]);
        rebuilt(hj, JoinType::Inner, p, build, probe)
    }

    /// The original join's output columns among its unprojected ones.
    fn original_columns(&self) -> Vec<usize> {
        match &self.projection {
            Some(p) => p.to_vec(),
            None => (0..self.build_types.len() + self.probe_types.len()).collect(),
        }
    }

    /// The counterpart's output columns: for an outer join, the original's output
    /// columns in order and then the row id, so that dropping the id leaves the
    /// original's rows; for the others the row id alone (a semi join outputs only the
    /// tracked side's columns).
    fn counterpart_projection(&self) -> Vec<usize> {
        let (nl, nr) = (self.build_types.len(), self.probe_types.len());
        match (self.tracking, self.side) {
            (Tracking::Rows, Tracked::Build) => vec![nl],
            (Tracking::Rows, Tracked::Probe) => vec![nr],
            (Tracking::Outer, side) => {
                let mut p = self.original_columns();
                let id = match side {
                    // Probe columns sit one further right, behind the build row id.
                    Tracked::Build => {
                        p.iter_mut().filter(|i| **i >= nl).for_each(|i| *i += 1);
                        nl
                    }
                    // The probe row id comes last.
                    Tracked::Probe => nl + nr,
                };
                p.push(id);
                p
            }
        }
    }

    /// Index of the row id in the counterpart join's output.
    pub(super) fn row_id_column(&self) -> usize {
        match self.tracking {
            Tracking::Outer => self
                .projection
                .as_ref()
                .map_or(self.build_types.len() + self.probe_types.len(), |p| p.len()),
            Tracking::Rows => 0,
        }
    }

    /// The rows of a counterpart output batch that the original join emits now: the
    /// pairs of an outer join without the row id; nothing for the others.
    pub(super) fn streamed(&self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if self.tracking == Tracking::Rows || batch.num_rows() == 0 {
            return Ok(None);
        }
        let mut columns = batch.columns().to_vec();
        columns.truncate(self.row_id_column());
        Ok(Some(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?))
    }

    /// The tracked rows (a batch with row ids) the original join emits at the end,
    /// given whether each was matched anywhere.
    pub(super) fn finished(
        &self,
        tracked: &RecordBatch,
        matched: impl Fn(usize) -> bool,
    ) -> Result<Option<RecordBatch>> {
        let rows = tracked.num_rows();
        let own_columns = match self.side {
            Tracked::Build => self.build_types.len(),
            Tracked::Probe => self.probe_types.len(),
        };
        // The unprojected output row of tracked rows without a match: for outer joins
        // the other side's columns are NULL.
        let padded = |rows: &RecordBatch| -> Vec<ArrayRef> {
            let own = rows.columns()[..own_columns].to_vec();
            if self.tracking == Tracking::Rows {
                return own;
            }
            let n = rows.num_rows();
            match self.side {
                Tracked::Build => own
                    .into_iter()
                    .chain(self.probe_types.iter().map(|t| new_null_array(t, n)))
                    .collect(),
                Tracked::Probe => self
                    .build_types
                    .iter()
                    .map(|t| new_null_array(t, n))
                    .chain(own)
                    .collect(),
            }
        };
        let keep = |want: bool| -> Result<Option<RecordBatch>> {
            let idx: Vec<u32> = (0..rows)
                .filter(|&r| matched(r) == want)
                .map(|r| r as u32)
                .collect();
            if idx.is_empty() {
                return Ok(None);
            }
            let taken = take_record_batch(tracked, &UInt32Array::from(idx))?;
            self.output(padded(&taken), taken.num_rows()).map(Some)
        };
        match self.join_type {
            JoinType::Left
            | JoinType::Right
            | JoinType::Full
            | JoinType::LeftAnti
            | JoinType::RightAnti => keep(false),
            JoinType::LeftSemi | JoinType::RightSemi => keep(true),
            JoinType::LeftMark | JoinType::RightMark => {
                if rows == 0 {
                    return Ok(None);
                }
                let mut columns = tracked.columns()[..own_columns].to_vec();
                let mark: BooleanArray = (0..rows).map(|r| Some(matched(r))).collect();
                columns.push(Arc::new(mark));
                self.output(columns, rows).map(Some)
            }
            JoinType::Inner => Err(internal_datafusion_err!("inner joins do not track rows")),
        }
    }

    /// The original join's projection over its unprojected output columns.
    fn output(&self, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
        let columns = match &self.projection {
            Some(p) => p.iter().map(|&i| Arc::clone(&columns[i])).collect(),
            None => columns,
        };
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }
}

/// One owner's matched rows, one bit each: its numbered rows, and apart from them its
/// kept build rows ([`RowIds::kept`]).
#[derive(Debug, Default)]
struct RowBits {
    rows: Vec<u64>,
    kept: Vec<u64>,
}

impl RowBits {
    #[inline(always)]
    fn set(&mut self, row: u64) {
        let (bits, row) = match row & KEPT_ROW {
            0 => (&mut self.rows, row),
            _ => (&mut self.kept, row & !KEPT_ROW),
        };
        let word = (row / 64) as usize;
        match bits.get_mut(word) {
            Some(w) => *w |= 1 << (row % 64),
            None => grow_and_set(bits, word, row),
        }
    }

    fn get(&self, row: u64) -> bool {
        let (bits, row) = match row & KEPT_ROW {
            0 => (&self.rows, row),
            _ => (&self.kept, row & !KEPT_ROW),
        };
        bits.get((row / 64) as usize)
            .is_some_and(|w| w & (1 << (row % 64)) != 0)
    }

    /// The row numbers set, in order, and clears them.
    fn take(&mut self) -> Vec<u64> {
        let ones = |bits: Vec<u64>, tag: u64| {
            bits.into_iter().enumerate().flat_map(move |(w, mut word)| {
                std::iter::from_fn(move || {
                    (word != 0).then(|| {
                        let bit = word.trailing_zeros() as u64;
                        word &= word - 1;
                        tag | (w as u64 * 64 + bit)
                    })
                })
            })
        };
        let rows = std::mem::take(&mut self.rows);
        let kept = std::mem::take(&mut self.kept);
        ones(rows, 0).chain(ones(kept, KEPT_ROW)).collect()
    }
}

#[cold]
fn grow_and_set(bits: &mut Vec<u64>, word: usize, row: u64) {
    bits.resize(word + 1, 0);
    bits[word] |= 1 << (row % 64);
}

/// The tracked rows one worker's joins matched, by owner: its own rows (this worker
/// decides them) and other workers' broadcast or replicated rows (reported to them).
/// Bitmaps, since a join records an id for every output row.
#[derive(Debug)]
pub(super) struct Matches {
    me: usize,
    by_owner: Vec<RowBits>,
}

impl Matches {
    pub(super) fn new(me: usize, workers: usize) -> Self {
        Self {
            me,
            by_owner: (0..workers).map(|_| RowBits::default()).collect(),
        }
    }

    /// Records the (non-null) ids of a counterpart output column. Runs once per output
    /// row of the join, hence the plain loop over raw values when there are no NULLs.
    pub(super) fn record(&mut self, ids: &dyn Array) -> Result<()> {
        let ids = as_ids(ids, "row ids")?;
        let stray = if ids.null_count() == 0 {
            ids.values().iter().copied().find(|&id| !self.note(id))
        } else {
            ids.iter().flatten().find(|&id| !self.note(id))
        };
        match stray {
            None => Ok(()),
            Some(id) => Err(internal_datafusion_err!(
                "row id of worker {} of {}",
                split(id).0,
                self.by_owner.len()
            )),
        }
    }

    /// Records one id; false if its owner is not a worker of the query.
    #[inline(always)]
    fn note(&mut self, id: u64) -> bool {
        let (owner, row) = split(id);
        match self.by_owner.get_mut(owner as usize) {
            Some(bits) => {
                bits.set(row);
                true
            }
            None => false,
        }
    }

    /// Records ids a peer matched; they must be this worker's.
    pub(super) fn merge_reported(&mut self, ids: &dyn Array, from: &str) -> Result<()> {
        let ids = as_ids(ids, &format!("the row ids {from} sent"))?;
        for id in ids.iter().flatten() {
            let (owner, row) = split(id);
            if owner != self.me as u64 {
                return Err(internal_datafusion_err!(
                    "{from} reported a match for row {row} of worker {owner}, not of this one"
                ));
            }
            self.by_owner[self.me].set(row);
        }
        Ok(())
    }

    /// The other owners' matched ids, by owner index (in order; none for this worker).
    pub(super) fn take_remote(&mut self) -> Vec<Vec<u64>> {
        let me = self.me;
        self.by_owner
            .iter_mut()
            .enumerate()
            .map(|(owner, bits)| match owner == me {
                true => Vec::new(),
                false => {
                    let base = (owner as u64) << OWNER_SHIFT;
                    bits.take().into_iter().map(|row| base | row).collect()
                }
            })
            .collect()
    }

    /// Whether own row `row` (its row id without the owner) matched.
    pub(super) fn is_matched(&self, row: u64) -> bool {
        self.by_owner[self.me].get(row)
    }

    /// Whether each row of `tracked` (this worker's rows, their ids in the last
    /// column) matched.
    pub(super) fn of_rows(&self, tracked: &RecordBatch) -> Result<Vec<bool>> {
        let ids = as_ids(
            tracked.column(tracked.num_columns() - 1).as_ref(),
            "tracked rows' ids",
        )?;
        ids.iter()
            .map(|id| {
                let (owner, row) =
                    split(id.ok_or_else(|| internal_datafusion_err!("a NULL row id"))?);
                if owner != self.me as u64 {
                    return Err(internal_datafusion_err!(
                        "worker {} holds row {row} of worker {owner} at the end",
                        self.me
                    ));
                }
                Ok(self.is_matched(row))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use datafusion::common::NullEquality;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::joins::PartitionMode;

    fn hash_join(join_type: JoinType, projection: Option<Vec<usize>>) -> HashJoinExec {
        let build = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
        ]));
        let probe = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("x", DataType::Int64, false),
        ]));
        HashJoinExec::try_new(
            Arc::new(EmptyExec::new(build)),
            Arc::new(EmptyExec::new(probe)),
            vec![(
                Arc::new(Column::new("k", 0)) as _,
                Arc::new(Column::new("k", 0)) as _,
            )],
            None,
            &join_type,
            projection,
            PartitionMode::Partitioned,
            NullEquality::NullEqualsNothing,
            false,
        )
        .unwrap()
    }

    fn numbered(owner: usize) -> Vec<RecordBatch> {
        let hj = hash_join(JoinType::Left, None);
        let schema = hj.left().schema();
        let batches: Vec<RecordBatch> = [vec![Some(1), None], vec![Some(3)]]
            .into_iter()
            .map(|k| {
                let n = k.len();
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(Int64Array::from(k)),
                        Arc::new(StringArray::from_iter_values((0..n).map(|i| i.to_string()))),
                    ],
                )
                .unwrap()
            })
            .collect();
        number_rows(owner, &batches, &with_row_id(&schema)).unwrap()
    }

    #[test]
    fn rows_are_numbered_per_owner_across_batches() {
        let b = numbered(2);
        let ids: Vec<u64> = b
            .iter()
            .flat_map(|b| {
                let ids = b.column(2).as_any().downcast_ref::<UInt64Array>().unwrap();
                ids.values().to_vec()
            })
            .collect();
        let base = 2u64 << OWNER_SHIFT;
        assert_eq!(ids, vec![base, base + 1, base + 2]);
        assert_eq!(b[0].schema().field(2).name(), ROW_ID);
    }

    #[test]
    fn matches_keep_own_rows_and_send_the_others() {
        let mut m = Matches::new(1, 4);
        let own = 1u64 << OWNER_SHIFT;
        let other = 3u64 << OWNER_SHIFT;
        let ids = UInt64Array::from(vec![Some(own + 70), None, Some(other + 5), Some(other + 5)]);
        m.record(&ids).unwrap();
        assert!(m.is_matched(70) && !m.is_matched(69) && !m.is_matched(1000));
        let remote = m.take_remote();
        assert_eq!(remote, vec![vec![], vec![], vec![], vec![other + 5]]);
        assert!(m.take_remote().iter().all(Vec::is_empty));
        // What peers report must be this worker's rows.
        m.merge_reported(&UInt64Array::from(vec![own + 2]), "worker 9")
            .unwrap();
        assert!(m.is_matched(2));
        let err = m
            .merge_reported(&UInt64Array::from(vec![other]), "worker 9")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("worker 9") && err.contains("of worker 3"),
            "{err}"
        );
        // An owner beyond the cluster is refused, not indexed.
        let err = m
            .record(&UInt64Array::from(vec![7u64 << OWNER_SHIFT]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("worker 7 of 4"), "{err}");
    }

    /// Kept build rows are numbered in a range of their own: matches of a kept row and
    /// of the partition row with the same number do not mix, and `of_rows` reads the
    /// ids a batch carries.
    #[test]
    fn kept_rows_are_numbered_apart_from_the_partition() {
        let hj = hash_join(JoinType::Left, None);
        let schema = with_row_id(&hj.left().schema());
        let plain = &numbered(1)[0];
        let columns = plain.columns()[..2].to_vec();
        let batch = RecordBatch::try_new(hj.left().schema(), columns).unwrap();
        let kept = RowIds::kept(1, Arc::clone(&schema)).number(&batch).unwrap();
        let mut m = Matches::new(1, 4);
        let kept_ids = as_ids(kept.column(2).as_ref(), "ids").unwrap().clone();
        assert!(kept_ids.values().iter().all(|id| split(*id).0 == 1));
        // A peer reports kept row 1; this worker matched partition row 0.
        m.merge_reported(&UInt64Array::from(vec![kept_ids.value(1)]), "worker 2")
            .unwrap();
        m.record(&UInt64Array::from(vec![1u64 << OWNER_SHIFT]))
            .unwrap();
        assert_eq!(m.of_rows(plain).unwrap(), vec![true, false]);
        assert_eq!(m.of_rows(&kept).unwrap(), vec![false, true]);
        // Rows of another worker are not this one's to decide.
        assert!(m.of_rows(&numbered(3)[0]).is_err());
    }

    #[test]
    fn build_rows_at_the_end_follow_the_join_type() {
        let b = &numbered(0)[0]; // keys 1, NULL; row 0 matched
        let matched = |r: usize| r == 0;
        let keys = |batch: &RecordBatch, col: usize| -> Vec<Option<i64>> {
            let a = batch
                .column(col)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            a.iter().collect()
        };
        // Left outer: the unmatched row, padded with NULL probe columns.
        let left = Shape::of(&hash_join(JoinType::Left, None), Tracked::Build).unwrap();
        let out = left.finished(b, matched).unwrap().unwrap();
        assert_eq!(out.num_columns(), 4);
        assert_eq!(keys(&out, 0), vec![None]);
        assert_eq!(out.column(2).null_count(), 1);
        // Projection of the original join (probe x, build s).
        let projected =
            Shape::of(&hash_join(JoinType::Full, Some(vec![3, 1])), Tracked::Build).unwrap();
        let out = projected.finished(b, matched).unwrap().unwrap();
        assert_eq!(out.schema().field(0).name(), "x");
        assert_eq!(out.column(0).null_count(), 1);
        // Semi, anti, mark.
        let semi = Shape::of(&hash_join(JoinType::LeftSemi, None), Tracked::Build).unwrap();
        assert_eq!(
            keys(&semi.finished(b, matched).unwrap().unwrap(), 0),
            vec![Some(1)]
        );
        let anti = Shape::of(&hash_join(JoinType::LeftAnti, None), Tracked::Build).unwrap();
        assert_eq!(
            keys(&anti.finished(b, matched).unwrap().unwrap(), 0),
            vec![None]
        );
        assert!(anti.finished(b, |_| true).unwrap().is_none());
        let mark = Shape::of(&hash_join(JoinType::LeftMark, None), Tracked::Build).unwrap();
        let out = mark.finished(b, matched).unwrap().unwrap();
        let flags = out
            .column(2)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .unwrap();
        assert_eq!(
            flags.iter().collect::<Vec<_>>(),
            vec![Some(true), Some(false)]
        );
        // The counterpart of a projected outer join outputs the original's columns,
        // then the row id; streamed batches lose the id, the others stream nothing.
        let hj = hash_join(JoinType::Left, Some(vec![3, 1]));
        let projected_left = Shape::of(&hj, Tracked::Build).unwrap();
        let counterpart = projected_left
            .join(
                &hj,
                Arc::new(EmptyExec::new(b.schema())),
                Arc::new(EmptyExec::new(hj.right().schema())),
            )
            .unwrap();
        let names: Vec<String> = counterpart
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, vec!["x", "s", ROW_ID]);
        assert_eq!(projected_left.row_id_column(), 2);
        let pairs = RecordBatch::try_new(
            counterpart.schema(),
            vec![
                Arc::new(Int64Array::from(vec![5])),
                Arc::new(StringArray::from(vec!["a"])),
                Arc::new(UInt64Array::from(vec![0])),
            ],
        )
        .unwrap();
        let out = projected_left.streamed(&pairs).unwrap().unwrap();
        assert_eq!(out.schema(), hj.schema());
        assert_eq!(left.row_id_column(), 4);
        assert!(semi.streamed(&pairs).unwrap().is_none());
    }

    /// Probe rows broadcast for build-heavy keys, numbered at their origin.
    fn numbered_probe(hj: &HashJoinExec) -> RecordBatch {
        let probe = RecordBatch::try_new(
            hj.right().schema(),
            vec![
                Arc::new(Int64Array::from(vec![4, 6])),
                Arc::new(Int64Array::from(vec![40, 60])),
            ],
        )
        .unwrap();
        let mut ids = RowIds::new(1, with_row_id(&hj.right().schema()));
        ids.number(&probe).unwrap();
        ids.number(&probe).unwrap()
    }

    #[test]
    fn probe_rows_at_the_end_follow_the_join_type() {
        let ints = |batch: &RecordBatch, col: usize| -> Vec<Option<i64>> {
            let a = batch.column(col).as_any().downcast_ref::<Int64Array>();
            a.unwrap().iter().collect()
        };
        let matched = |r: usize| r == 1; // key 6
        // Numbering goes on across batches.
        let hj = hash_join(JoinType::Right, None);
        let b = numbered_probe(&hj);
        let ids = b.column(2).as_any().downcast_ref::<UInt64Array>().unwrap();
        let base = 1u64 << OWNER_SHIFT;
        assert_eq!(ids.values().to_vec(), vec![base + 2, base + 3]);
        // Build-preserving joins track nothing on the probe side, and vice versa.
        assert!(Shape::of(&hash_join(JoinType::Left, None), Tracked::Probe).is_none());
        assert!(Shape::of(&hj, Tracked::Build).is_none());
        // Right outer: the unmatched probe row after NULL build columns.
        let right = Shape::of(&hj, Tracked::Probe).unwrap();
        let out = right.finished(&b, matched).unwrap().unwrap();
        assert_eq!(out.schema(), hj.schema());
        assert_eq!(out.column(0).null_count(), 1);
        assert_eq!(ints(&out, 2), vec![Some(4)]);
        // Full outer, projected (probe x, build s).
        let full = hash_join(JoinType::Full, Some(vec![3, 1]));
        let out = Shape::of(&full, Tracked::Probe)
            .unwrap()
            .finished(&numbered_probe(&full), matched)
            .unwrap()
            .unwrap();
        assert_eq!(ints(&out, 0), vec![Some(40)]);
        assert_eq!(out.column(1).null_count(), 1);
        // Semi, anti, mark: probe columns only.
        let semi = hash_join(JoinType::RightSemi, None);
        let shape = Shape::of(&semi, Tracked::Probe).unwrap();
        let out = shape.finished(&b, matched).unwrap().unwrap();
        assert_eq!((out.num_columns(), ints(&out, 0)), (2, vec![Some(6)]));
        assert_eq!(shape.row_id_column(), 0);
        let anti = Shape::of(&hash_join(JoinType::RightAnti, None), Tracked::Probe).unwrap();
        assert_eq!(
            ints(&anti.finished(&b, matched).unwrap().unwrap(), 0),
            vec![Some(4)]
        );
        let mark = Shape::of(&hash_join(JoinType::RightMark, None), Tracked::Probe).unwrap();
        let out = mark.finished(&b, matched).unwrap().unwrap();
        let flags = out.column(2).as_any().downcast_ref::<BooleanArray>();
        assert_eq!(
            flags.unwrap().iter().collect::<Vec<_>>(),
            vec![Some(false), Some(true)]
        );
        // The counterparts: right outer runs as inner with the original's columns and
        // the probe row id, full outer as left outer, right semi as right semi over
        // the id alone.
        let counterpart = |hj: &HashJoinExec| {
            let plan = Shape::of(hj, Tracked::Probe)
                .unwrap()
                .join(
                    hj,
                    Arc::new(EmptyExec::new(hj.left().schema())),
                    Arc::new(EmptyExec::new(with_row_id(&hj.right().schema()))),
                )
                .unwrap();
            let names: Vec<String> = plan
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            (
                *plan.downcast_ref::<HashJoinExec>().unwrap().join_type(),
                names,
            )
        };
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            counterpart(&hj),
            (JoinType::Inner, names(&["k", "s", "k", "x", ROW_ID]))
        );
        assert_eq!(right.row_id_column(), 4);
        assert_eq!(
            counterpart(&full),
            (JoinType::Left, names(&["x", "s", ROW_ID]))
        );
        assert_eq!(counterpart(&semi), (JoinType::RightSemi, names(&[ROW_ID])));
    }
}
