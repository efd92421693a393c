//! Running SQL: in this process (embedded cluster) or on a remote coordinator
//! through Arrow Flight SQL.

use crate::progress_line::with_progress;
use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow_flight::Action;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::TryStreamExt;
use futures::future::BoxFuture;
use gyre_cluster::Coordinator;
use gyre_cluster::coordinator::StatementResult;
use gyre_cluster::flight_sql::{ERROR_PLACE_HEADER, PROGRESS_ACTION, PROGRESS_HEADER};
use gyre_cluster::progress::{ProgressReport, StatementProgress};
use std::sync::Arc;
use tokio::sync::Mutex;
use tonic::transport::Channel;

pub type BoxError = Box<dyn std::error::Error>;

/// Something that runs one SQL statement.
pub trait SqlRunner {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>>;
}

/// Splits a script into statements (psql-style: each is run and printed in turn), each
/// as the text it was written as (not every statement prints back as valid SQL). Only
/// tokenized here: the server parses each in the session's dialect
/// (`datafusion.sql_parser.dialect`) and reports what it cannot parse.
pub fn split_statements(script: &str) -> Result<Vec<String>, BoxError> {
    let tokens = Tokenizer::new(&GenericDialect {}, script).tokenize_with_location()?;
    // Byte offset of each line's start (the tokenizer counts lines and columns from 1).
    let mut line_starts = vec![0];
    line_starts.extend(script.match_indices('\n').map(|(i, _)| i + 1));
    let offset = |line: u64, column: u64| -> usize {
        let start = line_starts
            .get((line.max(1) - 1) as usize)
            .copied()
            .unwrap_or(script.len());
        script[start..]
            .char_indices()
            .nth((column.max(1) - 1) as usize)
            .map_or(script.len(), |(i, _)| start + i)
    };
    let mut statements = vec![];
    let mut from = 0;
    for t in &tokens {
        if t.token == Token::SemiColon {
            let end = offset(t.span.start.line, t.span.start.column);
            statements.push(&script[from..end]);
            from = end + 1;
        }
    }
    statements.push(&script[from.min(script.len())..]);
    let mut out = vec![];
    for text in statements {
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        out.push(text.to_string());
    }
    Ok(out)
}

/// Runs SQL on the coordinator of an embedded cluster.
pub struct LocalRunner(pub Arc<Coordinator>);

impl SqlRunner for LocalRunner {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>> {
        Box::pin(async move {
            let progress = Arc::new(StatementProgress::default());
            let (coordinator, tracked) = (Arc::clone(&self.0), Arc::clone(&progress));
            let poll = move || {
                let (c, p) = (Arc::clone(&coordinator), Arc::clone(&tracked));
                Box::pin(async move {
                    c.poll_progress(&p).await;
                    Some(p.report())
                }) as BoxFuture<'static, Option<ProgressReport>>
            };
            let session = self.0.default_session();
            with_progress(self.0.sql_with_progress(session, sql, progress), poll)
                .await
                .map_err(|e| {
                    let text = gyre_exchange::error_text(&e);
                    match gyre_exchange::error_place(&e) {
                        Some(p) => format!("{text} (at {p})").into(),
                        None => text.into(),
                    }
                })
        })
    }
}

/// A Flight SQL connection to a coordinator.
pub struct RemoteClient {
    client: Mutex<FlightSqlServiceClient<Channel>>,
}

/// How a client proves who it is, and whom it trusts.
#[derive(Default)]
pub struct Login {
    /// Log in as this user with `password` (Flight SQL Handshake, HTTP Basic).
    pub user: Option<String>,
    pub password: Option<String>,
    /// Speak TLS, trusting only this CA certificate (PEM).
    pub tls_ca: Option<Vec<u8>>,
}

impl RemoteClient {
    /// Connects to `addr` (host:port, grpc://host:port) without logging in.
    pub async fn connect(addr: &str) -> Result<Self, BoxError> {
        Self::connect_with(addr, &Login::default()).await
    }

    /// Connects to `addr` (host:port, grpc:// or grpc+tls://) and logs in as `login` says.
    pub async fn connect_with(addr: &str, login: &Login) -> Result<Self, BoxError> {
        let (tls, rest) = match addr.split_once("://") {
            Some(("grpc+tls" | "https", rest)) => (true, rest),
            Some(("grpc" | "grpc+tcp" | "http", rest)) => (false, rest),
            Some((scheme, _)) => return Err(format!("unknown scheme {scheme}:// in {addr}").into()),
            None => (false, addr),
        };
        let mut endpoint = if tls || login.tls_ca.is_some() {
            let ca = login.tls_ca.as_deref().ok_or_else(|| {
                format!("{addr} speaks TLS: give the CA certificate with --tls-ca")
            })?;
            Channel::from_shared(format!("https://{rest}"))?
                .tls_config(gyre_cluster::auth::tls::trusting(ca))?
        } else {
            Channel::from_shared(format!("http://{rest}"))?
        };
        endpoint = endpoint.connect_timeout(std::time::Duration::from_secs(10));
        let channel = endpoint.connect().await.map_err(|e| {
            format!(
                "cannot connect to the coordinator at {addr}: {}",
                source_chain(&e)
            )
        })?;
        let mut client = FlightSqlServiceClient::new(channel);
        if let Some(user) = &login.user {
            let password = login.password.as_deref().unwrap_or_default();
            client
                .handshake(user, password)
                .await
                .map_err(|e| format!("cannot log in to {addr} as {user}: {e}"))?;
        }
        Ok(Self {
            client: Mutex::new(client),
        })
    }
}

/// An error with its causes, for errors whose own text says little ("transport error").
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

impl SqlRunner for RemoteClient {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tag = format!("{:032x}", rand::random::<u128>());
            client.set_header(PROGRESS_HEADER, tag.clone());
            let control = client.inner().clone();
            let token = client.token().cloned();
            let poll = move || {
                let (mut control, tag, token) = (control.clone(), tag.clone(), token.clone());
                Box::pin(async move {
                    let mut action = tonic::Request::new(Action {
                        r#type: PROGRESS_ACTION.to_string(),
                        body: tag.into_bytes().into(),
                    });
                    if let Some(token) = token {
                        let value = format!("Bearer {token}").parse().ok()?;
                        action.metadata_mut().insert("authorization", value);
                    }
                    let mut replies = control.do_action(action).await.ok()?.into_inner();
                    let reply = replies.message().await.ok()??;
                    serde_json::from_slice::<ProgressReport>(&reply.body).ok()
                }) as BoxFuture<'static, Option<ProgressReport>>
            };
            with_progress(Self::run_statement(&mut client, sql), poll).await
        })
    }
}

impl RemoteClient {
    /// Asks the coordinator for its SQL info: a standby of voting coordinators refuses,
    /// naming the primary.
    pub async fn probe(&self) -> Result<(), BoxError> {
        let mut client = self.client.lock().await;
        client
            .get_sql_info(vec![])
            .await
            .map(|_| ())
            .map_err(flight_error)
    }

    /// Runs one statement and returns its rows, without a progress line.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, BoxError> {
        let mut client = self.client.lock().await;
        let mut results = Self::run_statement(&mut client, sql).await?;
        Ok(results.pop().map(|r| r.batches).unwrap_or_default())
    }

    async fn run_statement(
        client: &mut FlightSqlServiceClient<Channel>,
        sql: &str,
    ) -> Result<Vec<StatementResult>, BoxError> {
        {
            let info = client
                .execute(sql.to_string(), None)
                .await
                .map_err(flight_error)?;
            let schema = Arc::new(info.clone().try_decode_schema().unwrap_or(Schema::empty()));
            let mut batches: Vec<RecordBatch> = vec![];
            for endpoint in info.endpoint {
                if let Some(ticket) = endpoint.ticket {
                    let stream = client.do_get(ticket).await.map_err(flight_error)?;
                    batches.extend(stream.try_collect::<Vec<_>>().await.map_err(flight_error)?);
                }
            }
            Ok(vec![StatementResult { schema, batches }])
        }
    }
}

/// A Flight error as a person reads it: the server's own message, and where in the
/// cluster it happened when the server says.
fn flight_error(e: FlightError) -> BoxError {
    match e {
        FlightError::Tonic(status) => {
            let place = status
                .metadata()
                .get(ERROR_PLACE_HEADER)
                .and_then(|v| v.to_str().ok());
            if status.code() == tonic::Code::Unauthenticated {
                return format!(
                    "{} (log in with --user NAME; the password comes from GYRE_PASSWORD or a prompt)",
                    status.message()
                )
                .into();
            }
            match place {
                Some(p) => format!("{} (at {p})", status.message()).into(),
                None => status.message().to_string().into(),
            }
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::split_statements;

    #[test]
    fn statements_are_split_at_semicolons_outside_strings_and_kept_verbatim() {
        let script = "COPY (SELECT 'a;b') TO '/tmp/x/' STORED AS PARQUET;\n\
                      select 1 ;  ;\n-- a comment; still a comment\nSELECT 'é;' as \"c;\"";
        let got = split_statements(script).unwrap();
        assert_eq!(
            got,
            vec![
                "COPY (SELECT 'a;b') TO '/tmp/x/' STORED AS PARQUET",
                "select 1",
                "-- a comment; still a comment\nSELECT 'é;' as \"c;\"",
            ]
        );
        // Parsing is the server's: it knows the session's dialect.
        assert_eq!(split_statements("SELEC 1").unwrap(), vec!["SELEC 1"]);
        assert!(split_statements("SELECT 'open").is_err());
    }
}
