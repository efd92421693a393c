//! Connection handshake: both ends prove they know the cluster secret
//! without sending it, and agree on keys for a sealed link.
//!
//! ```text
//! dialer                                                  acceptor
//!   Hello { node_d, window_d, nonce_d, share_d, seal_d }  -->
//!             <--  Challenge { node_a, window_a, nonce_a, share_a, seal_a, proof_a }
//!   Proof { proof_d }                                     -->
//!             <--  Welcome
//!
//! proof_a = HMAC-SHA256(secret, "gyre/3 accept" | hello_d | hello_a)
//! proof_d = HMAC-SHA256(secret, "gyre/3 dial"   | hello_d | hello_a)
//! ```
//!
//! Both nonces are fresh random 32-byte values, so a recorded handshake cannot
//! be replayed, and the role label keeps one side's proof from being reflected
//! back as the other's. The acceptor proves itself first, so a dialer never
//! reveals a proof to a stranger. The window is the number of messages per
//! stream the sending node may have buffered at the announcing node (its
//! initial credit). The share is an ephemeral X25519 public key and `seal`
//! says whether the node encrypts its data links; the proofs cover both
//! hellos whole, so no one in the middle can swap a share or turn sealing off
//! ([`crate::seal`] derives the link keys from the shares and the secret).

use crate::NodeId;
use crate::frame::{FrameError, FrameKind};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;

pub type Nonce = [u8; NONCE_LEN];
pub type Proof = [u8; PROOF_LEN];

/// A fresh random nonce.
pub fn nonce() -> Nonce {
    rand::random()
}

/// Which side of the handshake a proof comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Dialer,
    Acceptor,
}

/// What both sides know once the hello and challenge were exchanged.
#[derive(Debug, Clone, Copy)]
pub struct Transcript {
    pub dialer: Hello,
    pub acceptor: Hello,
}

impl Transcript {
    /// Both hellos as sent: what the proofs and the link keys are bound to.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = self.dialer.encode();
        b.extend_from_slice(&self.acceptor.encode());
        b
    }

    fn mac(&self, secret: &[u8], role: Role) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
        mac.update(match role {
            Role::Dialer => b"gyre/3 dial",
            Role::Acceptor => b"gyre/3 accept",
        });
        mac.update(&self.bytes());
        mac
    }

    /// The proof `role` sends.
    pub fn prove(&self, secret: &[u8], role: Role) -> Proof {
        self.mac(secret, role).finalize().into_bytes().into()
    }

    /// Checks the proof `role` sent, in constant time.
    pub fn verify(&self, secret: &[u8], role: Role, proof: &[u8]) -> bool {
        self.mac(secret, role).verify_slice(proof).is_ok()
    }
}

/// An X25519 public key.
pub type Share = [u8; SHARE_LEN];
pub const SHARE_LEN: usize = 32;

/// `Hello` and the first half of `Challenge`: node id, window, nonce, key share and
/// whether the node seals its data links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub node: NodeId,
    pub window: u32,
    pub nonce: Nonce,
    pub share: Share,
    pub seal: bool,
}

impl Hello {
    pub const LEN: usize = 8 + NONCE_LEN + SHARE_LEN + 1;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN + PROOF_LEN);
        b.extend_from_slice(&self.node.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.share);
        b.push(u8::from(self.seal));
        b
    }

    pub fn decode(kind: FrameKind, p: &[u8]) -> Result<Self, FrameError> {
        if kind != FrameKind::Hello {
            return Err(FrameError::Unexpected(kind));
        }
        if p.len() != Self::LEN {
            return Err(FrameError::BadLength { kind, len: p.len() });
        }
        Self::parse(kind, p)
    }

    fn parse(kind: FrameKind, p: &[u8]) -> Result<Self, FrameError> {
        let share_at = 8 + NONCE_LEN;
        let seal = match p[share_at + SHARE_LEN] {
            0 => false,
            1 => true,
            other => {
                return Err(FrameError::BadField {
                    kind,
                    field: "seal flag",
                    value: other.into(),
                    allowed: "0 or 1",
                });
            }
        };
        Ok(Self {
            node: u32::from_le_bytes([p[0], p[1], p[2], p[3]]),
            window: u32::from_le_bytes([p[4], p[5], p[6], p[7]]),
            nonce: p[8..share_at].try_into().expect("length checked"),
            share: p[share_at..share_at + SHARE_LEN]
                .try_into()
                .expect("length checked"),
            seal,
        })
    }
}

/// The acceptor's reply: its own hello plus its proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    pub hello: Hello,
    pub proof: Proof,
}

impl Challenge {
    pub const LEN: usize = Hello::LEN + PROOF_LEN;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.hello.encode();
        b.extend_from_slice(&self.proof);
        b
    }

    pub fn decode(kind: FrameKind, p: &[u8]) -> Result<Self, FrameError> {
        if kind != FrameKind::Challenge {
            return Err(FrameError::Unexpected(kind));
        }
        if p.len() != Self::LEN {
            return Err(FrameError::BadLength { kind, len: p.len() });
        }
        Ok(Self {
            hello: Hello::parse(kind, &p[..Hello::LEN])?,
            proof: p[Hello::LEN..].try_into().expect("length checked"),
        })
    }
}

/// Parses the dialer's `Proof` frame.
pub fn decode_proof(kind: FrameKind, p: &[u8]) -> Result<Proof, FrameError> {
    if kind != FrameKind::Proof {
        return Err(FrameError::Unexpected(kind));
    }
    p.try_into()
        .map_err(|_| FrameError::BadLength { kind, len: p.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(node: NodeId) -> Hello {
        Hello {
            node,
            window: 8,
            nonce: nonce(),
            share: [node as u8; SHARE_LEN],
            seal: false,
        }
    }

    fn transcript() -> Transcript {
        Transcript {
            dialer: hello(1),
            acceptor: hello(2),
        }
    }

    #[test]
    fn proofs_need_the_secret_and_are_role_bound() {
        let t = transcript();
        let p = t.prove(b"s3cret", Role::Dialer);
        assert!(t.verify(b"s3cret", Role::Dialer, &p));
        assert!(!t.verify(b"other", Role::Dialer, &p));
        // A dialer's proof cannot be passed off as the acceptor's.
        assert!(!t.verify(b"s3cret", Role::Acceptor, &p));
        // Fresh nonces give a different proof: no replay.
        let t2 = transcript();
        assert!(!t2.verify(b"s3cret", Role::Dialer, &p));
        // The proof does not contain the secret.
        assert!(!p.windows(6).any(|w| w == b"s3cret"));
        // Every field of either hello is covered: a share swapped or sealing turned
        // off in the middle fails the proof.
        let mut swapped = t;
        swapped.acceptor.share[0] ^= 1;
        assert!(!swapped.verify(b"s3cret", Role::Dialer, &p));
        let mut unsealed = t;
        unsealed.dialer.seal = true;
        assert!(!unsealed.verify(b"s3cret", Role::Dialer, &p));
        let mut window = t;
        window.dialer.window += 1;
        assert!(!window.verify(b"s3cret", Role::Dialer, &p));
    }

    #[test]
    fn handshake_messages_round_trip_and_check_lengths() {
        let h = Hello {
            seal: true,
            ..hello(3)
        };
        assert_eq!(Hello::decode(FrameKind::Hello, &h.encode()).unwrap(), h);
        let mut odd = h.encode();
        *odd.last_mut().unwrap() = 2;
        let err = Hello::decode(FrameKind::Hello, &odd).unwrap_err();
        assert!(
            matches!(err, FrameError::BadField { value: 2, .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "Hello frame with seal flag 2 (allowed: 0 or 1)"
        );
        assert!(Hello::decode(FrameKind::Hello, &h.encode()[1..]).is_err());
        assert!(Hello::decode(FrameKind::Data, &h.encode()).is_err());
        let c = Challenge {
            hello: h,
            proof: [9; PROOF_LEN],
        };
        assert_eq!(
            Challenge::decode(FrameKind::Challenge, &c.encode()).unwrap(),
            c
        );
        assert!(decode_proof(FrameKind::Proof, &[0; 31]).is_err());
        assert_eq!(decode_proof(FrameKind::Proof, &[1; 32]).unwrap(), [1; 32]);
    }
}
