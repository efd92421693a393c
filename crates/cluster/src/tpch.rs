//! TPC-H: in-place data generation on the workers, the 22 queries with the
//! specification's validation parameters, and the official SF 1 answers.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use std::fmt;
use std::sync::Arc;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow, RegionArrow,
    SupplierArrow,
};

/// The eight TPC-H tables, smallest first.
pub const TABLES: [&str; 8] = [
    "region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem",
];

/// The first primary-key column of a TPC-H table: its default hash placement key.
pub fn primary_key(table: &str) -> Option<&'static str> {
    Some(match table {
        "region" => "r_regionkey",
        "nation" => "n_nationkey",
        "supplier" => "s_suppkey",
        "customer" => "c_custkey",
        "part" => "p_partkey",
        "partsupp" => "ps_partkey",
        "orders" => "o_orderkey",
        "lineitem" => "l_orderkey",
        _ => return None,
    })
}

/// The Arrow schema tpchgen produces for a table.
pub fn schema(table: &str) -> Result<SchemaRef> {
    Ok(match table {
        "region" => RegionArrow::schema_ref(),
        "nation" => NationArrow::schema_ref(),
        "supplier" => SupplierArrow::schema_ref(),
        "customer" => CustomerArrow::schema_ref(),
        "part" => PartArrow::schema_ref(),
        "partsupp" => PartSuppArrow::schema_ref(),
        "orders" => OrderArrow::schema_ref(),
        "lineitem" => LineItemArrow::schema_ref(),
        other => return plan_err!("'{other}' is not a TPC-H table"),
    })
}

const BATCH: usize = 8192;

/// Generates part `part` (0-based) of `parts` of a table, as dbgen would with `-C parts -S part+1`.
pub fn generate(
    table: &str,
    sf: f64,
    part: usize,
    parts: usize,
) -> Result<
    Box<dyn Iterator<Item = std::result::Result<RecordBatch, arrow::error::ArrowError>> + Send>,
> {
    let (p, n) = (part as i32 + 1, parts as i32);
    Ok(match table {
        // The fixed tables are not split: part 0 generates them whole.
        "region" | "nation" if part > 0 => Box::new(std::iter::empty()),
        "region" => {
            Box::new(RegionArrow::new(RegionGenerator::new(sf, 1, 1)).with_batch_size(BATCH))
        }
        "nation" => {
            Box::new(NationArrow::new(NationGenerator::new(sf, 1, 1)).with_batch_size(BATCH))
        }
        "supplier" => {
            Box::new(SupplierArrow::new(SupplierGenerator::new(sf, p, n)).with_batch_size(BATCH))
        }
        "customer" => {
            Box::new(CustomerArrow::new(CustomerGenerator::new(sf, p, n)).with_batch_size(BATCH))
        }
        "part" => Box::new(PartArrow::new(PartGenerator::new(sf, p, n)).with_batch_size(BATCH)),
        "partsupp" => {
            Box::new(PartSuppArrow::new(PartSuppGenerator::new(sf, p, n)).with_batch_size(BATCH))
        }
        "orders" => Box::new(OrderArrow::new(OrderGenerator::new(sf, p, n)).with_batch_size(BATCH)),
        "lineitem" => {
            Box::new(LineItemArrow::new(LineItemGenerator::new(sf, p, n)).with_batch_size(BATCH))
        }
        other => return plan_err!("'{other}' is not a TPC-H table"),
    })
}

/// Generates one TPC-H table in place: partition `i` (on worker `i`) makes part `i` of `n`.
#[derive(Debug)]
pub struct TpchGenExec {
    pub table: String,
    pub scale_factor: f64,
    props: Arc<PlanProperties>,
}

impl TpchGenExec {
    pub fn try_new(table: &str, scale_factor: f64, partitions: usize) -> Result<Self> {
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema(table)?),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            table: table.to_string(),
            scale_factor,
            props,
        })
    }

    pub fn partitions(&self) -> usize {
        self.props.partitioning.partition_count()
    }
}

impl DisplayAs for TpchGenExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TpchGenExec: table={}, sf={}",
            self.table, self.scale_factor
        )
    }
}

impl ExecutionPlan for TpchGenExec {
    fn name(&self) -> &'static str {
        "TpchGenExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }
    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }
    fn execute(
        &self,
        partition: usize,
        _ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let (table, sf, parts) = (self.table.clone(), self.scale_factor, self.partitions());
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        // Generation is CPU-bound: run it off the async threads, batch by batch.
        tokio::task::spawn_blocking(move || {
            let iter = match generate(&table, sf, partition, parts) {
                Ok(it) => it,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            for batch in iter {
                if tx
                    .blocking_send(batch.map_err(DataFusionError::from))
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Validation parameters of TPC-H (specification, clause 2.4), per query, in order `:1, :2, ...`.
fn parameters(q: usize) -> &'static [&'static str] {
    match q {
        1 => &["90"],
        2 => &["15", "BRASS", "EUROPE"],
        3 => &["BUILDING", "1995-03-15"],
        4 => &["1993-07-01"],
        5 => &["ASIA", "1994-01-01"],
        6 => &["1994-01-01", "0.06", "24"],
        7 => &["FRANCE", "GERMANY"],
        8 => &["BRAZIL", "AMERICA", "ECONOMY ANODIZED STEEL"],
        9 => &["green"],
        10 => &["1993-10-01"],
        11 => &["GERMANY", "0.0001"],
        12 => &["MAIL", "SHIP", "1994-01-01"],
        13 => &["special", "requests"],
        14 => &["1995-09-01"],
        15 => &["1996-01-01"],
        16 => &[
            "Brand#45",
            "MEDIUM POLISHED",
            "49",
            "14",
            "23",
            "45",
            "19",
            "3",
            "36",
            "9",
        ],
        17 => &["Brand#23", "MED BOX"],
        18 => &["300"],
        19 => &["Brand#12", "Brand#23", "Brand#34", "1", "10", "20"],
        20 => &["forest", "1994-01-01", "CANADA"],
        21 => &["SAUDI ARABIA"],
        22 => &["13", "31", "23", "29", "30", "18", "17"],
        _ => &[],
    }
}

/// Row limits the specification applies to the output of some queries.
fn row_limit(q: usize) -> Option<usize> {
    match q {
        2 | 18 | 21 => Some(100),
        3 => Some(10),
        10 => Some(20),
        _ => None,
    }
}

/// The statements of TPC-H query `q` (1..=22) with validation parameters.
/// Q15 is three statements: create the view, query it, drop it.
pub fn query(q: usize) -> Result<Vec<String>> {
    let Some(template) = tpchgen::q_and_a::queries::query(q as i32) else {
        return plan_err!("TPC-H has queries 1 to 22, not {q}");
    };
    let mut sql = template.replace("revenue:s", "revenue0");
    // Substitute the highest-numbered parameters first so ":1" does not eat ":10".
    let params = parameters(q);
    for (i, value) in params.iter().enumerate().rev() {
        sql = sql.replace(&format!(":{}", i + 1), value);
    }
    // dbgen's interval precision syntax is not SQL standard.
    sql = sql.replace("day (3)", "day");
    let mut statements: Vec<String> = sql
        .split(';')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(limit) = row_limit(q) {
        let last = statements.last_mut().expect("query text");
        last.push_str(&format!("\nlimit {limit}"));
    }
    Ok(statements)
}

/// The official answer of query `q` at scale factor 1: column names and rows of text cells.
pub fn answer_sf1(q: usize) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let Some(text) = tpchgen::q_and_a::answers_sf1::answer(q as i32) else {
        return plan_err!("no TPC-H answer for query {q}");
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let split = |l: &str| {
        l.split('|')
            .map(|c| c.trim().to_string())
            .collect::<Vec<_>>()
    };
    let header = lines.next().map(split).unwrap_or_default();
    Ok((header, lines.map(split).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_have_no_unsubstituted_parameters() {
        for q in 1..=22 {
            let stmts = query(q).unwrap();
            for s in &stmts {
                assert!(!s.contains("':"), "Q{q}: {s}");
                assert!(!regex_like_param(s), "Q{q}: {s}");
            }
            assert_eq!(stmts.len(), if q == 15 { 3 } else { 1 }, "Q{q}");
        }
    }

    fn regex_like_param(s: &str) -> bool {
        s.as_bytes()
            .windows(2)
            .any(|w| w[0] == b':' && w[1].is_ascii_digit())
    }

    #[test]
    fn parts_cover_the_table_exactly_once() {
        let rows = |table: &str, parts: usize| -> usize {
            (0..parts)
                .map(|p| {
                    generate(table, 0.01, p, parts)
                        .unwrap()
                        .map(|b| b.unwrap().num_rows())
                        .sum::<usize>()
                })
                .sum()
        };
        for table in TABLES {
            assert_eq!(rows(table, 1), rows(table, 3), "{table}");
        }
        assert_eq!(rows("nation", 4), 25);
        assert_eq!(rows("orders", 4), 15_000);
    }

    #[test]
    fn answers_parse() {
        let (header, rows) = answer_sf1(1).unwrap();
        assert_eq!(header[0], "l_returnflag");
        assert_eq!(rows.len(), 4);
        assert_eq!(answer_sf1(2).unwrap().1.len(), 100);
    }
}
