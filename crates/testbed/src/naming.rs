//! Names and addresses of an emulated cluster: everything it creates carries the
//! prefix `gyre-NAME-`, so it can be told apart from what it did not create.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Prefix of every network namespace and cgroup a testbed creates.
pub const PREFIX: &str = "gyre-";

/// A cluster name: 1 to 24 of `[a-z0-9_]`. No `-`, so that the prefix `gyre-NAME-`
/// belongs to exactly one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClusterName(String);

impl ClusterName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `gyre-NAME-`: the prefix of this cluster's namespaces.
    pub fn prefix(&self) -> String {
        format!("{PREFIX}{}-", self.0)
    }

    /// The namespace that holds the bridge.
    pub fn bridge_netns(&self) -> String {
        format!("{}br", self.prefix())
    }

    /// The namespace of host `host` (`c` for the coordinator's host, `h0`, `h1`, ...).
    pub fn host_netns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix())
    }

    /// The cluster's cgroup directory name (under the CPU controller's mount).
    pub fn cgroup_dir(&self) -> String {
        format!("{PREFIX}{}", self.0)
    }
}

impl FromStr for ClusterName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let ok = (1..=24).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(Error::Invalid(format!(
                "bad cluster name '{s}': use 1 to 24 characters of a-z, 0-9 and _"
            )));
        }
        Ok(ClusterName(s.to_string()))
    }
}

impl TryFrom<String> for ClusterName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<ClusterName> for String {
    fn from(n: ClusterName) -> String {
        n.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Name of worker host `i` (`h0`, `h1`, ...).
pub fn worker_host(i: usize) -> String {
    format!("h{i}")
}

/// Name of the coordinator's host.
pub const COORDINATOR_HOST: &str = "c";

/// Name of the bridge, and of every host's interface, inside our namespaces.
pub const BRIDGE_IF: &str = "br0";
pub const HOST_IF: &str = "eth0";

/// Name of the bridge-side end of a host's veth pair (inside the bridge namespace).
pub fn bridge_port(host: &str) -> String {
    format!("p-{host}")
}

/// An IPv4 subnet private to the cluster, e.g. `10.213.0.0/24`.
///
/// Host addresses are only ever assigned inside the cluster's own namespaces, so
/// the subnet cannot clash with the machine's addresses; it only needs room for
/// the coordinator's host and the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Subnet {
    network: Ipv4Addr,
    prefix_len: u8,
}

impl Subnet {
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Usable host addresses (network and broadcast excluded).
    pub fn capacity(&self) -> u64 {
        (1u64 << (32 - self.prefix_len)) - 2
    }

    /// The `n`-th host address (1-based): `10.213.0.0/24` host 1 is `10.213.0.1`.
    pub fn host(&self, n: u64) -> Result<Ipv4Addr> {
        if n == 0 || n > self.capacity() {
            return Err(Error::Invalid(format!(
                "subnet {self} has no host number {n} (it holds {} hosts)",
                self.capacity()
            )));
        }
        Ok(Ipv4Addr::from(u32::from(self.network) + n as u32))
    }

    /// The coordinator host's address: the first host address.
    pub fn coordinator(&self) -> Result<Ipv4Addr> {
        self.host(1)
    }

    /// Worker host `i`'s address: the addresses after the coordinator's.
    pub fn worker(&self, i: usize) -> Result<Ipv4Addr> {
        self.host(2 + i as u64)
    }
}

impl Default for Subnet {
    fn default() -> Self {
        Subnet {
            network: Ipv4Addr::new(10, 213, 0, 0),
            prefix_len: 24,
        }
    }
}

impl FromStr for Subnet {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::Invalid(format!("bad subnet '{s}': {why}"));
        let (addr, len) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("expected ADDRESS/PREFIX, e.g. 10.213.0.0/24"))?;
        let network: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix_len: u8 = len.parse().map_err(|_| bad("prefix is not a number"))?;
        if !(8..=29).contains(&prefix_len) {
            return Err(bad("prefix length must be 8 to 29"));
        }
        let mask = u32::MAX << (32 - prefix_len);
        if u32::from(network) & !mask != 0 {
            return Err(bad(&format!(
                "host bits are set (the network is {}/{prefix_len})",
                Ipv4Addr::from(u32::from(network) & mask)
            )));
        }
        Ok(Subnet {
            network,
            prefix_len,
        })
    }
}

impl TryFrom<String> for Subnet {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Subnet> for String {
    fn from(s: Subnet) -> String {
        s.to_string()
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_cluster_prefix() {
        let n: ClusterName = "bench_1".parse().unwrap();
        assert_eq!(n.bridge_netns(), "gyre-bench_1-br");
        assert_eq!(n.host_netns(COORDINATOR_HOST), "gyre-bench_1-c");
        assert_eq!(n.host_netns(&worker_host(3)), "gyre-bench_1-h3");
        assert_eq!(n.cgroup_dir(), "gyre-bench_1");
        assert_eq!(bridge_port("h12"), "p-h12");
        // Interface names inside our namespaces stay within IFNAMSIZ (15).
        assert!(bridge_port(&worker_host(9999)).len() <= 15);
    }

    #[test]
    fn rejects_bad_cluster_names() {
        for bad in ["", "My", "a-b", "a b", "x/y", "abcdefghijklmnopqrstuvwxy"] {
            let err = bad.parse::<ClusterName>().unwrap_err().to_string();
            assert!(err.contains("bad cluster name"), "{bad:?}: {err}");
        }
        assert!("abcdefghijklmnopqrstuvwx".parse::<ClusterName>().is_ok());
    }

    #[test]
    fn subnet_addresses() {
        let s: Subnet = "10.9.8.0/24".parse().unwrap();
        assert_eq!(s.coordinator().unwrap(), Ipv4Addr::new(10, 9, 8, 1));
        assert_eq!(s.worker(0).unwrap(), Ipv4Addr::new(10, 9, 8, 2));
        assert_eq!(s.worker(252).unwrap(), Ipv4Addr::new(10, 9, 8, 254));
        assert!(
            s.worker(253)
                .unwrap_err()
                .to_string()
                .contains("holds 254 hosts")
        );
        let wide: Subnet = "172.20.0.0/16".parse().unwrap();
        assert_eq!(wide.worker(300).unwrap(), Ipv4Addr::new(172, 20, 1, 46));
        assert_eq!(Subnet::default().to_string(), "10.213.0.0/24");
    }

    #[test]
    fn rejects_bad_subnets() {
        for (input, needle) in [
            ("10.0.0.0", "ADDRESS/PREFIX"),
            ("10.0.0/24", "not an IPv4"),
            ("10.0.0.0/x", "not a number"),
            ("10.0.0.0/30", "8 to 29"),
            (
                "10.0.0.5/24",
                "host bits are set (the network is 10.0.0.0/24)",
            ),
        ] {
            let err = input.parse::<Subnet>().unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }
}
