//! Gyre's settings (`SET gyre.*`) as a DataFusion config extension.
//!
//! Each session's `ConfigOptions` carries its own [`GyreOptions`], so one client's
//! `SET gyre.join_strategy` changes that client's plans only; `SHOW ALL` and
//! `information_schema.df_settings` list every setting with its description, as they
//! do DataFusion's own. A value is checked when it is set: a wrong one is an error
//! naming the setting and the values it takes, and the setting keeps its old value.

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions};
use datafusion::common::{DataFusionError, Result};
use gyre_exchange::{BuildPreserving, Compression, NeoSchedule, NeoSettings, SkewSettings};
use gyre_transport::design::Design;
use std::any::Any;

/// How joins are distributed (`SET gyre.join_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JoinStrategy {
    /// Broadcast or shuffle hash joins by size; cyclo-join for large non-equi joins.
    #[default]
    Auto,
    /// Hash joins repartition both inputs.
    Shuffle,
    /// Hash joins broadcast their smaller input where the join type allows it.
    Broadcast,
    /// Inner joins run as cyclo-joins where their keys and columns allow it.
    Cyclo,
    /// Partitioned equi-joins run as Neo-Joins where their key allows it: placed by
    /// an assignment that keeps data where it already is.
    Neo,
}

impl JoinStrategy {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "shuffle" => Ok(Self::Shuffle),
            "broadcast" => Ok(Self::Broadcast),
            "cyclo" => Ok(Self::Cyclo),
            "neo" => Ok(Self::Neo),
            other => Err(invalid(format!(
                "gyre.join_strategy is auto, shuffle, broadcast, cyclo or neo, not '{other}'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Shuffle => "shuffle",
            Self::Broadcast => "broadcast",
            Self::Cyclo => "cyclo",
            Self::Neo => "neo",
        }
    }

    /// The strategy of a planning config (`auto` without Gyre's options).
    pub fn of(config: &ConfigOptions) -> Self {
        GyreOptions::of(config).join_strategy
    }
}

/// Which kernel runs partitioned hash joins (`SET gyre.join_kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JoinKernel {
    /// DataFusion's hash join (and Flow-Join where skew detection is on).
    Hash,
    /// Gyre's radix-partitioned hash join wherever it can run the join, Flow-Join's
    /// place included.
    Radix,
    /// The radix join where the planner expects each worker's build side to span
    /// several cache-sized partitions and no Flow-Join runs the join; DataFusion's
    /// hash join elsewhere.
    #[default]
    Auto,
}

impl JoinKernel {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "hash" => Ok(Self::Hash),
            "radix" => Ok(Self::Radix),
            "auto" => Ok(Self::Auto),
            other => Err(invalid(format!(
                "gyre.join_kernel is hash, radix or auto, not '{other}'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Radix => "radix",
            Self::Auto => "auto",
        }
    }
}

/// Where tables created without `WITH (replication = ...)` live (`SET
/// gyre.replication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replication {
    /// In the workers' memory only: distributed tables, fastest to load.
    #[default]
    None,
    /// Transactional and durable, every worker holding every row.
    Full,
    /// Transactional and durable, each worker holding its share of the rows.
    Partitioned,
    /// Transactional and durable, each worker holding runs of consecutive rows (tables
    /// without a primary key only).
    Chunked,
    /// Transactional and durable, each block of rows held by `gyre.replicas` workers
    /// chosen by rendezvous hashing.
    Fragmented,
}

impl Replication {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            "partitioned" => Ok(Self::Partitioned),
            "chunked" => Ok(Self::Chunked),
            "fragmented" => Ok(Self::Fragmented),
            other => Err(invalid(format!(
                "gyre.replication is none, full, partitioned, chunked or fragmented, not \
                 '{other}'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Full => "full",
            Self::Partitioned => "partitioned",
            Self::Chunked => "chunked",
            Self::Fragmented => "fragmented",
        }
    }
}

/// Gyre's session settings, under the prefix `gyre`.
#[derive(Debug, Clone, PartialEq)]
pub struct GyreOptions {
    /// `gyre.compression`: Arrow IPC compression of the exchanges.
    pub compression: Compression,
    /// `gyre.join_strategy`.
    pub join_strategy: JoinStrategy,
    /// `gyre.join_kernel`.
    pub join_kernel: JoinKernel,
    /// `gyre.join_reorder`: whether inner joins are reordered by estimated sizes.
    pub join_reorder: bool,
    /// `gyre.skew_detection`: whether shuffled hash joins become Flow-Joins.
    pub skew_detection: bool,
    /// `gyre.runtime_filters`: whether hash joins prune their probe input by their
    /// build keys where it is read.
    pub runtime_filters: bool,
    /// `gyre.skew_threshold`, `_first`, `_every`, `_sample`, `_build_preserving`,
    /// `_build_side`, `_sfr` and `_fetch`: how Flow-Join detects and handles heavy keys.
    pub skew: SkewSettings,
    /// `gyre.neo_partitions`, `_adaptive`, `_solver_ms`, `_broadcast` and `_min_saving`: how
    /// Neo-Joins partition and assign, and whether `auto` tries them.
    pub neo: NeoSettings,
    /// `gyre.statement_timeout`: a query still running after this long is canceled on
    /// every node (zero: no limit).
    pub statement_timeout: std::time::Duration,
    /// `gyre.replication`.
    pub replication: Replication,
    /// `gyre.replicas`: copies of each block of a fragmented table.
    pub replicas: u8,
    /// `gyre.shuffle_design`: how exchanges move data (`None`: auto, the
    /// shared-memory carrier's send/receive design where every node of the query
    /// has one, else TCP).
    pub shuffle_design: Option<Design>,
}

impl Default for GyreOptions {
    /// Skew detection and run-time filters are on unless a session turns them off.
    fn default() -> Self {
        Self {
            compression: Compression::default(),
            join_strategy: JoinStrategy::default(),
            join_kernel: JoinKernel::default(),
            join_reorder: true,
            skew_detection: true,
            runtime_filters: true,
            skew: SkewSettings::default(),
            neo: NeoSettings {
                min_saving: DEFAULT_NEO_MIN_SAVING,
                ..NeoSettings::default()
            },
            statement_timeout: std::time::Duration::ZERO,
            replication: Replication::None,
            replicas: DEFAULT_REPLICAS,
            shuffle_design: None,
        }
    }
}

impl ConfigExtension for GyreOptions {
    const PREFIX: &'static str = "gyre";
}

/// With `gyre.join_strategy = 'auto'`, the share of hash placement's busiest link a
/// Neo-Join's assignment must save to be used (`None`: `auto` plans no Neo-Joins).
pub const DEFAULT_NEO_MIN_SAVING: Option<u32> = Some(25);

/// Copies of each block of a fragmented table unless `gyre.replicas` or `WITH
/// (replicas = ...)` says otherwise: one worker may die without a query noticing more
/// than a retry.
pub const DEFAULT_REPLICAS: u8 = 2;

/// Every setting with its description, in the order `SHOW ALL` lists them.
const SETTINGS: [(&str, &str); 25] = [
    (
        "compression",
        "Arrow IPC compression of data sent between workers: none, lz4, zstd, or auto \
         (LZ4 where the measured link is slower than about 2 Gbit/s).",
    ),
    (
        "shuffle_design",
        "How exchanges move data between nodes: auto (default: tcp), tcp, or, where \
         every node of the query shares this host's memory (gyre local), one of the \
         RDMA-aware shuffle paper's designs over the shared-memory carrier: memq-sr, \
         semq-sr, mesq-sr, sesq-sr (send/receive over connections or datagrams), \
         memq-rd, semq-rd (one-sided read), memq-wr, semq-wr (one-sided write).",
    ),
    (
        "join_strategy",
        "How joins are distributed: auto (broadcast or shuffle by size, cyclo-join for \
         large non-equi joins), shuffle, broadcast, cyclo (inner joins rotate around \
         the workers' ring), or neo (equi-joins on one integer key placed by Neo-Join's \
         locality-aware assignment, with selective broadcast of skewed partitions; \
         GROUP BYs with an integer or date key placed the same way).",
    ),
    (
        "join_kernel",
        "Which kernel runs partitioned equi-joins on one integer key: auto (default: \
         radix where each worker's build side is expected to span several cache-sized \
         partitions and no Flow-Join runs the join, else hash), hash (DataFusion's hash \
         join, or Flow-Join with skew detection) or radix (Gyre's radix-partitioned \
         hash join, which probes cache-sized partitions of the build side, wherever \
         it can run the join).",
    ),
    (
        "join_reorder",
        "on: inner joins run in the order that keeps the estimated intermediate \
         results smallest (when that order is much cheaper than the written one); off: \
         in the order the query writes them.",
    ),
    (
        "runtime_filters",
        "on (default): a hash join's build keys prune its probe input where it is \
         read, before it is shuffled or aggregated (run-time filters); off: every \
         probe row reaches the join.",
    ),
    (
        "statement_timeout",
        "A query that runs longer than this is canceled on every node: '30s', '500ms', \
         '5min', '1h', or a number of milliseconds; 0 (default): no limit.",
    ),
    (
        "replication",
        "Where tables created without WITH (replication = ...) live: none (default: in \
         the workers' memory only), full, partitioned or chunked (transactional tables, \
         durable under --data-dir, each worker holding every row, its share of them by \
         key, or runs of consecutive rows of a table without a primary key), or \
         fragmented (transactional, each block of rows on gyre.replicas workers chosen \
         by rendezvous hashing).",
    ),
    (
        "replicas",
        "Copies of each block of a table created with replication 'fragmented' (or WITH \
         (replicas = ...)), from 1 to 16 (default 2): that many workers less one may die \
         without losing a block.",
    ),
    (
        "skew_detection",
        "on: shuffled hash joins detect heavy keys while they run and join them where \
         they are (Flow-Join); off: DataFusion's partitioned hash join.",
    ),
    (
        "skew_threshold",
        "A key is heavy above this share of a join's probe input (0.0001 or 0.01%).",
    ),
    (
        "skew_first",
        "The first skew detection runs after this share of a worker's expected probe rows.",
    ),
    (
        "skew_every",
        "Skew detection runs again after every further share of the probe rows (0: once).",
    ),
    (
        "skew_sample",
        "Skew detection counts every n-th row (1: all).",
    ),
    (
        "skew_build_preserving",
        "Which build-preserving joins become Flow-Joins: off, semi (left semi, anti and \
         mark joins) or all (also left and full outer joins).",
    ),
    (
        "skew_build_side",
        "on: joins whose build input is shuffled also detect heavy keys on it.",
    ),
    (
        "skew_sfr",
        "on: keys heavy on both sides are joined by Symmetric Fragment Replicate; off: \
         their probe rows are broadcast.",
    ),
    (
        "skew_fetch",
        "on: each worker decides its own heavy keys and fetches their build rows from \
         their owners (fetch on demand; keys heavy on both sides are broadcast, not \
         SFR); off: worker 0 forms one global list whose build rows every owner \
         broadcasts.",
    ),
    (
        "neo_partitions",
        "How many partitions Neo-Join's adaptive radix partitioning aims for: 1 to 65536, \
         or auto (4 per worker, the fastest measured).",
    ),
    (
        "neo_adaptive",
        "on: Neo-Join refines its partitions by the global histogram (adaptive radix \
         partitioning); off: plain radix partitioning into equal key ranges, the next \
         power of two of gyre.neo_partitions.",
    ),
    (
        "neo_solver_ms",
        "Time limit in milliseconds of Neo-Join's assignment MILP (HiGHS); the best \
         assignment found by then is used. 0: the greedy assignment only.",
    ),
    (
        "neo_broadcast",
        "on: Neo-Join may broadcast one side of a skewed partition where the join type \
         allows (selective broadcast).",
    ),
    (
        "neo_min_saving",
        "With gyre.join_strategy = auto, shuffled equi-joins on one integer key run as \
         Neo-Joins that decide at run time, from the measured placement of both inputs: \
         Neo-Join's assignment where it cuts the busiest link by at least this \
         percentage against hash placement, else a hash shuffle. 0 to 100, or off: auto \
         plans no Neo-Joins.",
    ),
    (
        "neo_sample_rows",
        "A Neo-Join or aggregation chosen at run time decides on the first this many \
         rows of each input on every worker: where they show that hash placement is as \
         good, every row streams where a hash shuffle sends it; otherwise each worker \
         collects all its rows and the decision is taken again on them. 0: collect every \
         row before deciding.",
    ),
    (
        "neo_schedule",
        "open-shop: each side of a Neo-Join's shuffle runs in the rounds of its \
         open-shop schedule, synchronised so that no worker receives from two at once; \
         free (the default, as fast or faster where measured): every worker sends to \
         all at once.",
    ),
];

impl GyreOptions {
    /// The settings a planning config carries (the defaults without any).
    pub fn of(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<GyreOptions>()
            .cloned()
            .unwrap_or_default()
    }

    /// Flow-Join's settings, `None` when skew detection is off.
    pub fn skew_detection(&self) -> Option<&SkewSettings> {
        self.skew_detection.then_some(&self.skew)
    }

    fn value(&self, key: &str) -> String {
        let s = &self.skew;
        match key {
            "compression" => self.compression.name().to_string(),
            "join_strategy" => self.join_strategy.name().to_string(),
            "join_kernel" => self.join_kernel.name().to_string(),
            "join_reorder" => on_off(self.join_reorder),
            "skew_detection" => on_off(self.skew_detection),
            "runtime_filters" => on_off(self.runtime_filters),
            "skew_threshold" => s.threshold.to_string(),
            "skew_first" => s.first.to_string(),
            "skew_every" => s.every.to_string(),
            "skew_sample" => s.sample.to_string(),
            "skew_build_preserving" => s.build_preserving.name().to_string(),
            "skew_build_side" => on_off(s.build_side),
            "skew_sfr" => on_off(s.sfr),
            "skew_fetch" => on_off(s.fetch),
            "statement_timeout" => duration_text(self.statement_timeout),
            "replication" => self.replication.name().to_string(),
            "replicas" => self.replicas.to_string(),
            "shuffle_design" => match self.shuffle_design {
                None => "auto".to_string(),
                Some(d) => d.name().to_string(),
            },
            "neo_partitions" => match self.neo.partitions {
                0 => "auto".to_string(),
                p => p.to_string(),
            },
            "neo_adaptive" => on_off(self.neo.adaptive),
            "neo_solver_ms" => match self.neo.milp {
                true => self.neo.solver_ms.to_string(),
                false => "0".to_string(),
            },
            "neo_broadcast" => on_off(self.neo.selective_broadcast),
            "neo_min_saving" => match self.neo.min_saving {
                Some(pct) => pct.to_string(),
                None => "off".to_string(),
            },
            "neo_schedule" => self.neo.schedule.name().to_string(),
            "neo_sample_rows" => self.neo.sample_rows.to_string(),
            _ => unreachable!("every key of SETTINGS has a value"),
        }
    }
}

impl ExtensionOptions for GyreOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.to_ascii_lowercase();
        let name = format!("gyre.{key}");
        let mut next = self.clone();
        let s = &mut next.skew;
        match key.as_str() {
            "compression" => {
                next.compression = Compression::parse(Some(value)).map_err(|_| {
                    invalid(format!(
                        "{name} is none, lz4, zstd or auto, not '{}'",
                        value.trim()
                    ))
                })?
            }
            "join_strategy" => next.join_strategy = JoinStrategy::parse(value)?,
            "join_kernel" => next.join_kernel = JoinKernel::parse(value)?,
            "join_reorder" => next.join_reorder = parse_on_off(&name, value)?,
            "skew_detection" => next.skew_detection = parse_on_off(&name, value)?,
            "runtime_filters" => next.runtime_filters = parse_on_off(&name, value)?,
            "skew_threshold" => s.threshold = parse_share(&name, value)?,
            "skew_first" => s.first = parse_share(&name, value)?,
            "skew_every" => s.every = parse_share(&name, value)?,
            "skew_sample" => {
                s.sample = value.trim().parse().map_err(|_| {
                    invalid(format!("{name} is a whole number of rows, not '{value}'"))
                })?
            }
            "skew_build_preserving" => s.build_preserving = BuildPreserving::parse(value)?,
            "skew_build_side" => s.build_side = parse_on_off(&name, value)?,
            "skew_sfr" => s.sfr = parse_on_off(&name, value)?,
            "skew_fetch" => s.fetch = parse_on_off(&name, value)?,
            "statement_timeout" => next.statement_timeout = parse_duration(&name, value)?,
            "replication" => next.replication = Replication::parse(value)?,
            "replicas" => next.replicas = parse_count(&name, value, 1, 16)? as u8,
            "shuffle_design" => {
                next.shuffle_design = match value.trim().eq_ignore_ascii_case("auto") {
                    true => None,
                    false => Some(
                        value
                            .parse::<Design>()
                            .map_err(|e| invalid(format!("{name}: {e} or auto")))?,
                    ),
                }
            }
            "neo_partitions" => {
                next.neo.partitions = match value.trim().eq_ignore_ascii_case("auto") {
                    true => 0,
                    false => parse_count(&name, value, 1, 1 << 16)?,
                }
            }
            "neo_solver_ms" => {
                let ms = parse_count(&name, value, 0, 60_000)?;
                next.neo.milp = ms > 0;
                if ms > 0 {
                    next.neo.solver_ms = ms;
                }
            }
            "neo_broadcast" => next.neo.selective_broadcast = parse_on_off(&name, value)?,
            "neo_adaptive" => next.neo.adaptive = parse_on_off(&name, value)?,
            "neo_min_saving" => {
                next.neo.min_saving = match value.trim().eq_ignore_ascii_case("off") {
                    true => None,
                    false => Some(parse_count(&name, value, 0, 100).map_err(|_| {
                        invalid(format!(
                            "{name} is a percentage from 0 to 100 or off, not '{value}'"
                        ))
                    })?),
                }
            }
            "neo_sample_rows" => {
                next.neo.sample_rows = parse_count(&name, value, 0, u32::MAX)?;
            }
            "neo_schedule" => {
                next.neo.schedule = match value.trim().to_ascii_lowercase().as_str() {
                    "free" => NeoSchedule::Free,
                    "open-shop" | "open_shop" | "openshop" => NeoSchedule::OpenShop,
                    _ => {
                        return Err(invalid(format!(
                            "{name} is open-shop or free, not '{value}'"
                        )));
                    }
                }
            }
            _ => {
                let known: Vec<String> =
                    SETTINGS.iter().map(|(k, _)| format!("gyre.{k}")).collect();
                return Err(invalid(format!(
                    "unknown setting '{name}' (known: {})",
                    known.join(", ")
                )));
            }
        }
        next.skew
            .detection()
            .map_err(|e| invalid(format!("{name}: {}", e.message())))?;
        *self = next;
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        SETTINGS
            .iter()
            .map(|(key, description)| ConfigEntry {
                key: format!("gyre.{key}"),
                value: Some(self.value(key)),
                description,
            })
            .collect()
    }
}

fn invalid(message: String) -> DataFusionError {
    DataFusionError::Configuration(message)
}

fn on_off(on: bool) -> String {
    if on { "on" } else { "off" }.to_string()
}

fn parse_on_off(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(invalid(format!("{name} is on or off, not '{other}'"))),
    }
}

/// A duration as PostgreSQL writes `statement_timeout`: a number with a unit (`ms`,
/// `s`, `min`, `h`), or a bare number of milliseconds.
fn parse_duration(name: &str, value: &str) -> Result<std::time::Duration> {
    let text = value.trim().to_ascii_lowercase();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let millis_per = match unit.trim() {
        "" | "ms" => 1.0,
        "s" | "sec" | "secs" => 1e3,
        "min" | "mins" => 60e3,
        "h" | "hour" | "hours" => 3600e3,
        _ => f64::NAN,
    };
    match number.parse::<f64>() {
        Ok(n) if n >= 0.0 && millis_per.is_finite() && n * millis_per < 1e15 => Ok(
            std::time::Duration::from_micros((n * millis_per * 1e3).round() as u64),
        ),
        _ => Err(invalid(format!(
            "{name} is a duration such as '30s', '500ms', '5min' or '1h' (0: no limit), \
             not '{}'",
            value.trim()
        ))),
    }
}

/// A duration as `SHOW` lists it, in the largest unit that writes it whole.
fn duration_text(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0".to_string(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// A share of an input: `0.0001` or `0.01%`.
/// A whole number in `min..=max`.
fn parse_count(name: &str, value: &str, min: u32, max: u32) -> Result<u32> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            invalid(format!(
                "{name} is a whole number from {min} to {max}, not '{value}'"
            ))
        })
}

fn parse_share(name: &str, value: &str) -> Result<f64> {
    let text = value.trim();
    match text.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| {
        invalid(format!(
            "{name} is a share of the input (0.0001 or 0.01%), not '{value}'"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_gyre() -> ConfigOptions {
        let mut c = ConfigOptions::default();
        c.extensions.insert(GyreOptions::default());
        c
    }

    #[test]
    fn settings_are_set_listed_and_checked() {
        let mut c = with_gyre();
        c.set("gyre.join_strategy", "Shuffle").unwrap();
        c.set("gyre.skew_threshold", "0.5%").unwrap();
        c.set("gyre.skew_detection", "off").unwrap();
        c.set("gyre.join_kernel", "RADIX").unwrap();
        c.set("gyre.neo_partitions", "Auto").unwrap();
        assert_eq!(GyreOptions::of(&c).neo.partitions, 0);
        assert_eq!(GyreOptions::of(&c).neo.partitions_for(4), 16);
        c.set("gyre.neo_partitions", "16").unwrap();
        c.set("gyre.neo_solver_ms", "0").unwrap();
        c.set("gyre.neo_adaptive", "off").unwrap();
        assert_eq!(GyreOptions::of(&c).neo.min_saving, DEFAULT_NEO_MIN_SAVING);
        c.set("gyre.neo_min_saving", "40").unwrap();
        assert_eq!(GyreOptions::of(&c).neo.min_saving, Some(40));
        c.set("gyre.neo_min_saving", "OFF").unwrap();
        assert_eq!(GyreOptions::of(&c).neo.schedule, NeoSchedule::Free);
        c.set("gyre.neo_schedule", "Open-Shop").unwrap();
        assert_eq!(GyreOptions::of(&c).neo.schedule, NeoSchedule::OpenShop);
        let o = GyreOptions::of(&c);
        assert_eq!(
            (
                o.neo.partitions,
                o.neo.milp,
                o.neo.adaptive,
                o.neo.min_saving
            ),
            (16, false, false, None)
        );
        assert_eq!(o.join_kernel, JoinKernel::Radix);
        assert_eq!(o.join_strategy, JoinStrategy::Shuffle);
        assert_eq!(o.skew.threshold, 0.005);
        assert!(o.skew_detection().is_none());
        let entries = c.entries();
        let listed = |k: &str| {
            entries
                .iter()
                .find(|e| e.key == k)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(listed("gyre.join_strategy").as_deref(), Some("shuffle"));
        assert_eq!(listed("gyre.skew_detection").as_deref(), Some("off"));
        assert_eq!(listed("gyre.replication").as_deref(), Some("none"));
        c.set("gyre.replication", "Partitioned").unwrap();
        assert_eq!(listed("gyre.shuffle_design").as_deref(), Some("auto"));
        c.set("gyre.skew_detection", "on").unwrap();
        c.set("gyre.shuffle_design", "MESQ/SR").unwrap();
        assert_eq!(GyreOptions::of(&c).shuffle_design, Some(Design::MesqSr));
        assert!(GyreOptions::of(&c).skew_detection().is_some());
        c.set("gyre.shuffle_design", "tcp").unwrap();
        c.set("gyre.skew_detection", "off").unwrap();
        c.set("gyre.shuffle_design", "auto").unwrap();
        assert_eq!(GyreOptions::of(&c).shuffle_design, None);
        assert_eq!(GyreOptions::of(&c).replication, Replication::Partitioned);
        assert_eq!(
            entries
                .iter()
                .filter(|e| e.key.starts_with("gyre."))
                .count(),
            SETTINGS.len()
        );
        for (bad, value, named) in [
            (
                "gyre.join_strategy",
                "fast",
                "auto, shuffle, broadcast, cyclo or neo",
            ),
            ("gyre.compression", "gzip", "lz4"),
            ("gyre.shuffle_design", "rdma", "memq-sr"),
            ("gyre.join_kernel", "sort", "hash, radix or auto"),
            ("gyre.skew_threshold", "2", "gyre.skew_threshold"),
            ("gyre.skew_sample", "0", "gyre.skew_sample"),
            ("gyre.skew_sfr", "maybe", "on or off"),
            ("gyre.neo_partitions", "0", "from 1 to 65536"),
            ("gyre.neo_solver_ms", "-1", "gyre.neo_solver_ms"),
            ("gyre.neo_min_saving", "101", "from 0 to 100 or off"),
            ("gyre.neo_schedule", "phased", "open-shop or free"),
            (
                "gyre.replication",
                "twice",
                "none, full, partitioned, chunked or fragmented",
            ),
            ("gyre.replicas", "0", "from 1 to 16"),
            ("gyre.nothing", "1", "gyre.join_strategy"),
        ] {
            let e = c.set(bad, value).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // A refused value leaves the setting as it was.
        assert_eq!(GyreOptions::of(&c).skew.threshold, 0.005);
    }

    #[test]
    fn statement_timeouts_read_as_postgres_writes_them() {
        let mut c = with_gyre();
        for (value, millis, shown) in [
            ("30s", 30_000, "30s"),
            ("1500", 1500, "1500ms"),
            ("2 min", 120_000, "2min"),
            ("1.5s", 1500, "1500ms"),
            ("1h", 3_600_000, "1h"),
            ("0", 0, "0"),
        ] {
            c.set("gyre.statement_timeout", value).unwrap();
            let t = GyreOptions::of(&c).statement_timeout;
            assert_eq!(t.as_millis(), millis, "{value}");
            assert_eq!(duration_text(t), shown);
        }
        for bad in ["-1s", "soon", "5 days", "1e30h", ""] {
            let e = c
                .set("gyre.statement_timeout", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("such as '30s'"), "{bad}: {e}");
        }
    }
}
