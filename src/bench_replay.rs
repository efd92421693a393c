//! `gyre bench replay`: ScyPer's log experiment (Rödiger's thesis, section 5.2.1,
//! figure 5.5 and the log sizes next to it) on TPC-C: what a logical and a physical
//! redo log cost per transaction, and how much faster a secondary replays them than
//! the primary executed the transactions.
//!
//! Per log mode and round: the TPC-C mix runs on a primary with a durable log
//! (`--threads` terminals, so group commit shares the fsyncs), whose durable groups a
//! secondary replays as shipped (row store and versioned Arrow tables); the same
//! calls run again serially on a primary without a log, which is the original
//! execution time. Execution and replay alternate in ten pieces, and rounds alternate
//! the modes, so a noisy machine shifts both alike.

use crate::stats::median;
use clap::Args;
use gyre_replica::{Database, LogMode, Options, Secondary};
use gyre_tpcc::{Kind, Mix, Scale, Terminal, create_and_load, procedures};
use parking_lot::Mutex;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error>;

#[derive(Args, Clone)]
pub struct ReplayArgs {
    /// TPC-C warehouses (the specification's size each).
    #[arg(long, default_value_t = 1)]
    warehouses: i64,
    /// Transactions of the mix per round.
    #[arg(long, default_value_t = 100_000)]
    transactions: usize,
    /// Terminals on the durable primary.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Rounds per log mode; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Transactions drawn: `full` (the specification's mix) or `new-order-payment`
    /// (those two alone, the transactions HyPer's per-core rate counts).
    #[arg(long, default_value = "full")]
    mix: Mix,
    /// Items and customers per district scaled down (for quick runs): 0 keeps the
    /// specification's.
    #[arg(long, default_value_t = 0)]
    customers: i64,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    log: String,
    transactions: usize,
    /// Transactions that wrote a log entry (read-only and rolled-back ones write none).
    logged: u64,
    log_bytes_per_tx: f64,
    log_written_bytes_per_tx: f64,
    lz4_saving: f64,
    execute_us_per_tx: f64,
    /// Execution of New-Order and Payment alone, per transaction.
    new_order_us: f64,
    payment_us: f64,
    replay_us_per_tx: f64,
    /// The part of the replay spent on the versioned Arrow tables.
    columnar_us_per_tx: f64,
    /// Replay with decoding the shipped groups.
    replay_with_decoding_us_per_tx: f64,
    /// Bringing the secondary's row store up to the rows physical entries changed
    /// (the replay leaves it behind until something reads it), per transaction: not
    /// part of the replay.
    catch_up_us_per_tx: f64,
    /// Original execution time over replay time.
    replay_speedup: f64,
    durable_tx_per_s: f64,
}

struct Round {
    logged: u64,
    raw: u64,
    written: u64,
    execute: Duration,
    /// Execution time and calls per kind of transaction (`Kind::ALL`'s order).
    by_kind: [(Duration, u32); 5],
    replay: Duration,
    /// The part of `replay` spent on the versioned Arrow tables.
    columnar: Duration,
    /// `replay` plus decoding the groups (LZ4, entries).
    with_decoding: Duration,
    /// The row store brought up to date after the replay.
    catch_up: Duration,
    durable: Duration,
}

const LOAD_TIME: i64 = 1_750_000_000_000_000_000;
/// Pieces the execution and the replay are timed in, alternately.
const PIECES: usize = 10;

fn calls(scale: Scale, mix: Mix, n: usize, terminals: usize) -> Vec<Vec<gyre_tpcc::Call>> {
    (0..terminals)
        .map(|t| {
            let home = 1 + t as i64 % scale.warehouses;
            let mut terminal = Terminal::new(scale, home, t as u64).with_mix(mix);
            (0..n / terminals)
                .map(|i| terminal.next(LOAD_TIME + 1_000 * i as i64))
                .collect()
        })
        .collect()
}

/// Applies shipped groups until the secondary reaches `lsn` (the log ships a group just
/// after it is durable, so the last ones may still be on their way); returns the time
/// spent applying them.
fn catch_up(
    secondary: &mut Secondary,
    shipped: &Mutex<Vec<Vec<u8>>>,
    lsn: u64,
) -> Result<Duration, BoxError> {
    let mut spent = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(30);
    while secondary.lsn() < lsn {
        let frames = std::mem::take(&mut *shipped.lock());
        for f in &frames {
            let started = Instant::now();
            secondary.apply_frames(f)?;
            spent += started.elapsed();
        }
        if frames.is_empty() {
            if Instant::now() > deadline {
                return Err(format!(
                    "the secondary reached LSN {}, the primary {lsn}",
                    secondary.lsn()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(spent)
}

fn round(mode: LogMode, scale: Scale, args: &ReplayArgs) -> Result<Round, String> {
    round_inner(mode, scale, args).map_err(|e| e.to_string())
}

fn round_inner(mode: LogMode, scale: Scale, args: &ReplayArgs) -> Result<Round, BoxError> {
    let work = calls(scale, args.mix, args.transactions, args.threads.max(1));
    let dir = tempfile::tempdir()?;
    let primary = Database::open(
        Options {
            log_mode: mode,
            ..Options::durable(dir.path())
        },
        procedures(),
    )?;
    let shipped: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = Arc::clone(&shipped);
    primary.ship(Box::new(move |_, frames| sink.lock().push(frames.to_vec())))?;
    create_and_load(&primary, scale, LOAD_TIME)?;
    let loaded = primary.log_stats().unwrap_or_default();
    // The secondary replays the load untimed.
    let mut secondary = Secondary::new(procedures());
    catch_up(&mut secondary, &shipped, primary.durable_lsn())?;

    let primary = Arc::new(primary);
    let started = Instant::now();
    std::thread::scope(|s| {
        for calls in &work {
            let primary = Arc::clone(&primary);
            s.spawn(move || {
                for c in calls {
                    // New-Order's unused items roll back, as the mix wants.
                    let _ = primary.call(c.procedure(), &c.args);
                }
            });
        }
    });
    let durable = started.elapsed();
    let stats = primary.log_stats().unwrap_or_default();
    let lsn = primary.durable_lsn();
    // Closing the primary stops its committer after it has shipped every group.
    drop(primary);
    let frames = std::mem::take(&mut *shipped.lock());

    // The original execution: the same calls, serially, on a primary without a log.
    // It alternates with the replay of the shipped groups in pieces, so that a busy
    // spell on a shared machine slows both alike rather than one of them.
    let plain = Database::open(Options::default(), procedures())?;
    create_and_load(&plain, scale, LOAD_TIME)?;
    let serial: Vec<&gyre_tpcc::Call> = work.iter().flatten().collect();
    let (_, before) = secondary.replay_stats();
    let columnar_before = secondary.columnar_time();
    let (mut execute, mut with_decoding) = (Duration::ZERO, Duration::ZERO);
    let mut by_kind = [(Duration::ZERO, 0); 5];
    for k in 0..PIECES {
        let piece = |len: usize| k * len / PIECES..(k + 1) * len / PIECES;
        let started = Instant::now();
        let mut call_started = started;
        for c in &serial[piece(serial.len())] {
            // New-Order's unused items roll back, as the mix wants.
            let _ = plain.call(c.procedure(), &c.args);
            let now = Instant::now();
            let kind = &mut by_kind[c.kind as usize];
            kind.0 += now - call_started;
            kind.1 += 1;
            call_started = now;
        }
        execute += started.elapsed();
        for f in &frames[piece(frames.len())] {
            let started = Instant::now();
            secondary.apply_frames(f)?;
            with_decoding += started.elapsed();
        }
    }
    if secondary.lsn() != lsn {
        return Err(format!(
            "the secondary replayed to LSN {}, the primary made {lsn} durable",
            secondary.lsn()
        )
        .into());
    }
    let (_, after) = secondary.replay_stats();
    let columnar = secondary.columnar_time() - columnar_before;
    let caught = Instant::now();
    secondary.rows()?;
    let catch_up = caught.elapsed();
    Ok(Round {
        logged: stats.entries - loaded.entries,
        raw: stats.raw_bytes - loaded.raw_bytes,
        written: stats.written_bytes - loaded.written_bytes,
        execute,
        by_kind,
        replay: after - before,
        columnar,
        with_decoding,
        catch_up,
        durable,
    })
}

/// A round's execution time per call of one kind, in µs.
fn kind_us(r: &Round, kind: Kind) -> f64 {
    let (time, calls) = r.by_kind[kind as usize];
    time.as_secs_f64() * 1e6 / f64::from(calls.max(1))
}

pub async fn run(args: ReplayArgs) -> Result<(), BoxError> {
    let scale = Scale::with_customers(args.warehouses, args.customers);
    let modes = [LogMode::Logical, LogMode::Physical];
    let mut rounds: Vec<Vec<Round>> = vec![vec![], vec![]];
    for r in 0..args.repeat.max(1) {
        for (i, mode) in modes.iter().enumerate() {
            let a = args.clone();
            let mode = *mode;
            let result = tokio::task::spawn_blocking(move || round(mode, scale, &a))
                .await?
                .map_err(|e| format!("{mode:?} round {r}: {e}"))?;
            eprintln!(
                "round {}/{} {mode:?}: {} logged, {:.0} B/tx, replay {:.1} ms, execute {:.1} ms",
                r + 1,
                args.repeat.max(1),
                result.logged,
                result.raw as f64 / result.logged.max(1) as f64,
                result.replay.as_secs_f64() * 1e3,
                result.execute.as_secs_f64() * 1e3
            );
            rounds[i].push(result);
        }
    }
    println!(
        "{:>9} {:>8} {:>10} {:>10} {:>7} {:>11} {:>7} {:>7} {:>10} {:>9} {:>10} {:>8} {:>9} {:>10}",
        "log",
        "logged",
        "B/tx raw",
        "B/tx LZ4",
        "LZ4",
        "exec µs/tx",
        "NO µs",
        "Pay µs",
        "replay µs",
        "columnar",
        "+decoding",
        "speedup",
        "catch-up",
        "tx/s dur."
    );
    let mut rows = vec![];
    for (mode, rounds) in modes.iter().zip(&rounds) {
        let per = |f: &dyn Fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        let n = args.transactions as f64;
        let row = Row {
            log: format!("{mode:?}").to_lowercase(),
            transactions: args.transactions,
            logged: rounds[0].logged,
            log_bytes_per_tx: per(&|r| r.raw as f64 / r.logged.max(1) as f64).unwrap_or(0.0),
            log_written_bytes_per_tx: per(&|r| r.written as f64 / r.logged.max(1) as f64)
                .unwrap_or(0.0),
            lz4_saving: per(&|r| 1.0 - r.written as f64 / r.raw.max(1) as f64).unwrap_or(0.0),
            execute_us_per_tx: per(&|r| r.execute.as_secs_f64() * 1e6 / n).unwrap_or(0.0),
            new_order_us: per(&|r| kind_us(r, Kind::NewOrder)).unwrap_or(0.0),
            payment_us: per(&|r| kind_us(r, Kind::Payment)).unwrap_or(0.0),
            replay_us_per_tx: per(&|r| r.replay.as_secs_f64() * 1e6 / n).unwrap_or(0.0),
            columnar_us_per_tx: per(&|r| r.columnar.as_secs_f64() * 1e6 / n).unwrap_or(0.0),
            replay_with_decoding_us_per_tx: per(&|r| r.with_decoding.as_secs_f64() * 1e6 / n)
                .unwrap_or(0.0),
            catch_up_us_per_tx: per(&|r| r.catch_up.as_secs_f64() * 1e6 / n).unwrap_or(0.0),
            replay_speedup: per(&|r| r.execute.as_secs_f64() / r.replay.as_secs_f64().max(1e-9))
                .unwrap_or(0.0),
            durable_tx_per_s: per(&|r| n / r.durable.as_secs_f64().max(1e-9)).unwrap_or(0.0),
        };
        println!(
            "{:>9} {:>8} {:>10.0} {:>10.0} {:>6.0}% {:>11.1} {:>7.1} {:>7.1} {:>10.1} {:>9.1} {:>10.1} {:>7.2}x {:>9.1} {:>10.0}",
            row.log,
            row.logged,
            row.log_bytes_per_tx,
            row.log_written_bytes_per_tx,
            row.lz4_saving * 100.0,
            row.execute_us_per_tx,
            row.new_order_us,
            row.payment_us,
            row.replay_us_per_tx,
            row.columnar_us_per_tx,
            row.replay_with_decoding_us_per_tx,
            row.replay_speedup,
            row.catch_up_us_per_tx,
            row.durable_tx_per_s
        );
        rows.push(row);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
