//! CPU quotas: how much of one CPU an emulated host may use.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The CFS period every quota is expressed in (the kernel default, 100 ms).
pub const CFS_PERIOD_US: u64 = 100_000;

/// A CPU share in CPUs: `0.5` is half of one CPU, `2` is two CPUs.
///
/// Parsed from `0.5`, `2`, or a percentage of one CPU (`50%`). At least 0.01 CPU
/// (the kernel refuses quotas below 1 ms per period), at most 1024.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuQuota {
    cpus: f64,
}

impl CpuQuota {
    pub fn new(cpus: f64) -> Result<Self> {
        if !cpus.is_finite() || !(0.01..=1024.0).contains(&cpus) {
            return Err(Error::Invalid(format!(
                "CPU quota {cpus} is out of range (0.01 to 1024 CPUs)"
            )));
        }
        Ok(CpuQuota { cpus })
    }

    pub fn cpus(&self) -> f64 {
        self.cpus
    }

    /// Run time allowed per [`CFS_PERIOD_US`], in microseconds.
    pub fn quota_us(&self) -> u64 {
        (self.cpus * CFS_PERIOD_US as f64).round() as u64
    }

    /// Threads that can use the quota: the CPUs it covers, rounded up.
    pub fn threads(&self) -> usize {
        self.cpus.ceil().max(1.0) as usize
    }
}

impl FromStr for CpuQuota {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let text = s.trim();
        let (number, scale) = match text.strip_suffix('%') {
            Some(pct) => (pct.trim(), 0.01),
            None => (text, 1.0),
        };
        let value: f64 = number.parse().map_err(|_| {
            Error::Invalid(format!(
                "bad CPU quota '{s}': expected CPUs (e.g. 0.5, 2) or a percentage of one CPU (50%)"
            ))
        })?;
        CpuQuota::new(value * scale).map_err(|_| {
            Error::Invalid(format!(
                "bad CPU quota '{s}': must be between 0.01 and 1024 CPUs"
            ))
        })
    }
}

impl fmt::Display for CpuQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpus_and_percentages() {
        let q: CpuQuota = "0.5".parse().unwrap();
        assert_eq!(q.quota_us(), 50_000);
        assert_eq!(q.threads(), 1);
        assert_eq!("50%".parse::<CpuQuota>().unwrap(), q);
        let two: CpuQuota = " 2 ".parse().unwrap();
        assert_eq!(two.quota_us(), 200_000);
        assert_eq!(two.threads(), 2);
        assert_eq!("1.5".parse::<CpuQuota>().unwrap().threads(), 2);
        assert_eq!("0.01".parse::<CpuQuota>().unwrap().quota_us(), 1_000);
        assert_eq!(q.to_string(), "0.5");
    }

    #[test]
    fn rejects_bad_quotas() {
        for input in [
            "", "half", "0", "-1", "0.001", "2000", "NaN", "inf", "%", "x%",
        ] {
            let err = input.parse::<CpuQuota>().unwrap_err().to_string();
            assert!(err.contains("bad CPU quota"), "{input:?}: {err}");
        }
    }
}
