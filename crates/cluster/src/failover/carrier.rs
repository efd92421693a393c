//! Raft's requests between coordinators, over TCP, signed with the cluster secret.
//!
//! A message is `sender (u32 LE) | header length (u16 LE) | header | body length (u32
//! LE) | body`. The header is the control signature ([`crate::auth::node`]) of the
//! body for the receiving voter: the receiver checks it before it reads the body, and
//! refuses a body longer than [`MAX_RAFT_MESSAGE`]. The answer comes back on the same
//! connection, signed for the sender; its body is `0 | Raft's answer` or `1 | why
//! not`. Connections are kept for later requests, one request at a time on each.

use crate::auth::NodeKey;
use crate::auth::node::NodeVerifier;
use gyre_consensus::{Carrier, NodeId, Voter};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The longest request or answer body (a batch of log groups, a snapshot chunk).
pub const MAX_RAFT_MESSAGE: usize = 256 << 20;

/// The longest signature header.
const MAX_HEADER: usize = 512;

const REQUEST: &str = "gyre.raft";
const ANSWER: &str = "gyre.raft.answer";

/// The voter a coordinator runs now (none while it restarts its voter).
pub type VoterSlot = Arc<RwLock<Option<Arc<Voter>>>>;

/// Writes one signed message.
async fn send(
    stream: &mut TcpStream,
    key: &NodeKey,
    from: NodeId,
    to: NodeId,
    action: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let header = key.sign(voter_node(to), action, body);
    let mut message = Vec::with_capacity(10 + header.len() + body.len());
    message.extend_from_slice(&(from as u32).to_le_bytes());
    message.extend_from_slice(&(header.len() as u16).to_le_bytes());
    message.extend_from_slice(header.as_bytes());
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(body);
    stream.write_all(&message).await?;
    stream.flush().await
}

/// Reads one message signed for this voter; returns its sender and body. Anything
/// unsigned, forged, replayed or too long is an error naming why.
async fn receive(
    stream: &mut TcpStream,
    verifier: &NodeVerifier,
    action: &str,
) -> std::io::Result<(NodeId, Vec<u8>)> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let from = NodeId::from(stream.read_u32_le().await?);
    let header_len = stream.read_u16_le().await? as usize;
    if header_len > MAX_HEADER {
        return Err(invalid(format!("a {header_len}-byte signature")));
    }
    let mut header = vec![0; header_len];
    stream.read_exact(&mut header).await?;
    let header =
        String::from_utf8(header).map_err(|_| invalid("a signature not in UTF-8".into()))?;
    verifier.check_header(Some(&header)).map_err(invalid)?;
    let body_len = stream.read_u32_le().await? as usize;
    if body_len > MAX_RAFT_MESSAGE {
        return Err(invalid(format!(
            "a {body_len}-byte Raft message (at most {MAX_RAFT_MESSAGE})"
        )));
    }
    let mut body = vec![0; body_len];
    stream.read_exact(&mut body).await?;
    verifier
        .check(Some(&header), action, &body)
        .map_err(invalid)?;
    Ok((from, body))
}

/// Voters sign for a node id of their own, apart from the workers' ids.
fn voter_node(voter: NodeId) -> gyre_transport::NodeId {
    u32::MAX - voter as u32
}

/// Serves the Raft requests of the other voters on `listener`, answering with the
/// voter in `slot`.
pub fn serve(listener: TcpListener, slot: VoterSlot, key: NodeKey, me: NodeId) {
    let verifier = Arc::new(NodeVerifier::new(key.clone(), voter_node(me)));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: try again shortly.
                    tracing::warn!("accepting Raft connections: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (slot, key, verifier) = (slot.clone(), key.clone(), verifier.clone());
            tokio::spawn(async move {
                if let Err(e) = answer_connection(stream, &slot, &key, &verifier, me).await
                    && e.kind() != std::io::ErrorKind::UnexpectedEof
                {
                    tracing::info!(%peer, "a Raft connection ended: {e}");
                }
            });
        }
    });
}

async fn answer_connection(
    mut stream: TcpStream,
    slot: &VoterSlot,
    key: &NodeKey,
    verifier: &NodeVerifier,
    me: NodeId,
) -> std::io::Result<()> {
    loop {
        let (from, request) = receive(&mut stream, verifier, REQUEST).await?;
        let voter = slot.read().clone();
        let answer = match voter {
            Some(voter) => voter.answer(&request).await,
            None => Err(format!("voter {me} is restarting")),
        };
        let body = match answer {
            Ok(bytes) => [&[0u8][..], &bytes].concat(),
            Err(why) => [&[1u8][..], why.as_bytes()].concat(),
        };
        send(&mut stream, key, me, from, ANSWER, &body).await?;
    }
}

/// Sends this voter's Raft requests to the others.
pub struct TcpCarrier {
    me: NodeId,
    key: NodeKey,
    verifier: NodeVerifier,
    /// Each voter's Raft address.
    peers: HashMap<NodeId, SocketAddr>,
    /// Connections not in use, by voter.
    idle: Mutex<HashMap<NodeId, Vec<TcpStream>>>,
}

impl TcpCarrier {
    pub fn new(me: NodeId, key: NodeKey, peers: HashMap<NodeId, SocketAddr>) -> Self {
        Self {
            me,
            verifier: NodeVerifier::new(key.clone(), voter_node(me)),
            key,
            peers,
            idle: Mutex::new(HashMap::new()),
        }
    }

    async fn exchange(&self, to: NodeId, request: &[u8]) -> Result<Vec<u8>, String> {
        let addr = *self
            .peers
            .get(&to)
            .ok_or_else(|| format!("no voter {to}"))?;
        let pooled = self.idle.lock().get_mut(&to).and_then(Vec::pop);
        let mut stream = match pooled {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("{addr}: {e}"))?;
                let _ = stream.set_nodelay(true);
                stream
            }
        };
        send(&mut stream, &self.key, self.me, to, REQUEST, request)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let (_, answer) = receive(&mut stream, &self.verifier, ANSWER)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        self.idle.lock().entry(to).or_default().push(stream);
        match answer.split_first() {
            Some((0, bytes)) => Ok(bytes.to_vec()),
            Some((1, why)) => Err(String::from_utf8_lossy(why).into_owned()),
            _ => Err(format!("{addr}: a malformed answer")),
        }
    }
}

#[async_trait::async_trait]
impl Carrier for TcpCarrier {
    async fn call(
        &self,
        to: NodeId,
        _addr: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        // A connection whose answer timed out is dropped with the future: the next
        // request takes another.
        tokio::time::timeout(timeout, self.exchange(to, &request))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn listening(key: &NodeKey, me: NodeId) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, VoterSlot::default(), key.clone(), me);
        addr
    }

    #[tokio::test]
    async fn requests_are_signed_for_their_voter_and_answered_signed() {
        let key = NodeKey::from_secret("raft carrier test");
        let addr = listening(&key, 2).await;
        let carrier = TcpCarrier::new(1, key.clone(), [(2, addr)].into());
        // Voter 2 runs no voter right now: its answer says so, signed and accepted.
        let answer = carrier
            .call(2, "", b"request".to_vec(), Duration::from_secs(5))
            .await;
        assert_eq!(answer, Err("voter 2 is restarting".into()));
        // The connection is kept and serves the next request.
        let answer = carrier
            .call(2, "", b"again".to_vec(), Duration::from_secs(5))
            .await;
        assert_eq!(answer, Err("voter 2 is restarting".into()));
        assert_eq!(carrier.idle.lock()[&2].len(), 1);

        // Another secret, or a request signed for another voter: no answer at all.
        for (secret, to) in [("another secret", 2), ("raft carrier test", 3)] {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let forger = NodeKey::from_secret(secret);
            send(&mut stream, &forger, 1, to, REQUEST, b"x")
                .await
                .unwrap();
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
                .await
                .unwrap();
            assert!(matches!(read, Ok(0) | Err(_)), "{secret}/{to}: {read:?}");
        }
        // A body longer than any Raft message is refused before it is read.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let header = key.sign(voter_node(2), REQUEST, b"");
        let mut message = 1u32.to_le_bytes().to_vec();
        message.extend_from_slice(&(header.len() as u16).to_le_bytes());
        message.extend_from_slice(header.as_bytes());
        message.extend_from_slice(&u32::MAX.to_le_bytes());
        stream.write_all(&message).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        // An unknown voter is an error, not a panic.
        let unknown = carrier
            .call(9, "", vec![], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(unknown.contains("no voter 9"), "{unknown}");
    }
}
