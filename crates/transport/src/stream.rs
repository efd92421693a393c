//! Stream handles given to exchange operators.
//!
//! A stream is one-directional and credit-controlled: the sender starts with
//! [`INITIAL_CREDITS`] messages it may send and gets one more each time the
//! receiver's consumer takes a message. The receiving node therefore never
//! buffers more than `INITIAL_CREDITS` messages per stream, whatever the
//! speed of the consumer, and a slow consumer slows the producer down.

use crate::frame::{StreamFrame, StreamKey};
use crate::{NodeId, TransportError};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// Messages a sender may have in flight on one stream before the receiver grants more.
pub const INITIAL_CREDITS: u32 = 8;

/// Sends frames to a peer; implemented by each transport backend.
pub(crate) trait FrameSink: Send + Sync {
    fn send_frame(
        &self,
        dest: NodeId,
        frame: StreamFrame,
    ) -> BoxFuture<'_, Result<(), TransportError>>;
}

/// What the receiving side of a stream gets.
#[derive(Debug)]
pub(crate) enum Inbound {
    Data(Bytes),
    End,
    Failed(TransportError),
}

/// The producing side of one stream.
pub struct StreamSender {
    key: StreamKey,
    dest: NodeId,
    credits: Arc<Semaphore>,
    sink: Arc<dyn FrameSink>,
    finished: bool,
}

impl std::fmt::Debug for StreamSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSender")
            .field("key", &self.key)
            .field("dest", &self.dest)
            .finish()
    }
}

impl StreamSender {
    pub(crate) fn new(
        key: StreamKey,
        dest: NodeId,
        credits: Arc<Semaphore>,
        sink: Arc<dyn FrameSink>,
    ) -> Self {
        Self {
            key,
            dest,
            credits,
            sink,
            finished: false,
        }
    }

    pub fn key(&self) -> StreamKey {
        self.key
    }

    pub fn dest(&self) -> NodeId {
        self.dest
    }

    /// Sends one message, waiting for a credit first (this is the backpressure point).
    pub async fn send(&mut self, body: Bytes) -> Result<(), TransportError> {
        let permit = self
            .credits
            .acquire()
            .await
            .map_err(|_| TransportError::PeerLost {
                peer: self.dest,
                reason: format!("stream {} closed while waiting for credit", self.key),
            })?;
        permit.forget();
        self.sink
            .send_frame(self.dest, StreamFrame::Data(self.key, body))
            .await
    }

    /// Marks the stream complete.
    pub async fn finish(mut self) -> Result<(), TransportError> {
        self.finished = true;
        self.sink
            .send_frame(self.dest, StreamFrame::End(self.key))
            .await
    }

    /// Tells the receiver that the producer failed.
    pub async fn fail(mut self, message: String) -> Result<(), TransportError> {
        self.finished = true;
        self.sink
            .send_frame(self.dest, StreamFrame::Error(self.key, message))
            .await
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped without finishing (the producing task was cancelled or panicked):
            // tell the receiver, so it never waits for an end that cannot come.
            let sink = Arc::clone(&self.sink);
            let (dest, key) = (self.dest, self.key);
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = sink
                        .send_frame(
                            dest,
                            StreamFrame::Error(key, "sender was cancelled".to_string()),
                        )
                        .await;
                });
            }
        }
    }
}

/// The consuming side of one stream.
pub struct StreamReceiver {
    key: StreamKey,
    src: NodeId,
    rx: mpsc::UnboundedReceiver<Inbound>,
    sink: Arc<dyn FrameSink>,
    done: bool,
}

impl std::fmt::Debug for StreamReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReceiver")
            .field("key", &self.key)
            .field("src", &self.src)
            .finish()
    }
}

impl StreamReceiver {
    pub(crate) fn new(
        key: StreamKey,
        src: NodeId,
        rx: mpsc::UnboundedReceiver<Inbound>,
        sink: Arc<dyn FrameSink>,
    ) -> Self {
        Self {
            key,
            src,
            rx,
            sink,
            done: false,
        }
    }

    pub fn key(&self) -> StreamKey {
        self.key
    }

    pub fn src(&self) -> NodeId {
        self.src
    }

    /// The next message, `None` once the sender finished, or the error that ended the stream.
    pub async fn next(&mut self) -> Result<Option<Bytes>, TransportError> {
        if self.done {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(Inbound::Data(body)) => {
                // Return the credit: the consumer has taken the message off the buffer.
                self.sink
                    .send_frame(self.src, StreamFrame::Credit(self.key, 1))
                    .await?;
                Ok(Some(body))
            }
            Some(Inbound::End) => {
                self.done = true;
                Ok(None)
            }
            Some(Inbound::Failed(e)) => {
                self.done = true;
                Err(e)
            }
            None => {
                self.done = true;
                Err(TransportError::Cancelled(self.key))
            }
        }
    }
}
