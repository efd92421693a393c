//! Exchange operators: the points where a distributed plan crosses the network.
//!
//! A distributed plan is cut into stages. The root of every stage but the last
//! is an [`ExchangeSenderExec`]; the leaves that read another stage's output are
//! [`ExchangeReceiverExec`]s. Both are ordinary DataFusion `ExecutionPlan`s, so
//! everything between them is DataFusion's own operators. They move Arrow record
//! batches as IPC messages through the endpoints of a [`gyre_transport::Transport`]
//! found in the task's [`QueryContext`]: a sender coalesces rows per destination
//! into roughly message-sized batches and encodes each straight into a pooled
//! message buffer (a broadcast encodes once for all workers); a receiver decodes
//! each source's IPC stream and releases every buffer as soon as it is decoded.
//!
//! [`CycloJoinExec`] is the third operator that crosses the network: a join whose
//! rotating input travels the workers' ring (the Data Roundabout of `gyre_join::cyclo`);
//! [`FlowJoinExec`] is a partitioned hash join that routes its own probe shuffle, keeping
//! heavy-hitter rows local and broadcasting their build rows (Flow-Join, `gyre_join::flow`).

pub mod codec;
pub mod context;
pub mod cyclo;
pub mod flow;
mod join_filter;
pub mod key_hash;
mod memory;
pub mod neo;
pub mod network;
mod prepared;
pub mod radix_join;
pub mod receiver;
pub mod relayed;
pub mod runtime_filter;
pub mod sender;
mod task;

pub use codec::{AUTO_LZ4_BELOW_BYTES_PER_SEC, BatchDecoder, BatchEncoder, Compression};
pub use context::{ExchangeId, Placement, QueryContext};
pub use cyclo::{CycloJoinExec, CycloJoinType, CycloKernel, CycloSide};
pub use flow::{BuildPreserving, FlowJoinExec, SkewSettings};
pub use neo::{NeoAggregateExec, NeoJoinExec, NeoSchedule, NeoSettings};
pub use network::{InputsAt, NetworkOperator, network_operator, wrapped_join};
pub use radix_join::RadixJoinExec;
pub use receiver::{ExchangeReceiverExec, ReceiveMode};
pub use relayed::{RelayedError, error_place, error_text};
pub use runtime_filter::{FilterFrom, FilterSourceExec, FilterTargetExec};
pub use sender::{ExchangeSenderExec, SendMode};

#[cfg(test)]
mod tests;
