//! Run-time filters across the network: every worker's part of a partitioned join's
//! build keys goes to every worker, where a target in the stage that sends the join's
//! probe rows unites the parts.
//!
//! Each worker's build side holds the keys of its hash partition, so the union of all
//! parts is every key of the join: a probe row whose key is in no part matches nothing
//! on any worker and can be dropped before it is shuffled.
//!
//! On the wire a part is one stream per (source worker, destination): messages of
//! `[tag][8-byte little-endian hashes...]`, tag [`KEYS`] or [`PASS_ALL`]. A stream that
//! ends without a message (its source stopped before finishing) counts as pass-all.

use super::keys::KeyFilter;
use crate::context::QueryContext;
use crate::sender::transport_err;
use datafusion::common::{HashSet, Result, internal_datafusion_err};
use gyre_transport::{ReceiveSpec, To};
use std::sync::Arc;

/// Tag of a message that carries key hashes.
const KEYS: u8 = 1;
/// Tag of a message that says the part lets every row through.
const PASS_ALL: u8 = 0;

/// Distinct key hashes a united filter holds at most (the parts of four workers at
/// their largest); beyond it the filter lets every row through.
pub const MAX_UNITED_KEYS: usize = 4 * super::MAX_FILTER_KEYS;

/// Sends `filter`, this worker's part (from `partition`), to every worker of the query
/// on exchange `exchange`.
pub async fn ship(
    qc: &QueryContext,
    exchange: u32,
    partition: usize,
    filter: &KeyFilter,
) -> Result<()> {
    let ep = qc.open_send(exchange, partition, qc.workers.clone())?;
    let per_message = (qc.transport.message_size().saturating_sub(1) / 8).max(1);
    match filter.hashes() {
        None => {
            let mut buf = ep.acquire(To::All).await.map_err(transport_err)?;
            buf.extend_from_slice(&[PASS_ALL]);
            ep.put(buf, true).map_err(transport_err)?;
        }
        Some(set) => {
            let hashes: Vec<u64> = set.iter().copied().collect();
            let chunks: Vec<&[u64]> = match hashes.is_empty() {
                true => vec![&[]],
                false => hashes.chunks(per_message).collect(),
            };
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.into_iter().enumerate() {
                let mut buf = ep.acquire(To::All).await.map_err(transport_err)?;
                let mut bytes = Vec::with_capacity(1 + 8 * chunk.len());
                bytes.push(KEYS);
                for h in chunk {
                    bytes.extend_from_slice(&h.to_le_bytes());
                }
                buf.extend_from_slice(&bytes);
                ep.put(buf, i == last).map_err(transport_err)?;
            }
        }
    }
    ep.finish();
    ep.flushed().await;
    Ok(())
}

/// Receives the parts of filter exchange `exchange` from every worker and unites them.
pub async fn gather(qc: &QueryContext, exchange: u32) -> Result<Arc<KeyFilter>> {
    let ep = qc
        .transport
        .open_receive(ReceiveSpec {
            query: qc.query_id,
            exchange,
            sources: (0..qc.workers.len() as u32)
                .zip(qc.workers.clone())
                .collect(),
        })
        .map_err(transport_err)?;
    let mut united: Option<HashSet<u64>> = Some(HashSet::default());
    let mut heard = vec![false; qc.workers.len()];
    while let Some(msg) = ep.get().await.map_err(transport_err)? {
        let data = msg.data();
        if data.is_empty() {
            continue;
        }
        heard[msg.source] = true;
        let (tag, body) = (data[0], &data[1..]);
        match tag {
            PASS_ALL => united = None,
            KEYS if body.len() % 8 == 0 => {
                if let Some(set) = &mut united {
                    set.extend(
                        body.chunks_exact(8)
                            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
                    );
                    if set.len() > MAX_UNITED_KEYS {
                        united = None;
                    }
                }
            }
            _ => {
                return Err(internal_datafusion_err!(
                    "run-time filter part from worker {} of exchange {exchange}: a message of \
                     {} bytes with tag {tag} (expected tag {KEYS} and a multiple of 8 bytes)",
                    msg.slot,
                    data.len()
                ));
            }
        }
    }
    if heard.iter().any(|h| !h) {
        united = None;
    }
    Ok(Arc::new(KeyFilter::from_hashes(united)))
}
