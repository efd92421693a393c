//! CPU time of this process and of single threads, from Linux's `/proc`
//! (`None` where it is not available).

use std::time::Duration;

/// Clock ticks per second of `/proc/*/stat` times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: u64 = 100;

/// User plus system CPU time of every thread of this process, living or ended
/// (10 ms resolution).
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may contain spaces; fields after it are space separated.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / TICKS_PER_SECOND,
    ))
}

/// The kernel id of the calling thread.
pub fn current_thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// CPU time of thread `tid` of this process (nanosecond resolution).
pub fn thread_cpu(tid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_grow_with_work() {
        let (Some(p0), Some(tid)) = (process_cpu(), current_thread_id()) else {
            return; // not Linux
        };
        let t0 = thread_cpu(tid).unwrap();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        assert!(thread_cpu(tid).unwrap() > t0);
        assert!(process_cpu().unwrap() >= p0);
    }
}
