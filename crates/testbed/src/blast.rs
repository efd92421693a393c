//! A raw TCP blast: one side writes zeros as fast as the link takes them, the
//! other counts what arrives. The receiver's count is the link's capacity for one
//! TCP stream (what a transport on top of TCP can hope for at best).
//!
//! Used as a small command (`serve` / `send`) run inside the hosts' namespaces by
//! [`crate::capacity`]; results are JSON lines on stdout.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// What the receiver saw on one connection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceivedStream {
    /// The sender's address.
    pub peer: SocketAddr,
    /// All bytes received.
    pub bytes: u64,
    /// From the first byte to the end of the stream.
    pub seconds: f64,
    /// Bytes received after the warm-up (TCP's ramp-up excluded).
    pub measured_bytes: u64,
    pub measured_seconds: f64,
    /// `measured_bytes / measured_seconds`.
    pub bytes_per_sec: f64,
}

/// What the sender sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SentStream {
    pub bytes: u64,
    pub seconds: f64,
}

/// One line of the blast command's output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BlastEvent {
    /// The receiver listens.
    Ready {
        addr: SocketAddr,
    },
    Received(ReceivedStream),
    Sent(SentStream),
    Error {
        message: String,
    },
}

const READ_BUFFER: usize = 256 * 1024;

/// Accepts `connections` connections (within `accept_timeout`) and receives each
/// to its end, in one thread per connection. `on_stream` is called as each ends.
pub fn serve(
    listener: TcpListener,
    connections: usize,
    warmup: Duration,
    accept_timeout: Duration,
    on_stream: impl Fn(&std::io::Result<ReceivedStream>) + Sync,
) -> std::io::Result<Vec<ReceivedStream>> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + accept_timeout;
    let mut streams = Vec::with_capacity(connections);
    while streams.len() < connections {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                streams.push(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "only {} of {connections} senders connected within {accept_timeout:?}",
                            streams.len()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .into_iter()
            .map(|s| {
                let on_stream = &on_stream;
                scope.spawn(move || {
                    let result = receive(s, warmup);
                    on_stream(&result);
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("receiver thread panicked"))
            .collect()
    })
}

/// Reads a stream to its end, timing it from the first byte.
pub fn receive(mut stream: TcpStream, warmup: Duration) -> std::io::Result<ReceivedStream> {
    let peer = stream.peer_addr()?;
    let mut buf = vec![0u8; READ_BUFFER];
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    let mut warm: Option<(Instant, u64)> = None;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        let start = *first.get_or_insert(now);
        bytes += n as u64;
        if warm.is_none() && now - start >= warmup {
            warm = Some((now, bytes));
        }
    }
    let end = Instant::now();
    let start = first.unwrap_or(end);
    let seconds = (end - start).as_secs_f64();
    // A stream shorter than twice the warm-up is measured whole.
    let (measured_bytes, measured_seconds) = match warm {
        Some((t, b)) if (end - t) >= warmup => (bytes - b, (end - t).as_secs_f64()),
        _ => (bytes, seconds),
    };
    let bytes_per_sec = if measured_seconds > 0.0 {
        measured_bytes as f64 / measured_seconds
    } else {
        0.0
    };
    Ok(ReceivedStream {
        peer,
        bytes,
        seconds,
        measured_bytes,
        measured_seconds,
        bytes_per_sec,
    })
}

/// Connects (retrying for up to 5 s), writes zeros for `duration`, closes its
/// sending side and waits for the receiver to close.
pub fn send(addr: SocketAddr, duration: Duration, buffer: usize) -> std::io::Result<SentStream> {
    let connect_deadline = Instant::now() + Duration::from_secs(5);
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < connect_deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot connect to {addr}: {e}"),
                ));
            }
        }
    };
    let buf = vec![0u8; buffer.max(1)];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < duration {
        stream.write_all(&buf)?;
        bytes += buf.len() as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    // The receiver closes once it has read everything; wait for that, bounded.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut sink = [0u8; 64];
    while stream.read(&mut sink)? > 0 {}
    Ok(SentStream {
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The blast command: `serve --listen ADDR --connections K [--warmup-ms W]
/// [--accept-timeout-s T]` or `send --connect ADDR --seconds S [--buffer-kib B]`.
/// Prints [`BlastEvent`]s as JSON lines.
pub fn run_cli(args: &[String]) -> Result<(), String> {
    let (mode, rest) = args
        .split_first()
        .ok_or_else(|| "usage: blast serve|send [options]".to_string())?;
    let opts = Options::parse(rest)?;
    match mode.as_str() {
        "serve" => {
            let listen: SocketAddr = opts.get_parsed("--listen")?;
            let connections: usize = opts.get_parsed_or("--connections", 1)?;
            let warmup = Duration::from_millis(opts.get_parsed_or("--warmup-ms", 500)?);
            let accept = Duration::from_secs(opts.get_parsed_or("--accept-timeout-s", 20)?);
            let listener =
                TcpListener::bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
            emit(&BlastEvent::Ready {
                addr: listener.local_addr().map_err(|e| e.to_string())?,
            });
            let result = serve(listener, connections, warmup, accept, |r| match r {
                Ok(s) => emit(&BlastEvent::Received(s.clone())),
                Err(e) => emit(&BlastEvent::Error {
                    message: format!("receive failed: {e}"),
                }),
            });
            result.map(|_| ()).map_err(|e| {
                let message = e.to_string();
                emit(&BlastEvent::Error {
                    message: message.clone(),
                });
                message
            })
        }
        "send" => {
            let addr: SocketAddr = opts.get_parsed("--connect")?;
            let seconds: f64 = opts.get_parsed_or("--seconds", 3.0)?;
            if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
                return Err(format!("--seconds {seconds}: must be in (0, 3600]"));
            }
            let kib: usize = opts.get_parsed_or("--buffer-kib", 1024)?;
            let sent = send(addr, Duration::from_secs_f64(seconds), kib * 1024).map_err(|e| {
                let message = format!("sending to {addr} failed: {e}");
                emit(&BlastEvent::Error {
                    message: message.clone(),
                });
                message
            })?;
            emit(&BlastEvent::Sent(sent));
            Ok(())
        }
        other => Err(format!("unknown blast mode '{other}' (serve or send)")),
    }
}

fn emit(event: &BlastEvent) {
    let line = serde_json::to_string(event).expect("blast events serialise");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `--key value` pairs.
struct Options(Vec<(String, String)>);

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        if !args.len().is_multiple_of(2) {
            return Err(format!("options come in pairs (--key value): {args:?}"));
        }
        let pairs = args
            .chunks(2)
            .map(|kv| {
                if kv[0].starts_with("--") {
                    Ok((kv[0].clone(), kv[1].clone()))
                } else {
                    Err(format!("expected an option, got '{}'", kv[0]))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Options(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn get_parsed<T: std::str::FromStr>(&self, key: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.get(key).ok_or_else(|| format!("{key} is required"))?;
        v.parse().map_err(|e| format!("bad {key} '{v}': {e}"))
    }

    fn get_parsed_or<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            Some(_) => self.get_parsed(key),
            None => Ok(default),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blast_over_loopback_receives_every_byte_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = std::thread::spawn(move || {
            serve(
                listener,
                2,
                Duration::from_millis(50),
                Duration::from_secs(5),
                |_| {},
            )
            .unwrap()
        });
        let senders: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || {
                    send(addr, Duration::from_millis(200), 64 * 1024).unwrap()
                })
            })
            .collect();
        let sent: Vec<SentStream> = senders.into_iter().map(|h| h.join().unwrap()).collect();
        let received = receiver.join().unwrap();
        assert_eq!(received.len(), 2);
        let total_sent: u64 = sent.iter().map(|s| s.bytes).sum();
        let total_received: u64 = received.iter().map(|r| r.bytes).sum();
        assert_eq!(total_sent, total_received);
        for r in &received {
            assert!(r.measured_bytes > 0 && r.measured_bytes < r.bytes, "{r:?}");
            assert!(r.bytes_per_sec > 0.0);
        }
    }

    #[test]
    fn accept_times_out_naming_the_missing_senders() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = serve(
            listener,
            1,
            Duration::ZERO,
            Duration::from_millis(50),
            |_| {},
        )
        .unwrap_err();
        assert!(err.to_string().contains("only 0 of 1 senders"), "{err}");
    }

    #[test]
    fn cli_rejects_bad_arguments() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(run_cli(&[]).unwrap_err().contains("usage"));
        assert!(
            run_cli(&args("fly"))
                .unwrap_err()
                .contains("unknown blast mode")
        );
        assert!(
            run_cli(&args("serve"))
                .unwrap_err()
                .contains("--listen is required")
        );
        assert!(
            run_cli(&args("serve --listen nowhere"))
                .unwrap_err()
                .contains("bad --listen")
        );
        assert!(
            run_cli(&args("send --connect 127.0.0.1:1 --seconds 0"))
                .unwrap_err()
                .contains("must be in")
        );
        assert!(
            run_cli(&args("send --connect"))
                .unwrap_err()
                .contains("pairs")
        );
    }

    #[test]
    fn events_round_trip_as_tagged_json() {
        let line = serde_json::to_string(&BlastEvent::Sent(SentStream {
            bytes: 5,
            seconds: 1.5,
        }))
        .unwrap();
        assert_eq!(line, r#"{"event":"sent","bytes":5,"seconds":1.5}"#);
        assert!(matches!(
            serde_json::from_str::<BlastEvent>(&line).unwrap(),
            BlastEvent::Sent(SentStream { bytes: 5, .. })
        ));
    }
}
