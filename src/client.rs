//! Running SQL: in this process (embedded cluster) or on a remote coordinator
//! through Arrow Flight SQL.

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::sql::parser::DFParser;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use gyre_cluster::Coordinator;
use gyre_cluster::coordinator::StatementResult;
use std::sync::Arc;
use tokio::sync::Mutex;
use tonic::transport::Channel;

pub type BoxError = Box<dyn std::error::Error>;

/// Something that runs one SQL statement.
pub trait SqlRunner {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>>;
}

/// Splits a script into statements (psql-style: each is run and printed in turn).
pub fn split_statements(script: &str) -> Result<Vec<String>, BoxError> {
    Ok(
        DFParser::parse_sql_with_dialect(script, &GenericDialect {})?
            .into_iter()
            .map(|s| s.to_string())
            .collect(),
    )
}

/// Runs SQL on the coordinator of an embedded cluster.
pub struct LocalRunner(pub Arc<Coordinator>);

impl SqlRunner for LocalRunner {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>> {
        Box::pin(async move { Ok(self.0.sql(sql).await?) })
    }
}

/// A Flight SQL connection to a coordinator.
pub struct RemoteClient {
    client: Mutex<FlightSqlServiceClient<Channel>>,
}

impl RemoteClient {
    pub async fn connect(addr: &str) -> Result<Self, BoxError> {
        let url = if addr.contains("://") {
            addr.replace("grpc://", "http://")
        } else {
            format!("http://{addr}")
        };
        let channel = Channel::from_shared(url)?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to the coordinator at {addr}: {e}"))?;
        Ok(Self {
            client: Mutex::new(FlightSqlServiceClient::new(channel)),
        })
    }
}

impl SqlRunner for RemoteClient {
    fn run<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, Result<Vec<StatementResult>, BoxError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let info = client.execute(sql.to_string(), None).await?;
            let schema = Arc::new(info.clone().try_decode_schema().unwrap_or(Schema::empty()));
            let mut batches: Vec<RecordBatch> = vec![];
            for endpoint in info.endpoint {
                if let Some(ticket) = endpoint.ticket {
                    let stream = client.do_get(ticket).await?;
                    batches.extend(stream.try_collect::<Vec<_>>().await?);
                }
            }
            Ok(vec![StatementResult { schema, batches }])
        })
    }
}
