//! Cyclo-join on the Data Roundabout (Frey, Goncalves, Kersten, Teubner: "A Spinning Join
//! That Does Not Get Dizzy", ICDCS 2010).
//!
//! The nodes form a logical ring; one join input stays in place, the fragments of the
//! other travel the ring once, and every node joins every passing fragment with its own
//! stationary part, so the result ends up spread over the nodes. Any predicate works,
//! which is why Gyre uses it for band, inequality and theta joins that hash partitioning
//! cannot serve.
//!
//! - [`fragment`]: the travelling unit, raw little-endian arrays joined in place;
//! - [`ring`]: a node's fixed ring of pre-allocated buffers;
//! - [`roundabout`]: the Data Roundabout: receiver, join entity and transmitter per node
//!   over the transport's endpoints;
//! - [`local`]: the local algorithms on the ring (radix hash, sort-merge with band and
//!   inequalities, nested loops) and their setup, done once;
//! - [`join`]: cyclo-join itself (agree, prepare, run) for operators;
//! - [`bench`]: the per-node benchmark driver [`run_cyclo`] and an in-process ring.

pub mod bench;
pub mod error;
pub mod fragment;
pub mod join;
pub mod local;
mod ring;
pub mod roundabout;
#[cfg(test)]
mod tests;

pub use bench::{
    CycloFigures, CycloSpec, format_table, loopback_ring, parse_algorithm, run_cyclo, run_on,
};
pub use error::CycloError;
pub use fragment::{ByteColumn, FragmentForm, FragmentView};
pub use join::{
    CycloOptions, CycloRunFigures, PreparedCycloJoin, Relation, ResultSink, RingPlan, Rotate,
    SetupFigures, agree, cyclo_join, for_each_cross_chunk, scatter,
};
pub use local::{CycloAlgorithm, FragmentLimits, Side, Stationary, ThetaPredicate};
pub use roundabout::{
    ForwardPolicy, JoinEntity, RingSpec, RoundaboutConfig, RoundaboutFigures, run_roundabout,
};
