//! The log over TCP, where multicast is not available: the publisher sends each
//! message to every subscriber over a connection of its own, so a message crosses the
//! network once per secondary (the multicast's advantage is exactly that it does not).
//!
//! TCP delivers in order and without loss, so there are no NAKs. A subscriber that
//! falls `queue` messages behind is dropped rather than allowed to stall the log; its
//! receiver fails and has to catch up from the durable log. Frames are
//! `[seq u64][len u32][bytes]`; a receiver checks the sequence and bounds the length
//! before it allocates.

use super::ShipError;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver as Queue, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

/// The largest message a receiver accepts (a log group is at most 256 MiB).
const MAX_MESSAGE: usize = 257 << 20;

struct Subscriber {
    queue: SyncSender<(u64, Arc<[u8]>)>,
    addr: SocketAddr,
}

/// Sends every message to every connected subscriber.
pub struct TcpPublisher {
    subscribers: Arc<Mutex<Vec<Subscriber>>>,
    next: Mutex<u64>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    dropped: Arc<Mutex<Vec<SocketAddr>>>,
}

impl TcpPublisher {
    /// Listens on `addr`; each subscriber may fall `queue` messages behind.
    pub fn bind(addr: SocketAddr, queue: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let subscribers: Arc<Mutex<Vec<Subscriber>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (subs, halt) = (Arc::clone(&subscribers), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("gyre-log-tcp-accept".into())
            .spawn(move || {
                while !halt.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            let _ = stream.set_nodelay(true);
                            let (tx, rx) = sync_channel(queue.max(1));
                            let h = Arc::clone(&halt);
                            let spawned = std::thread::Builder::new()
                                .name("gyre-log-tcp-send".into())
                                .spawn(move || send_loop(stream, rx, h));
                            if spawned.is_ok() {
                                subs.lock().push(Subscriber {
                                    queue: tx,
                                    addr: peer,
                                });
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(Self {
            subscribers,
            next: Mutex::new(0),
            addr,
            stop,
            dropped: Arc::default(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn subscribers(&self) -> usize {
        self.subscribers.lock().len()
    }

    /// Subscribers dropped for falling behind or going away.
    pub fn dropped(&self) -> Vec<SocketAddr> {
        self.dropped.lock().clone()
    }

    /// Queues `message` for every subscriber; never waits for a slow one.
    pub fn publish(&self, message: &[u8]) {
        let mut next = self.next.lock();
        let seq = *next;
        *next += 1;
        let bytes: Arc<[u8]> = message.into();
        let mut dropped = self.dropped.lock();
        self.subscribers
            .lock()
            .retain(|s| match s.queue.try_send((seq, Arc::clone(&bytes))) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    dropped.push(s.addr);
                    false
                }
            });
    }
}

impl Drop for TcpPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.subscribers.lock().clear();
    }
}

fn send_loop(mut stream: TcpStream, queue: Queue<(u64, Arc<[u8]>)>, stop: Arc<AtomicBool>) {
    while let Ok((seq, bytes)) = queue.recv() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut head = [0u8; 12];
        head[..8].copy_from_slice(&seq.to_le_bytes());
        head[8..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        if stream
            .write_all(&head)
            .and_then(|()| stream.write_all(&bytes))
            .is_err()
        {
            return;
        }
    }
}

/// Receives a [`TcpPublisher`]'s messages in order.
pub struct TcpReceiver {
    stream: TcpStream,
    next: Option<u64>,
    failed: Option<ShipError>,
    /// Bytes of the frame being read, across timeouts.
    partial: Vec<u8>,
}

impl TcpReceiver {
    pub fn connect(addr: SocketAddr) -> Result<Self, ShipError> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            stream,
            next: None,
            failed: None,
            partial: Vec::new(),
        })
    }

    /// The next message, waiting at most `timeout` (`None` if none came in time).
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, ShipError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.take_frame()? {
                return Ok(Some(m));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(deadline - now))?;
            let mut buf = [0u8; 64 * 1024];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(self.fail(ShipError::Io(
                        "the log publisher closed the connection (dropped for falling \
                         behind, or gone): catch up from the durable log"
                            .into(),
                    )));
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(self.fail(e.into())),
            }
        }
    }

    fn fail(&mut self, e: ShipError) -> ShipError {
        self.failed = Some(e.clone());
        e
    }

    /// A whole frame from the bytes read so far, checked.
    fn take_frame(&mut self) -> Result<Option<Vec<u8>>, ShipError> {
        if self.partial.len() < 12 {
            return Ok(None);
        }
        let seq = u64::from_le_bytes(self.partial[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(self.partial[8..12].try_into().expect("4 bytes")) as usize;
        if len > MAX_MESSAGE {
            return Err(self.fail(ShipError::Protocol(format!(
                "a {len} byte message, more than a log group can be"
            ))));
        }
        if let Some(want) = self.next
            && seq != want
        {
            return Err(self.fail(ShipError::Protocol(format!(
                "message {seq} where {want} was due"
            ))));
        }
        if self.partial.len() < 12 + len {
            return Ok(None);
        }
        let message = self.partial[12..12 + len].to_vec();
        self.partial.drain(..12 + len);
        self.next = Some(seq + 1);
        Ok(Some(message))
    }
}
