//! `gyre bench fragments`: a transactional table fragmented by rendezvous hashing
//! (`WITH (replicas = x)`) while workers die and join (ScyPer's outlook, Rödiger's
//! thesis section 5.3).
//!
//! A coordinator and `--workers` workers run as processes of this binary on loopback.
//! Each round starts a self-join of the table through Flight SQL, kills (-9) a worker
//! while it runs, and checks the join's answer (the coordinator runs it again on the
//! remaining workers). Once the survivors hold their new shares, a new worker joins:
//! the round records the rows and bytes of state it received, what the others
//! received meanwhile, and what a worker's departure cost, against the rendezvous
//! ideal (a newcomer takes `x / n` of the rows, nobody else anything).

use crate::bench_cluster::{BoxError, write_outputs};
use crate::bench_failover::{free_port, spawner};
use crate::client::RemoteClient;
use crate::plot::{Series, grouped_bars};
use clap::Args;
use datafusion::arrow::array::{Array, Int64Array};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct FragmentsArgs {
    /// Workers at the start (a killed one is replaced in each round).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Copies of each block.
    #[arg(long, default_value_t = 2)]
    replicas: u8,
    /// Rows of the table.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Rounds: a worker killed during a join, then a new one joining.
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the rows each newcomer received against the ideal as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Round {
    /// Whether the join was still running when the worker was killed.
    running_at_kill: bool,
    /// Whether it then returned the right answer.
    answered: bool,
    join_ms: f64,
    /// Rows and bytes of state the survivors received after the kill.
    leave_rows: u64,
    leave_bytes: u64,
    /// Rows and bytes of state the newcomer received.
    join_rows: u64,
    join_bytes: u64,
    /// Bytes of state the other workers received while it joined.
    join_bytes_others: u64,
    /// What rendezvous hashing moves at best when a worker joins: `x / n` of the rows.
    ideal_join_rows: f64,
}

#[derive(Serialize)]
struct Report {
    workers: usize,
    replicas: u8,
    rows: u64,
    rounds: Vec<Round>,
    /// Of the joins running at a kill, the share that returned the right answer.
    retry_success_rate: f64,
    /// Rows a newcomer received over the ideal `x / n` of the table, averaged.
    join_rows_over_ideal: f64,
    /// Bytes of state other workers received while one joined, summed over the rounds.
    join_bytes_others: u64,
    /// Rows the survivors received when a worker left, over the ideal (the dead
    /// worker's copies, `x / n` of the rows), averaged.
    leave_rows_over_ideal: f64,
}

/// Each worker's id, replica rows and bytes of state received.
async fn replicas(client: &RemoteClient) -> Result<Vec<(i64, u64, u64)>, BoxError> {
    let batches = client
        .query(
            "SELECT CAST(worker AS BIGINT) AS w, CAST(replica_rows AS BIGINT) AS r, \
             CAST(replica_state_bytes AS BIGINT) AS b FROM gyre_workers() ORDER BY w",
        )
        .await?;
    let mut out = vec![];
    for b in batches {
        let col = |i: usize| -> Result<Int64Array, BoxError> {
            Ok(b.column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or("gyre_workers() columns are not BIGINT")?
                .clone())
        };
        let (w, r, s) = (col(0)?, col(1)?, col(2)?);
        out.extend((0..w.len()).map(|i| (w.value(i), r.value(i) as u64, s.value(i) as u64)));
    }
    Ok(out)
}

/// The workers' replicas once `n` workers are live and none has received state for
/// two seconds (the coordinator checks shares every second).
async fn settled(client: &RemoteClient, n: usize) -> Result<Vec<(i64, u64, u64)>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (Instant::now(), vec![]);
    loop {
        let now = match replicas(client).await {
            Ok(now) => now,
            // A worker just killed fails the call until it is declared dead.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if now != last.1 {
            last = (Instant::now(), now);
        } else if now.len() == n
            && now.iter().all(|w| w.1 > 0)
            && last.0.elapsed() > Duration::from_secs(2)
        {
            return Ok(now);
        }
        if Instant::now() > deadline {
            return Err(
                format!("the workers did not settle within 2 minutes: {:?}", last.1).into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// State rows and bytes received by the workers of `after` since `before`.
fn received(before: &[(i64, u64, u64)], after: &[(i64, u64, u64)], skip: Option<i64>) -> u64 {
    after
        .iter()
        .filter(|w| Some(w.0) != skip)
        .map(|w| {
            let had = before.iter().find(|b| b.0 == w.0).map_or(0, |b| b.2);
            w.2.saturating_sub(had)
        })
        .sum()
}

pub async fn run(args: FragmentsArgs) -> Result<(), BoxError> {
    let quiet = args.json.as_deref() == Some(std::path::Path::new("-"));
    let say = |s: String| {
        if quiet {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    if args.workers < 2 || args.replicas < 2 || usize::from(args.replicas) > args.workers {
        return Err("the bench needs at least two workers and 2 <= --replicas <= --workers".into());
    }
    let spawn = spawner("bench fragments")?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let _coordinator = spawn(&["coordinator", "--listen", &addr])?;
    let worker = || spawn(&["worker", "--coordinator", &addr, "--threads", "1"]);
    let mut workers = (0..args.workers)
        .map(|_| worker())
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        if let Ok(c) = RemoteClient::connect(&addr).await
            && replicas(&c).await.is_ok_and(|w| w.len() == args.workers)
        {
            break c;
        }
        if Instant::now() > deadline {
            return Err("the coordinator did not see its workers within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (n, x) = (args.rows, args.replicas);
    client
        .query(&format!(
            "CREATE TABLE frag (k BIGINT PRIMARY KEY, v BIGINT) WITH (replicas = {x})"
        ))
        .await?;
    // v repeats every 10,000 keys: the self-join makes n * n / 10,000 pairs.
    client
        .query(&format!(
            "INSERT INTO frag SELECT value, value % 10000 FROM generate_series(1, {n}) AS s(value)"
        ))
        .await?;
    let join = "SELECT count(*), sum(a.k % 7 * b.k % 11) FROM frag a JOIN frag b ON a.v = b.v";
    let answer = |batches: &[datafusion::arrow::array::RecordBatch]| {
        datafusion::arrow::util::pretty::pretty_format_batches(batches)
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let expected = answer(&client.query(join).await?);
    say(format!(
        "{} workers, {x} copies of each block, {n} rows; the join's answer:\n{expected}",
        args.workers
    ));
    say(format!(
        "{:>5} {:>8} {:>8} {:>9} {:>12} {:>10} {:>12} {:>12}",
        "round",
        "running",
        "answer",
        "join ms",
        "leave rows",
        "join rows",
        "ideal rows",
        "others B"
    ));
    let mut rounds = vec![];
    for round in 1..=args.kills {
        let before_kill = settled(&client, args.workers).await?;
        let runner = RemoteClient::connect(&addr).await?;
        let started = Instant::now();
        let query = tokio::spawn(async move {
            runner
                .query(join)
                .await
                .map(|b| answer(&b))
                .map_err(|e| e.to_string())
        });
        tokio::time::sleep(Duration::from_millis(200 + rand::random::<u64>() % 400)).await;
        let running_at_kill = !query.is_finished();
        let victim = rand::random::<u64>() as usize % workers.len();
        drop(workers.remove(victim));
        let result = query.await.map_err(|e| e.to_string())?;
        let join_ms = started.elapsed().as_secs_f64() * 1e3;
        let answered = result.as_ref().is_ok_and(|got| *got == expected);
        if let Err(e) = &result {
            say(format!("round {round}: the join failed: {e}"));
        }
        let after_kill = settled(&client, args.workers - 1).await?;
        let leave_bytes = received(&before_kill, &after_kill, None);
        let leave_rows: u64 = after_kill
            .iter()
            .filter(|w| received(&before_kill, std::slice::from_ref(w), None) > 0)
            .map(|w| w.1)
            .sum();
        workers.push(worker()?);
        let after_join = settled(&client, args.workers).await?;
        let newcomer = after_join
            .iter()
            .find(|w| !after_kill.iter().any(|b| b.0 == w.0))
            .ok_or("no new worker among the workers")?;
        let r = Round {
            running_at_kill,
            answered,
            join_ms,
            leave_rows,
            leave_bytes,
            join_rows: newcomer.1,
            join_bytes: newcomer.2,
            join_bytes_others: received(&after_kill, &after_join, Some(newcomer.0)),
            ideal_join_rows: n as f64 * f64::from(x) / args.workers as f64,
        };
        say(format!(
            "{round:>5} {:>8} {:>8} {join_ms:>9.0} {:>12} {:>10} {:>12.0} {:>12}",
            r.running_at_kill,
            r.answered,
            r.leave_rows,
            r.join_rows,
            r.ideal_join_rows,
            r.join_bytes_others
        ));
        rounds.push(r);
    }
    let running = rounds.iter().filter(|r| r.running_at_kill).count();
    let right = rounds
        .iter()
        .filter(|r| r.running_at_kill && r.answered)
        .count();
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = v.collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let ideal_leave = n as f64 * f64::from(x) / args.workers as f64;
    let report = Report {
        workers: args.workers,
        replicas: x,
        rows: n,
        retry_success_rate: right as f64 / running.max(1) as f64,
        join_rows_over_ideal: mean(
            &mut rounds
                .iter()
                .map(|r| r.join_rows as f64 / r.ideal_join_rows),
        ),
        join_bytes_others: rounds.iter().map(|r| r.join_bytes_others).sum(),
        leave_rows_over_ideal: mean(&mut rounds.iter().map(|r| r.leave_rows as f64 / ideal_leave)),
        rounds,
    };
    say(format!(
        "retries: {} of {} joins running at a kill answered right; a newcomer received \
         {:.2}x the ideal rows, the others {} bytes; a departure moved {:.2}x the ideal",
        right,
        running,
        report.join_rows_over_ideal,
        report.join_bytes_others,
        report.leave_rows_over_ideal
    ));
    let failed = running - right;
    write_outputs(args.json.as_deref(), args.plot.as_deref(), &report, |r| {
        let labels: Vec<String> = (1..=r.rounds.len()).map(|i| i.to_string()).collect();
        let values: Vec<Vec<f64>> = r
            .rounds
            .iter()
            .map(|round| {
                vec![
                    round.ideal_join_rows,
                    round.join_rows as f64,
                    round.leave_rows as f64,
                ]
            })
            .collect();
        grouped_bars(
            &format!(
                "Rows moved per round ({} workers, {} copies; retries {:.0}% right)",
                r.workers,
                r.replicas,
                r.retry_success_rate * 100.0
            ),
            "rows",
            &[
                Series {
                    name: "ideal on a join (x/n)",
                    color: "#999999",
                },
                Series {
                    name: "to the joining worker",
                    color: "#4c72b0",
                },
                Series {
                    name: "to the survivors of a kill",
                    color: "#dd8452",
                },
            ],
            &labels,
            &values,
        )
    })?;
    if failed > 0 {
        return Err(format!("{failed} joins running at a kill did not answer right").into());
    }
    Ok(())
}
