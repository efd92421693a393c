//! Exchange operators end to end over real transports: a shuffle and a gather
//! among in-process nodes, checked against the input rows.

use crate::{
    Compression, ExchangeReceiverExec, ExchangeSenderExec, Placement, QueryContext, ReceiveMode,
    SendMode,
};
use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, common};
use datafusion::prelude::SessionConfig;
use gyre_transport::{COORDINATOR, NodeId, Schedule, TcpTransport, Transport, TransportConfig};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, false),
    ]))
}

/// `parts` partitions of `rows` rows each, in batches of 1000; keys are unique.
fn input(parts: usize, rows: usize) -> Vec<Vec<RecordBatch>> {
    (0..parts)
        .map(|p| {
            (0..rows)
                .step_by(1000)
                .map(|start| {
                    let keys: Vec<i64> = (start..(start + 1000).min(rows))
                        .map(|i| (p * rows + i) as i64)
                        .collect();
                    let vals: Vec<String> = keys.iter().map(|k| format!("value {k:>12}")).collect();
                    RecordBatch::try_new(
                        schema(),
                        vec![
                            Arc::new(Int64Array::from(keys)),
                            Arc::new(StringArray::from(vals)),
                        ],
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect()
}

async fn nodes(ids: &[NodeId], schedule: Schedule) -> Vec<TcpTransport> {
    let config = TransportConfig {
        message_size: 64 * 1024,
        schedule,
        ..Default::default()
    };
    let mut out = vec![];
    for &id in ids {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        out.push(TcpTransport::bind(id, any, config.clone()).await.unwrap());
    }
    let peers: HashMap<NodeId, SocketAddr> =
        out.iter().map(|t| (t.node_id(), t.local_addr())).collect();
    for t in &out {
        t.set_peers(&peers);
    }
    for a in &out {
        for b in &out {
            while a.node_id() != b.node_id() && !a.is_connected(b.node_id()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    out
}

fn task_ctx(t: &TcpTransport, workers: &[NodeId], compression: Compression) -> Arc<TaskContext> {
    let qc = QueryContext {
        query_id: 1,
        transport: Arc::new(t.clone()),
        workers: workers.to_vec(),
        compression,
    };
    let config = SessionConfig::new().with_extension(Arc::new(qc));
    Arc::new(TaskContext::default().with_session_config(config))
}

fn keys(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            (0..b.num_rows()).map(move |i| {
                assert_eq!(v.value(i), format!("value {:>12}", k.value(i)));
                k.value(i)
            })
        })
        .collect()
}

/// Shuffles 3 x 20 000 rows among 3 workers by key, then gathers everything at the
/// coordinator; every row must arrive exactly once, at exactly one worker.
async fn shuffle_then_gather(schedule: Schedule, compression: Compression) {
    let workers: Vec<NodeId> = vec![1, 2, 3];
    let all = nodes(&[COORDINATOR, 1, 2, 3], schedule).await;
    let n = workers.len();
    let data = input(n, 20_000);
    let source = MemorySourceConfig::try_new_exec(&data, schema(), None).unwrap();
    let key = col("k", &schema()).unwrap();
    let hash = Partitioning::Hash(vec![key], n);
    let shuffle = Arc::new(ExchangeSenderExec::new(
        source,
        1,
        Placement::Workers,
        SendMode::Shuffle(hash.clone()),
    ));
    let received = Arc::new(ExchangeReceiverExec::new(
        1,
        schema(),
        Placement::Workers,
        n,
        ReceiveMode::Shuffle,
        hash,
        None,
    ));
    // Each worker forwards what it received to the coordinator.
    let gather = Arc::new(ExchangeSenderExec::new(
        Arc::clone(&received) as Arc<dyn ExecutionPlan>,
        2,
        Placement::Workers,
        SendMode::Gather,
    ));
    let at_coordinator = Arc::new(ExchangeReceiverExec::new(
        2,
        schema(),
        Placement::Workers,
        n,
        ReceiveMode::Forward,
        Partitioning::UnknownPartitioning(n),
        None,
    ));
    let mut tasks = vec![];
    for (i, t) in all[1..].iter().enumerate() {
        let ctx = task_ctx(t, &workers, compression);
        let (s, g) = (Arc::clone(&shuffle), Arc::clone(&gather));
        tasks.push(tokio::spawn(async move {
            let a = common::collect(s.execute(i, Arc::clone(&ctx)).unwrap());
            let b = common::collect(g.execute(i, ctx).unwrap());
            let (a, b) = tokio::join!(a, b);
            a.unwrap();
            b.unwrap();
        }));
    }
    let ctx = task_ctx(&all[0], &workers, compression);
    let mut per_worker = vec![];
    for p in 0..n {
        let stream = at_coordinator.execute(p, Arc::clone(&ctx)).unwrap();
        per_worker.push(tokio::spawn(common::collect(stream)));
    }
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for (w, h) in per_worker.into_iter().enumerate() {
        let batches = tokio::time::timeout(Duration::from_secs(30), h)
            .await
            .expect("exchange hung")
            .unwrap()
            .unwrap();
        for k in keys(&batches) {
            assert!(seen.insert(k, w).is_none(), "key {k} arrived twice");
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let want: Vec<i64> = keys(&data.concat());
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), {
        let mut w = want;
        w.sort();
        w
    });
    // Hash partitioning sends every key to one worker; all workers got some.
    let mut per: Vec<usize> = vec![0; n];
    for w in seen.values() {
        per[*w] += 1;
    }
    assert!(per.iter().all(|c| *c > 10_000), "{per:?}");
    // Messages were coalesced to the buffer size, not sent per input batch.
    let sent: u64 = all[1..].iter().map(|t| t.stats().messages_sent).sum();
    assert!(
        sent < 3 * 60,
        "{sent} messages for 60 input batches of 1000 rows"
    );
    for t in &all {
        t.release_query(1);
        t.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_and_gather_free_schedule() {
    shuffle_then_gather(Schedule::Free, Compression::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_and_gather_phased_schedule_lz4() {
    shuffle_then_gather(Schedule::Phased { quota: 2 }, Compression::Lz4).await;
}
