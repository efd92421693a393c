//! Entry points for coverage-guided fuzzing (`crates/fuzz`): the multiplexer's read
//! path over bytes held in memory, so that a fuzzer drives exactly the code that reads
//! a connection after its handshake, thousands of times a second and with a fresh node
//! each time. Not part of the transport's interface.

use crate::hub::Hub;
use crate::mux::Mux;
use crate::{NodeId, TransportConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::Notify;

/// The node that reads, and the member whose connection it reads (the lower id dials,
/// so the reader never dials back).
pub const NODE: NodeId = 2;
pub const PEER: NodeId = 1;
/// Small buffers, so that bodies of a few hundred bytes already take pooled buffers and
/// larger ones the oversize path.
pub const MESSAGE_SIZE: usize = 1024;

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime for the fuzz target");
}

/// Feeds `input` to a fresh node as what `PEER` sent on an admitted connection, until
/// the bytes end or the peer breaks the protocol, and then loses the peer as a real
/// connection's reader does. Says whether the peer was lost for breaking the protocol.
pub fn multiplexer_stream(input: &[u8]) -> bool {
    let config = TransportConfig {
        message_size: MESSAGE_SIZE,
        send_buffers: 2,
        recv_buffers: 2,
        ..Default::default()
    };
    let hub = Arc::new(Hub::for_config(NODE, &config));
    RUNTIME.with(|rt| {
        let mux = Mux::new(
            NODE,
            hub,
            config,
            rt.handle().clone(),
            Arc::new(Notify::new()),
            None,
        );
        let addr: SocketAddr = ([127, 0, 0, 1], 9).into();
        mux.set_peers(&HashMap::from([(NODE, addr), (PEER, addr)]));
        rt.block_on(Arc::clone(&mux).read_loop(PEER, input, None));
        mux.protocol_errors.load(Ordering::Relaxed) > 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamKey;
    use crate::frame::{Control, FrameKind, encode_frame};

    fn data(to: NodeId, body: &[u8], last: bool) -> Vec<u8> {
        let key = StreamKey {
            query: 3,
            exchange: 1,
            from: PEER,
            to,
        };
        let mut payload = key.to_bytes().to_vec();
        payload.extend_from_slice(body);
        encode_frame(FrameKind::Data, u8::from(last), &payload)
    }

    /// The target reaches the stream table: a peer's messages (small, pooled and
    /// oversize) and end of stream pass, a message for another node or a credit for a
    /// stream never opened cuts the peer.
    #[test]
    fn the_fuzz_entry_reads_what_a_connection_reads() {
        let good = [
            data(NODE, b"small", false),
            data(NODE, &[1; MESSAGE_SIZE / 2], false),
            data(NODE, &[2; MESSAGE_SIZE * 3], false),
            data(NODE, &[], true),
        ]
        .concat();
        assert!(!multiplexer_stream(&good));
        assert!(!multiplexer_stream(&[]));
        assert!(multiplexer_stream(&data(3, b"x", false)));
        let key = StreamKey {
            query: 3,
            exchange: 1,
            from: NODE,
            to: PEER,
        };
        let (kind, flags, payload) = Control::Credit(key, 1).encode();
        assert!(multiplexer_stream(&encode_frame(kind, flags, &payload)));
        assert!(multiplexer_stream(&[0xff; 40]));
    }
}
