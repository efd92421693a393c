//! The benchmark commands on embedded clusters: they run, their figures add up,
//! and a bad option is refused with a clear message.

use std::process::Command;

fn gyre() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let out = gyre().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "gyre {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_join_cyclo_strategies_agree_on_every_cluster_size() {
    let report = json_of(&[
        "bench",
        "join",
        "--link",
        "loopback",
        "--nodes",
        "1,3",
        "--build",
        "30K",
        "--probe",
        "20K",
        "--strategy",
        "cyclo-hash,cyclo-sort-merge,cyclo-band:2",
        "--zipf",
        "0,0.9",
        "--json",
        "-",
    ]);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 3 * 2);
    for run in runs {
        let workers = run["workers"].as_array().unwrap();
        assert_eq!(workers.len() as u64, run["nodes"].as_u64().unwrap());
        let results: u64 = workers.iter().map(|w| w["results"].as_u64().unwrap()).sum();
        assert_eq!(results, run["results"].as_u64().unwrap());
        // Every probe key is a build key: an equi-join returns each probe tuple once,
        // a band of width 2 about five times as many (fewer at the ends of the key range).
        let expected = match run["strategy"].as_str().unwrap() {
            "cyclo-band:2" => (5 * 20_000 - 5_000)..=5 * 20_000,
            _ => 20_000..=20_000,
        };
        assert!(expected.contains(&results), "{run}");
        // Each worker generated its share of both relations.
        let build: u64 = workers
            .iter()
            .map(|w| w["build_rows_local"].as_u64().unwrap())
            .sum();
        assert_eq!(build, 30_000);
    }
}

/// The partitioned joins run as SQL: the same count and checksum for the plain hash
/// join and Flow-Join with a global list or fetching on demand (the command checks
/// that), and Flow-Join finds heavy hitters only under skew.
#[test]
fn bench_join_partitioned_strategies_agree_with_and_without_skew() {
    let report = json_of(&[
        "bench",
        "join",
        "--link",
        "loopback",
        "--nodes",
        "3",
        "--build",
        "150K",
        "--probe",
        "300K",
        "--strategy",
        "hash,flow,flow-fetch",
        "--zipf",
        "0,1.25",
        "--json",
        "-",
    ]);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 3);
    for run in runs {
        // Unique build keys, every probe key among them: one result per probe row.
        assert_eq!(run["results"].as_u64().unwrap(), 300_000, "{run}");
        assert_eq!(run["workers"].as_array().unwrap().len(), 3, "{run}");
        let heavy = run["heavy_hitters"].as_str();
        // About a hundred keys pass the 0.01% threshold under Zipf 1.25, none without
        // skew; the plain hash join does not look for them.
        let found: Option<u64> = heavy.map(|h| {
            h.trim_start_matches("heavy_hitters=")
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        });
        match (
            run["strategy"].as_str().unwrap(),
            run["zipf"].as_f64().unwrap() > 1.0,
        ) {
            ("hash", _) => assert_eq!(found, None, "{run}"),
            ("flow", true) => assert!(found.unwrap() >= 50, "{run}"),
            // Each worker's own list (the first worker's is shown).
            ("flow-fetch", true) => assert!(found.unwrap() >= 20, "{run}"),
            ("flow" | "flow-fetch", false) => assert_eq!(found, Some(0), "{run}"),
            _ => panic!("{run}"),
        }
    }
}

#[test]
fn bench_join_refuses_an_unknown_strategy() {
    // An unknown cyclo kernel, and an unknown partitioned join.
    for (strategy, named) in [
        ("cyclo-zigzag", "zigzag"),
        ("hash,flow-broadcast", "flow-broadcast"),
    ] {
        let out = gyre()
            .args([
                "bench",
                "join",
                "--link",
                "loopback",
                "--strategy",
                strategy,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{strategy}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{err}");
    }
}

/// Both carriers, TCP and shared memory (send/receive on connections and over
/// datagrams, RDMA Read, RDMA Write),
/// move and check every byte (the command verifies each message against the
/// plan).
#[test]
fn bench_shuffle_on_loopback_moves_every_byte() {
    let report = json_of(&[
        "bench",
        "shuffle",
        "--link",
        "loopback",
        "--nodes",
        "3",
        "--bytes",
        "30MB",
        "--schedule",
        "free,phased",
        "--carrier",
        "tcp,shm",
        "--design",
        "memq-sr,mesq-sr,memq-rd,memq-wr",
        "--pattern",
        "repartition,broadcast",
        "--message-size",
        "64KiB",
        "--json",
        "-",
    ]);
    let runs = report["runs"].as_array().unwrap();
    let designs: Vec<&str> = runs.iter().map(|r| r["design"].as_str().unwrap()).collect();
    for design in [
        "tcp",
        "shm/memq-sr",
        "shm/mesq-sr",
        "shm/memq-rd",
        "shm/memq-wr",
    ] {
        let runs = designs.iter().filter(|d| **d == design).count();
        assert_eq!(runs, 4, "{designs:?}");
    }
    for run in runs {
        let workers = run["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 3);
        // A repartition sends each worker's 10 MB once; a broadcast to both others.
        let each = match run["pattern"].as_str().unwrap() {
            "broadcast" => 20_000_000,
            _ => 10_000_000,
        };
        for w in workers {
            assert_eq!(w["bytes_sent"].as_u64().unwrap(), each, "{w}");
            assert_eq!(w["bytes_received"].as_u64().unwrap(), each, "{w}");
        }
    }
}

/// Several sending threads per node, through one endpoint per node (SE) or
/// one per thread (ME): every byte arrives, and each worker reports its
/// endpoints' queue pairs and registered bytes (ME's grow with the threads).
#[test]
fn bench_shuffle_runs_single_and_multiple_endpoint_designs_with_threads() {
    let report = json_of(&[
        "bench",
        "shuffle",
        "--link",
        "loopback",
        "--nodes",
        "3",
        "--bytes",
        "6MB",
        "--carrier",
        "shm",
        "--design",
        "semq-sr,memq-sr,sesq-sr,semq-rd,semq-wr",
        "--threads",
        "1,3",
        "--message-size",
        "16KiB",
        "--json",
        "-",
    ]);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 10);
    let qps = |design: &str, threads: u64| {
        let run = runs
            .iter()
            .find(|r| r["design"] == design && r["threads"] == threads)
            .unwrap_or_else(|| panic!("no {design} run with {threads} threads"));
        for w in run["workers"].as_array().unwrap() {
            assert_eq!(w["bytes_received"].as_u64().unwrap(), 2_000_000, "{w}");
            assert!(w["design"]["registered_bytes"].as_u64().unwrap() > 0, "{w}");
        }
        run["workers"][0]["design"]["queue_pairs"].as_u64().unwrap()
    };
    // Per worker, a queue pair per sending endpoint and destination plus one
    // per receiving stream: SE holds 2 + 2 whatever the threads, ME 3 x (2 + 2).
    assert_eq!(qps("shm/semq-sr", 1), 4);
    assert_eq!(qps("shm/semq-sr", 3), 4);
    assert_eq!(qps("shm/memq-sr", 1), 4);
    assert_eq!(qps("shm/memq-sr", 3), 12);
    qps("shm/sesq-sr", 3);
    qps("shm/semq-rd", 3);
    qps("shm/semq-wr", 3);
}

/// Receive buffers as the RDMA-aware shuffle's section 6 compares them: a
/// fixed window, the bandwidth-delay product and adaptive buffers, with and
/// without busy receivers. Every byte arrives; the fixed window holds its
/// buffers, the adaptive one reports what it lent and retired over time.
#[test]
fn bench_shuffle_compares_fixed_bdp_and_adaptive_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("buffers.svg");
    let report = json_of(&[
        "bench",
        "shuffle",
        "--link",
        "loopback",
        "--nodes",
        "2",
        "--bytes",
        "8MB",
        "--carrier",
        "shm",
        "--design",
        "memq-sr,mesq-sr",
        "--buffers",
        "4,bdp,adaptive",
        "--consume",
        "0,500",
        "--message-size",
        "4000",
        "--json",
        "-",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    // The rates, and below them the buffers in use over each run.
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("aggregate GB/s"), "{svg}");
    assert!(svg.contains("receive buffers in use"), "{svg}");
    assert!(svg.contains("shm/mesq-sr adaptive 500ns/KiB"), "{svg}");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 3 * 2);
    for run in runs {
        let buffers = run["buffers"].as_str().unwrap();
        for w in run["workers"].as_array().unwrap() {
            assert_eq!(w["bytes_received"].as_u64().unwrap(), 4_000_000, "{w}");
            let d = &w["design"];
            let (mean, peak) = (d["buffers_mean"].as_f64().unwrap(), &d["buffers_peak"]);
            let timeline = d["buffers_over_time"].as_array().unwrap();
            assert!(!timeline.is_empty() && timeline.len() <= 200, "{d}");
            match buffers {
                // A window of 4 and the reserve, for the one stream.
                // (Fewer in the last samples: an ended stream gives its back.)
                "4" => assert!(peak == 5 && mean > 3.0, "{d}"),
                "adaptive" => assert!(mean >= 1.0 && mean <= peak.as_f64().unwrap(), "{d}"),
                b => assert!(b.starts_with("bdp="), "{b}"),
            }
        }
    }
}

/// The TPC-H benchmark of `gyre local` over TCP and a shared-memory design:
/// both answer as DataFusion does, and the bytes a query moved between nodes
/// are counted (a join moves some; the scan-only Q6 little: its partial sums).
#[test]
fn bench_tpch_compares_designs_and_counts_the_bytes_moved() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tpch.json");
    let out = gyre()
        .args([
            "local",
            "--workers",
            "2",
            "--tpch",
            "0.01",
            "--bench",
            "tpch",
        ])
        .args(["--iterations", "1", "--no-duckdb", "--queries", "3,6"])
        .args(["--shuffle-designs", "tcp,memq-sr", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let queries = report["queries"].as_array().unwrap();
    assert_eq!(queries.len(), 2);
    let moved = |i: usize| queries[i]["moved_bytes"].as_u64().unwrap();
    for q in queries {
        assert_eq!(q["same_result"], true, "{q}");
        assert_eq!(q["designs"].as_array().unwrap().len(), 2, "{q}");
    }
    assert!(moved(0) > 5_000, "{report}");
    assert!(moved(1) > 0 && moved(1) < moved(0), "{report}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("MB to other nodes"), "{stdout}");
}

#[test]
fn bench_shuffle_refuses_what_it_cannot_run() {
    for (args, named) in [
        (&["--carrier", "verbs"][..], "verbs"),
        (&["--carrier", "shm", "--design", "tcp"][..], "tcp"),
        (&["--carrier", "shm", "--threads", "0"][..], "--threads"),
        (&["--carrier", "shm", "--design", "nosuch"][..], "nosuch"),
        (
            &[
                "--carrier",
                "shm",
                "--design",
                "memq-rd",
                "--buffers",
                "adaptive",
            ][..],
            "send/receive",
        ),
        (&["--carrier", "shm", "--buffers", "lots"][..], "lots"),
        (&["--carrier", "shm", "--consume", "slow"][..], "--consume"),
    ] {
        let out = gyre()
            .args(["bench", "shuffle", "--link", "loopback", "--bytes", "1MB"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{args:?}: {err}");
    }
    // The shared-memory nodes live in this process: not on emulated hosts.
    let out = gyre()
        .args(["bench", "shuffle", "--link", "1gbit", "--carrier", "shm"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--link loopback"));
}

/// A short CH-benCHmark run: terminals commit, analytical streams complete, the
/// workers replay what the primary logged, and nothing fails (with the growing
/// tables partitioned over the workers; the same SQL on full tables is checked in
/// tests/transactions.rs).
#[test]
fn bench_chbench_mixes_transactions_and_analytical_queries() {
    let r = json_of(&[
        "bench",
        "chbench",
        "--warehouses",
        "2",
        "--customers",
        "30",
        "--terminals",
        "2",
        "--olap-streams",
        "1",
        "--nodes",
        "2",
        "--duration",
        "4",
        "--placement",
        "partitioned",
        "--json",
        "-",
    ]);
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in {r}"));
    assert_eq!(r["placement"], "partitioned", "{r}");
    assert!(f("replica_rows_per_worker") > 0.0, "{r}");
    assert!(f("tx_per_s") > 1.0, "{r}");
    assert!(f("olap_queries_per_h") > 0.0, "{r}");
    assert!(f("log_bytes_per_tx") > 0.0, "{r}");
    assert!(f("replay_speedup") > 0.0, "{r}");
    assert!(f("replay_lag_ms_p99") >= 0.0, "{r}");
    assert!(f("snapshot_ms_p50") >= 0.0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["olap_query_ms_p50"].as_object().unwrap().len(), 4, "{r}");
}
