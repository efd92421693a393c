//! Shared by the end-to-end tests that start `gyre` processes and query them over
//! Flight SQL.
#![allow(dead_code)] // each test file uses what it needs

use arrow::array::RecordBatch;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use std::process::{Child, Command, Stdio};
use tonic::transport::Channel;

/// A started process, killed and reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `gyre` binary under test.
pub fn gyre_binary() -> &'static str {
    env!("CARGO_BIN_EXE_gyre")
}

/// `command ARGS` with the cluster secret `secret`, no input and its output dropped.
pub fn spawn(mut command: Command, secret: &str, args: &[&str]) -> Proc {
    Proc(
        command
            .args(args)
            .env("GYRE_SECRET", secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start gyre"),
    )
}

/// `gyre ARGS` with the cluster secret `secret`.
pub fn gyre(secret: &str, args: &[&str]) -> Proc {
    spawn(Command::new(gyre_binary()), secret, args)
}

/// A port the kernel had free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every batch of the result of `sql`, or the error as text.
pub async fn batches(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<RecordBatch>, String> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = vec![];
    for ep in info.endpoint {
        let stream = client
            .do_get(ep.ticket.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        out.extend(
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}
