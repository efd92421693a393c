//! Sealed data links: every frame after the handshake encrypted and
//! authenticated with AES-256-GCM, under keys only the two ends of the link
//! hold.
//!
//! Keys: each hello carries an ephemeral X25519 share ([`crate::auth`]). Both
//! ends compute the Diffie-Hellman secret and derive one key per direction
//! with HKDF-SHA256 over that secret and the cluster secret, salted with both
//! hellos. The proofs of the handshake cover the shares, so someone in the
//! middle cannot substitute their own; a recorded link stays unreadable even
//! to someone who learns the cluster secret later (forward secrecy).
//!
//! Frames keep their clear 16-byte header (its checksum field is zero: the
//! tags replace it) and seal what follows:
//!
//! ```text
//! control frame:  header | E(payload) tag
//! data frame:     header | E(stream key) tag | E(body) tag
//! ```
//!
//! The header's length counts the tags. The header is the associated data of
//! the frame's first seal, so kind, flags and length are authenticated too.
//! The nonce is a counter per direction that both ends keep and that never
//! goes on the wire: a frame dropped, replayed, reordered or injected fails to
//! open, and the link is cut. The stream key is sealed apart from the body so
//! that the reader checks the sender's right to the stream before it reads
//! the body, as on an unsealed link.
//!
//! What stays visible to an observer: frame kinds, flags and sizes, and the
//! timing of the traffic.

use crate::auth::{Role, SHARE_LEN, Share, Transcript};
use crate::frame::FrameError;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::hkdf;
use ring::rand::SystemRandom;

/// Bytes of one authentication tag.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a data frame's payload: the stream key's tag and the body's.
pub const DATA_OVERHEAD: usize = 2 * TAG_LEN;
/// A seal buffer larger than this is given back once a smaller message follows.
const SCRATCH_KEEP: usize = 1 << 20;

/// This end's ephemeral X25519 key for one handshake.
pub struct KeyShare {
    private: EphemeralPrivateKey,
    public: Share,
}

impl KeyShare {
    pub fn new() -> Result<Self, String> {
        let private = EphemeralPrivateKey::generate(&X25519, &SystemRandom::new())
            .map_err(|_| "cannot generate an X25519 key".to_string())?;
        let public = private
            .compute_public_key()
            .map_err(|_| "cannot compute an X25519 public key".to_string())?;
        let public = public
            .as_ref()
            .try_into()
            .map_err(|_| format!("an X25519 public key is not {SHARE_LEN} bytes"))?;
        Ok(Self { private, public })
    }

    /// What goes into this end's hello.
    pub fn public(&self) -> Share {
        self.public
    }

    /// The keys of a link whose handshake `t` both ends proved, for the end `role`
    /// (which sent this share).
    pub fn link_keys(
        self,
        secret: &[u8],
        t: &Transcript,
        role: Role,
    ) -> Result<(Sealer, Opener), String> {
        let theirs = match role {
            Role::Dialer => t.acceptor.share,
            Role::Acceptor => t.dialer.share,
        };
        let mut ikm = agreement::agree_ephemeral(
            self.private,
            &UnparsedPublicKey::new(&X25519, theirs),
            |shared| shared.to_vec(),
        )
        .map_err(|_| "its key share is not a usable X25519 public key".to_string())?;
        ikm.extend_from_slice(secret);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &t.bytes()).extract(&ikm);
        ikm.fill(0);
        let key = |label: &[u8]| {
            let info = [label];
            let okm = prk
                .expand(&info, &AES_256_GCM)
                .map_err(|_| "cannot derive a link key".to_string())?;
            Ok::<_, String>(LessSafeKey::new(UnboundKey::from(okm)))
        };
        let to_acceptor = key(b"gyre/3 dialer to acceptor")?;
        let to_dialer = key(b"gyre/3 acceptor to dialer")?;
        Ok(match role {
            Role::Dialer => (Sealer::new(to_acceptor), Opener::new(to_dialer)),
            Role::Acceptor => (Sealer::new(to_dialer), Opener::new(to_acceptor)),
        })
    }
}

/// The next nonce of a direction: a 96-bit big-endian frame counter.
fn next_nonce(counter: &mut u64) -> Option<Nonce> {
    let n = *counter;
    *counter = n.checked_add(1)?;
    let mut b = [0u8; NONCE_LEN];
    b[NONCE_LEN - 8..].copy_from_slice(&n.to_be_bytes());
    Some(Nonce::assume_unique_for_key(b))
}

/// The sending half of a sealed link (owned by the link's writer).
pub struct Sealer {
    key: LessSafeKey,
    next: u64,
    scratch: Vec<u8>,
}

impl Sealer {
    fn new(key: LessSafeKey) -> Self {
        Self {
            key,
            next: 0,
            scratch: Vec::new(),
        }
    }

    /// Encrypts `data` in place, binding `aad`; returns the tag that follows it.
    pub fn seal(&mut self, aad: &[u8], data: &mut [u8]) -> std::io::Result<[u8; TAG_LEN]> {
        let nonce = next_nonce(&mut self.next)
            .ok_or_else(|| std::io::Error::other("the link's nonces are used up"))?;
        let tag: Tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), data)
            .map_err(|_| std::io::Error::other("a frame is too large to seal"))?;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// A sealed copy of `body` followed by its tag (message buffers are shared with
    /// other links and the sender, so they are not encrypted in place).
    pub fn seal_copy(&mut self, body: &[u8]) -> std::io::Result<&[u8]> {
        let mut scratch = std::mem::take(&mut self.scratch);
        if scratch.capacity() > SCRATCH_KEEP && body.len() <= SCRATCH_KEEP {
            scratch = Vec::new();
        }
        scratch.clear();
        scratch.extend_from_slice(body);
        let tag = self.seal(&[], &mut scratch)?;
        scratch.extend_from_slice(&tag);
        self.scratch = scratch;
        Ok(&self.scratch)
    }
}

/// The receiving half of a sealed link (owned by the link's reader).
pub struct Opener {
    key: LessSafeKey,
    next: u64,
}

impl Opener {
    fn new(key: LessSafeKey) -> Self {
        Self { key, next: 0 }
    }

    /// Decrypts `data` in place if it and `aad` are what the other end sealed next.
    pub fn open(
        &mut self,
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), FrameError> {
        let nonce = next_nonce(&mut self.next).ok_or(FrameError::Unauthentic)?;
        let tag = Tag::from(*tag);
        self.key
            .open_in_place_separate_tag(nonce, Aad::from(aad), tag, data, 0..)
            .map(|_| ())
            .map_err(|_| FrameError::Unauthentic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Hello, nonce};

    fn hello(node: u32, share: Share) -> Hello {
        Hello {
            node,
            window: 8,
            nonce: nonce(),
            share,
            seal: true,
        }
    }

    fn handshake(secret_d: &[u8], secret_a: &[u8]) -> ((Sealer, Opener), (Sealer, Opener)) {
        let (d, a) = (KeyShare::new().unwrap(), KeyShare::new().unwrap());
        let t = Transcript {
            dialer: hello(1, d.public()),
            acceptor: hello(2, a.public()),
        };
        (
            d.link_keys(secret_d, &t, Role::Dialer).unwrap(),
            a.link_keys(secret_a, &t, Role::Acceptor).unwrap(),
        )
    }

    fn sealed(s: &mut Sealer, aad: &[u8], text: &[u8]) -> (Vec<u8>, [u8; TAG_LEN]) {
        let mut data = text.to_vec();
        let tag = s.seal(aad, &mut data).unwrap();
        (data, tag)
    }

    #[test]
    fn both_directions_open_in_order_and_hide_the_text() {
        let ((mut ds, mut do_), (mut as_, mut ao)) = handshake(b"secret", b"secret");
        for i in 0..3u8 {
            let text = [i; 64];
            let (mut c, tag) = sealed(&mut ds, b"hdr", &text);
            assert_ne!(c, text);
            ao.open(b"hdr", &mut c, &tag).unwrap();
            assert_eq!(c, text);
            let (mut c, tag) = sealed(&mut as_, b"", b"back");
            do_.open(b"", &mut c, &tag).unwrap();
            assert_eq!(c, b"back");
        }
        // seal_copy appends the tag and leaves the source alone.
        let body = vec![7u8; 3 << 20];
        let out = ds.seal_copy(&body).unwrap().to_vec();
        assert_eq!(out.len(), body.len() + TAG_LEN);
        let (c, tag) = out.split_at(body.len());
        let mut c = c.to_vec();
        ao.open(&[], &mut c, tag.try_into().unwrap()).unwrap();
        assert_eq!(c, body);
        // A small message after a large one gives the large buffer back.
        ds.seal_copy(b"x").unwrap();
        assert!(ds.scratch.capacity() <= SCRATCH_KEEP);
    }

    #[test]
    fn altered_replayed_reordered_or_foreign_frames_do_not_open() {
        let ((mut ds, _), (_, mut ao)) = handshake(b"secret", b"secret");
        // A flipped bit in the text, the tag or the header.
        let (mut c, tag) = sealed(&mut ds, b"hdr", b"payload");
        c[3] ^= 1;
        assert_eq!(ao.open(b"hdr", &mut c, &tag), Err(FrameError::Unauthentic));
        let ((mut ds, _), (_, mut ao)) = handshake(b"secret", b"secret");
        let (mut c, tag) = sealed(&mut ds, b"hdr", b"payload");
        assert!(ao.open(b"hdX", &mut c, &tag).is_err());
        // Reordered: the second frame does not open first.
        let ((mut ds, _), (_, mut ao)) = handshake(b"secret", b"secret");
        let _first = sealed(&mut ds, b"", b"one");
        let (mut second, tag) = sealed(&mut ds, b"", b"two");
        assert!(ao.open(b"", &mut second, &tag).is_err());
        // Replayed: once the first frame opened, it does not open again.
        let ((mut ds, _), (_, mut ao)) = handshake(b"secret", b"secret");
        let (one, tag) = sealed(&mut ds, b"", b"one");
        ao.open(b"", &mut one.clone(), &tag).unwrap();
        assert!(ao.open(b"", &mut one.clone(), &tag).is_err());
        // Another cluster secret gives other keys.
        let ((mut ds, _), (_, mut ao)) = handshake(b"secret", b"other");
        let (mut c, tag) = sealed(&mut ds, b"", b"payload");
        assert!(ao.open(b"", &mut c, &tag).is_err());
        // A frame one direction sealed does not open as the other direction's.
        let ((mut ds, mut do_), _) = handshake(b"secret", b"secret");
        let (mut c, tag) = sealed(&mut ds, b"", b"payload");
        assert!(do_.open(b"", &mut c, &tag).is_err());
    }

    #[test]
    fn an_invalid_share_is_refused() {
        let d = KeyShare::new().unwrap();
        let t = Transcript {
            dialer: hello(1, d.public()),
            acceptor: hello(2, [0; SHARE_LEN]),
        };
        let e = d.link_keys(b"secret", &t, Role::Dialer).err().unwrap();
        assert!(e.contains("X25519"), "{e}");
    }
}
