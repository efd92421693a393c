//! The `gyre` command line: `local -c/-f/--format`, and `local --listen` serving
//! Flight SQL to `gyre sql` and `gyre load`.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn gyre() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
}

fn stdout_of(out: Output) -> String {
    assert!(
        out.status.success(),
        "gyre failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn local_runs_statements_in_order_in_every_format() {
    let out = gyre()
        .args(["local", "--workers", "2", "--format", "csv", "-c"])
        .arg("CREATE TABLE t (k INT PRIMARY KEY, v VARCHAR); INSERT INTO t VALUES (2, 'b'), (1, 'a'); SELECT k, v FROM t ORDER BY k")
        .output()
        .unwrap();
    let text = stdout_of(out);
    assert!(text.ends_with("k,v\n1,a\n2,b\n"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("q.sql");
    std::fs::write(&script, "SELECT 40 + 2 AS answer;\nSELECT 'x' AS s;").unwrap();
    let out = gyre()
        .args(["local", "--workers", "1", "--format", "json", "-f"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(stdout_of(out), "[{\"answer\":42}]\n[{\"s\":\"x\"}]\n");

    let out = gyre()
        .args(["local", "--workers", "2", "-c", "SELECT 1 AS one"])
        .output()
        .unwrap();
    let text = stdout_of(out);
    assert!(
        text.contains("| one |") && text.contains("(1 row)"),
        "{text}"
    );

    // --timing: each statement's answer, then its time, as psql's \timing.
    let out = gyre()
        .args([
            "local",
            "--workers",
            "2",
            "--format",
            "csv",
            "--timing",
            "-c",
        ])
        .arg("SELECT 1 AS one; SELECT count(*) AS n FROM generate_series(1, 1000)")
        .output()
        .unwrap();
    let text = stdout_of(out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!((lines[0], lines[1]), ("one", "1"));
    assert_eq!((lines[3], lines[4]), ("n", "1000"));
    for time in [lines[2], lines[5]] {
        let ms = time
            .strip_prefix("Time: ")
            .and_then(|t| t.strip_suffix(" ms"))
            .and_then(|t| t.parse::<f64>().ok());
        assert!(ms.is_some_and(|ms| ms > 0.0), "{text}");
    }
}

#[test]
fn local_reports_bad_sql_clearly() {
    let out = gyre()
        .args(["local", "--workers", "1", "-c", "SELEC 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SELEC"), "{err}");
    let out = gyre()
        .args(["local", "--workers", "1", "-c", "SELECT 'a' + 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("utf8"), "{err}");
}

#[test]
fn sql_and_load_talk_to_a_served_local_cluster() {
    // A port the kernel had free (a fixed range collided with other tests' ports).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _server = Server(
        gyre()
            .args(["local", "--workers", "3", "--listen", &addr])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = gyre()
            .args(["sql", "--connect", &addr, "-c", "SELECT 1"])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the served cluster never came up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("people.csv");
    let mut text = String::from("id,name\n");
    for i in 0..1000 {
        text.push_str(&format!("{i},name{i}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    stdout_of(
        gyre()
            .args(["load", "--connect", &addr, "--table", "people"])
            .args(["--file-format", "csv", "--partition-by", "id"])
            .arg(&csv)
            .output()
            .unwrap(),
    );
    let out = gyre()
        .args(["sql", "--connect", &addr, "--format", "csv", "-c"])
        .arg("SELECT count(*) AS n, sum(id) AS s FROM people; SELECT name FROM people WHERE id = 7")
        .output()
        .unwrap();
    assert_eq!(stdout_of(out), "n,s\n1000,499500\nname\nname7\n");
    let out = gyre()
        .args([
            "sql",
            "--connect",
            &addr,
            "-c",
            "SELECT * FROM missing_table",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing_table"), "{err}");
    // Several addresses are tried in order until one answers; when none does, the
    // error names each.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let out = gyre()
        .args([
            "sql",
            "--format",
            "csv",
            "--connect",
            &format!("{dead}, {addr}"),
        ])
        .args(["-c", "SELECT count(*) AS n FROM people"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(out), "n\n1000\n");
    let out = gyre()
        .args([
            "sql",
            "--connect",
            &format!("{dead},grpc://{dead}"),
            "-c",
            "SELECT 1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no coordinator answered") && err.matches(&dead).count() >= 2,
        "{err}"
    );
}

/// Runs `gyre args...` with a terminal for stdout and stderr (`script` from util-linux)
/// and returns everything it wrote there.
fn in_terminal(args: &[&str]) -> String {
    let command: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_gyre").to_string())
        .chain(
            args.iter()
                .map(|a| format!("'{}'", a.replace('\'', "'\\''"))),
        )
        .collect();
    let out = Command::new("script")
        .args(["-qec", &command.join(" "), "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs a command in a terminal");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A statement that runs for seconds (about three here): 10M regular expressions.
const SLOW: &str = "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 10000000) AS s(value); \
                    SELECT count(*) AS pairs FROM t \
                    WHERE length(regexp_replace(repeat(CAST(k AS VARCHAR), 4), '[13579]', 'odd', 'g')) > 0";

#[test]
fn long_statements_show_progress_on_a_terminal_only() {
    // On a terminal: a line with rows read, redrawn, then erased before the result.
    let shown = in_terminal(&["local", "--workers", "2", "--format", "csv", "-c", SLOW]);
    assert!(shown.contains("\r\x1b[2K"), "{shown:?}");
    assert!(shown.contains(" rows, "), "{shown:?}");
    assert!(shown.contains("pairs\r\n10000000"), "{shown:?}");
    // Not on a terminal: no progress at all.
    let out = gyre()
        .args(["local", "--workers", "2", "--format", "csv", "-c", SLOW])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains('\x1b'));
    assert!(stdout_of(out).ends_with("pairs\n10000000\n"));
}
