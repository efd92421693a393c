//! Fuzz targets for every decoder that reads bytes from another node.
//!
//! A [`Target`] is a name, seeds made by Gyre's own encoders (so they are exactly what
//! a node receives) and the decoding a node runs on such bytes. Errors are the expected
//! answer to a bad input; a panic or an abort is a bug. Two drivers run the targets:
//! the mutation fuzzer in `tests/fuzz.rs` (part of `cargo test`) and the coverage-guided
//! AFL++ driver in `fuzz/afl` (`scripts/fuzz.sh`).

pub mod flow;
pub mod frames;
pub mod stream;

#[cfg(feature = "engine")]
mod arrays;
#[cfg(feature = "engine")]
pub mod control;
#[cfg(feature = "engine")]
pub mod cyclo;
#[cfg(feature = "engine")]
pub mod ipc;
#[cfg(feature = "engine")]
pub mod plan;
#[cfg(feature = "engine")]
pub mod redo;

/// One decoder under fuzzing.
#[derive(Clone, Copy)]
pub struct Target {
    /// What the driver and the reports call it.
    pub name: &'static str,
    /// Valid inputs, made by the matching encoder.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Decodes one input as a node does with bytes from a peer.
    pub run: fn(&[u8]),
}

/// Every target this build has.
pub fn targets() -> Vec<Target> {
    #[allow(unused_mut)]
    let mut all = vec![
        Target {
            name: "frames",
            seeds: frames::seeds,
            run: frames::run,
        },
        Target {
            name: "stream",
            seeds: stream::seeds,
            run: stream::run,
        },
        Target {
            name: "flow",
            seeds: flow::seeds,
            run: flow::run,
        },
    ];
    #[cfg(feature = "engine")]
    all.extend([
        Target {
            name: "control",
            seeds: control::seeds,
            run: control::run,
        },
        Target {
            name: "ipc",
            seeds: ipc::seeds,
            run: ipc::run,
        },
        Target {
            name: "cyclo",
            seeds: cyclo::seeds,
            run: cyclo::run,
        },
        Target {
            name: "plan",
            seeds: plan::seeds,
            run: plan::run,
        },
        Target {
            name: "redo",
            seeds: redo::seeds,
            run: redo::run,
        },
    ]);
    all
}

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    targets().into_iter().find(|t| t.name == name)
}

/// Runs `f` on a thread of its own with a fresh Tokio runtime, so seed generation works
/// whether or not the caller is inside a runtime already.
#[cfg(feature = "engine")]
fn in_runtime<T: Send + 'static, F>(f: impl FnOnce() -> F + Send + 'static) -> T
where
    F: Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a Tokio runtime")
            .block_on(f())
    })
    .join()
    .expect("seed generation panicked")
}
