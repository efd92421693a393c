//! CPU time of this process (`getrusage`) and of single threads (Linux's `/proc`),
//! `None` where it is not available.

use std::time::Duration;

/// User plus system CPU time of every thread of this process, living or ended
/// (`getrusage`, microsecond resolution: a join of 0.1 CPU-seconds is measured to
/// within a few percent, where `/proc/self/stat`'s 10 ms ticks would not do).
pub fn process_cpu() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised.
    let usage = unsafe { usage.assume_init() };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Some(Duration::from_micros(
        micros(usage.ru_utime) + micros(usage.ru_stime),
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
