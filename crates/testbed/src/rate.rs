//! Link rates, parsed as tc(8) parses them, and the tbf parameters used to enforce one.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A link rate in bits per second.
///
/// Parsed with tc(8)'s units: `bit`, `kbit`, `mbit`, `gbit`, `tbit` are bits per
/// second (SI), `kibit`.. are binary multiples, and `bps`, `kbps`, `mbps`, `gbps`,
/// `tbps` are **bytes** per second (so `100mbps` is 800 Mbit/s, as in tc). A unit
/// is required: a bare number is ambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LinkRate {
    bits_per_sec: u64,
}

/// Slowest rate accepted: below this the tbf burst floor dominates and TCP crawls.
const MIN_BITS: u64 = 64_000;
/// Fastest rate accepted: far above what veth reaches, but a valid tbf rate.
const MAX_BITS: u64 = 400_000_000_000;

const UNITS: &[(&str, f64)] = &[
    ("bit", 1.0),
    ("kbit", 1e3),
    ("mbit", 1e6),
    ("gbit", 1e9),
    ("tbit", 1e12),
    ("kibit", 1024.0),
    ("mibit", 1024.0 * 1024.0),
    ("gibit", 1024.0 * 1024.0 * 1024.0),
    ("tibit", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("bps", 8.0),
    ("kbps", 8e3),
    ("mbps", 8e6),
    ("gbps", 8e9),
    ("tbps", 8e12),
    ("kibps", 8.0 * 1024.0),
    ("mibps", 8.0 * 1024.0 * 1024.0),
    ("gibps", 8.0 * 1024.0 * 1024.0 * 1024.0),
    ("tibps", 8.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
];

impl LinkRate {
    pub fn from_bits_per_sec(bits_per_sec: u64) -> Result<Self> {
        if !(MIN_BITS..=MAX_BITS).contains(&bits_per_sec) {
            return Err(Error::Invalid(format!(
                "link rate {bits_per_sec} bit/s is out of range ({} to {})",
                LinkRate {
                    bits_per_sec: MIN_BITS
                },
                LinkRate {
                    bits_per_sec: MAX_BITS
                }
            )));
        }
        Ok(LinkRate { bits_per_sec })
    }

    pub fn bits_per_sec(&self) -> u64 {
        self.bits_per_sec
    }

    pub fn bytes_per_sec(&self) -> f64 {
        self.bits_per_sec as f64 / 8.0
    }

    /// The tbf parameters that enforce this rate (see [`TbfParams`]).
    pub fn tbf(&self) -> TbfParams {
        TbfParams::for_rate(*self)
    }
}

impl FromStr for LinkRate {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let text = s.trim().to_ascii_lowercase();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let unit = unit.trim();
        let expected =
            "expected a number and a unit, e.g. 1gbit, 10gbit, 500mbit, 100mbps (bytes/s)";
        if number.is_empty() {
            return Err(Error::Invalid(format!("bad link rate '{s}': {expected}")));
        }
        let value: f64 = number.parse().map_err(|_| {
            Error::Invalid(format!("bad link rate '{s}': '{number}' is not a number"))
        })?;
        if unit.is_empty() {
            return Err(Error::Invalid(format!(
                "bad link rate '{s}': a unit is needed ({expected})"
            )));
        }
        let Some((_, factor)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            let known: Vec<&str> = UNITS.iter().map(|(u, _)| *u).collect();
            return Err(Error::Invalid(format!(
                "bad link rate '{s}': unknown unit '{unit}' (known: {})",
                known.join(", ")
            )));
        };
        let bits = value * factor;
        if !bits.is_finite() || bits < 1.0 {
            return Err(Error::Invalid(format!(
                "bad link rate '{s}': must be positive"
            )));
        }
        if bits > MAX_BITS as f64 {
            return Err(Error::Invalid(format!(
                "link rate '{s}' is out of range (at most {})",
                LinkRate {
                    bits_per_sec: MAX_BITS
                }
            )));
        }
        LinkRate::from_bits_per_sec(bits.round() as u64)
    }
}

impl fmt::Display for LinkRate {
    /// The largest SI bit unit that states the rate exactly: `1gbit`, `500mbit`, `1500kbit`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_sec;
        for (unit, factor) in [
            ("tbit", 1_000_000_000_000u64),
            ("gbit", 1_000_000_000),
            ("mbit", 1_000_000),
            ("kbit", 1_000),
        ] {
            if b >= factor && b.is_multiple_of(factor) {
                return write!(f, "{}{unit}", b / factor);
            }
        }
        write!(f, "{b}bit")
    }
}

/// Token bucket filter settings for one direction of one link.
///
/// - `burst` (bucket size) is one millisecond of traffic at the rate, but at least
///   128 KiB: veth hands tbf GSO packets of up to 64 KiB, and a bucket smaller than
///   a packet would force tbf to segment every packet; one millisecond keeps the
///   shaper's timer at about a thousand wakeups per second even at 10 Gbit/s, so
///   the CPU cost of shaping stays small on a 2-core machine, while a burst is
///   still short compared with a transfer (the long-run rate is exactly `rate`).
/// - `limit` (bytes queued before tbf drops) is 20 ms at the rate, but at least four
///   bursts: a switch port buffer of that size lets several senders converge on one
///   receiver (the all-to-all case) without TCP collapsing, while bounding the
///   queueing delay so TCP's feedback stays prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TbfParams {
    pub rate: LinkRate,
    pub burst_bytes: u64,
    pub limit_bytes: u64,
}

const MIN_BURST: u64 = 128 * 1024;

impl TbfParams {
    pub fn for_rate(rate: LinkRate) -> Self {
        let bytes_per_ms = rate.bits_per_sec / 8 / 1000;
        let burst_bytes = bytes_per_ms.max(MIN_BURST);
        let limit_bytes = (bytes_per_ms * 20).max(4 * burst_bytes);
        TbfParams {
            rate,
            burst_bytes,
            limit_bytes,
        }
    }

    /// Arguments after `tc qdisc add dev DEV root`.
    pub fn tc_args(&self) -> Vec<String> {
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate.bits_per_sec),
            "burst".into(),
            self.burst_bytes.to_string(),
            "limit".into(),
            self.limit_bytes.to_string(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(s: &str) -> u64 {
        s.parse::<LinkRate>().unwrap().bits_per_sec()
    }

    #[test]
    fn parses_tc_units() {
        assert_eq!(bits("1gbit"), 1_000_000_000);
        assert_eq!(bits("10gbit"), 10_000_000_000);
        assert_eq!(bits("500mbit"), 500_000_000);
        assert_eq!(bits("100mbps"), 800_000_000);
        assert_eq!(bits("1.5gbit"), 1_500_000_000);
        assert_eq!(bits(" 2Gbit "), 2_000_000_000);
        assert_eq!(bits("64kbit"), 64_000);
        assert_eq!(bits("1mibit"), 1_048_576);
        assert_eq!(bits("8kibps"), 65_536);
        assert_eq!(bits("125000000bps"), 1_000_000_000);
    }

    #[test]
    fn rejects_bad_rates_naming_the_cause() {
        for (input, needle) in [
            ("", "expected a number"),
            ("gbit", "expected a number"),
            ("100", "a unit is needed"),
            ("10 furlongs", "unknown unit 'furlongs'"),
            ("1..2gbit", "not a number"),
            ("0gbit", "must be positive"),
            ("1bit", "out of range"),
            ("1000tbit", "out of range"),
            ("-1gbit", "expected a number"),
        ] {
            let err = input.parse::<LinkRate>().unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    #[test]
    fn displays_the_exact_largest_unit() {
        for s in ["1gbit", "10gbit", "500mbit", "1500kbit", "64kbit"] {
            assert_eq!(s.parse::<LinkRate>().unwrap().to_string(), s);
        }
        assert_eq!(
            "100mbps".parse::<LinkRate>().unwrap().to_string(),
            "800mbit"
        );
        assert_eq!(
            "1mibit".parse::<LinkRate>().unwrap().to_string(),
            "1048576bit"
        );
    }

    #[test]
    fn tbf_burst_and_limit_scale_with_rate_above_the_floor() {
        let slow = "100mbit".parse::<LinkRate>().unwrap().tbf();
        assert_eq!(slow.burst_bytes, MIN_BURST);
        assert_eq!(slow.limit_bytes, 4 * MIN_BURST);
        let gbit = "1gbit".parse::<LinkRate>().unwrap().tbf();
        assert_eq!(gbit.burst_bytes, MIN_BURST);
        assert_eq!(gbit.limit_bytes, 2_500_000);
        let fast = "10gbit".parse::<LinkRate>().unwrap().tbf();
        assert_eq!(fast.burst_bytes, 1_250_000);
        assert_eq!(fast.limit_bytes, 25_000_000);
        assert_eq!(
            fast.tc_args(),
            [
                "tbf",
                "rate",
                "10000000000bit",
                "burst",
                "1250000",
                "limit",
                "25000000"
            ]
        );
    }
}
