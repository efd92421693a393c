//! Control messages signed with the cluster secret.
//!
//! Nodes (coordinator, workers, benchmark drivers) share the cluster secret; a client
//! that logged in does not know it. Each control message carries, in the
//! [`NODE_HEADER`] header, `time.nonce.digest.mac`: the sender's clock in milliseconds
//! since the Unix epoch, 128 random bits, SHA-256(action type | 0 | body), and
//! HMAC-SHA256(key, "gyre/control" | receiver | time | nonce | digest) with a key
//! derived from the secret, where the receiver is the node id the message is for (the
//! coordinator is node 0). The receiver checks the MAC with its own id, that the time
//! is within [`MAX_SKEW`] of its own clock, and that it has not seen the nonce in that
//! window, so a message can be neither forged, altered, replayed, nor replayed to
//! another node. Since the MAC covers the header alone, a node checks it before it
//! reads the body ([`NodeVerifier::check_header`]), then the body against the digest.
//! Without TLS the body is readable on the wire; the secret never is.

use gyre_transport::NodeId;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// The header that carries a control message's signature.
pub const NODE_HEADER: &str = "x-gyre-node-auth";

/// How far a sender's clock may be from the receiver's.
pub const MAX_SKEW: Duration = Duration::from_secs(300);

/// The key control messages are signed with, derived from the cluster secret (apart
/// from the data transport's handshake, which uses the secret itself).
#[derive(Clone)]
pub struct NodeKey([u8; 32]);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(..)")
    }
}

impl NodeKey {
    pub fn from_secret(secret: &str) -> Self {
        let mut mac =
            HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
        mac.update(b"gyre/control key");
        Self(mac.finalize().into_bytes().into())
    }

    fn mac(&self, to: NodeId, millis: u64, nonce: u128, digest: &[u8; 32]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        mac.update(b"gyre/control");
        mac.update(&to.to_le_bytes());
        mac.update(&millis.to_le_bytes());
        mac.update(&nonce.to_le_bytes());
        mac.update(digest);
        mac
    }

    /// The header value that signs a control message for node `to`.
    pub fn sign(&self, to: NodeId, action: &str, body: &[u8]) -> String {
        self.sign_at(to, now_millis(), rand::random(), action, body)
    }

    fn sign_at(&self, to: NodeId, millis: u64, nonce: u128, action: &str, body: &[u8]) -> String {
        let digest = digest(action, body);
        let mac = self.mac(to, millis, nonce, &digest).finalize().into_bytes();
        format!("{millis:x}.{nonce:032x}.{}.{}", hex(&digest), hex(&mac))
    }
}

/// What a control message's MAC binds of its body.
fn digest(action: &str, body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut d = Sha256::new();
    d.update(action.as_bytes());
    d.update([0]);
    d.update(body);
    d.finalize().into()
}

/// A header whose MAC, time and nonce passed, before its body was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedHeader {
    millis: u64,
    nonce: u128,
    digest: [u8; 32],
}

/// Checks signed control messages and remembers their nonces.
pub struct NodeVerifier {
    key: NodeKey,
    /// This node's id: messages signed for another node are refused.
    me: NodeId,
    /// Nonces seen within the skew window, with their senders' times.
    seen: Mutex<HashMap<u128, u64>>,
}

impl NodeVerifier {
    pub fn new(key: NodeKey, me: NodeId) -> Self {
        Self {
            key,
            me,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `header` signs a message for this node, checked before its body is
    /// read: the MAC, the time and an unseen nonce. The error says why not.
    pub fn check_header(&self, header: Option<&str>) -> Result<SignedHeader, String> {
        let header = header.ok_or("the control message is not signed")?;
        let mut parts = header.split('.');
        let (Some(millis), Some(nonce), Some(digest), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("malformed control signature".to_string());
        };
        let millis = u64::from_str_radix(millis, 16).map_err(|_| "malformed signature time")?;
        let nonce = u128::from_str_radix(nonce, 16).map_err(|_| "malformed signature nonce")?;
        let digest = unhex(digest).ok_or("malformed signature digest")?;
        let mac = unhex(mac).ok_or("malformed signature MAC")?;
        if self
            .key
            .mac(self.me, millis, nonce, &digest)
            .verify_slice(&mac)
            .is_err()
        {
            return Err(format!(
                "the control message's signature does not match the cluster secret and {}",
                gyre_transport::node_name(self.me)
            ));
        }
        let now = now_millis();
        let skew = now.abs_diff(millis);
        if skew > MAX_SKEW.as_millis() as u64 {
            return Err(format!(
                "the control message was signed {:.0} s away from this node's clock (at most {} s): synchronise the clocks",
                skew as f64 / 1000.0,
                MAX_SKEW.as_secs()
            ));
        }
        if self.seen.lock().contains_key(&nonce) {
            return Err("the control message is a replay".to_string());
        }
        Ok(SignedHeader {
            millis,
            nonce,
            digest,
        })
    }

    /// Whether `header` signs this message (`action` with `body`); the error says why
    /// not. A message passes once.
    pub fn check(&self, header: Option<&str>, action: &str, body: &[u8]) -> Result<(), String> {
        let SignedHeader {
            millis,
            nonce,
            digest: signed,
        } = self.check_header(header)?;
        if digest(action, body) != signed {
            return Err("the control message's body is not the one its signature covers".into());
        }
        let now = now_millis();
        let mut seen = self.seen.lock();
        if seen.contains_key(&nonce) {
            return Err("the control message is a replay".to_string());
        }
        // Nonces older than the window can go: their messages fail the time check.
        if seen.len() >= 4096 && seen.len().is_power_of_two() {
            let window = MAX_SKEW.as_millis() as u64;
            seen.retain(|_, t| now.abs_diff(*t) <= window);
        }
        seen.insert(nonce, millis);
        Ok(())
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_the_secret_the_message_and_one_use() {
        let key = NodeKey::from_secret("cluster secret");
        let verifier = NodeVerifier::new(key.clone(), 3);
        let sig = key.sign(3, "gyre.control", b"body");
        assert_eq!(verifier.check(Some(&sig), "gyre.control", b"body"), Ok(()));
        // Once only.
        let e = verifier
            .check(Some(&sig), "gyre.control", b"body")
            .unwrap_err();
        assert!(e.contains("replay"), "{e}");
        // Another body, another action, another secret, no signature, garbage.
        let sig = key.sign(3, "gyre.control", b"body");
        // The header alone passes before the body is read, and does not use up the nonce.
        assert!(verifier.check_header(Some(&sig)).is_ok());
        let e = verifier
            .check(Some(&sig), "gyre.control", b"bodY")
            .unwrap_err();
        assert!(e.contains("body"), "{e}");
        assert!(verifier.check(Some(&sig), "other", b"body").is_err());
        let forged = NodeKey::from_secret("guess").sign(3, "gyre.control", b"body");
        let e = verifier
            .check(Some(&forged), "gyre.control", b"body")
            .unwrap_err();
        assert!(e.contains("cluster secret"), "{e}");
        assert!(verifier.check(None, "gyre.control", b"body").is_err());
        assert!(verifier.check_header(Some(&forged)).is_err());
        for bad in ["", "a.b.c", "1.2", "1.2.3.4.5", "zz.1.00.00", "1.1.éé.00"] {
            assert!(
                verifier.check(Some(bad), "gyre.control", b"").is_err(),
                "{bad}"
            );
        }
        // A message for another node is refused here, whatever else is right.
        let elsewhere = key.sign(4, "gyre.control", b"body");
        let e = verifier
            .check(Some(&elsewhere), "gyre.control", b"body")
            .unwrap_err();
        assert!(e.contains("worker 3"), "{e}");
        // The untouched message still passes.
        assert_eq!(verifier.check(Some(&sig), "gyre.control", b"body"), Ok(()));
    }

    #[test]
    fn old_messages_are_refused_naming_the_clock() {
        let key = NodeKey::from_secret("s");
        let verifier = NodeVerifier::new(key.clone(), 0);
        let old = now_millis() - 2 * MAX_SKEW.as_millis() as u64;
        let sig = key.sign_at(0, old, 7, "a", b"");
        let e = verifier.check(Some(&sig), "a", b"").unwrap_err();
        assert!(e.contains("clock"), "{e}");
    }
}
