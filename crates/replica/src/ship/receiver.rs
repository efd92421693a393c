//! The receiving side of a log stream: in-order, exactly-once delivery with NAKs.

use super::packet::{MAX_NAK_RANGES, Packet};
use super::{Group, ShipError, multicast_socket};
use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub group: Group,
    /// The first sequence number wanted: `Some(0)` for the whole stream (what the
    /// publisher's window no longer has fails as [`ShipError::Lost`]), `None` to start
    /// at the first message that begins after joining.
    pub from_seq: Option<u64>,
    /// How long a gap waits before it is NAKed (a reordered packet may still come).
    pub nak_delay: Duration,
    /// How long an unrepaired gap waits before it is NAKed again.
    pub nak_retry: Duration,
    /// How long a gap may stay unrepaired before the receiver gives up.
    pub give_up: Duration,
    /// Out-of-order packets buffered at most; later ones are dropped and NAKed again.
    pub max_buffered: usize,
    /// For experiments and tests: drop this many per million first transmissions on
    /// arrival, as a lossy link would (repairs are never dropped).
    pub simulated_loss_ppm: u32,
}

impl ReceiverConfig {
    pub fn new(group: Group) -> Self {
        Self {
            group,
            from_seq: Some(0),
            nak_delay: Duration::from_millis(2),
            nak_retry: Duration::from_millis(20),
            give_up: Duration::from_secs(5),
            max_buffered: 1 << 16,
            simulated_loss_ppm: 0,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub messages: u64,
    pub packets: u64,
    pub duplicates: u64,
    pub naks: u64,
    /// Data packets dropped by `simulated_loss_ppm`.
    pub dropped: u64,
    /// Datagrams that were not packets of the stream.
    pub ignored: u64,
}

/// Joins a group and delivers its messages in order, each once.
pub struct Receiver {
    config: ReceiverConfig,
    socket: UdpSocket,
    stream: Option<u64>,
    publisher: Option<SocketAddr>,
    /// The next sequence number to deliver (`None` until the start is known).
    next: Option<u64>,
    /// The publisher's next sequence number as far as we know (from data and
    /// heartbeats): everything below it that we lack is missing.
    lead: u64,
    pending: BTreeMap<u64, (u32, u32, Vec<u8>)>,
    /// Joined mid-stream: fragments before the first message start are skipped.
    aligning: bool,
    /// The message being put together: its fragment count and bytes so far.
    partial: Option<(u32, Vec<u8>)>,
    /// The fragment number the next packet of the partial message must have.
    next_frag: u32,
    ready: VecDeque<Vec<u8>>,
    gap_since: Option<Instant>,
    last_nak: Option<Instant>,
    /// When a packet of our stream last arrived (the publisher's heartbeat keeps it
    /// fresh while the log is idle).
    last_heard: Instant,
    /// Another publisher's stream was heard (a restarted primary).
    other_stream: bool,
    loss_state: u64,
    failed: Option<ShipError>,
    stats: ReceiverStats,
}

impl Receiver {
    pub fn join(config: ReceiverConfig) -> Result<Self, ShipError> {
        let socket = multicast_socket(&config.group, config.group.group.port())?;
        socket.join_multicast_v4(config.group.group.ip(), &config.group.interface)?;
        Ok(Self {
            next: config.from_seq,
            aligning: config.from_seq.is_none(),
            config,
            socket,
            stream: None,
            publisher: None,
            lead: 0,
            pending: BTreeMap::new(),
            partial: None,
            next_frag: 0,
            ready: VecDeque::new(),
            gap_since: None,
            last_nak: None,
            last_heard: Instant::now(),
            other_stream: false,
            loss_state: 0x1234_5678,
            failed: None,
            stats: ReceiverStats::default(),
        })
    }

    pub fn stats(&self) -> ReceiverStats {
        self.stats.clone()
    }

    /// The next message, waiting at most `timeout` (`None` if none came in time).
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, ShipError> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            // What arrived whole before a failure is still delivered.
            if let Some(m) = self.ready.pop_front() {
                self.stats.messages += 1;
                return Ok(Some(m));
            }
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            let now = Instant::now();
            if self.stream.is_some() && now - self.last_heard > self.config.give_up {
                return Err(self.fail(ShipError::Silent {
                    waited_ms: (now - self.last_heard).as_millis() as u64,
                    other_stream: self.other_stream,
                }));
            }
            if now >= deadline {
                return Ok(None);
            }
            self.check_gap(now)?;
            let wait = (deadline - now)
                .min(self.config.nak_delay)
                .max(Duration::from_micros(100));
            self.socket.set_read_timeout(Some(wait))?;
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => self.on_datagram(&buf[..n], from),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(self.fail(ShipError::Io(e.to_string()))),
            }
        }
    }

    fn fail(&mut self, e: ShipError) -> ShipError {
        self.failed = Some(e.clone());
        e
    }

    fn on_datagram(&mut self, b: &[u8], from: SocketAddr) {
        let Ok(packet) = Packet::decode(b) else {
            self.stats.ignored += 1;
            return;
        };
        // The first stream heard is ours; another publisher's packets are not.
        match self.stream {
            None => self.stream = Some(packet.stream()),
            Some(s) if s != packet.stream() => {
                self.stats.ignored += 1;
                self.other_stream = true;
                return;
            }
            Some(_) => {}
        }
        if !matches!(packet, Packet::Nak { .. }) {
            self.last_heard = Instant::now();
        }
        match packet {
            Packet::Data {
                seq,
                frag,
                frags,
                repair,
                payload,
                ..
            } => {
                self.publisher = Some(from);
                if !repair && self.simulated_drop() {
                    self.stats.dropped += 1;
                    return;
                }
                let Some(after) = seq.checked_add(1) else {
                    self.stats.ignored += 1;
                    return;
                };
                // A late joiner starts at a first transmission, never at a repair sent
                // for someone else (which may be far behind the stream).
                if self.next.is_none() && repair {
                    return;
                }
                self.stats.packets += 1;
                let next = *self.next.get_or_insert(seq);
                self.lead = self.lead.max(after);
                if seq < next || self.pending.contains_key(&seq) {
                    self.stats.duplicates += 1;
                    return;
                }
                if self.pending.len() >= self.config.max_buffered && seq != next {
                    return;
                }
                self.pending.insert(seq, (frag, frags, payload));
                self.deliver();
            }
            Packet::Heartbeat { next, trail, .. } => {
                self.publisher = Some(from);
                self.lead = self.lead.max(next);
                match self.next {
                    Some(want) if want < trail && want < next => {
                        self.fail(ShipError::Lost {
                            needed: want,
                            trail,
                        });
                    }
                    // The publisher's next packet starts a message.
                    None => {
                        self.next = Some(next);
                        self.aligning = false;
                    }
                    _ => {}
                }
            }
            Packet::Lost { trail, .. } => {
                if let Some(want) = self.next
                    && want < trail
                {
                    self.fail(ShipError::Lost {
                        needed: want,
                        trail,
                    });
                }
            }
            Packet::Nak { .. } => {}
        }
    }

    fn simulated_drop(&mut self) -> bool {
        if self.config.simulated_loss_ppm == 0 {
            return false;
        }
        // xorshift64: a fixed sequence, so a lossy run can be repeated.
        let mut x = self.loss_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.loss_state = x;
        x % 1_000_000 < u64::from(self.config.simulated_loss_ppm)
    }

    /// Moves the packets that continue the sequence into messages.
    fn deliver(&mut self) {
        let Some(mut next) = self.next else { return };
        while let Some((frag, frags, payload)) = self.pending.remove(&next) {
            next += 1;
            if self.aligning {
                if frag != 0 {
                    continue;
                }
                self.aligning = false;
            }
            match (&mut self.partial, frag) {
                (None, 0) => self.partial = Some((frags, payload)),
                (Some((n, bytes)), f) if *n == frags && f > 0 && f == self.next_frag => {
                    bytes.extend_from_slice(&payload)
                }
                _ => {
                    self.next = Some(next);
                    self.fail(ShipError::Protocol(format!(
                        "packet {} is fragment {frag} of {frags}, out of place",
                        next - 1
                    )));
                    return;
                }
            }
            self.next_frag = frag + 1;
            if frag + 1 == frags {
                let (_, bytes) = self.partial.take().expect("just extended");
                self.ready.push_back(bytes);
            }
        }
        let progressed = self.next != Some(next);
        self.next = Some(next);
        if next >= self.lead || progressed {
            // Caught up, or a gap closed: a gap that remains waits afresh.
            self.gap_since = None;
            self.last_nak = None;
        }
    }

    /// NAKs a gap that has waited long enough, and gives up on one that waited too long.
    fn check_gap(&mut self, now: Instant) -> Result<(), ShipError> {
        let Some(next) = self.next else { return Ok(()) };
        if next >= self.lead {
            self.gap_since = None;
            return Ok(());
        }
        let since = *self.gap_since.get_or_insert(now);
        if now - since > self.config.give_up {
            return Err(self.fail(ShipError::Timeout {
                needed: next,
                waited_ms: (now - since).as_millis() as u64,
            }));
        }
        let due = match self.last_nak {
            None => now - since >= self.config.nak_delay,
            Some(t) => now - t >= self.config.nak_retry,
        };
        let (Some(publisher), Some(stream)) = (self.publisher, self.stream) else {
            return Ok(());
        };
        if !due {
            return Ok(());
        }
        let mut ranges = vec![];
        let mut at = next;
        for &seq in self.pending.keys() {
            if seq > at {
                ranges.push((at, seq - 1));
                if ranges.len() == MAX_NAK_RANGES {
                    break;
                }
            }
            at = seq.saturating_add(1);
        }
        if ranges.len() < MAX_NAK_RANGES && at < self.lead {
            ranges.push((at, self.lead - 1));
        }
        let nak = Packet::Nak { stream, ranges };
        self.socket.send_to(&nak.encode(), publisher)?;
        self.stats.naks += 1;
        self.last_nak = Some(now);
        Ok(())
    }
}
