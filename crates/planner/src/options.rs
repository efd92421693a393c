//! Gyre's settings (`SET gyre.*`) as a DataFusion config extension.
//!
//! Each session's `ConfigOptions` carries its own [`GyreOptions`], so one client's
//! `SET gyre.join_strategy` changes that client's plans only; `SHOW ALL` and
//! `information_schema.df_settings` list every setting with its description, as they
//! do DataFusion's own. A value is checked when it is set: a wrong one is an error
//! naming the setting and the values it takes, and the setting keeps its old value.

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions};
use datafusion::common::{DataFusionError, Result};
use gyre_exchange::{BuildPreserving, Compression, SkewSettings};
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
}

impl JoinStrategy {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "shuffle" => Ok(Self::Shuffle),
            "broadcast" => Ok(Self::Broadcast),
            "cyclo" => Ok(Self::Cyclo),
            other => Err(invalid(format!(
                "gyre.join_strategy is auto, shuffle, broadcast or cyclo, not '{other}'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Shuffle => "shuffle",
            Self::Broadcast => "broadcast",
            Self::Cyclo => "cyclo",
        }
    }

    /// The strategy of a planning config (`auto` without Gyre's options).
    pub fn of(config: &ConfigOptions) -> Self {
        GyreOptions::of(config).join_strategy
    }
}

/// Gyre's session settings, under the prefix `gyre`.
#[derive(Debug, Clone, PartialEq)]
pub struct GyreOptions {
    /// `gyre.compression`: Arrow IPC compression of the exchanges.
    pub compression: Compression,
    /// `gyre.join_strategy`.
    pub join_strategy: JoinStrategy,
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
}

impl Default for GyreOptions {
    /// Skew detection is on unless a session turns it off; run-time filters are off
    /// unless a session turns them on (at TPC-DS SF 1 their per-row cost outweighs
    /// what they prune on this 2-core machine).
    fn default() -> Self {
        Self {
            compression: Compression::default(),
            join_strategy: JoinStrategy::default(),
            join_reorder: true,
            skew_detection: true,
            runtime_filters: false,
            skew: SkewSettings::default(),
        }
    }
}

impl ConfigExtension for GyreOptions {
    const PREFIX: &'static str = "gyre";
}

/// Every setting with its description, in the order `SHOW ALL` lists them.
const SETTINGS: [(&str, &str); 13] = [
    (
        "compression",
        "Arrow IPC compression of data sent between workers: none, lz4, zstd, or auto \
         (LZ4 where the measured link is slower than about 2 Gbit/s).",
    ),
    (
        "join_strategy",
        "How joins are distributed: auto (broadcast or shuffle by size, cyclo-join for \
         large non-equi joins), shuffle, broadcast, or cyclo (inner joins rotate around \
         the workers' ring).",
    ),
    (
        "join_reorder",
        "on: inner joins run in the order that keeps the estimated intermediate \
         results smallest (when that order is much cheaper than the written one); off: \
         in the order the query writes them.",
    ),
    (
        "runtime_filters",
        "on: a hash join's build keys prune its probe input where it is read, before \
         it is shuffled if it comes from another stage (run-time filters); off \
         (default): every probe row reaches the join.",
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

/// A share of an input: `0.0001` or `0.01%`.
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
        let o = GyreOptions::of(&c);
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
                "auto, shuffle, broadcast or cyclo",
            ),
            ("gyre.compression", "gzip", "lz4"),
            ("gyre.skew_threshold", "2", "gyre.skew_threshold"),
            ("gyre.skew_sample", "0", "gyre.skew_sample"),
            ("gyre.skew_sfr", "maybe", "on or off"),
            ("gyre.nothing", "1", "gyre.join_strategy"),
        ] {
            let e = c.set(bad, value).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // A refused value leaves the setting as it was.
        assert_eq!(GyreOptions::of(&c).skew.threshold, 0.005);
    }
}
