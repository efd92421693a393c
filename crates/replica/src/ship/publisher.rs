//! The sending side of a log stream.

use super::packet::{MAX_NAK_RANGES, PAYLOAD_BYTES, Packet};
use super::{Group, multicast_socket};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub group: Group,
    /// Bytes of sent packets kept for repairs.
    pub window_bytes: usize,
    /// How often the lead and trail are announced.
    pub heartbeat: Duration,
    /// A packet is repaired at most once in this time, however many NAK it.
    pub repair_holdoff: Duration,
    /// Sending rate limit in bytes per second (PGM's rate limit): a burst faster than
    /// receivers drain overflows their buffers. `None`: as fast as the socket takes.
    pub rate: Option<u64>,
}

impl PublisherConfig {
    pub fn new(group: Group) -> Self {
        Self {
            group,
            window_bytes: 64 << 20,
            heartbeat: Duration::from_millis(20),
            repair_holdoff: Duration::from_millis(5),
            rate: None,
        }
    }
}

/// Counters of a publisher.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublisherStats {
    pub messages: u64,
    pub packets: u64,
    /// Bytes of data packets sent the first time (datagram payloads, headers included).
    pub bytes: u64,
    pub repairs: u64,
    pub repair_bytes: u64,
    pub naks: u64,
    /// NAKs for packets already gone, answered with LOST.
    pub lost_answers: u64,
    /// Datagrams that were not packets of this stream.
    pub ignored: u64,
}

struct Sent {
    seq: u64,
    datagram: Vec<u8>,
    repaired_at: Option<Instant>,
}

struct Window {
    next: u64,
    sent: VecDeque<Sent>,
    bytes: usize,
    /// The rate limiter's clock: when the bytes sent so far may all have left.
    paced_until: Instant,
}

struct Inner {
    config: PublisherConfig,
    publishing: Mutex<()>,
    socket: UdpSocket,
    stream: u64,
    window: Mutex<Window>,
    stop: AtomicBool,
    counters: [AtomicU64; 8],
}

/// The most packets one NAK gets repaired.
const MAX_REPAIRS: usize = 1024;

const MESSAGES: usize = 0;
const PACKETS: usize = 1;
const BYTES: usize = 2;
const REPAIRS: usize = 3;
const REPAIR_BYTES: usize = 4;
const NAKS: usize = 5;
const LOST: usize = 6;
const IGNORED: usize = 7;

/// Multicasts messages to a group and repairs what receivers NAK. A thread of its own
/// answers NAKs and sends heartbeats until the publisher is dropped.
pub struct Publisher {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    /// A publisher of a new stream (its id is random, so receivers tell a restarted
    /// publisher's stream from the old one).
    pub fn new(mut config: PublisherConfig) -> std::io::Result<Self> {
        config.rate = config.rate.filter(|r| *r > 0);
        let socket = multicast_socket(&config.group, 0)?;
        socket.set_read_timeout(Some(config.heartbeat))?;
        let stream = {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        };
        let inner = Arc::new(Inner {
            publishing: Mutex::new(()),
            config,
            socket,
            stream,
            window: Mutex::new(Window {
                next: 0,
                sent: VecDeque::new(),
                bytes: 0,
                paced_until: Instant::now(),
            }),
            stop: AtomicBool::new(false),
            counters: Default::default(),
        });
        let worker = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("gyre-log-publisher".into())
            .spawn(move || worker.serve())?;
        Ok(Self {
            inner,
            thread: Some(thread),
        })
    }

    pub fn stream(&self) -> u64 {
        self.inner.stream
    }

    /// The address receivers send NAKs to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.socket.local_addr()
    }

    /// The sequence number the next packet gets.
    pub fn next_seq(&self) -> u64 {
        self.inner.window.lock().next
    }

    /// Sends one message (a log group) to the group, in order after the previous ones.
    pub fn publish(&self, message: &[u8]) -> std::io::Result<()> {
        let inner = &self.inner;
        let frags = message.len().div_ceil(PAYLOAD_BYTES).max(1);
        if frags > super::packet::MAX_FRAGS as usize {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a {} byte message is too large to ship", message.len()),
            ));
        }
        // One message at a time, so its fragments get consecutive numbers; the window
        // is locked only to file each packet, so repairs and heartbeats go on while a
        // large message is paced out.
        let _one_at_a_time = inner.publishing.lock();
        for frag in 0..frags {
            let payload = &message[(frag * PAYLOAD_BYTES).min(message.len())
                ..((frag + 1) * PAYLOAD_BYTES).min(message.len())];
            let (datagram, wait) = {
                let mut w = inner.window.lock();
                let seq = w.next;
                w.next += 1;
                let datagram = Packet::Data {
                    stream: inner.stream,
                    seq,
                    frag: frag as u32,
                    frags: frags as u32,
                    repair: false,
                    payload: payload.to_vec(),
                }
                .encode();
                w.bytes += datagram.len();
                w.sent.push_back(Sent {
                    seq,
                    datagram: datagram.clone(),
                    repaired_at: None,
                });
                while w.bytes > inner.config.window_bytes && w.sent.len() > 1 {
                    let old = w.sent.pop_front().expect("not empty");
                    w.bytes -= old.datagram.len();
                }
                let wait = inner.pace(&mut w, datagram.len());
                (datagram, wait)
            };
            std::thread::sleep(wait);
            inner.send(&datagram, inner.config.group.group.into())?;
            inner.add(PACKETS, 1);
            inner.add(BYTES, datagram.len() as u64);
        }
        inner.add(MESSAGES, 1);
        Ok(())
    }

    pub fn stats(&self) -> PublisherStats {
        let c = |i: usize| self.inner.counters[i].load(Ordering::Relaxed);
        PublisherStats {
            messages: c(MESSAGES),
            packets: c(PACKETS),
            bytes: c(BYTES),
            repairs: c(REPAIRS),
            repair_bytes: c(REPAIR_BYTES),
            naks: c(NAKS),
            lost_answers: c(LOST),
            ignored: c(IGNORED),
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    /// How long to wait before sending `bytes` more under the rate limit (repairs
    /// included: a NAK must not turn into a burst the limit exists to prevent).
    fn pace(&self, w: &mut Window, bytes: usize) -> Duration {
        let Some(rate) = self.config.rate else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        let start = w.paced_until.max(now);
        w.paced_until = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
        start - now
    }

    fn add(&self, counter: usize, n: u64) {
        self.counters[counter].fetch_add(n, Ordering::Relaxed);
    }

    fn send(&self, datagram: &[u8], to: SocketAddr) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.socket.send_to(datagram, to) {
                Ok(_) => return Ok(()),
                // The socket's buffer is full: wait a while for it to drain rather than
                // drop (a dropped packet costs a NAK and a repair).
                Err(e)
                    if (e.kind() == std::io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::ENOBUFS))
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Answers NAKs and announces the lead and trail, until stopped.
    fn serve(&self) {
        let mut buf = vec![0u8; 65536];
        let mut last_heartbeat = Instant::now() - self.config.heartbeat;
        while !self.stop.load(Ordering::Relaxed) {
            if last_heartbeat.elapsed() >= self.config.heartbeat {
                last_heartbeat = Instant::now();
                let (next, trail) = {
                    let w = self.window.lock();
                    (w.next, w.sent.front().map_or(w.next, |s| s.seq))
                };
                let hb = Packet::Heartbeat {
                    stream: self.stream,
                    next,
                    trail,
                };
                let _ = self.send(&hb.encode(), self.config.group.group.into());
            }
            let (n, from) = match self.socket.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(_) => continue,
            };
            match Packet::decode(&buf[..n]) {
                Ok(Packet::Nak { stream, ranges }) if stream == self.stream => {
                    self.add(NAKS, 1);
                    self.repair(&ranges, from);
                }
                // Our own multicasts loop back to this socket too.
                Ok(Packet::Data { stream, .. } | Packet::Heartbeat { stream, .. })
                    if stream == self.stream => {}
                _ => self.add(IGNORED, 1),
            }
        }
    }

    /// Multicasts the NAKed packets still in the window (at most [`MAX_REPAIRS`] per
    /// NAK: the receiver NAKs again for the rest); tells the receiver which are gone.
    fn repair(&self, ranges: &[(u64, u64)], from: SocketAddr) {
        debug_assert!(ranges.len() <= MAX_NAK_RANGES);
        let mut out = vec![];
        let mut gone = None;
        {
            let mut w = self.window.lock();
            let trail = w.sent.front().map_or(w.next, |s| s.seq);
            let now = Instant::now();
            for &(lo, hi) in ranges {
                if lo < trail {
                    gone = Some(trail);
                }
                let hi = hi.min(w.next.saturating_sub(1));
                let lo = lo.max(trail);
                if lo > hi || w.sent.is_empty() {
                    continue;
                }
                let first = (lo - trail) as usize;
                let last = (hi - trail) as usize;
                let last = last.min(first + MAX_REPAIRS - out.len().min(MAX_REPAIRS));
                for s in w.sent.range_mut(first..=last) {
                    if out.len() >= MAX_REPAIRS {
                        break;
                    }
                    if s.repaired_at
                        .is_some_and(|t| now - t < self.config.repair_holdoff)
                    {
                        continue;
                    }
                    s.repaired_at = Some(now);
                    let mut d = s.datagram.clone();
                    d[4] = 2; // RDATA
                    out.push(d);
                }
            }
        }
        for d in out {
            let wait = self.pace(&mut self.window.lock(), d.len());
            std::thread::sleep(wait);
            if self.send(&d, self.config.group.group.into()).is_ok() {
                self.add(REPAIRS, 1);
                self.add(REPAIR_BYTES, d.len() as u64);
            }
        }
        if let Some(trail) = gone {
            self.add(LOST, 1);
            let lost = Packet::Lost {
                stream: self.stream,
                trail,
            };
            let _ = self.send(&lost.encode(), from);
        }
    }
}
