//! The radix join against DataFusion's hash join on the same partitions: every join
//! type, with and without a filter and a projection, NULL and duplicate keys, build
//! sides of one and of several radix partitions, probe inputs in many batches.

use super::RadixJoinExec;
use arrow::array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, collect_partitioned};
use datafusion::prelude::SessionConfig;
use std::sync::Arc;

const JOIN_TYPES: [JoinType; 10] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::LeftAnti,
    JoinType::LeftMark,
    JoinType::RightSemi,
    JoinType::RightAnti,
    JoinType::RightMark,
];

/// A deterministic stream of numbers (no test depends on a seed it cannot print).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn side_schema(prefix: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(format!("{prefix}k"), DataType::Int32, true),
        Field::new(format!("{prefix}v"), DataType::Int64, false),
        Field::new(format!("{prefix}s"), DataType::Utf8, true),
    ]))
}

/// `partitions` partitions of `batches` batches of `rows` rows each; keys below `keys`
/// with about 5% NULLs; `v` numbers the rows in order (the probe input's order).
fn input(
    prefix: &str,
    partitions: usize,
    batches: usize,
    rows: usize,
    keys: u64,
    rng: &mut Lcg,
) -> Vec<Vec<RecordBatch>> {
    let schema = side_schema(prefix);
    let mut next = 0i64;
    (0..partitions)
        .map(|_| {
            (0..batches)
                .map(|_| {
                    let k: Int32Array = (0..rows)
                        .map(|_| (rng.below(20) != 0).then(|| rng.below(keys) as i32))
                        .collect();
                    let v: Int64Array = (0..rows)
                        .map(|_| {
                            next += 1;
                            next
                        })
                        .collect();
                    let s: StringArray = (0..rows)
                        .map(|i| (i % 7 != 0).then(|| format!("{prefix}{}", rng.below(1000))))
                        .collect();
                    RecordBatch::try_new(
                        Arc::clone(&schema),
                        vec![Arc::new(k), Arc::new(v), Arc::new(s)],
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect()
}

fn source(data: &[Vec<RecordBatch>], schema: SchemaRef, ordered: bool) -> Arc<dyn ExecutionPlan> {
    let mut config = MemorySourceConfig::try_new(data, Arc::clone(&schema), None).unwrap();
    if ordered {
        let order = PhysicalSortExpr::new_default(Arc::new(Column::new("pv", 1)));
        config = config
            .try_with_sort_information(vec![LexOrdering::new(vec![order]).unwrap()])
            .unwrap();
    }
    DataSourceExec::from_data_source(config)
}

/// `build.v % 3 <> probe.v % 5` over the intermediate columns (build v, probe v).
fn filter() -> JoinFilter {
    let schema = Schema::new(vec![
        Field::new("bv", DataType::Int64, false),
        Field::new("pv", DataType::Int64, false),
    ]);
    let modulo = |c: usize, name: &str, m: i64| {
        Arc::new(BinaryExpr::new(
            Arc::new(Column::new(name, c)),
            Operator::Modulo,
            datafusion::physical_expr::expressions::lit(m),
        ))
    };
    JoinFilter::new(
        Arc::new(BinaryExpr::new(
            modulo(0, "bv", 3),
            Operator::NotEq,
            modulo(1, "pv", 5),
        )),
        vec![
            ColumnIndex {
                index: 1,
                side: JoinSide::Left,
            },
            ColumnIndex {
                index: 1,
                side: JoinSide::Right,
            },
        ],
        Arc::new(schema),
    )
}

/// Each partition's rows as sorted text lines.
fn lines(partitions: &[Vec<RecordBatch>]) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    partitions
        .iter()
        .map(|batches| {
            let mut out = vec![];
            for b in batches {
                let formatters: Vec<_> = b
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
                    .collect();
                for row in 0..b.num_rows() {
                    let cells: Vec<String> = formatters
                        .iter()
                        .map(|f| f.value(row).to_string())
                        .collect();
                    out.push(cells.join("|"));
                }
            }
            out.sort();
            out
        })
        .collect()
}

struct Case {
    build: Vec<Vec<RecordBatch>>,
    probe: Vec<Vec<RecordBatch>>,
    batch_size: usize,
}

impl Case {
    async fn check(&self, join_type: JoinType, filtered: bool, projection: Option<Vec<usize>>) {
        let ordered = true;
        let join = HashJoinExec::try_new(
            source(&self.build, side_schema("b"), false),
            source(&self.probe, side_schema("p"), ordered),
            vec![(
                Arc::new(Column::new("bk", 0)) as _,
                Arc::new(Column::new("pk", 0)) as _,
            )],
            filtered.then(filter),
            &join_type,
            projection.clone(),
            PartitionMode::Partitioned,
            NullEquality::NullEqualsNothing,
            false,
        )
        .unwrap();
        let join: Arc<dyn ExecutionPlan> = Arc::new(join);
        let radix: Arc<dyn ExecutionPlan> =
            Arc::new(RadixJoinExec::try_new(Arc::clone(&join)).unwrap());
        let ctx = Arc::new(
            TaskContext::default()
                .with_session_config(SessionConfig::new().with_batch_size(self.batch_size)),
        );
        let want = collect_partitioned(Arc::clone(&join), Arc::clone(&ctx))
            .await
            .unwrap();
        let got = collect_partitioned(Arc::clone(&radix), ctx).await.unwrap();
        let what = format!("{join_type} filtered={filtered} projection={projection:?}");
        assert_eq!(got.len(), want.len(), "{what}");
        for batches in &got {
            for b in batches {
                assert_eq!(b.schema(), join.schema(), "{what}");
                assert!(b.num_rows() <= self.batch_size, "{what}");
            }
        }
        let (got_lines, want_lines) = (lines(&got), lines(&want));
        for (p, (g, w)) in got_lines.iter().zip(&want_lines).enumerate() {
            assert_eq!(g.len(), w.len(), "{what}: rows of partition {p}");
            assert!(g == w, "{what}: partition {p} differs");
        }
        // Where the hash join keeps the probe order, so does the radix join.
        if let Some(order) = join.output_ordering() {
            assert_eq!(radix.output_ordering(), Some(order));
            // (`UnknownPartitioning` is never equal to itself.)
            assert_eq!(
                radix.output_partitioning().to_string(),
                join.output_partitioning().to_string()
            );
            let pv = join.schema().index_of("pv").unwrap();
            for batches in &got {
                let values: Vec<i64> = batches
                    .iter()
                    .flat_map(|b| {
                        let c = b.column(pv).as_any().downcast_ref::<Int64Array>().unwrap();
                        c.values().to_vec()
                    })
                    .collect();
                assert!(values.is_sorted(), "{what}: probe order lost");
            }
        }
    }

    async fn check_all(&self) {
        for join_type in JOIN_TYPES {
            for filtered in [false, true] {
                self.check(join_type, filtered, None).await;
            }
        }
        // Projections that drop, reorder and repeat columns.
        self.check(JoinType::Inner, true, Some(vec![4, 0, 2, 4]))
            .await;
        self.check(JoinType::Full, false, Some(vec![5, 1])).await;
        self.check(JoinType::LeftMark, false, Some(vec![3, 0]))
            .await;
        self.check(JoinType::RightSemi, true, Some(vec![])).await;
    }
}

#[tokio::test]
async fn small_build_sides_match_the_hash_join() {
    let mut rng = Lcg(7);
    let case = Case {
        build: input("b", 2, 2, 150, 200, &mut rng),
        probe: input("p", 2, 5, 333, 250, &mut rng),
        batch_size: 100,
    };
    case.check_all().await;
}

#[tokio::test]
async fn build_sides_of_many_radix_partitions_match_the_hash_join() {
    let mut rng = Lcg(11);
    // 120K build rows per partition need several cache-sized radix partitions, and the
    // probe rows arrive in batches smaller than one chunk.
    let case = Case {
        build: input("b", 2, 3, 40_000, 60_000, &mut rng),
        probe: input("p", 2, 25, 4_000, 70_000, &mut rng),
        batch_size: 8192,
    };
    case.check_all().await;
}

#[tokio::test]
async fn empty_inputs_match_the_hash_join() {
    let mut rng = Lcg(3);
    for (b, p) in [(0, 100), (100, 0), (0, 0)] {
        let case = Case {
            build: input("b", 1, 1, b, 50, &mut rng),
            probe: input("p", 1, 1, p, 50, &mut rng),
            batch_size: 64,
        };
        case.check_all().await;
    }
}

#[test]
fn joins_the_kernel_cannot_run_are_refused_with_the_reason() {
    let join = |on: Vec<(&str, usize, &str, usize)>, null_aware: bool, mode: PartitionMode| {
        HashJoinExec::try_new(
            source(&[vec![]], side_schema("b"), false),
            source(&[vec![]], side_schema("p"), false),
            on.into_iter()
                .map(|(l, li, r, ri)| {
                    (
                        Arc::new(Column::new(l, li)) as _,
                        Arc::new(Column::new(r, ri)) as _,
                    )
                })
                .collect(),
            None,
            &JoinType::LeftAnti,
            None,
            mode,
            NullEquality::NullEqualsNothing,
            null_aware,
        )
        .unwrap()
    };
    let p = PartitionMode::Partitioned;
    for (hj, reason) in [
        (join(vec![("bs", 2, "ps", 2)], false, p), "Utf8"),
        (
            join(vec![("bk", 0, "pk", 0), ("bv", 1, "pv", 1)], false, p),
            "2 key columns",
        ),
        (join(vec![("bk", 0, "pk", 0)], true, p), "null-aware"),
        (
            join(vec![("bk", 0, "pk", 0)], false, PartitionMode::CollectLeft),
            "CollectLeft",
        ),
    ] {
        let e = RadixJoinExec::supports(&hj).unwrap_err();
        assert!(e.contains(reason), "{e}");
        assert!(RadixJoinExec::try_new(Arc::new(hj)).is_err());
    }
    assert!(RadixJoinExec::supports(&join(vec![("bk", 0, "pk", 0)], false, p)).is_ok());
}
