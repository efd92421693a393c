//! [`NeoJoinExec`]: Neo-Join, a distributed equi-join that moves as few bytes as the
//! data's placement allows.
//!
//! The node wraps a partitioned `HashJoinExec` whose inputs are *not* shuffled
//! (partition `i` of each input is whatever worker `i` holds) and replaces the two
//! hash shuffles with the phases of a Neo shuffle of both inputs ([`super::shuffle`]),
//! then runs the hash join (or the radix join kernel, `radix_kernel`) on what arrives.
//! Chosen at run time, a table already hash-placed on the key stays put under hash
//! placement.
//!
//! Broadcasting a side replicates its rows, so a partition's side is broadcast only
//! when the join never emits that side's rows on their own ([`broadcastable`]). Rows
//! with a NULL key match nothing and stay where they are.

use super::shuffle::{self, NullKeys, Shuffled};
use super::{NeoReport, NeoSettings, fmt_shuffle, neo_exchanges};
use crate::RadixJoinExec;
use crate::context::ExchangeId;
use crate::network::{InputsAt, NetworkOperator};
use crate::radix_join::radix_join_stream;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{JoinType, Result, internal_datafusion_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_join::neo::Broadcastable;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;

/// Which sides of a join's partitions may be broadcast without changing its answer:
/// a side whose rows the join never emits on their own (matched or not, as semi,
/// anti, mark and outer joins do), so a replicated row cannot come out twice.
pub fn broadcastable(join_type: JoinType) -> Broadcastable {
    use JoinType::*;
    Broadcastable {
        build: matches!(join_type, Inner | Right | RightSemi | RightAnti | RightMark),
        probe: matches!(join_type, Inner | Left | LeftSemi | LeftAnti | LeftMark),
    }
}

/// A distributed equi-join by Neo-Join's phases.
#[derive(Debug)]
pub struct NeoJoinExec {
    /// The partitioned `HashJoinExec` over the unshuffled inputs, its only child.
    join: Arc<dyn ExecutionPlan>,
    settings: NeoSettings,
    exchange: Option<ExchangeId>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    report: Arc<Mutex<NeoReport>>,
}

impl NeoJoinExec {
    pub fn try_new(
        join: Arc<dyn ExecutionPlan>,
        settings: NeoSettings,
        exchange: Option<ExchangeId>,
    ) -> Result<Self> {
        let Some(hj) = join.downcast_ref::<HashJoinExec>() else {
            return plan_err!("a Neo-Join wraps a hash join, not {}", join.name());
        };
        if let Err(reason) = Self::supports(hj) {
            return plan_err!("Neo-Join cannot run this join: {reason}");
        }
        settings.check()?;
        let n = hj.left().output_partitioning().partition_count();
        // Rows are joined wherever the assignment puts their partition: the output is
        // neither hash-partitioned nor ordered.
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(join.schema()),
            Partitioning::UnknownPartitioning(n),
            join.pipeline_behavior(),
            join.boundedness(),
        ));
        Ok(Self {
            join,
            settings,
            exchange,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
            report: Arc::default(),
        })
    }

    /// Whether Neo-Join can run `hj`, and if not, why not: the joins the radix kernel
    /// runs (one integer or date key, NULLs matching nothing, no null-aware anti join,
    /// no pushed-down limit, as many build as probe partitions).
    pub fn supports(hj: &HashJoinExec) -> std::result::Result<(), String> {
        RadixJoinExec::supports(hj)
    }

    pub fn join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.join
    }

    pub fn hash_join(&self) -> &HashJoinExec {
        self.join
            .downcast_ref::<HashJoinExec>()
            .expect("checked by try_new")
    }

    pub fn settings(&self) -> NeoSettings {
        self.settings
    }

    pub fn exchange(&self) -> Option<ExchangeId> {
        self.exchange
    }
}

impl NetworkOperator for NeoJoinExec {
    fn exchanges(&self) -> u32 {
        neo_exchanges(2)
    }

    fn inputs_at(&self) -> InputsAt {
        InputsAt::Workers
    }

    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            Arc::clone(&self.join),
            self.settings,
            Some(first),
        )?))
    }
}

impl DisplayAs for NeoJoinExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let b = broadcastable(*self.hash_join().join_type());
        let sides = match (self.settings.selective_broadcast, b.build, b.probe) {
            (false, ..) | (true, false, false) => "none",
            (true, true, true) => "build or probe",
            (true, true, false) => "build",
            (true, false, true) => "probe",
        };
        let kernel = if self.settings.radix_kernel {
            ", kernel=radix"
        } else {
            ""
        };
        write!(f, "NeoJoinExec: ")?;
        fmt_shuffle(
            f,
            &self.settings,
            self.props.output_partitioning().partition_count(),
            &format!(", broadcast={sides}{kernel}"),
            self.exchange.map(|e| (e, neo_exchanges(2))),
            &self.report,
        )
    }
}

impl ExecutionPlan for NeoJoinExec {
    fn name(&self) -> &'static str {
        "NeoJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.join]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [join] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a Neo-Join has one child, its hash join"))?;
        Ok(Arc::new(Self::try_new(join, self.settings, self.exchange)?))
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
        let hj = self.hash_join();
        let op = Shuffled {
            what: "Neo-Join",
            local: &self.join,
            input_names: &["build rows", "probe rows"],
            keys: vec![Arc::clone(&hj.on()[0].0), Arc::clone(&hj.on()[0].1)],
            broadcast: broadcastable(*hj.join_type()),
            nulls: NullKeys::Stay,
            settings: self.settings,
            exchange: self.exchange,
            metrics: &self.metrics,
            report: &self.report,
        };
        let radix_kernel = self.settings.radix_kernel;
        let ctx = Arc::clone(&context);
        shuffle::execute(op, partition, context, |local| {
            match (radix_kernel, local.downcast_ref::<HashJoinExec>()) {
                (true, Some(hj)) => radix_join_stream(hj, partition, ctx, &self.metrics),
                _ => local.execute(partition, ctx),
            }
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
