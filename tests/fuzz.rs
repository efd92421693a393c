//! Fuzzing of every decoder that reads bytes from another node: transport frames and
//! the handshake, the multiplexer's byte stream after a real handshake, control
//! messages, exchange (IPC) messages with compression, cyclo-join fragments, Flow-Join
//! messages, the plan codec, and the redo log (groups replayed by a secondary,
//! segments, multicast packets).
//!
//! The targets (seeds and decoding) live in `crates/fuzz`, shared with the
//! coverage-guided AFL++ driver (`fuzz/afl`, `scripts/fuzz.sh`). Here each target
//! starts from its seeds and decodes mutations of them (bit flips, interesting values written over length fields,
//! insertions, deletions, splices, truncations, random bytes). Errors are the expected
//! answer; a panic anywhere in the process (decoder or multiplexer task) fails the
//! test and prints the input. The mutations are not coverage-guided.
//!
//! `GYRE_FUZZ_INPUTS` sets the inputs per target (default: a smoke run of 20 000; the
//! live multiplexer target runs a hundredth of it, each input being a connection):
//!
//! ```sh
//! GYRE_FUZZ_INPUTS=10000000 cargo test --release --test fuzz -- --nocapture
//! ```

use gyre_fuzz::frames::with_checksums;
use gyre_transport::auth::{self, Challenge, Hello, Role, Transcript};
use gyre_transport::frame::{FrameHeader, FrameKind, HEADER_LEN, encode_frame};
use gyre_transport::{TcpTransport, TransportConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Inputs per target.
fn inputs() -> u64 {
    std::env::var("GYRE_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Panics on the transport's threads (its multiplexer and runtimes), which tokio
/// catches: a task that died is a crash the test must see. Panics of the targets on
/// the test's own threads are caught by [`fuzz`].
static PANICS: AtomicU64 = AtomicU64::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("gyre-") || name.starts_with("tokio-") {
                PANICS.fetch_add(1, Ordering::SeqCst);
                default(info);
            }
            // On the test's threads a panic is caught, contained by the decoder or
            // reported with its input by `fuzz`; millions of them would flood the log.
        }));
    });
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Values that sit on the edges of lengths and counts.
const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
];

/// One mutation of a seed (or of two, spliced).
fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.random_range(0..seeds.len())].clone();
    if rng.random_ratio(1, 50) {
        let n = rng.random_range(0..256);
        return (0..n).map(|_| rng.random()).collect();
    }
    for _ in 0..rng.random_range(1..=6) {
        let len = v.len();
        match rng.random_range(0..9) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                v[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                v[i] = rng.random();
            }
            2 if len > 0 => {
                // An interesting value over 1, 2, 4 or 8 bytes, as a length would be.
                let width = [1, 2, 4, 8][rng.random_range(0..4)];
                let at = rng.random_range(0..len);
                let value = INTERESTING[rng.random_range(0..INTERESTING.len())];
                let value = if rng.random() {
                    value
                } else {
                    value.wrapping_add_signed(rng.random_range(-2..=2))
                };
                for (k, b) in value.to_le_bytes().iter().take(width).enumerate() {
                    if at + k < len {
                        v[at + k] = *b;
                    }
                }
            }
            3 => {
                let at = rng.random_range(0..=len);
                let n = rng.random_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                v.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - at).min(64));
                v.drain(at..at + n);
            }
            5 if len > 0 => {
                let at = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - at).min(64));
                let copy = v[at..at + n].to_vec();
                let to = rng.random_range(0..=len);
                v.splice(to..to, copy);
            }
            6 => v.truncate(rng.random_range(0..=len)),
            7 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let cut = rng.random_range(0..=len);
                let from = rng.random_range(0..=other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ if len > 0 => {
                let i = rng.random_range(0..len);
                v[i] = v[i].wrapping_add(rng.random_range(1..=4));
            }
            _ => {}
        }
    }
    v
}

/// Runs `target` on the seeds and then on `n` mutations of them, failing on the first
/// panic with its input.
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, n: u64, target: impl Fn(&[u8])) {
    count_panics();
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let mut rng = StdRng::seed_from_u64(0x6779_7265 ^ n);
    let start = Instant::now();
    let mut last = start;
    for i in 0..n {
        let input = if (i as usize) < seeds.len() {
            seeds[i as usize].clone()
        } else {
            mutate(&mut rng, &seeds)
        };
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| target(&input))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            // The panic hook keeps quiet on this thread: say it here.
            let report = format!("{name}: input {i} panicked ({why}): {}", hex(&input));
            eprintln!("{report}");
            panic!("{report}");
        }
        if last.elapsed() > Duration::from_secs(30) {
            last = Instant::now();
            eprintln!(
                "{name}: {i} inputs in {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
    }
    let s = start.elapsed().as_secs_f64();
    eprintln!(
        "{name}: {n} inputs without a panic in {s:.1} s ({:.0}/s)",
        n as f64 / s.max(1e-9)
    );
}

/// Runs the mutation fuzzer on the target called `name`.
fn fuzz_target(name: &str) {
    let t = gyre_fuzz::target(name).expect("a fuzz target of that name");
    fuzz(name, (t.seeds)(), inputs(), t.run);
}

#[test]
fn transport_frames_and_handshake() {
    fuzz_target("frames");
}

#[test]
fn the_multiplexer_reading_a_stream() {
    fuzz_target("stream");
}

/// Opens a connection to `addr` (node 2) as node 1 and completes the handshake,
/// retrying while node 2 is not yet listening.
fn handshake(addr: std::net::SocketAddr, secret: &str) -> std::net::TcpStream {
    let start = Instant::now();
    loop {
        match try_handshake(addr, secret) {
            Ok(sock) => return sock,
            Err(e) if start.elapsed() > Duration::from_secs(10) => {
                panic!("no handshake with the transport within 10 s: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn try_handshake(addr: std::net::SocketAddr, secret: &str) -> std::io::Result<std::net::TcpStream> {
    let mut sock = std::net::TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let hello = Hello {
        node: 1,
        window: 8,
        nonce: auth::nonce(),
        share: gyre_transport::seal::KeyShare::new().unwrap().public(),
        seal: false,
    };
    sock.write_all(&encode_frame(FrameKind::Hello, 0, &hello.encode()))?;
    let mut header = [0u8; HEADER_LEN];
    sock.read_exact(&mut header)?;
    let h = FrameHeader::decode(&header).unwrap();
    let mut payload = vec![0u8; h.len];
    sock.read_exact(&mut payload)?;
    let challenge = Challenge::decode(h.kind, &payload).unwrap();
    let t = Transcript {
        dialer: hello,
        acceptor: challenge.hello,
    };
    assert!(t.verify(secret.as_bytes(), Role::Acceptor, &challenge.proof));
    sock.write_all(&encode_frame(
        FrameKind::Proof,
        0,
        &t.prove(secret.as_bytes(), Role::Dialer),
    ))?;
    sock.read_exact(&mut header)?;
    assert_eq!(
        FrameHeader::decode(&header).unwrap().kind,
        FrameKind::Welcome
    );
    Ok(sock)
}

#[test]
fn the_multiplexer_after_a_handshake() {
    let n = (inputs() / 100).max(200);
    let secret = "fuzzing secret of the transport".to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = TransportConfig {
        secret: secret.clone(),
        ..Default::default()
    };
    let seeds = gyre_fuzz::stream::seeds();
    fuzz("multiplexer stream", seeds, n, |input| {
        // A node that breaks the protocol is lost for good: a fresh node 2 per input,
        // which accepts node 1 (the lower id dials), a member nobody serves.
        let transport = rt
            .block_on(TcpTransport::bind(
                2,
                "127.0.0.1:0".parse().unwrap(),
                config.clone(),
            ))
            .unwrap();
        let addr = transport.local_addr();
        transport.set_peers(&std::collections::HashMap::from([
            (1, "127.0.0.1:9".parse().unwrap()),
            (2, addr),
        ]));
        let mut sock = handshake(addr, &secret);
        let _ = sock.write_all(&with_checksums(input));
        let _ = sock.shutdown(std::net::Shutdown::Write);
        // The node answers (credits, errors) or closes; either way it must go on.
        let mut sink = [0u8; 4096];
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        while let Ok(n) = sock.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        transport.shutdown();
    });
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a transport thread panicked"
    );
}

#[test]
fn control_messages() {
    fuzz_target("control");
}

#[test]
fn flow_join_messages() {
    fuzz_target("flow");
}

#[test]
fn exchange_messages_with_compression() {
    fuzz_target("ipc");
}

#[test]
fn cyclo_join_fragments() {
    fuzz_target("cyclo");
}

#[test]
fn plans() {
    fuzz_target("plan");
}

#[test]
fn redo_log_groups_segments_and_packets() {
    fuzz_target("redo");
}
