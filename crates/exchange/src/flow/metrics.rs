//! The per-worker figures of a Flow-Join that `EXPLAIN ANALYZE` shows.

use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};

/// Per-worker figures of a Flow-Join, shown by `EXPLAIN ANALYZE`.
#[derive(Clone)]
pub(super) struct FlowMetrics {
    pub(super) output_rows: Count,
    pub(super) probe_rows: Count,
    /// Probe rows with a heavy hash, kept on this worker.
    pub(super) probe_rows_local: Count,
    pub(super) heavy_hitters: Count,
    /// Probe rows this worker had routed when its first heavy hitter took effect.
    pub(super) first_heavy_after_rows: Gauge,
    pub(super) detection_rounds: Count,
    /// Build rows of heavy keys this owner sent: once per row broadcast for the global
    /// list, once per row and asking worker with fetch on demand.
    pub(super) build_rows_broadcast: Count,
    pub(super) heavy_build_rows_received: Count,
    pub(super) routing_time: Time,
    /// Detection windows after which this worker counted only a sample of rows.
    pub(super) quiet_windows: Count,
    /// Time the router waited for the first round's heavy hitters.
    pub(super) first_round_wait: Time,
    /// Build-preserving joins: other owners' build rows this worker matched (sent to
    /// them), and own build rows peers reported matched.
    pub(super) build_matches_sent: Count,
    pub(super) build_matches_received: Count,
    /// Probe-preserving joins that route their build input: the same for the probe
    /// rows broadcast for build-heavy keys.
    pub(super) probe_matches_sent: Count,
    pub(super) probe_matches_received: Count,
    /// Joins that route their build input: build rows routed, those kept on this worker
    /// (their key heavy on the build side), the build-side heavy hitters, the probe
    /// rows broadcast because their key is one, and the time the probe router waited
    /// for the final build-side list.
    pub(super) build_rows: Count,
    pub(super) build_rows_local: Count,
    pub(super) build_heavy_hitters: Count,
    pub(super) probe_rows_broadcast: Count,
    pub(super) build_list_wait: Time,
    /// Keys heavy on both sides (SFR): build and probe rows this worker sent to the
    /// nodes of its grid column and row (itself included).
    pub(super) sfr_build_rows_sent: Count,
    pub(super) sfr_probe_rows_sent: Count,
}

impl FlowMetrics {
    pub(super) fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let m = || MetricBuilder::new(set);
        Self {
            output_rows: m().output_rows(partition),
            probe_rows: m().counter("probe_rows", partition),
            probe_rows_local: m().counter("probe_rows_kept_local", partition),
            heavy_hitters: m().counter("heavy_hitters", partition),
            first_heavy_after_rows: m().gauge("first_heavy_after_rows", partition),
            detection_rounds: m().counter("detection_rounds", partition),
            build_rows_broadcast: m().counter("build_rows_broadcast", partition),
            heavy_build_rows_received: m().counter("heavy_build_rows_received", partition),
            routing_time: m().subset_time("routing_time", partition),
            quiet_windows: m().counter("quiet_windows", partition),
            first_round_wait: m().subset_time("first_round_wait", partition),
            build_matches_sent: m().counter("build_matches_sent", partition),
            build_matches_received: m().counter("build_matches_received", partition),
            probe_matches_sent: m().counter("probe_matches_sent", partition),
            probe_matches_received: m().counter("probe_matches_received", partition),
            build_rows: m().counter("build_rows", partition),
            build_rows_local: m().counter("build_rows_kept_local", partition),
            build_heavy_hitters: m().counter("build_heavy_hitters", partition),
            probe_rows_broadcast: m().counter("probe_rows_broadcast", partition),
            build_list_wait: m().subset_time("build_list_wait", partition),
            sfr_build_rows_sent: m().counter("sfr_build_rows_sent", partition),
            sfr_probe_rows_sent: m().counter("sfr_probe_rows_sent", partition),
        }
    }
}
