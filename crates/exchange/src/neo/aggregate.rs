//! [`NeoAggregateExec`]: a GROUP BY whose rows are placed by a Neo shuffle, the thesis'
//! locality-sensitive data shuffling applied to aggregation.
//!
//! The node wraps a partitioned `AggregateExec` (final or single mode) whose input is
//! *not* shuffled: partition `i` is whatever worker `i` holds, typically the partial
//! aggregates of its own rows. A Neo shuffle of that one input places it by one
//! integer or date group key ([`super::shuffle`]): the key range is cut into adaptive
//! radix partitions and each partition goes to the worker where most of its bytes
//! already are, within the assignment's bound on the busiest link. Rows equal on every
//! group key are equal on that one, so each group still ends up on one worker; the
//! aggregate then runs on what arrives. Rows whose key is NULL go to worker 0. No part
//! of an aggregation's input can be broadcast.
//!
//! Where it pays: groups that are mostly on one worker already, as after a join on
//! the same key or on tables in generation order (a `GROUP BY l_orderkey` over
//! lineitem placed in chunks), where a hash shuffle moves `(n - 1) / n` of the rows.

use super::shuffle::{self, NullKeys, Shuffled};
use super::{NeoReport, NeoSettings, fmt_shuffle, neo_exchanges};
use crate::context::ExchangeId;
use crate::cyclo::key_type_supported;
use crate::network::{InputsAt, NetworkOperator};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_datafusion_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_join::neo::Broadcastable;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;

/// A distributed GROUP BY whose input is placed by a Neo shuffle.
#[derive(Debug)]
pub struct NeoAggregateExec {
    /// The partitioned `AggregateExec` over the unshuffled input, its only child.
    aggregate: Arc<dyn ExecutionPlan>,
    /// Which group expression the rows are placed by.
    key: usize,
    settings: NeoSettings,
    exchange: Option<ExchangeId>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    report: Arc<Mutex<NeoReport>>,
}

impl NeoAggregateExec {
    /// `key`: the group expression to place rows by ([`Self::supports`] finds one).
    pub fn try_new(
        aggregate: Arc<dyn ExecutionPlan>,
        key: usize,
        settings: NeoSettings,
        exchange: Option<ExchangeId>,
    ) -> Result<Self> {
        let Some(agg) = aggregate.downcast_ref::<AggregateExec>() else {
            return plan_err!(
                "a Neo aggregation wraps an aggregate, not {}",
                aggregate.name()
            );
        };
        match Self::supports(agg) {
            Err(reason) => return plan_err!("a Neo aggregation cannot run this: {reason}"),
            Ok(keys) if !keys.contains(&key) => {
                return plan_err!("a Neo aggregation cannot place rows by group key {key}");
            }
            Ok(_) => {}
        }
        settings.check()?;
        let n = agg.input().output_partitioning().partition_count();
        // Groups end up wherever the assignment puts their partition.
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(aggregate.schema()),
            Partitioning::UnknownPartitioning(n),
            aggregate.pipeline_behavior(),
            aggregate.boundedness(),
        ));
        Ok(Self {
            aggregate,
            key,
            settings,
            exchange,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
            report: Arc::default(),
        })
    }

    /// The group expressions a Neo aggregation can place `agg`'s rows by (integer or
    /// date ones), or why it cannot run `agg`: it must aggregate each hash partition
    /// of its input on its own (final or single partitioned mode), without grouping
    /// sets (their NULL-filled keys are not groups of one key) and without requiring
    /// its input in order.
    pub fn supports(agg: &AggregateExec) -> std::result::Result<Vec<usize>, String> {
        if !matches!(
            agg.mode(),
            AggregateMode::FinalPartitioned | AggregateMode::SinglePartitioned
        ) {
            return Err(format!("{:?} mode, not partitioned", agg.mode()));
        }
        if !agg.group_expr().is_single() {
            return Err("grouping sets".into());
        }
        if agg.required_input_ordering().iter().any(Option::is_some) {
            return Err("it needs its input in order".into());
        }
        let schema = agg.input().schema();
        let keys: Vec<usize> = agg
            .group_expr()
            .input_exprs()
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.data_type(&schema)
                    .is_ok_and(|t| key_type_supported(&t).is_some())
            })
            .map(|(i, _)| i)
            .collect();
        match keys.is_empty() {
            true => Err("no integer or date group key".into()),
            false => Ok(keys),
        }
    }

    pub fn aggregate(&self) -> &Arc<dyn ExecutionPlan> {
        &self.aggregate
    }

    /// The group expression rows are placed by.
    pub fn key(&self) -> usize {
        self.key
    }

    pub fn settings(&self) -> NeoSettings {
        self.settings
    }

    pub fn exchange(&self) -> Option<ExchangeId> {
        self.exchange
    }

    fn aggregate_exec(&self) -> &AggregateExec {
        self.aggregate
            .downcast_ref::<AggregateExec>()
            .expect("checked by try_new")
    }
}

impl NetworkOperator for NeoAggregateExec {
    fn exchanges(&self) -> u32 {
        neo_exchanges(1)
    }

    fn inputs_at(&self) -> InputsAt {
        InputsAt::Workers
    }

    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            Arc::clone(&self.aggregate),
            self.key,
            self.settings,
            Some(first),
        )?))
    }
}

impl DisplayAs for NeoAggregateExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "NeoAggregateExec: key={}, ",
            self.aggregate_exec().group_expr().input_exprs()[self.key]
        )?;
        fmt_shuffle(
            f,
            &self.settings,
            self.props.output_partitioning().partition_count(),
            "",
            self.exchange.map(|e| (e, neo_exchanges(1))),
            &self.report,
        )
    }
}

impl ExecutionPlan for NeoAggregateExec {
    fn name(&self) -> &'static str {
        "NeoAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.aggregate]
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
        let [aggregate] = <[_; 1]>::try_from(children).map_err(|_| {
            internal_datafusion_err!("a Neo aggregation has one child, its aggregate")
        })?;
        Ok(Arc::new(Self::try_new(
            aggregate,
            self.key,
            self.settings,
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
        let op = Shuffled {
            what: "Neo aggregation",
            local: &self.aggregate,
            input_names: &["grouped rows"],
            keys: vec![Arc::clone(
                &self.aggregate_exec().group_expr().input_exprs()[self.key],
            )],
            broadcast: Broadcastable::NONE,
            nulls: NullKeys::ToFirstWorker,
            settings: self.settings,
            exchange: self.exchange,
            metrics: &self.metrics,
            report: &self.report,
        };
        let ctx = Arc::clone(&context);
        shuffle::execute(op, partition, context, |local| {
            local.execute(partition, ctx)
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
