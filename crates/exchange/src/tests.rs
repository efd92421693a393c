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
use gyre_transport::{
    COORDINATOR, NodeId, ReceiveEndpoint, ReceiveSpec, Schedule, SendEndpoint, SendSpec,
    TcpTransport, Transport, TransportConfig,
};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Node 1 alone on loopback, for tests that send to themselves.
pub(crate) async fn lone_node() -> TcpTransport {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    TcpTransport::bind(1, any, TransportConfig::default())
        .await
        .unwrap()
}

/// One stream from `t` to itself: `query`, exchange 0, sender slot 0.
pub(crate) fn stream_to_self(t: &TcpTransport, query: u64) -> (SendEndpoint, ReceiveEndpoint) {
    let me = t.node_id();
    let send = t
        .open_send(SendSpec {
            query,
            exchange: 0,
            from: 0,
            destinations: vec![me],
            groups: vec![],
        })
        .unwrap();
    let recv = t
        .open_receive(ReceiveSpec {
            query,
            exchange: 0,
            sources: vec![(0, me)],
        })
        .unwrap();
    (send, recv)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, false),
    ]))
}

/// A batch of `keys`, each with its value string.
fn batch(keys: Vec<i64>) -> RecordBatch {
    let vals: Vec<String> = keys.iter().map(|k| format!("value {k:>12}")).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(StringArray::from(vals)),
        ],
    )
    .unwrap()
}

/// `parts` partitions of `rows` rows each, in batches of 1000; keys are unique.
fn input(parts: usize, rows: usize) -> Vec<Vec<RecordBatch>> {
    (0..parts)
        .map(|p| {
            (0..rows)
                .step_by(1000)
                .map(|start| {
                    batch(
                        (start..(start + 1000).min(rows))
                            .map(|i| (p * rows + i) as i64)
                            .collect(),
                    )
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
    Arc::new(query_task(t, workers, compression))
}

/// The task context of query 1 on `t`, with DataFusion's default runtime.
fn query_task(t: &TcpTransport, workers: &[NodeId], compression: Compression) -> TaskContext {
    let qc = QueryContext {
        query_id: 1,
        transport: Arc::new(t.clone()),
        workers: workers.to_vec(),
        compression,
        runtime_filters: Default::default(),
    };
    let config = SessionConfig::new().with_extension(Arc::new(qc));
    TaskContext::default().with_session_config(config)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_receiver_holds_counts_in_the_memory_pool() {
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use futures::StreamExt;
    let workers: Vec<NodeId> = vec![1];
    let all = nodes(&[COORDINATOR, 1], Schedule::Free).await;
    let data = input(1, 40_000);
    let source = MemorySourceConfig::try_new_exec(&data, schema(), None).unwrap();
    let gather = Arc::new(ExchangeSenderExec::new(
        source,
        1,
        Placement::Workers,
        SendMode::Gather,
    ));
    let at_coordinator = ExchangeReceiverExec::new(
        1,
        schema(),
        Placement::Workers,
        1,
        ReceiveMode::Forward,
        Partitioning::UnknownPartitioning(1),
        None,
    );
    let ctx = task_ctx(&all[1], &workers, Compression::None);
    let sender = tokio::spawn(common::collect(gather.execute(0, ctx).unwrap()));
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool))
        .build_arc()
        .unwrap();
    let ctx = Arc::new(query_task(&all[0], &workers, Compression::None).with_runtime(runtime));
    let mut stream = at_coordinator.execute(0, ctx).unwrap();
    let mut rows = stream.next().await.unwrap().unwrap().num_rows();
    // The sender fills its credits while nobody reads: those messages are held here.
    tokio::time::sleep(Duration::from_millis(300)).await;
    rows += stream.next().await.unwrap().unwrap().num_rows();
    let held = pool.reserved();
    assert!(
        held >= 4 * 64 * 1024,
        "{held} bytes counted with a full window of 64 KiB messages queued"
    );
    while let Some(b) = stream.next().await {
        rows += b.unwrap().num_rows();
    }
    assert_eq!(rows, 40_000);
    assert_eq!(pool.reserved(), 0, "all given back at the end");
    sender.await.unwrap().unwrap();
    for t in &all {
        t.release_query(1);
        t.shutdown();
    }
}

/// Output keys of `rows` build rows (`k` unique, 0..rows) joined with two probe
/// partitions of 60 000 rows each; with `skewed`, a third of the probe rows have key 7.
/// Worker `early.0` (if any) reads `early.1` batches of its Flow-Join's output and
/// drops the stream: a LIMIT above it stops after a batch; a hash join above it whose
/// build side is empty never reads it. Returns each worker's output keys, sorted, or the
/// error its stream ended with, and the probe rows kept local for heavy keys.
async fn flow_join_outputs(
    join_type: datafusion::common::JoinType,
    skewed: bool,
    early: Option<(usize, usize)>,
) -> (Vec<std::result::Result<Vec<i64>, String>>, usize) {
    use crate::flow::{FlowJoinExec, SkewSettings};
    use datafusion::common::NullEquality;
    use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
    use datafusion::physical_plan::repartition::RepartitionExec;
    use futures::StreamExt;

    let workers: Vec<NodeId> = vec![1, 2];
    let all = nodes(&workers, Schedule::Free).await;
    let n = workers.len();
    let build_rows = 20_000usize;
    let build: Vec<RecordBatch> = (0..build_rows as i64)
        .collect::<Vec<_>>()
        .chunks(1000)
        .map(|c| batch(c.to_vec()))
        .collect();
    // Probe keys 0..2 * build_rows: half of them find no build row.
    let probe: Vec<Vec<RecordBatch>> = (0..n as i64)
        .map(|p| {
            (0..60)
                .map(|b| {
                    batch(
                        (0..1000i64)
                            .map(|i| {
                                let r = p * 60_000 + b * 1000 + i;
                                if skewed && r % 3 == 0 {
                                    7
                                } else {
                                    (r * 7919) % (2 * build_rows as i64)
                                }
                            })
                            .collect(),
                    )
                })
                .collect()
        })
        .collect();
    let key = col("k", &schema()).unwrap();
    // Build partition i on worker i: the build rows of hash partition i.
    let build = Arc::new(
        RepartitionExec::try_new(
            MemorySourceConfig::try_new_exec(&[build], schema(), None).unwrap(),
            Partitioning::Hash(vec![Arc::clone(&key)], n),
        )
        .unwrap(),
    );
    let probe = MemorySourceConfig::try_new_exec(&probe, schema(), None).unwrap();
    let join = Arc::new(
        HashJoinExec::try_new(
            build,
            probe,
            vec![(Arc::clone(&key), key)],
            None,
            &join_type,
            None,
            PartitionMode::Partitioned,
            NullEquality::NullEqualsNothing,
            false,
        )
        .unwrap(),
    );
    let settings = SkewSettings {
        // Heavy above 5% of the probe rows: key 7 only.
        threshold: 0.05,
        ..SkewSettings::default()
    };
    let flow = Arc::new(
        FlowJoinExec::try_new(
            join,
            settings,
            crate::flow::FlowInputs {
                probe_rows_per_worker: Some(60_000),
                ..Default::default()
            },
            Some(1),
        )
        .unwrap(),
    );
    let mut tasks = vec![];
    for (i, t) in all.iter().enumerate() {
        let stream = flow
            .execute(i, task_ctx(t, &workers, Compression::None))
            .unwrap();
        let reads = early.filter(|e| e.0 == i).map_or(usize::MAX, |e| e.1);
        tasks.push(tokio::spawn(async move {
            let mut stream = stream;
            let mut keys = vec![];
            let mut batches = 0;
            while batches < reads
                && let Some(b) = stream.next().await
            {
                let b = b.map_err(|e| e.to_string())?;
                let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                keys.extend(k.values().iter().copied());
                batches += 1;
            }
            keys.sort_unstable();
            Ok(keys)
        }));
    }
    let mut out = vec![];
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("Flow-Join hung")
                .unwrap(),
        );
    }
    for t in &all {
        t.release_query(1);
        t.shutdown();
    }
    let kept_local = flow
        .metrics()
        .and_then(|m| m.sum_by_name("probe_rows_kept_local"))
        .map_or(0, |v| v.as_usize());
    (out, kept_local)
}

/// A worker whose consumer stops reading a Flow-Join early (a LIMIT above it) must not
/// break the join on the other workers: it keeps routing, broadcasting and reporting
/// matches until its part is done, and only then goes quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_join_left_early_by_one_worker_completes_on_the_others() {
    use datafusion::common::JoinType;
    // Uniform keys: routing is plain hash partitioning, so worker 1's rows are fixed;
    // worker 0 stops after one batch. Skewed semi join: worker 1 emits its own build
    // rows that matched anywhere, which needs worker 0's match reports; worker 0 never
    // reads its output (a semi join's first batch comes after the reports).
    for (join_type, skewed, reads) in [(JoinType::Inner, false, 1), (JoinType::LeftSemi, true, 0)] {
        let (full, _) = flow_join_outputs(join_type, skewed, None).await;
        let (early, kept_local) = flow_join_outputs(join_type, skewed, Some((0, reads))).await;
        let want = full[1].clone().unwrap();
        assert!(!want.is_empty());
        match &early[1] {
            Ok(got) => assert!(
                *got == want,
                "{join_type} join, skewed: {skewed}: {} rows instead of {}",
                got.len(),
                want.len()
            ),
            Err(e) => panic!("{join_type} join, skewed: {skewed}: {e}"),
        }
        assert_eq!(
            skewed,
            kept_local > 0,
            "heavy path taken: {kept_local} rows"
        );
        if skewed {
            let all: Vec<i64> = full.iter().flat_map(|r| r.clone().unwrap()).collect();
            assert!(all.contains(&7), "the heavy key's build row is matched");
        }
    }
}
