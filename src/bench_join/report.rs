//! The report of `gyre bench join`: the tables, the paired ratios with their
//! intervals, how busy the hosts were, and the plot.

use super::{JoinArgs, JoinBenchReport, JoinResult};
use crate::bench_cluster::{BoxError, write_outputs};
use crate::stats::{median, median_interval, spread};
use gyre_testbed::LinkRate;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub(super) fn emit(args: &JoinArgs, r: &JoinBenchReport) -> Result<(), BoxError> {
    let to_stdout = write_outputs(args.json.as_deref(), args.plot.as_deref(), r, plot_svg)?;
    if to_stdout {
        return Ok(());
    }
    println!(
        "{:<18} {:>5} {:>5} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>11} {:>7}",
        "strategy",
        "nodes",
        "zipf",
        "locality",
        "build",
        "probe",
        "time s",
        "setup s",
        "join s",
        "sync s",
        "imbalance",
        "M tuples/s",
        "CPU s"
    );
    for run in &r.runs {
        println!(
            "{:<18} {:>5} {:>5} {:>8} {:>9} {:>9} {:>8.3} {:>8} {:>8} {:>8} {:>9} {:>11.1} {:>7}",
            run.strategy,
            run.nodes,
            run.zipf,
            optional(run.locality, 2),
            run.build_rows,
            run.probe_rows,
            run.elapsed_s,
            optional(run.setup_s, 3),
            optional(run.join_s, 3),
            optional(run.sync_s, 3),
            optional(run.imbalance, 2),
            run.tuples_per_sec / 1e6,
            optional(run.cpu_s, 3)
        );
    }
    let mut heavy: Vec<(&str, usize, f64, &str)> = r
        .runs
        .iter()
        .filter_map(|run| {
            Some((
                run.strategy.as_str(),
                run.nodes,
                run.zipf,
                run.heavy_hitters.as_deref()?,
            ))
        })
        .collect();
    heavy.dedup_by(|a, b| (a.0, a.1, a.2.to_bits()) == (b.0, b.1, b.2.to_bits()));
    if !heavy.is_empty() {
        println!("\nheavy hitters Flow-Join found (EXPLAIN ANALYZE, one run per configuration):");
        for (strategy, nodes, zipf, text) in heavy {
            println!("  {strategy} on {nodes}, Zipf {zipf}: {text}");
        }
    }
    println!(
        "\nper worker: cyclo-join: tuples joined (its share of the work) / results; \
         SQL: CPU seconds / MB received"
    );
    for run in &r.runs {
        let shares: Vec<String> = run
            .workers
            .iter()
            .map(|w| match &run.setup_s {
                Some(_) => format!("w{} {}/{}", w.node, w.tuples_joined, w.results),
                None => format!(
                    "w{} {}/{:.1}",
                    w.node,
                    optional(w.process_cpu_s, 3),
                    w.bytes_received as f64 / 1e6
                ),
            })
            .collect();
        println!(
            "  {} on {}, Zipf {}{}: {}",
            run.strategy,
            run.nodes,
            run.zipf,
            run.locality
                .map(|x| format!(", locality {x}"))
                .unwrap_or_default(),
            shares.join(", ")
        );
    }
    let rows = &r.summary;
    if rows.iter().any(|row| row.runs > 1) {
        println!(
            "\nmedians over the repetitions; time and CPU over the first strategy's in the \
             same repetition: median (its 95% bootstrap interval, from 5 runs) [min-max]:"
        );
        println!(
            "{:<18} {:>5} {:>5} {:>8} {:>4} {:>8} {:>7} {:>9} {:>34} {:>34}",
            "strategy",
            "nodes",
            "zipf",
            "locality",
            "runs",
            "time s",
            "CPU s",
            "imbalance",
            "time ratio",
            "CPU ratio"
        );
        let ratio = |v: &[f64]| match (spread(v), median_interval(v)) {
            (Some((med, lo, hi)), Some((a, b))) => {
                format!("{med:.3} ({a:.3}-{b:.3}) [{lo:.2}-{hi:.2}]")
            }
            (Some((med, lo, hi)), None) => format!("{med:.3} [{lo:.2}-{hi:.2}]"),
            _ => "-".into(),
        };
        for row in rows {
            println!(
                "{:<18} {:>5} {:>5} {:>8} {:>4} {:>8.3} {:>7} {:>9} {:>34} {:>34}",
                row.strategy,
                row.nodes,
                row.zipf,
                optional(row.locality, 2),
                row.runs,
                row.time_s,
                row.cpu_s
                    .map(|c| format!("{c:.3}"))
                    .unwrap_or_else(|| "-".into()),
                optional(row.imbalance, 2),
                ratio(&row.time_ratios),
                ratio(&row.cpu_ratios)
            );
        }
    }
    let busy = busy_summary(r);
    if !busy.is_empty() {
        println!(
            "\nhow busy the hosts were over the join (median over the runs): the share of \
             each host's CPU quota its process used, and of its link's rate in the busier \
             direction; least busy host - busiest"
        );
        println!(
            "{:<18} {:>5} {:>5} {:>8} {:>13} {:>13}",
            "strategy", "nodes", "zipf", "locality", "CPU busy", "link busy"
        );
        let range = |(lo, hi): (f64, f64)| format!("{:.0}-{:.0}%", lo * 100.0, hi * 100.0);
        for b in &busy {
            println!(
                "{:<18} {:>5} {:>5} {:>8} {:>13} {:>13}",
                b.strategy,
                b.nodes,
                b.zipf,
                optional(b.locality, 2),
                b.cpu.map(range).unwrap_or_else(|| "-".into()),
                range(b.link)
            );
        }
    }
    Ok(())
}

/// `v` with `digits` decimals, or "-".
fn optional(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// How busy one strategy's hosts were, on one cluster size and skew.
#[derive(Debug, PartialEq)]
struct Busy {
    strategy: String,
    nodes: usize,
    zipf: f64,
    locality: Option<f64>,
    /// Medians over the runs of the least and the busiest host's share of its CPU
    /// quota (`None` without a quota or CPU figures) and of its link rate.
    cpu: Option<(f64, f64)>,
    link: (f64, f64),
}

/// Busy shares on an emulated cluster (known link rate) over the whole join: the
/// slowest host's elapsed time, so a host that finished early counts as idle for the
/// rest. The link share takes the busier direction: bytes sent or received.
fn busy_summary(r: &JoinBenchReport) -> Vec<Busy> {
    let Ok(rate) = r.link.parse::<LinkRate>() else {
        return vec![];
    };
    let seconds = |run: &JoinResult| run.elapsed_s.max(1e-9);
    let lo_hi = |v: Vec<f64>| {
        v.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
    };
    // Per run: (least, most) busy host's CPU share (if known) and link share.
    let shares = |run: &JoinResult| {
        let cpu: Option<Vec<f64>> = r.cpus.and_then(|quota| {
            run.workers
                .iter()
                .map(|w| Some(w.process_cpu_s? / (seconds(run) * quota)))
                .collect()
        });
        let link: Vec<f64> = run
            .workers
            .iter()
            .map(|w| {
                w.bytes_sent.max(w.bytes_received) as f64 / (seconds(run) * rate.bytes_per_sec())
            })
            .collect();
        (cpu.map(lo_hi), lo_hi(link))
    };
    let groups = by_configuration(r.runs.iter().filter(|run| !run.workers.is_empty()));
    let med = |v: Vec<f64>| median(&v).unwrap_or(0.0);
    groups
        .into_iter()
        .flat_map(|(_, strategies)| strategies)
        .map(|(_, runs)| {
            let run = runs[0];
            let shares: Vec<_> = runs.into_iter().map(&shares).collect();
            let cpu: Option<Vec<(f64, f64)>> = shares.iter().map(|s| s.0).collect();
            Busy {
                strategy: run.strategy.clone(),
                nodes: run.nodes,
                zipf: run.zipf,
                locality: run.locality,
                cpu: cpu.map(|c| {
                    (
                        med(c.iter().map(|x| x.0).collect()),
                        med(c.iter().map(|x| x.1).collect()),
                    )
                }),
                link: (
                    med(shares.iter().map(|s| s.1.0).collect()),
                    med(shares.iter().map(|s| s.1.1).collect()),
                ),
            }
        })
        .collect()
}

/// One strategy on one configuration (cluster size, skew, locality), over its
/// repetitions: the report's `summary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    pub strategy: String,
    pub nodes: usize,
    pub zipf: f64,
    pub locality: Option<f64>,
    pub runs: usize,
    /// Medians.
    pub time_s: f64,
    pub cpu_s: Option<f64>,
    pub imbalance: Option<f64>,
    /// The strategy the ratios are taken over: the configuration's first.
    pub baseline: String,
    /// The median of `time_ratios`.
    pub time_ratio: Option<f64>,
    /// Per repetition: this strategy's time (CPU) over the baseline's. The
    /// strategies of one repetition run back to back, so each pair shares the
    /// machine's conditions; on a noisy machine these ratios are much steadier than
    /// ratios of medians.
    pub time_ratios: Vec<f64>,
    pub cpu_ratios: Vec<f64>,
}

/// A strategy's runs on one configuration, in the order they ran.
type StrategyRuns<'a> = (&'a str, Vec<&'a JoinResult>);

/// A configuration: workers, Zipf exponent and locality (as bits).
type Configuration = (usize, u64, Option<u64>);

/// Runs grouped by configuration, then by strategy, each in the order it first ran.
fn by_configuration<'a>(
    runs: impl Iterator<Item = &'a JoinResult>,
) -> Vec<(Configuration, Vec<StrategyRuns<'a>>)> {
    let mut groups: Vec<(Configuration, Vec<StrategyRuns>)> = vec![];
    for run in runs {
        let key = (
            run.nodes,
            run.zipf.to_bits(),
            run.locality.map(f64::to_bits),
        );
        let at = match groups.iter().position(|g| g.0 == key) {
            Some(i) => i,
            None => {
                groups.push((key, vec![]));
                groups.len() - 1
            }
        };
        let strategies = &mut groups[at].1;
        match strategies.iter_mut().find(|s| s.0 == run.strategy) {
            Some(s) => s.1.push(run),
            None => strategies.push((&run.strategy, vec![run])),
        }
    }
    groups
}

/// Groups runs by configuration and strategy, in the order they ran; the k-th run of
/// a strategy is paired with the k-th run of the group's first strategy.
pub(super) fn paired_summary(runs: &[JoinResult]) -> Vec<SummaryRow> {
    let groups = by_configuration(runs.iter());
    let mut out = vec![];
    for (_, strategies) in &groups {
        let base = &strategies[0].1;
        for (strategy, list) in strategies {
            let pairs = || list.iter().zip(base.iter());
            let cpus: Option<Vec<f64>> = list.iter().map(|r| r.cpu_s).collect();
            let time_ratios: Vec<f64> = pairs()
                .map(|(r, b)| r.elapsed_s / b.elapsed_s.max(1e-9))
                .collect();
            out.push(SummaryRow {
                strategy: strategy.to_string(),
                nodes: list[0].nodes,
                zipf: list[0].zipf,
                locality: list[0].locality,
                runs: list.len(),
                time_s: median(&list.iter().map(|r| r.elapsed_s).collect::<Vec<_>>())
                    .unwrap_or(0.0),
                cpu_s: cpus.as_deref().and_then(median),
                imbalance: median(&list.iter().filter_map(|r| r.imbalance).collect::<Vec<_>>()),
                baseline: strategies[0].0.to_string(),
                time_ratio: median(&time_ratios),
                time_ratios,
                cpu_ratios: pairs()
                    .filter_map(|(r, b)| Some(r.cpu_s? / b.cpu_s?.max(1e-9)))
                    .collect(),
            });
        }
    }
    out
}

/// Time per strategy over the locality when several ran (one line per strategy and
/// Zipf exponent), else over the workers when several cluster sizes ran, else over the
/// Zipf exponent; each polyline goes through the medians of repeated runs,
/// setup/join/sync are in the JSON.
fn plot_svg(r: &JoinBenchReport) -> String {
    let distinct = |f: fn(&JoinResult) -> u64| {
        r.runs
            .iter()
            .map(f)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let by_locality = distinct(|x| x.locality.map_or(u64::MAX, f64::to_bits));
    let by_nodes = !by_locality && distinct(|x| x.nodes as u64);
    let several_zipf = distinct(|x| x.zipf.to_bits());
    let x_of = |x: &JoinResult| match (by_locality, by_nodes) {
        (true, _) => x.locality.unwrap_or(0.0),
        (false, true) => x.nodes as f64,
        _ => x.zipf,
    };
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for run in &r.runs {
        let name = match by_locality && several_zipf {
            true => format!("{} (Zipf {})", run.strategy, run.zipf),
            false => run.strategy.clone(),
        };
        series
            .entry(name)
            .or_default()
            .push((x_of(run), run.elapsed_s));
    }
    let x_label = match (by_locality, by_nodes) {
        (true, _) => "locality",
        (false, true) => "workers",
        _ => "Zipf exponent",
    };
    crate::plot::lines(
        &format!("gyre bench join ({} links): time over {x_label}", r.link),
        x_label,
        "s",
        &series
            .iter()
            .map(|(name, points)| (name.as_str(), points.clone()))
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_cluster::protocol::JoinFigures;

    fn run(strategy: &str, zipf: f64, elapsed_s: f64, cpu_s: Option<f64>) -> JoinResult {
        JoinResult {
            strategy: strategy.into(),
            nodes: 4,
            build_rows: 10,
            probe_rows: 100,
            zipf,
            locality: None,
            elapsed_s,
            tuples_per_sec: 110.0 / elapsed_s,
            setup_s: None,
            join_s: None,
            sync_s: None,
            imbalance: Some(1.0),
            cpu_s,
            results: 100,
            checksum: 7,
            heavy_hitters: None,
            workers: vec![],
        }
    }

    /// Ratios pair the runs of one repetition, so a slow repetition (the machine
    /// busy) moves both strategies and not the ratio.
    #[test]
    fn ratios_pair_each_repetition_with_the_first_strategy() {
        let runs = vec![
            run("hash", 0.0, 1.0, Some(2.0)),
            run("flow", 0.0, 1.1, Some(2.2)),
            // Rotated order: the repetition's runs still pair up.
            run("flow", 0.0, 2.2, Some(4.4)),
            run("hash", 0.0, 2.0, Some(4.0)),
            run("hash", 0.0, 1.5, None),
            run("flow", 0.0, 1.65, Some(3.0)),
            run("hash", 1.25, 3.0, Some(1.0)),
            run("flow", 1.25, 1.0, Some(1.0)),
        ];
        let rows = paired_summary(&runs);
        assert_eq!(rows.len(), 4);
        let flow = &rows[1];
        assert_eq!(
            (flow.strategy.as_str(), flow.zipf, flow.runs),
            ("flow", 0.0, 3)
        );
        assert_eq!(flow.time_s, 1.65);
        // One run without a CPU figure: no median CPU, and only two CPU pairs.
        assert_eq!(flow.cpu_s, Some(3.0));
        assert_eq!(rows[0].cpu_s, None);
        assert!(flow.time_ratios.iter().all(|r| (r - 1.1).abs() < 1e-9));
        assert_eq!(flow.cpu_ratios.len(), 2);
        assert_eq!(
            spread(&flow.time_ratios).map(|s| (s.0 * 10.0).round()),
            Some(11.0)
        );
        let skewed = &rows[3];
        assert_eq!(
            (skewed.zipf, skewed.time_ratios.clone()),
            (1.25, vec![1.0 / 3.0])
        );
    }

    /// Busy shares: CPU over the quota and bytes over the link rate, both over the
    /// slowest host's time, as the least and the busiest host's median over the runs.
    #[test]
    fn busy_shares_are_taken_over_the_whole_join() {
        let worker = |node: u32, cpu_s: f64, sent: u64, received: u64| JoinFigures {
            node,
            strategy: "hash".into(),
            build_rows_local: 0,
            probe_rows_local: 0,
            elapsed_s: 0.5,
            setup_s: 0.0,
            join_s: 0.5,
            sync_s: None,
            tuples_joined: 0,
            bytes_sent: sent,
            bytes_received: received,
            results: 0,
            checksum: 0,
            details: vec![],
            process_cpu_s: Some(cpu_s),
        };
        // 1 Gbit/s = 125 MB/s; a 0.5-CPU quota over 2 s is 1 CPU second.
        let mut a = run("hash", 0.0, 2.0, Some(1.0));
        a.workers = vec![
            worker(1, 1.0, 250_000_000, 0),
            worker(2, 0.5, 0, 125_000_000),
        ];
        let mut b = run("hash", 0.0, 2.0, Some(1.0));
        b.workers = vec![worker(1, 0.8, 50_000_000, 50_000_000), worker(2, 0.2, 0, 0)];
        let report = |link: &str, cpus| JoinBenchReport {
            link: link.into(),
            cpus,
            runs: vec![a.clone(), b.clone()],
            summary: vec![],
        };
        let busy = busy_summary(&report("1gbit", Some(0.5)));
        assert_eq!(busy.len(), 1);
        let (cpu, link) = (busy[0].cpu.unwrap(), busy[0].link);
        // Least busy: 0.5 and 0.2 -> 0.35; busiest: 1.0 and 0.8 -> 0.9.
        assert!(
            (cpu.0 - 0.35).abs() < 1e-9 && (cpu.1 - 0.9).abs() < 1e-9,
            "{cpu:?}"
        );
        // Links: run a 1.0 and 0.5 (the received side), run b 0.2 and 0.
        assert!(
            (link.0 - 0.25).abs() < 1e-9 && (link.1 - 0.6).abs() < 1e-9,
            "{link:?}"
        );
        assert_eq!(busy_summary(&report("1gbit", None))[0].cpu, None);
        assert!(busy_summary(&report("loopback", None)).is_empty());
    }
}
