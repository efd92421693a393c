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

#[test]
fn bench_join_refuses_an_unknown_strategy() {
    let out = gyre()
        .args([
            "bench",
            "join",
            "--link",
            "loopback",
            "--strategy",
            "cyclo-zigzag",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("zigzag"), "{err}");
}

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
        "--json",
        "-",
    ]);
    for run in report["runs"].as_array().unwrap() {
        let workers = run["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 3);
        for w in workers {
            assert_eq!(w["bytes_sent"].as_u64().unwrap(), 10_000_000, "{w}");
            assert_eq!(w["bytes_received"].as_u64().unwrap(), 10_000_000, "{w}");
        }
    }
}
