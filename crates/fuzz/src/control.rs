//! Control messages between the coordinator and the workers (requests and responses
//! of the cluster protocol), as either side decodes them.

use gyre_cluster::protocol::{Request, Response, ShuffleRun, decode, encode};

/// One of every request, and responses.
pub fn seeds() -> Vec<Vec<u8>> {
    let requests = [
        Request::Register {
            control_addr: "10.0.0.2:50051".into(),
            data_addr: "10.0.0.2:50052".into(),
            host_shuffle: Some("/dev/shm/gyre".into()),
        },
        Request::Heartbeat {
            node: 3,
            incarnation: 7,
        },
        Request::QueryFailed {
            query: 12,
            node: 2,
            error: "worker 2 failed".into(),
        },
        Request::SetPeers {
            peers: vec![(1, "10.0.0.2:1".into()), (2, "10.0.0.3:1".into())],
        },
        Request::StartQuery {
            query: 5,
            workers: vec![1, 2, 3],
            stages: vec![(0, vec![1, 2, 3, 4]), (1, vec![0; 40])],
            compression: Some("lz4".into()),
            shuffle_design: Some("memq-sr".into()),
            execution: vec![("datafusion.execution.batch_size".into(), "8192".into())],
        },
        Request::FinishQuery {
            query: 5,
            commit: true,
            metrics: false,
        },
        Request::CreateTable {
            name: "t".into(),
            schema: vec![9; 30],
        },
        Request::BenchShuffle(ShuffleRun {
            run_id: 1,
            nodes: vec![1, 2],
            pattern: "repartition".into(),
            total_bytes: 1 << 20,
            message_size: 1 << 16,
            schedule: "free".into(),
        }),
        Request::DropTable { name: "t".into() },
        Request::RegisterStore {
            locations: vec!["s3://bucket/x".into()],
            options: vec![("aws.region".into(), "eu".into())],
        },
        Request::Progress { query: 5 },
        Request::Stats,
    ];
    let mut seeds: Vec<Vec<u8>> = requests.iter().map(encode).collect();
    seeds.push(encode(&Response::Ok));
    seeds.push(encode(&Response::Registered {
        node: 4,
        incarnation: 9,
    }));
    seeds.push(encode(&Response::Forgotten {
        reason: "worker 4 died".into(),
    }));
    seeds.push(encode(&Response::Finished {
        stages: vec![(0, "metrics".into())],
        tables: vec![],
    }));
    seeds
}

/// Decodes the input as a request and as a response.
pub fn run(input: &[u8]) {
    let _ = decode::<Request>(input);
    let _ = decode::<Response>(input);
}
