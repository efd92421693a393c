//! `gyre bench failover`: how long a cluster of voting coordinators is without a
//! primary when the primary dies (ScyPer's failover, by Raft election).
//!
//! Three coordinators (`gyre coordinator --voters`) and two workers run as processes
//! of this binary on loopback. A client commits rows one at a time through Flight SQL.
//! Each round kills (-9) the primary and times the path a client sees: from the kill
//! to the first commit the new primary acknowledges (election, the new primary's
//! start, the client finding it). The killed voter then restarts on its directory
//! and catches up before the next round. At the end every acknowledged row must be
//! there, once.

use crate::bench_cluster::{BoxError, write_outputs};
use crate::client::RemoteClient;
use crate::plot::{Series, grouped_bars};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct FailoverArgs {
    /// Primaries killed, one per round.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Rows committed in each round before the kill.
    #[arg(long, default_value_t = 20)]
    commits: usize,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw each round's failover time as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    voters: usize,
    workers: usize,
    kills: usize,
    /// Kill of the primary to the first commit acknowledged by the next, per round.
    failover_ms: Vec<f64>,
    failover_ms_p50: f64,
    failover_ms_max: f64,
    rows_acknowledged: usize,
    rows_found: usize,
}

/// A child process, killed (-9) when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts processes of this binary (`gyre ARGS`) with a cluster secret of their own,
/// standard output discarded.
pub(crate) fn spawner(
    name: &str,
) -> Result<impl Fn(&[&str]) -> Result<Proc, BoxError> + use<>, BoxError> {
    let exe = std::env::current_exe()?;
    let secret = format!("{name} {}", rand::random::<u64>());
    Ok(move |args: &[&str]| -> Result<Proc, BoxError> {
        Ok(Proc(
            Command::new(&exe)
                .args(args)
                .env("GYRE_SECRET", &secret)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?,
        ))
    })
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The client of whichever coordinator is the primary now, if one answers.
async fn primary(addrs: &[String]) -> Option<(usize, RemoteClient)> {
    for (i, addr) in addrs.iter().enumerate() {
        if let Ok(client) = RemoteClient::connect(addr).await
            && client.probe().await.is_ok()
        {
            return Some((i, client));
        }
    }
    None
}

/// Commits row `k`, finding the primary again for as long as it takes (at most a
/// minute). Returns which voter acknowledged it. An attempt whose answer was lost may
/// have committed: the next one then finds the key taken, which is the row's
/// acknowledgement.
async fn commit(addrs: &[String], k: usize) -> Result<usize, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tried = false;
    loop {
        if let Some((i, client)) = primary(addrs).await {
            match client
                .query(&format!("INSERT INTO failover VALUES ({k})"))
                .await
            {
                Ok(_) => return Ok(i),
                Err(e) if tried && e.to_string().contains("duplicate key") => return Ok(i),
                Err(_) => tried = true,
            }
        }
        if Instant::now() > deadline {
            return Err(format!("row {k}: no primary acknowledged it within a minute").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn run(args: FailoverArgs) -> Result<(), BoxError> {
    let quiet = args.json.as_deref() == Some(std::path::Path::new("-"));
    let say = |s: String| {
        if quiet {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let spawn = spawner("bench failover")?;
    let clients = (0..3)
        .map(|_| Ok(format!("127.0.0.1:{}", free_port()?)))
        .collect::<Result<Vec<_>, std::io::Error>>()?;
    let list = clients
        .iter()
        .map(|c| Ok(format!("{c}/127.0.0.1:{}", free_port()?)))
        .collect::<Result<Vec<_>, std::io::Error>>()?
        .join(",");
    let dirs = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<Vec<_>, _>>()?;
    let voter = |i: usize| {
        spawn(&[
            "coordinator",
            "--listen",
            &clients[i],
            "--data-dir",
            dirs[i].path().to_str().expect("a UTF-8 temporary path"),
            "--voters",
            &list,
        ])
    };
    let mut voters = (0..3)
        .map(|i| voter(i).map(Some))
        .collect::<Result<Vec<_>, _>>()?;
    let all = clients.join(",");
    let _workers = (0..2)
        .map(|_| spawn(&["worker", "--coordinator", &all, "--threads", "1"]))
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        if let Some((_, c)) = primary(&clients).await
            && c.query("SELECT count(*) FROM gyre_workers()").await.is_ok()
        {
            break c;
        }
        if Instant::now() > deadline {
            return Err("the voters elected no primary with workers within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    client
        .query("CREATE TABLE failover (k BIGINT PRIMARY KEY) WITH (replication = 'full')")
        .await?;
    drop(client);

    let mut acked = 0;
    let mut failover_ms = vec![];
    say(format!(
        "{:>5} {:>12} {:>8}",
        "round", "failover ms", "primary"
    ));
    for round in 1..=args.kills {
        let mut last = 0;
        for _ in 0..args.commits {
            acked += 1;
            last = commit(&clients, acked).await?;
        }
        voters[last] = None;
        let killed = Instant::now();
        acked += 1;
        let next = commit(&clients, acked).await?;
        let ms = killed.elapsed().as_secs_f64() * 1e3;
        say(format!("{round:>5} {ms:>12.0} {:>8}", next + 1));
        failover_ms.push(ms);
        voters[last] = Some(voter(last)?);
        // The restarted voter catches up before the next primary is killed, so that a
        // majority is there to elect one.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let found = loop {
        if let Some((_, c)) = primary(&clients).await
            && let Ok(batches) = c.query("SELECT count(DISTINCT k) FROM failover").await
            && let Some(n) = batches.first().and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .map(|a| a.value(0) as usize)
            })
            && n >= acked
        {
            break n;
        }
        if Instant::now() > deadline {
            return Err("the acknowledged rows were not all found within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut sorted = failover_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let report = Report {
        voters: 3,
        workers: 2,
        kills: args.kills,
        failover_ms_p50: crate::stats::median(&sorted).unwrap_or(0.0),
        failover_ms_max: sorted.last().copied().unwrap_or(0.0),
        failover_ms,
        rows_acknowledged: acked,
        rows_found: found,
    };
    say(format!(
        "failover p50 {:.0} ms, max {:.0} ms over {} kills; {} rows acknowledged, {} found",
        report.failover_ms_p50, report.failover_ms_max, report.kills, acked, found
    ));
    if found != acked {
        return Err(format!("{acked} rows acknowledged, {found} found").into());
    }
    write_outputs(args.json.as_deref(), args.plot.as_deref(), &report, |r| {
        let labels: Vec<String> = (1..=r.kills).map(|i| i.to_string()).collect();
        let values: Vec<Vec<f64>> = r.failover_ms.iter().map(|ms| vec![*ms]).collect();
        grouped_bars(
            &format!(
                "Kill -9 of the primary to the first commit on the next (3 voters; p50 {:.0} ms)",
                r.failover_ms_p50
            ),
            "ms",
            &[Series {
                name: "failover",
                color: "#4c72b0",
            }],
            &labels,
            &values,
        )
    })?;
    Ok(())
}
