//! A [`Connector`] for endpoints in different processes that share a
//! directory (one host, or a shared file system): each side of a stream
//! writes its offer as a file named after the stream, side and phase, and
//! waits for the other side's file, which it reads and removes. Files appear
//! whole (written aside, then renamed), so a reader never sees half an offer.
//!
//! Offers come from other processes, so they are checked like any input: a
//! file of the wrong size or with unknown flags fails the stream, naming it.

use super::{Connector, Offer, Phase, Side};
use crate::frame::StreamKey;
use crate::verbs::{QpAddr, RemoteRegion};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a released query's marker stays: its late sides are turned away.
const RELEASED_FOR: Duration = Duration::from_secs(600);

/// Bytes of an offer on disk.
const OFFER_LEN: usize = 4 + 4 + 1 + 4 + 4 + 8 + 8 + 1 + 4 + 4 + 8;

/// Brings the two sides of each stream together through files in a directory.
#[derive(Debug)]
pub struct DirConnector {
    dir: PathBuf,
}

impl DirConnector {
    /// Meets in `dir` (created if missing). Every process of a cluster must
    /// name the same directory.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<std::sync::Arc<Self>> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(std::sync::Arc::new(Self { dir }))
    }

    /// Forgets every offer and released query: for a cluster that starts
    /// afresh, whose query ids start again.
    pub fn clear(&self) -> std::io::Result<()> {
        for e in std::fs::read_dir(&self.dir)? {
            let _ = std::fs::remove_file(e?.path());
        }
        Ok(())
    }

    fn file(&self, key: StreamKey, side: Side, phase: Phase) -> PathBuf {
        let side = match side {
            Side::Sender => "s",
            Side::Receiver => "r",
        };
        let phase = match phase {
            Phase::Offer => "offer",
            Phase::Ready => "ready",
        };
        self.dir.join(format!(
            "{}-{}-{}-{}.{side}.{phase}",
            key.query, key.exchange, key.from, key.to
        ))
    }

    fn released(&self, query: u64) -> PathBuf {
        self.dir.join(format!("{query}.released"))
    }
}

fn encode(o: &Offer) -> [u8; OFFER_LEN] {
    let mut b = Vec::with_capacity(OFFER_LEN);
    b.extend_from_slice(&o.qp.node.to_le_bytes());
    b.extend_from_slice(&o.qp.qpn.to_le_bytes());
    let r = o.region.unwrap_or(RemoteRegion {
        node: 0,
        key: 0,
        len: 0,
    });
    b.push(o.region.is_some() as u8);
    b.extend_from_slice(&r.node.to_le_bytes());
    b.extend_from_slice(&r.key.to_le_bytes());
    b.extend_from_slice(&r.len.to_le_bytes());
    b.extend_from_slice(&o.offset.to_le_bytes());
    let d = o.datagrams.unwrap_or(QpAddr { node: 0, qpn: 0 });
    b.push(o.datagrams.is_some() as u8);
    b.extend_from_slice(&d.node.to_le_bytes());
    b.extend_from_slice(&d.qpn.to_le_bytes());
    b.extend_from_slice(&o.terms.to_le_bytes());
    b.try_into().expect("the offer layout's length")
}

fn decode(b: &[u8]) -> Result<Offer, String> {
    if b.len() != OFFER_LEN {
        return Err(format!(
            "an offer of {} bytes (expected {OFFER_LEN})",
            b.len()
        ));
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let flag = |i: usize| match b[i] {
        0 => Ok(false),
        1 => Ok(true),
        f => Err(format!("an offer with flag byte {f} at {i}")),
    };
    Ok(Offer {
        qp: QpAddr {
            node: u32_at(0),
            qpn: u32_at(4),
        },
        region: flag(8)?.then(|| RemoteRegion {
            node: u32_at(9),
            key: u32_at(13),
            len: u64_at(17),
        }),
        offset: u64_at(25),
        datagrams: flag(33)?.then(|| QpAddr {
            node: u32_at(34),
            qpn: u32_at(38),
        }),
        terms: u64_at(42),
    })
}

/// Writes `bytes` to `path` so that it appears whole.
fn publish(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[async_trait::async_trait]
impl Connector for DirConnector {
    async fn meet(
        &self,
        key: StreamKey,
        side: Side,
        phase: Phase,
        offer: Offer,
        timeout: Duration,
    ) -> Result<Offer, String> {
        let other = side.other();
        let released = self.released(key.query);
        if released.exists() {
            return Err(format!("stream {key}: its query is over"));
        }
        let mine = self.file(key, side, phase);
        if mine.exists() {
            return Err(format!("stream {key} was offered twice by its {side:?}"));
        }
        publish(&mine, &encode(&offer))
            .map_err(|e| format!("stream {key}: offering in {}: {e}", self.dir.display()))?;
        let theirs = self.file(key, other, phase);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_micros(100);
        loop {
            match std::fs::read(&theirs) {
                Ok(bytes) => {
                    let _ = std::fs::remove_file(&theirs);
                    return decode(&bytes).map_err(|e| format!("stream {key}: {e}"));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("stream {key}: reading {}: {e}", theirs.display())),
            }
            if released.exists() {
                let _ = std::fs::remove_file(&mine);
                return Err(format!("stream {key}: its query is over"));
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = std::fs::remove_file(&mine);
                return Err(format!(
                    "the other side of stream {key} did not reach {phase:?} within {timeout:?}"
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    fn release(&self, query: u64) {
        let _ = publish(&self.released(query), b"");
        // Offers of the query nobody will read, and queries released long ago.
        let prefix = format!("{query}-");
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let old = || {
                    e.metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > RELEASED_FOR))
                };
                if name.starts_with(&prefix) || (name.ends_with(".released") && old()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StreamKey {
        StreamKey {
            query: 5,
            exchange: 1,
            from: 2,
            to: 3,
        }
    }

    fn offer(node: u32) -> Offer {
        Offer {
            qp: QpAddr { node, qpn: 77 },
            region: Some(RemoteRegion {
                node,
                key: 9,
                len: 1 << 20,
            }),
            offset: 4096,
            datagrams: (node == 2).then_some(QpAddr { node, qpn: 78 }),
            terms: 0xdead_beef,
        }
    }

    #[test]
    fn offers_round_trip_and_bad_ones_are_refused() {
        for o in [offer(2), offer(3)] {
            assert_eq!(decode(&encode(&o)).unwrap(), o);
        }
        assert!(decode(&[0u8; 10]).unwrap_err().contains("10 bytes"));
        let mut b = encode(&offer(2));
        b[8] = 7;
        assert!(decode(&b).unwrap_err().contains("flag byte 7"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_connectors_on_one_directory_meet_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            DirConnector::new(dir.path()).unwrap(),
            DirConnector::new(dir.path()).unwrap(),
        );
        let t = Duration::from_secs(10);
        let s =
            tokio::spawn(
                async move { a.meet(key(), Side::Sender, Phase::Offer, offer(2), t).await },
            );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let got = b
            .meet(key(), Side::Receiver, Phase::Offer, offer(3), t)
            .await
            .unwrap();
        assert_eq!(got, offer(2));
        assert_eq!(s.await.unwrap().unwrap(), offer(3));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_peer_times_out_and_a_released_query_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let c = DirConnector::new(dir.path()).unwrap();
        let err = c
            .meet(
                key(),
                Side::Sender,
                Phase::Offer,
                offer(2),
                Duration::from_millis(50),
            )
            .await
            .unwrap_err();
        assert!(err.contains("did not reach Offer"), "{err}");
        let waiting = {
            let c = DirConnector::new(dir.path()).unwrap();
            tokio::spawn(async move {
                c.meet(
                    key(),
                    Side::Sender,
                    Phase::Offer,
                    offer(2),
                    Duration::from_secs(30),
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.release(5);
        let err = waiting.await.unwrap().unwrap_err();
        assert!(err.contains("query is over"), "{err}");
        let err = c
            .meet(
                key(),
                Side::Receiver,
                Phase::Offer,
                offer(3),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(err.contains("query is over"), "{err}");
        c.clear().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
