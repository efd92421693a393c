//! The door of a node's Flight service: every call passes [`Gate`] first.
//!
//! - A client logs in with Flight's `Handshake` and HTTP Basic credentials
//!   (`authorization: Basic base64(name:password)`, what ADBC's `username`/`password`
//!   options and the Flight SQL JDBC driver's `user`/`password` send) and gets a bearer
//!   token in the reply's `authorization` header; its later calls carry
//!   `authorization: Bearer <token>`.
//! - Control actions ([`crate::protocol::ACTION`]) must be signed with the cluster secret
//!   ([`super::node`]), whoever sends them: a logged-in client cannot register a worker
//!   or cancel a query.
//!
//! Refused calls get `Unauthenticated`, are logged with the caller's address, and reach
//! nothing behind the gate. [`Admission`] checks a call's headers before its body is
//! read (a live token, a well-formed login, a control signature whose MAC and time
//! pass), so that a stranger's request costs no more than its headers; the gate
//! itself then checks the whole call.

use super::node::{NODE_HEADER, NodeKey, NodeVerifier};
use super::tokens::Tokens;
use super::users::Users;
use crate::protocol::{ACTION, Standings};
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest,
    HandshakeResponse, PollInfo, SchemaResult, Ticket,
};
use base64::Engine;
use futures::stream::BoxStream;
use std::sync::Arc;
use tonic::codegen::http::HeaderMap;
use tonic::{Request, Response, Status, Streaming};

/// Who may call besides signed control messages.
#[derive(Clone)]
pub enum Clients {
    /// Anyone (a loopback listener, or `--insecure-no-auth`).
    Open,
    /// Users who log in with a name and password.
    Users(Arc<Users>),
    /// Nobody: a worker's port serves cluster nodes only.
    NodesOnly,
}

/// How long a login waits for the password checks before it is turned away.
const LOGIN_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the gate and its admission share: who may call, and how they prove it.
struct Door {
    clients: Clients,
    nodes: NodeVerifier,
    tokens: Tokens,
}

/// A Flight service behind authentication.
pub struct Gate<S> {
    inner: S,
    door: Arc<Door>,
    /// Password checks are slow on purpose (Argon2); one runs at a time, so that a
    /// flood of logins takes one core, not all. The permit goes with the check onto
    /// its blocking thread: a client that drops its login does not free it early.
    logins: Arc<tokio::sync::Semaphore>,
}

impl<S> Gate<S> {
    /// A gate of node `me` (the coordinator is node 0): control messages must be
    /// signed for it.
    pub fn new(inner: S, clients: Clients, key: NodeKey, me: gyre_transport::NodeId) -> Self {
        Self {
            inner,
            door: Arc::new(Door {
                clients,
                nodes: NodeVerifier::new(key, me),
                tokens: Tokens::default(),
            }),
            logins: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// `Unauthenticated`, logged with the caller.
    fn refuse<T>(&self, request: &Request<T>, call: &str, reason: &str) -> Status {
        refusal(request.remote_addr(), call, reason)
    }

    /// Lets a client's call through, or says why not.
    fn client<T>(&self, request: &Request<T>, call: &str) -> Result<(), Status> {
        self.door
            .client(request.metadata().as_ref())
            .map_err(|reason| self.refuse(request, call, reason))
    }

    /// Checks a login's credentials and issues its token.
    async fn login<T>(&self, request: &Request<T>) -> Result<Option<String>, Status> {
        let users = match &self.door.clients {
            Clients::Open => return Ok(None),
            Clients::NodesOnly => {
                return Err(self.refuse(
                    request,
                    "Handshake",
                    "this port serves cluster nodes only",
                ));
            }
            Clients::Users(users) => Arc::clone(users),
        };
        let (name, password) = basic_credentials(request.metadata().as_ref())
            .map_err(|reason| self.refuse(request, "Handshake", reason))?;
        let permit =
            tokio::time::timeout(LOGIN_QUEUE_WAIT, Arc::clone(&self.logins).acquire_owned())
                .await
                .map_err(|_| {
                    Status::resource_exhausted("too many logins at once: try again later")
                })?
                .map_err(|_| Status::unavailable("the server is shutting down"))?;
        let who = name.clone();
        let ok = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            users.verify(&who, &password)
        })
        .await
        .map_err(|e| Status::internal(format!("password check failed: {e}")))?;
        if !ok {
            // The name is logged, not echoed: a password typed into it stays off the wire.
            tracing::warn!("failed login as {name:?}");
            return Err(self.refuse(request, "Handshake", "wrong user name or password"));
        }
        tracing::info!("user {name} logged in");
        Ok(Some(self.door.tokens.issue(&name)))
    }
}

/// `Unauthenticated`, logged with the caller.
fn refusal(peer: Option<std::net::SocketAddr>, call: &str, reason: &str) -> Status {
    let peer = peer.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
    tracing::warn!("refused {call} from {peer}: {reason}");
    Status::unauthenticated(reason.to_string())
}

impl Door {
    /// Whether a client's call (not a control message) may pass.
    fn client(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        match &self.clients {
            Clients::Open => Ok(()),
            Clients::NodesOnly => {
                Err("this port serves cluster nodes only (clients connect to the coordinator)")
            }
            Clients::Users(_) => match bearer(headers) {
                None => Err("log in first: Flight SQL Handshake with a user name and password"),
                Some(token) if self.tokens.user_of(token).is_none() => {
                    Err("the bearer token is unknown or expired: log in again")
                }
                Some(_) => Ok(()),
            },
        }
    }

    /// Whether a call may be read, judged by its path and headers alone, and whether
    /// its connection is admitted by it (a login is read, but its credentials are
    /// only checked later).
    fn admits(&self, path: &str, headers: &HeaderMap) -> Result<Admits, String> {
        if matches!(self.clients, Clients::Open) {
            return Ok(Admits::Connection);
        }
        if let Some(signature) = headers.get(NODE_HEADER) {
            if path != DO_ACTION {
                return Err("control signatures go with DoAction only".to_string());
            }
            return self
                .nodes
                .check_header(signature.to_str().ok())
                .map(|_| Admits::Connection);
        }
        if path == HANDSHAKE && matches!(self.clients, Clients::Users(_)) {
            return basic_credentials(headers)
                .map(|_| Admits::Call)
                .map_err(str::to_string);
        }
        self.client(headers)
            .map(|_| Admits::Connection)
            .map_err(str::to_string)
    }
}

/// What a call that passes the header check admits.
enum Admits {
    /// The call only (a login, whose password is checked later).
    Call,
    /// The call and its connection (see [`crate::protocol::incoming_nodelay`]).
    Connection,
}

/// The gRPC paths of Flight's login and actions.
const HANDSHAKE: &str = "/arrow.flight.protocol.FlightService/Handshake";
const DO_ACTION: &str = "/arrow.flight.protocol.FlightService/DoAction";

/// The gate's first check, before a call's body is read: a call passes only with a
/// live bearer token, well-formed login credentials (`Handshake`), or a control
/// signature whose MAC, time and nonce pass. Everything else is answered
/// `Unauthenticated` at once, its body never buffered.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    door: Arc<Door>,
    standings: Standings,
}

/// A gate's header check, to put around the gRPC server that serves the gate.
#[derive(Clone)]
pub struct HeaderCheck(Arc<Door>);

impl HeaderCheck {
    /// `server` (serving the gate this came from) behind the header check, which
    /// marks in `standings` the connections its calls admit.
    pub fn around<S>(self, server: S, standings: Standings) -> Admission<S> {
        Admission {
            inner: server,
            door: self.0,
            standings,
        }
    }
}

impl<S> Gate<S> {
    /// The check of this gate's calls by their headers, for [`HeaderCheck::around`].
    pub fn header_check(&self) -> HeaderCheck {
        HeaderCheck(Arc::clone(&self.door))
    }
}

/// The caller's address, as the server recorded it (over TCP or TLS).
fn caller<B>(request: &tonic::codegen::http::Request<B>) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(|i| i.get_ref())
        })
        .and_then(|i| i.remote_addr())
}

impl<S> tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for Admission<S>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
        >,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::Either<
        S::Future,
        futures::future::Ready<Result<Self::Response, Self::Error>>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        match self.door.admits(request.uri().path(), request.headers()) {
            Ok(admits) => {
                if let (Admits::Connection, Some(peer)) = (admits, caller(&request)) {
                    self.standings.admit(peer);
                }
                futures::future::Either::Left(self.inner.call(request))
            }
            Err(reason) => {
                let peer = caller(&request);
                let call = request.uri().path().rsplit('/').next().unwrap_or("a call");
                let status = refusal(peer, call, &reason);
                futures::future::Either::Right(futures::future::ready(Ok(status.into_http())))
            }
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Admission<S> {
    const NAME: &'static str = S::NAME;
}

/// The token of an `authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Base64 with or without padding: Go's Flight client (under ADBC) sends none.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The name and password of an `authorization: Basic <base64(name:password)>` header.
fn basic_credentials(headers: &HeaderMap) -> Result<(String, String), &'static str> {
    const MISSING: &str = "no credentials: send a user name and password (HTTP Basic)";
    let value = headers
        .get("authorization")
        .ok_or(MISSING)?
        .to_str()
        .map_err(|_| MISSING)?;
    let (scheme, encoded) = value.split_once(' ').ok_or(MISSING)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(MISSING);
    }
    const MALFORMED: &str = "malformed HTTP Basic credentials";
    if encoded.len() > 4096 {
        return Err(MALFORMED);
    }
    let decoded = BASE64.decode(encoded.trim()).map_err(|_| MALFORMED)?;
    let text = String::from_utf8(decoded).map_err(|_| MALFORMED)?;
    let (name, password) = text.split_once(':').ok_or(MALFORMED)?;
    Ok((name.to_string(), password.to_string()))
}

#[tonic::async_trait]
impl<S: FlightService> FlightService for Gate<S> {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = S::ListFlightsStream;
    type DoGetStream = S::DoGetStream;
    type DoPutStream = S::DoPutStream;
    type DoExchangeStream = S::DoExchangeStream;
    type DoActionStream = S::DoActionStream;
    type ListActionsStream = S::ListActionsStream;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let token = self.login(&request).await?;
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().unwrap_or_default().into_bytes().into(),
        };
        let mut response =
            Response::new(Box::pin(futures::stream::iter([Ok(reply)])) as Self::HandshakeStream);
        if let Some(token) = token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| Status::internal("token is not a header value"))?;
            response.metadata_mut().insert("authorization", value);
        }
        Ok(response)
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.client(&request, "ListFlights")?;
        self.inner.list_flights(request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.client(&request, "GetFlightInfo")?;
        self.inner.get_flight_info(request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        self.client(&request, "PollFlightInfo")?;
        self.inner.poll_flight_info(request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.client(&request, "GetSchema")?;
        self.inner.get_schema(request).await
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.client(&request, "DoGet")?;
        self.inner.do_get(request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.client(&request, "DoPut")?;
        self.inner.do_put(request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.client(&request, "DoExchange")?;
        self.inner.do_exchange(request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.get_ref();
        if action.r#type == ACTION {
            let header = request
                .metadata()
                .get(NODE_HEADER)
                .and_then(|v| v.to_str().ok());
            if let Err(reason) = self.door.nodes.check(header, ACTION, &action.body) {
                return Err(self.refuse(&request, "a control message", &reason));
            }
        } else {
            self.client(&request, "DoAction")?;
        }
        self.inner.do_action(request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.client(&request, "ListActions")?;
        self.inner.list_actions(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    #[test]
    fn credentials_are_read_from_their_headers_only_when_well_formed() {
        let mut m = MetadataMap::new();
        let alice = |s: &str| Ok((s.to_string(), "pa:ss".to_string()));
        let padded = base64::engine::general_purpose::STANDARD.encode("alice:pa:ss");
        m.insert("authorization", format!("Basic {padded}").parse().unwrap());
        assert_eq!(basic_credentials(m.as_ref()), alice("alice"));
        assert_eq!(bearer(m.as_ref()), None);
        // Go's Flight client (ADBC) sends no padding.
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("alice:pa:ss");
        assert_ne!(padded, unpadded);
        m.insert(
            "authorization",
            format!("basic {unpadded}").parse().unwrap(),
        );
        assert_eq!(basic_credentials(m.as_ref()), alice("alice"));
        m.insert("authorization", "bearer abc".parse().unwrap());
        assert_eq!(bearer(m.as_ref()), Some("abc"));
        assert!(
            basic_credentials(m.as_ref())
                .unwrap_err()
                .contains("no credentials")
        );
        for bad in ["Basic !!!", "Basic", "Bearer ", "Token x", "Basic YWxpY2U="] {
            m.insert("authorization", bad.parse().unwrap());
            assert!(basic_credentials(m.as_ref()).is_err(), "{bad}");
            assert_eq!(bearer(m.as_ref()), None, "{bad}");
        }
        assert_eq!(
            basic_credentials(MetadataMap::new().as_ref()).unwrap_err(),
            "no credentials: send a user name and password (HTTP Basic)"
        );
    }
}
