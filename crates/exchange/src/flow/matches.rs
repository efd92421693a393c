//! Build-preserving joins under Flow-Join: left and full outer, left semi, anti and mark.
//!
//! A heavy build row is broadcast and joined on every worker, so whether it matched is
//! known only by combining all workers' joins (thesis §4.3: unmatched and semi results
//! must be redistributed). Every build row therefore carries an id (its owner and its
//! row number there), and the joins run as a counterpart that reports matches instead
//! of deciding alone:
//!
//! - left outer runs as inner and full outer as right outer: matched pairs (and, for
//!   full, unmatched probe rows, which each worker sees exactly once) stream out as
//!   they are found, with the id dropped;
//! - left semi, anti and mark run as left semi projected to the id: only which build
//!   rows matched is needed.
//!
//! Each worker records the ids its joins matched: its own rows in a bitmap, other
//! owners' heavy rows in a set it sends to their owners once its joins are done. Each
//! owner then emits its build rows by their combined state: unmatched ones padded with
//! NULLs (outer), matched ones (semi), unmatched ones (anti), or all with the match as
//! the mark (mark).

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
    new_null_array,
};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{JoinType, Result, internal_datafusion_err};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Row ids are distinct integers: one multiplication spreads them well enough for a
/// set probed once per heavy output row (SipHash cost more than the join there).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Name of the build-row id column appended to the build side.
const ROW_ID: &str = "__gyre_build_row";

/// Bits of a row id below the owner's index.
const OWNER_SHIFT: u32 = 48;

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

/// How a join type's build rows are decided when heavy build rows are joined on
/// several workers; `None` for the probe-preserving types, which need nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BuildTracking {
    /// Left and full outer: pairs stream out, unmatched build rows come at the end.
    Outer,
    /// Left semi, anti and mark: build rows come at the end by their match state.
    Rows,
}

impl BuildTracking {
    pub(crate) fn of(join_type: JoinType) -> Option<Self> {
        match join_type {
            JoinType::Left | JoinType::Full => Some(Self::Outer),
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => Some(Self::Rows),
            _ => None,
        }
    }

    /// The join each worker runs instead: its output shows which build rows matched.
    fn counterpart(self, join_type: JoinType) -> JoinType {
        match (self, join_type) {
            (Self::Outer, JoinType::Full) => JoinType::Right,
            (Self::Outer, _) => JoinType::Inner,
            (Self::Rows, _) => JoinType::LeftSemi,
        }
    }
}

/// The build schema with the row id appended.
pub(super) fn with_row_id(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(row_id_field()));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Appends the row ids of `owner`'s build partition to its batches, numbering rows
/// from 0 in order.
pub(super) fn number_rows(
    owner: usize,
    batches: &[RecordBatch],
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let base = (owner as u64) << OWNER_SHIFT;
    let mut next = 0u64;
    batches
        .iter()
        .map(|b| {
            let rows = b.num_rows() as u64;
            let ids = UInt64Array::from_iter_values((next..next + rows).map(|r| base | r));
            next += rows;
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(ids));
            Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
        })
        .collect()
}

/// What the original join's output looks like, to shape the counterpart's rows and the
/// build rows emitted at the end.
#[derive(Debug)]
pub(super) struct Shape {
    tracking: BuildTracking,
    join_type: JoinType,
    /// Build columns (without the row id).
    build_columns: usize,
    probe_types: Vec<DataType>,
    projection: Option<Arc<[usize]>>,
    /// The original join's output schema.
    schema: SchemaRef,
}

impl Shape {
    pub(super) fn new(hj: &HashJoinExec, tracking: BuildTracking) -> Self {
        Self {
            tracking,
            join_type: *hj.join_type(),
            build_columns: hj.left().schema().fields().len(),
            probe_types: hj
                .right()
                .schema()
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
            projection: hj.projection.clone(),
            schema: hj.schema(),
        }
    }

    /// The counterpart join over `build` (with row ids) and `probe`. It shares the
    /// original's metrics, so `EXPLAIN ANALYZE` shows its inputs there.
    pub(super) fn join(
        &self,
        hj: &HashJoinExec,
        build: Arc<dyn ExecutionPlan>,
        probe: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        hj.builder()
            .with_type(self.tracking.counterpart(self.join_type))
            .with_projection(Some(self.counterpart_projection()))
            .with_fetch(None)
            .with_new_children(vec![build, probe])?
            .build_exec()
    }

    /// The counterpart's output columns (over build-with-id ++ probe): for an outer
    /// join, the original's output columns in order and then the row id, so that
    /// dropping the id leaves the original's rows; for the others the row id alone.
    fn counterpart_projection(&self) -> Vec<usize> {
        let nl = self.build_columns;
        match self.tracking {
            BuildTracking::Rows => vec![nl],
            BuildTracking::Outer => {
                let unprojected = nl + self.probe_types.len();
                let mut p: Vec<usize> = match &self.projection {
                    Some(p) => p.to_vec(),
                    None => (0..unprojected).collect(),
                };
                // Probe columns sit one further right, behind the row id.
                p.iter_mut().filter(|i| **i >= nl).for_each(|i| *i += 1);
                p.push(nl);
                p
            }
        }
    }

    /// Index of the row id in the counterpart join's output.
    pub(super) fn row_id_column(&self) -> usize {
        match self.tracking {
            BuildTracking::Outer => self
                .projection
                .as_ref()
                .map_or(self.build_columns + self.probe_types.len(), |p| p.len()),
            BuildTracking::Rows => 0,
        }
    }

    /// The rows of a counterpart output batch that the original join emits now: the
    /// pairs of an outer join without the row id; nothing for the others.
    pub(super) fn streamed(&self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if self.tracking == BuildTracking::Rows || batch.num_rows() == 0 {
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

    /// The build rows (a batch with row ids) the original join emits at the end, given
    /// whether each was matched anywhere.
    pub(super) fn finished(
        &self,
        build: &RecordBatch,
        matched: impl Fn(usize) -> bool,
    ) -> Result<Option<RecordBatch>> {
        let rows = build.num_rows();
        let keep = |want: bool| -> Result<Option<RecordBatch>> {
            let idx: Vec<u32> = (0..rows)
                .filter(|&r| matched(r) == want)
                .map(|r| r as u32)
                .collect();
            if idx.is_empty() {
                return Ok(None);
            }
            let taken = take_record_batch(build, &UInt32Array::from(idx))?;
            let mut columns = taken.columns()[..self.build_columns].to_vec();
            if self.tracking == BuildTracking::Outer {
                let n = taken.num_rows();
                columns.extend(self.probe_types.iter().map(|t| new_null_array(t, n)));
            }
            self.output(columns, taken.num_rows()).map(Some)
        };
        match self.join_type {
            JoinType::Left | JoinType::Full | JoinType::LeftAnti => keep(false),
            JoinType::LeftSemi => keep(true),
            JoinType::LeftMark => {
                if rows == 0 {
                    return Ok(None);
                }
                let mut columns = build.columns()[..self.build_columns].to_vec();
                let mark: BooleanArray = (0..rows).map(|r| Some(matched(r))).collect();
                columns.push(Arc::new(mark));
                self.output(columns, rows).map(Some)
            }
            other => Err(internal_datafusion_err!(
                "{other} joins do not track build rows"
            )),
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

/// The build rows one worker's joins matched.
#[derive(Debug)]
pub(super) struct Matches {
    me: u64,
    /// This worker's own rows, one bit each.
    own: Vec<u64>,
    /// Other owners' (heavy, broadcast) rows.
    remote: HashSet<u64, BuildHasherDefault<IdHasher>>,
}

impl Matches {
    pub(super) fn new(me: usize) -> Self {
        Self {
            me: me as u64,
            own: Vec::new(),
            remote: HashSet::default(),
        }
    }

    fn set_own(&mut self, row: u64) {
        let word = (row / 64) as usize;
        match self.own.get_mut(word) {
            Some(w) => *w |= 1 << (row % 64),
            None => {
                self.own.resize(word + 1, 0);
                self.own[word] |= 1 << (row % 64);
            }
        }
    }

    fn note(&mut self, id: u64, last_remote: &mut u64) {
        let (owner, row) = split(id);
        if owner == self.me {
            self.set_own(row);
        } else if *last_remote != id {
            // A heavy build row matches many probe rows in a row: skip the repeats.
            self.remote.insert(id);
            *last_remote = id;
        }
    }

    /// Records the (non-null) ids of a counterpart output column. Runs once per output
    /// row of the join, hence the loop over raw values when there are no NULLs.
    pub(super) fn record(&mut self, ids: &dyn Array) -> Result<()> {
        let ids = as_ids(ids, "build row ids")?;
        // No valid id has every bit set (owners are worker indices).
        let mut last_remote = u64::MAX;
        if ids.null_count() == 0 {
            for &id in ids.values().iter() {
                self.note(id, &mut last_remote);
            }
        } else {
            for id in ids.iter().flatten() {
                self.note(id, &mut last_remote);
            }
        }
        Ok(())
    }

    /// Records ids a peer matched; they must be this worker's.
    pub(super) fn merge_reported(&mut self, ids: &dyn Array, from: &str) -> Result<()> {
        let ids = as_ids(ids, &format!("the build row ids {from} sent"))?;
        for id in ids.iter().flatten() {
            let (owner, row) = split(id);
            if owner != self.me {
                return Err(internal_datafusion_err!(
                    "{from} reported a match for build row {row} of worker {owner}, not of this one"
                ));
            }
            self.set_own(row);
        }
        Ok(())
    }

    /// The other owners' matched ids, by owner index.
    pub(super) fn take_remote(&mut self, workers: usize) -> Result<Vec<Vec<u64>>> {
        let mut by_owner = vec![Vec::new(); workers];
        for id in std::mem::take(&mut self.remote) {
            let owner = split(id).0 as usize;
            by_owner
                .get_mut(owner)
                .ok_or_else(|| {
                    internal_datafusion_err!("build row id of worker {owner} of {workers}")
                })?
                .push(id);
        }
        for ids in &mut by_owner {
            ids.sort_unstable();
        }
        Ok(by_owner)
    }

    /// Whether own row `row` (numbered from 0 over the partition) matched.
    pub(super) fn is_matched(&self, row: u64) -> bool {
        self.own
            .get((row / 64) as usize)
            .is_some_and(|w| w & (1 << (row % 64)) != 0)
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
        let mut m = Matches::new(1);
        let own = 1u64 << OWNER_SHIFT;
        let other = 3u64 << OWNER_SHIFT;
        let ids = UInt64Array::from(vec![Some(own + 70), None, Some(other + 5), Some(other + 5)]);
        m.record(&ids).unwrap();
        assert!(m.is_matched(70) && !m.is_matched(69) && !m.is_matched(1000));
        let remote = m.take_remote(4).unwrap();
        assert_eq!(remote, vec![vec![], vec![], vec![], vec![other + 5]]);
        assert!(m.take_remote(4).unwrap().iter().all(Vec::is_empty));
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
        m.record(&UInt64Array::from(vec![7u64 << OWNER_SHIFT]))
            .unwrap();
        assert!(m.take_remote(4).is_err());
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
        let left = Shape::new(&hash_join(JoinType::Left, None), BuildTracking::Outer);
        let out = left.finished(b, matched).unwrap().unwrap();
        assert_eq!(out.num_columns(), 4);
        assert_eq!(keys(&out, 0), vec![None]);
        assert_eq!(out.column(2).null_count(), 1);
        // Projection of the original join (probe x, build s).
        let projected = Shape::new(
            &hash_join(JoinType::Full, Some(vec![3, 1])),
            BuildTracking::Outer,
        );
        let out = projected.finished(b, matched).unwrap().unwrap();
        assert_eq!(out.schema().field(0).name(), "x");
        assert_eq!(out.column(0).null_count(), 1);
        // Semi, anti, mark.
        let semi = Shape::new(&hash_join(JoinType::LeftSemi, None), BuildTracking::Rows);
        assert_eq!(
            keys(&semi.finished(b, matched).unwrap().unwrap(), 0),
            vec![Some(1)]
        );
        let anti = Shape::new(&hash_join(JoinType::LeftAnti, None), BuildTracking::Rows);
        assert_eq!(
            keys(&anti.finished(b, matched).unwrap().unwrap(), 0),
            vec![None]
        );
        assert!(anti.finished(b, |_| true).unwrap().is_none());
        let mark = Shape::new(&hash_join(JoinType::LeftMark, None), BuildTracking::Rows);
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
        let projected_left = Shape::new(&hj, BuildTracking::Outer);
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
}
