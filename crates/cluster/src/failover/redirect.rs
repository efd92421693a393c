//! What a standby coordinator's client port answers: every call (a client's SQL, a
//! worker's registration) fails as `unavailable`, naming the primary, so that a client
//! given several coordinators (`gyre sql --connect a,b,c`, a worker's list) goes on
//! to the next and an ADBC client's error says where to reconnect.

use crate::auth::TlsIdentity;
use std::convert::Infallible;
use std::future::Ready;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// Says who the primary is, when asked.
pub type PrimaryName = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A Flight service whose every call is refused with the primary's address.
#[derive(Clone)]
struct Redirect {
    primary: PrimaryName,
}

/// The refusal a standby gives.
pub fn not_primary(primary: Option<String>) -> tonic::Status {
    match primary {
        Some(addr) => tonic::Status::unavailable(format!(
            "this coordinator is not the primary: the primary is at {addr}"
        )),
        None => tonic::Status::unavailable(
            "this coordinator is not the primary, and no primary is elected yet: try again",
        ),
    }
}

impl<B> Service<http::Request<B>> for Redirect {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<B>) -> Self::Future {
        std::future::ready(Ok(not_primary((self.primary)()).into_http()))
    }
}

impl NamedService for Redirect {
    const NAME: &'static str = "arrow.flight.protocol.FlightService";
}

/// A running redirect server.
pub struct Serving {
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// Stops it and waits until its listener is closed (connections get HTTP/2's
    /// GOAWAY; their calls are all answered at once).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let mut done = self.done;
        if tokio::time::timeout(std::time::Duration::from_secs(2), &mut done)
            .await
            .is_err()
        {
            done.abort();
        }
    }
}

/// Serves the refusal on `addr` until stopped.
pub async fn serve(
    addr: SocketAddr,
    tls: Option<&TlsIdentity>,
    primary: PrimaryName,
) -> std::io::Result<Serving> {
    let listener = super::bind(addr).await?;
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server
            .tls_config(tls.server_config())
            .map_err(std::io::Error::other)?;
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let done = tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        if let Err(e) = server
            .add_service(Redirect { primary })
            .serve_with_incoming_shutdown(incoming, stopped)
            .await
        {
            tracing::warn!("the standby's client port stopped: {e}");
        }
    });
    Ok(Serving { stop, done })
}
