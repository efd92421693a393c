//! Transport frames and the handshake: every frame kind's decoder behind the header,
//! as a node reads them before and after a connection's handshake.

use bytes::Bytes;
use gyre_transport::StreamKey;
use gyre_transport::auth::{self, Challenge, Hello, decode_proof};
use gyre_transport::frame::{Control, FrameHeader, FrameKind, HEADER_LEN, encode_frame};
use gyre_transport::fuzzing::{NODE, PEER};

/// A stream from the fuzzed connection's peer to the node that reads it.
pub fn key() -> StreamKey {
    StreamKey {
        query: 7,
        exchange: 2,
        from: PEER,
        to: NODE,
    }
}

/// Valid frames of every kind, and a stream of them all.
pub fn seeds() -> Vec<Vec<u8>> {
    let controls = [
        Control::Error(key(), "the stage failed".into()),
        Control::Credit(key(), 4),
        Control::Ready,
        Control::Grant { phase: 3 },
        Control::EndTurn { more: true },
    ];
    let mut frames: Vec<Vec<u8>> = controls
        .iter()
        .map(|c| {
            let (kind, flags, payload) = c.encode();
            encode_frame(kind, flags, &payload)
        })
        .collect();
    let hello = Hello {
        node: PEER,
        window: 8,
        nonce: [3; auth::NONCE_LEN],
        share: [4; auth::SHARE_LEN],
        seal: false,
    };
    frames.push(encode_frame(FrameKind::Hello, 0, &hello.encode()));
    let challenge = Challenge {
        hello,
        proof: [9; auth::PROOF_LEN],
    };
    frames.push(encode_frame(FrameKind::Challenge, 0, &challenge.encode()));
    frames.push(encode_frame(FrameKind::Proof, 0, &[5; auth::PROOF_LEN]));
    frames.push(encode_frame(FrameKind::Welcome, 0, &[]));
    for body in [&b""[..], b"x", &[0xab; 300]] {
        let mut payload = key().to_bytes().to_vec();
        payload.extend_from_slice(body);
        frames.push(encode_frame(FrameKind::Data, 0, &payload));
        frames.push(encode_frame(FrameKind::Data, 1, &payload));
    }
    let stream: Vec<u8> = frames.concat();
    frames.push(stream);
    frames
}

/// What a node does with bytes from a peer, frame by frame: the header, the payload's
/// checksum, then the kind's decoder.
pub fn run(input: &[u8]) {
    let mut rest = input;
    while rest.len() >= HEADER_LEN {
        let header: [u8; HEADER_LEN] = rest[..HEADER_LEN].try_into().expect("a header");
        let Ok(h) = FrameHeader::decode(&header) else {
            return;
        };
        let payload = &rest[HEADER_LEN..HEADER_LEN + h.len.min(rest.len() - HEADER_LEN)];
        let _ = h.verify_crc(crc32fast::hash(payload));
        let _ = match h.kind {
            FrameKind::Data => {
                if payload.len() >= StreamKey::LEN {
                    let k: [u8; StreamKey::LEN] =
                        payload[..StreamKey::LEN].try_into().expect("a stream key");
                    let _ = StreamKey::from_bytes(&k);
                }
                Ok(())
            }
            FrameKind::Hello => Hello::decode(h.kind, payload).map(|_| ()),
            FrameKind::Challenge => Challenge::decode(h.kind, payload).map(|_| ()),
            FrameKind::Proof => decode_proof(h.kind, payload).map(|_| ()),
            FrameKind::Welcome => Ok(()),
            kind => Control::decode(kind, h.flags, Bytes::copy_from_slice(payload)).map(|_| ()),
        };
        rest = &rest[HEADER_LEN + payload.len()..];
    }
}

/// Frames with their checksums made right again after a mutation (as an attacker
/// would send them), so that mutations reach the code behind the checksum.
pub fn with_checksums(input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    let mut at = 0;
    while out.len() >= at + HEADER_LEN {
        let header: [u8; HEADER_LEN] = out[at..at + HEADER_LEN].try_into().expect("a header");
        let Ok(h) = FrameHeader::decode(&header) else {
            break;
        };
        let end = (at + HEADER_LEN + h.len).min(out.len());
        let crc = crc32fast::hash(&out[at + HEADER_LEN..end]);
        out[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    out
}
