//! The multiplexer's byte stream after a handshake: what an authenticated peer (or
//! someone who stole the cluster secret) can send on a data connection, read by the
//! multiplexer's own reader into a fresh node's stream table and scheduler.

use crate::frames::{key, with_checksums};
use gyre_transport::frame::{Control, FrameHeader, FrameKind, HEADER_LEN, encode_frame};

/// The post-handshake frames of [`crate::frames::seeds`], and streams a peer sends in
/// a query: messages then an end-of-stream marker, a stream error, the phased
/// schedule's turn messages.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = crate::frames::seeds()
        .into_iter()
        .filter(|f| {
            let h = FrameHeader::decode(&f[..HEADER_LEN].try_into().expect("a header"))
                .expect("a valid seed");
            !matches!(
                h.kind,
                FrameKind::Hello | FrameKind::Challenge | FrameKind::Proof | FrameKind::Welcome
            )
        })
        .collect();
    let data = |body: &[u8], last: bool| {
        let mut payload = key().to_bytes().to_vec();
        payload.extend_from_slice(body);
        encode_frame(FrameKind::Data, u8::from(last), &payload)
    };
    let control = |c: Control| {
        let (kind, flags, payload) = c.encode();
        encode_frame(kind, flags, &payload)
    };
    seeds.push(
        [
            data(&[1; 40], false),
            data(&[2; 700], false),
            data(&[], true),
        ]
        .concat(),
    );
    seeds.push(
        [
            data(&[7; 2000], false),
            control(Control::Error(key(), "x".into())),
        ]
        .concat(),
    );
    seeds.push(
        [
            control(Control::Ready),
            control(Control::Grant { phase: 1 }),
            data(&[3; 10], false),
            control(Control::EndTurn { more: false }),
        ]
        .concat(),
    );
    seeds
}

/// The input with its checksums made right, read by a fresh node's multiplexer.
pub fn run(input: &[u8]) {
    gyre_transport::fuzzing::multiplexer_stream(&with_checksums(input));
}
