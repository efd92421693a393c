//! A real 2-host testbed, network only: reachability, shaping, CPU quota and a
//! clean teardown. Needs root and iproute2; without them it says why and skips.

use gyre_testbed::{
    BlastHelper, BlastOptions, ClusterName, Error, GyreProcesses, Testbed, TestbedSpec, cgroup,
    measure_capacity, measure_ring, sys,
};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn skip_reason() -> Option<String> {
    if !sys::is_root() {
        return Some("not running as root".into());
    }
    for tool in ["ip", "tc"] {
        if let Err(e) = sys::require_tool(tool, "-V") {
            return Some(e.to_string());
        }
    }
    None
}

fn helper() -> BlastHelper {
    BlastHelper {
        program: PathBuf::from(env!("CARGO_BIN_EXE_gyre-testbed-blast")),
        args: Vec::new(),
    }
}

#[test]
fn two_host_testbed_shapes_links_limits_cpu_and_leaves_nothing_behind() {
    if let Some(reason) = skip_reason() {
        println!(
            "SKIPPED two_host_testbed...: {reason}; the emulated cluster needs root and iproute2"
        );
        eprintln!("SKIPPED two_host_testbed...: {reason}");
        return;
    }
    let started = Instant::now();
    let state_dir = tempfile::tempdir().unwrap();
    let name: ClusterName = format!("t{}", std::process::id()).parse().unwrap();
    let mut spec = TestbedSpec::new(name.clone(), 2, "100mbit".parse().unwrap());
    let has_cpu_controller = cgroup::CpuController::detect().is_some();
    if has_cpu_controller {
        // A small share, so that a busy loop exceeds it even on a machine loaded by
        // other work (where a thread may get well under a whole core).
        spec.cpus = Some("0.2".parse().unwrap());
    } else {
        println!("NOTE: no cgroup CPU controller on this machine; the CPU quota is not tested");
    }
    spec.state_dir = state_dir.path().to_path_buf();
    let tb = Testbed::up(spec.clone()).expect("testbed up");

    // The same name again is refused, and the refusal touches nothing.
    match Testbed::up(spec.clone()) {
        Err(Error::AlreadyExists(msg)) => assert!(msg.contains("already exists"), "{msg}"),
        Err(e) => panic!("second up failed with the wrong error: {e}"),
        Ok(_) => panic!("second up with the same name succeeded"),
    }
    assert!(tb.health().unwrap().is_empty(), "{:?}", tb.health());

    let prefix = name.prefix();
    let ours = |list: Vec<String>| -> Vec<String> {
        list.into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect()
    };
    let mut netns = ours(sys::list_netns().unwrap());
    netns.sort();
    assert_eq!(
        netns,
        ["br", "c", "h0", "h1"].map(|h| format!("{prefix}{h}"))
    );

    // Each host has its address on eth0, and the tbf shaper on both link ends.
    let [h0, h1] = [&tb.worker_hosts()[0], &tb.worker_hosts()[1]];
    let addr = sys::ip(["-n", &h0.netns, "-4", "-o", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(addr.contains(&format!("{}/24", h0.addr)), "{addr}");
    let qdisc = sys::tc(["-n", &h1.netns, "qdisc", "show", "dev", "eth0"]).unwrap();
    assert!(
        qdisc.contains("tbf") && qdisc.contains("100Mbit"),
        "{qdisc}"
    );
    let qdisc = sys::tc(["-n", &name.bridge_netns(), "qdisc", "show", "dev", "p-h1"]).unwrap();
    assert!(
        qdisc.contains("tbf") && qdisc.contains("100Mbit"),
        "{qdisc}"
    );

    let h0_cgroup = h0.cgroup.clone();
    if has_cpu_controller {
        // A command on a host runs in its cgroup, and the quota throttles a busy loop.
        let h0_cgroup = h0_cgroup.as_ref().expect("host cgroup");
        let out = sys::run(h0.command("cat").arg("/proc/self/cgroup")).unwrap();
        let group = h0_cgroup
            .strip_prefix(&tb.state().cgroup.as_ref().unwrap().controller.mount)
            .unwrap();
        assert!(
            out.lines()
                .any(|l| l.ends_with(&format!(":/{}", group.display()))),
            "{out} does not show {}",
            group.display()
        );
        sys::run(h0.command("sh").args([
            "-c",
            "end=$(($(date +%s%N) + 600000000)); while [ $(date +%s%N) -lt $end ]; do :; done",
        ]))
        .unwrap();
        let throttled = cgroup::throttled_periods(h0_cgroup).unwrap();
        assert!(throttled > 0, "a busy loop at 0.2 CPU was never throttled");
    }

    // TCP between hosts works, at the shaped rate (a check of the shaping, with a
    // wide band: 50% to 110% of 100 Mbit/s), in one direction and both at once.
    let options = BlastOptions {
        duration: Duration::from_secs(2),
        warmup: Duration::from_millis(300),
    };
    let rate = 100e6 / 8.0;
    let one = measure_capacity(&tb, &helper(), h0, h1, options).expect("blast h0 -> h1");
    println!("h0 -> h1: {:.1} Mbit/s", one.bits_per_sec() / 1e6);
    assert!(
        (0.5 * rate..=1.1 * rate).contains(&one.bytes_per_sec),
        "h0 -> h1 at {:.1} Mbit/s is outside 50-110 Mbit/s",
        one.bits_per_sec() / 1e6
    );
    let ring = measure_ring(&tb, &helper(), options).expect("ring blast");
    for s in &ring {
        println!(
            "ring {} -> {}: {:.1} Mbit/s",
            s.from,
            s.to,
            s.bits_per_sec() / 1e6
        );
        assert!(
            (0.5 * rate..=1.1 * rate).contains(&s.bytes_per_sec),
            "{} -> {} at {:.1} Mbit/s (both directions at once) is outside 50-110 Mbit/s",
            s.from,
            s.to,
            s.bits_per_sec() / 1e6
        );
    }

    // Down removes everything; down again finds nothing.
    let report = tb.down().expect("down");
    println!("{report}");
    assert_eq!(report.netns.len(), 4);
    assert!(
        ours(sys::list_netns().unwrap()).is_empty(),
        "namespaces left behind"
    );
    let leaked: Vec<String> = sys::root_interfaces()
        .unwrap()
        .into_iter()
        .filter(|i| i.contains(name.as_str()) || i.starts_with("p-h") || i.starts_with("gyre"))
        .collect();
    assert!(leaked.is_empty(), "interfaces left behind: {leaked:?}");
    if let Some(dir) = &h0_cgroup {
        assert!(
            !dir.exists() && !dir.parent().unwrap().exists(),
            "cgroups left behind"
        );
    }
    assert!(!state_dir.path().join(format!("{name}.json")).exists());
    assert!(
        Testbed::down_by_name(&name, state_dir.path())
            .unwrap()
            .is_none()
    );
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&left.stdout).contains(&prefix));
    println!("testbed test took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_failed_up_removes_what_it_made() {
    if let Some(reason) = skip_reason() {
        println!("SKIPPED a_failed_up...: {reason}; the emulated cluster needs root and iproute2");
        return;
    }
    let state_dir = tempfile::tempdir().unwrap();
    let name: ClusterName = format!("f{}", std::process::id()).parse().unwrap();
    let mut spec = TestbedSpec::new(name.clone(), 2, "1gbit".parse().unwrap());
    let controller = gyre_testbed::cgroup::CpuController::detect();
    if controller.is_some() {
        spec.cpus = Some("0.5".parse().unwrap());
    }
    spec.state_dir = state_dir.path().to_path_buf();
    // A "gyre" that exits at once: the coordinator never gets ready.
    spec.gyre = Some(GyreProcesses {
        exe: PathBuf::from("false"),
        secret: "s".into(),
        worker_threads: None,
        ready_timeout: Duration::from_secs(10),
        data_roots: Vec::new(),
        encrypt_links: false,
        coordinator_args: Vec::new(),
        log_multicast: None,
    });
    let err = match Testbed::up(spec) {
        Ok(_) => panic!("up with a failing coordinator succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("coordinator on host c exited"),
        "unexpected error: {err}"
    );
    let prefix = name.prefix();
    let left: Vec<String> = sys::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(
        left.is_empty(),
        "namespaces left after a failed up: {left:?}"
    );
    if let Some(c) = controller {
        assert!(!c.mount.join(name.cgroup_dir()).exists(), "cgroup left");
    }
    assert!(!state_dir.path().join(format!("{name}.json")).exists());
}
