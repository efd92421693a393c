//! An emulated cluster on one Linux machine, for measuring Gyre against real
//! link rates: one network namespace per host, veth links to a bridge shaped
//! with `tc tbf` in both directions, a cgroup CPU quota per host, optionally a
//! gyre coordinator and workers; and raw TCP blasts that measure what the links
//! really carry.
//!
//! ```no_run
//! use gyre_testbed::*;
//! let spec = TestbedSpec::new("bench".parse()?, 4, "1gbit".parse()?);
//! let tb = Testbed::up(TestbedSpec { cpus: Some("0.5".parse()?), ..spec })?;
//! let helper = BlastHelper::gyre()?;
//! let [a, b] = [&tb.worker_hosts()[0], &tb.worker_hosts()[1]];
//! let rate = measure_capacity(&tb, &helper, a, b, BlastOptions::default())?;
//! println!("{:.0} MB/s", rate.bytes_per_sec / 1e6);
//! tb.down()?;
//! # Ok::<(), gyre_testbed::Error>(())
//! ```

pub mod blast;
pub mod capacity;
pub mod cgroup;
pub mod cpu;
pub mod error;
pub mod naming;
pub mod rate;
pub mod state;
pub mod sys;
pub mod testbed;

pub use capacity::{
    BlastHelper, BlastOptions, StreamRate, measure_capacity, measure_ring, measure_streams,
};
pub use cpu::CpuQuota;
pub use error::{Error, Result};
pub use naming::{ClusterName, Subnet};
pub use rate::{LinkRate, TbfParams};
pub use state::{DEFAULT_STATE_DIR, Host, Role};
pub use testbed::{DEFAULT_BASE_PORT, DownReport, GyreProcesses, Testbed, TestbedSpec};
