//! Exchange operators: the points where a distributed plan crosses the network.
//!
//! A distributed plan is cut into stages. The root of every stage but the last
//! is an [`ExchangeSenderExec`]; the leaves that read another stage's output are
//! [`ExchangeReceiverExec`]s. Both are ordinary DataFusion `ExecutionPlan`s, so
//! everything between them is DataFusion's own operators. They move Arrow record
//! batches as IPC messages through a [`gyre_transport::Transport`] found in the
//! task's [`QueryContext`], streaming each batch as soon as it is produced.

pub mod codec;
pub mod context;
pub mod receiver;
pub mod sender;

pub use codec::{BatchDecoder, BatchEncoder};
pub use context::{ExchangeId, Placement, QueryContext};
pub use receiver::{ExchangeReceiverExec, ReceiveMode};
pub use sender::{ExchangeSenderExec, SendMode};
