//! Cache sizes that drive the radix fan-out (cyclo-join paper, Sec. IV-C.1: partitions of
//! the stationary side plus their hash table must fit the L2 cache).

/// Fallback when sysfs does not say: the L2 size the brief and many x86 cores have.
pub const DEFAULT_L2_BYTES: usize = 256 * 1024;

/// L2 size of CPU 0 from `/sys/devices/system/cpu/cpu0/cache`, else [`DEFAULT_L2_BYTES`].
pub fn l2_cache_bytes() -> usize {
    detect_cache_bytes(2).unwrap_or(DEFAULT_L2_BYTES)
}

fn detect_cache_bytes(level: u32) -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    for entry in dir.flatten() {
        let path = entry.path();
        let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
        let Some(l) = read("level") else { continue };
        if l.trim().parse::<u32>().ok() != Some(level) {
            continue;
        }
        let kind = read("type").unwrap_or_default();
        if kind.trim() == "Instruction" {
            continue;
        }
        if let Some(size) = read("size").and_then(|s| parse_size(s.trim())) {
            return Some(size);
        }
    }
    None
}

/// Parses sysfs sizes such as `512K`, `32M` or `1024`.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1024),
        b'M' | b'm' => (&s[..s.len() - 1], 1024 * 1024),
        b'G' | b'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok().map(|n| n * mult)
}

/// Threads to use when the caller passes 0.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub(crate) fn resolve_threads(threads: usize) -> usize {
    if threads == 0 {
        default_threads()
    } else {
        threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_size("512K"), Some(512 * 1024));
        assert_eq!(parse_size("32M"), Some(32 * 1024 * 1024));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert!(l2_cache_bytes() >= 16 * 1024);
    }
}
