//! Calls queued for the primary and run back to back by one of their callers (flat
//! combining).
//!
//! Transactions run one at a time under the primary's lock. When every caller takes
//! that lock for its own transaction, each hand-over wakes a parked thread, and the
//! lock stays idle for the wake-up, often longer than a TPC-C transaction runs. So a
//! caller queues its call instead; if nobody is running the queue, it becomes the
//! runner: it takes the whole queue, runs the calls under one lock hold, hands each
//! its outcome and looks for more. The other callers sleep until their outcome is
//! there. HyPer runs its transactions on one thread from a queue in the same spirit.
//!
//! States of a call: *queued* (in the queue), *running* (taken by the runner), *done*
//! (its outcome set, the caller woken). Invariant, kept under the queue's lock: while a
//! call is queued, a runner exists or its own caller is about to become one. A runner
//! stops when it finds the queue empty, or, once its own call is done, after it ran
//! [`HAND_OVER_AFTER`] more, so that one client does not serve the others forever;
//! a caller woken with its call still queued and no runner takes over.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// Calls a runner runs for others after its own before it hands the queue over.
const HAND_OVER_AFTER: usize = 64;

/// One queued call: what to run and, once run, its outcome.
pub(crate) struct Queued<J, T> {
    pub(crate) job: J,
    outcome: Mutex<Option<T>>,
    /// The caller, parked until its outcome is set or it must take over the queue.
    caller: std::thread::Thread,
    /// Whoever set the outcome wakes the caller itself (or has it woken).
    wakes_itself: std::sync::atomic::AtomicBool,
}

impl<J, T> Queued<J, T> {
    /// Sets the call's outcome (its caller is woken after the batch).
    pub(crate) fn finish(&self, outcome: T) {
        *self.outcome.lock() = Some(outcome);
    }

    /// Sets the call's outcome and returns its caller, for the runner to have it
    /// woken later: a caller that waits next for its commit to be durable can be
    /// woken once, by the log, instead of by the runner first (a system call on the
    /// path every transaction waits behind).
    pub(crate) fn finish_waking_later(&self, outcome: T) -> std::thread::Thread {
        self.wakes_itself
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.finish(outcome);
        self.caller.clone()
    }

    fn is_done(&self) -> bool {
        self.outcome.lock().is_some()
    }
}

struct State<J, T> {
    queue: VecDeque<Arc<Queued<J, T>>>,
    running: bool,
}

/// The queue of calls and who runs it. Callers wait parked, each woken alone: a
/// condition variable shared by dozens of callers woke them all for every batch.
pub(crate) struct Combiner<J, T> {
    state: Mutex<State<J, T>>,
}

impl<J, T> Default for Combiner<J, T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                running: false,
            }),
        }
    }
}

impl<J, T> Combiner<J, T> {
    /// Queues `job` and returns its outcome once run, by this caller or another.
    /// `run_batch` runs a batch and must [`Queued::finish`] each call in it; a call it
    /// leaves unfinished (it panicked, say) gets `failed()`.
    pub(crate) fn call(
        &self,
        job: J,
        run_batch: impl Fn(&[Arc<Queued<J, T>>]),
        failed: impl Fn() -> T,
    ) -> T {
        let me = Arc::new(Queued {
            job,
            outcome: Mutex::new(None),
            caller: std::thread::current(),
            wakes_itself: Default::default(),
        });
        self.state.lock().queue.push_back(Arc::clone(&me));
        loop {
            let mut state = self.state.lock();
            if let Some(outcome) = me.outcome.lock().take() {
                return outcome;
            }
            if !state.running {
                // Not done, so still queued: run the queue.
                state.running = true;
                drop(state);
                self.run(&me, &run_batch, &failed);
                continue;
            }
            drop(state);
            // An unpark between the check and here makes this return at once.
            std::thread::park();
        }
    }

    /// Runs batches until the queue is empty or it is time to hand over.
    fn run(
        &self,
        me: &Queued<J, T>,
        run_batch: &impl Fn(&[Arc<Queued<J, T>>]),
        failed: &impl Fn() -> T,
    ) {
        let mut ran_for_others = 0;
        loop {
            let batch: Vec<_> = {
                let mut state = self.state.lock();
                let handing_over = ran_for_others >= HAND_OVER_AFTER && me.is_done();
                if state.queue.is_empty() || handing_over {
                    state.running = false;
                    if let Some(next) = state.queue.front() {
                        // It finds nobody running and takes over.
                        next.caller.unpark();
                    }
                    return;
                }
                state.queue.drain(..).collect()
            };
            if me.is_done() {
                ran_for_others += batch.len();
            }
            // A panic answers the batch's unfinished calls with the failure; the
            // queue goes on (the primary's lock guard and the transaction's undo
            // have unwound).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_batch(&batch)));
            for call in &batch {
                if !call.is_done() {
                    call.finish(failed());
                    call.caller.unpark();
                } else if !call.wakes_itself.load(std::sync::atomic::Ordering::Relaxed) {
                    call.caller.unpark();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Many callers, each call run exactly once and answered with its own outcome;
    /// the calls of a batch run back to back under one "lock", and a panicking batch
    /// answers its calls with the failure and leaves the queue to the others.
    #[test]
    fn every_call_runs_once_and_gets_its_own_outcome() {
        let combiner: Combiner<u64, Result<u64, String>> = Combiner::default();
        let runs = AtomicUsize::new(0);
        let batches = AtomicUsize::new(0);
        let in_batch = Mutex::new(());
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (combiner, runs, batches, in_batch) = (&combiner, &runs, &batches, &in_batch);
                s.spawn(move || {
                    for i in 0..2_000u64 {
                        let job = t * 1_000_000 + i;
                        let out = combiner.call(
                            job,
                            |batch| {
                                let _one_at_a_time = in_batch.try_lock().expect("one runner");
                                batches.fetch_add(1, Ordering::Relaxed);
                                for call in batch {
                                    runs.fetch_add(1, Ordering::Relaxed);
                                    if call.job % 997 == 13 {
                                        panic!("job {}", call.job);
                                    }
                                    call.finish(Ok(call.job * 2));
                                }
                            },
                            || Err("failed".to_string()),
                        );
                        match out {
                            Ok(v) => assert_eq!(v, job * 2),
                            Err(e) => assert_eq!(e, "failed"),
                        }
                    }
                });
            }
        });
        assert!(runs.load(Ordering::Relaxed) <= 16_000);
        assert!(batches.load(Ordering::Relaxed) <= 16_000);
        let state = combiner.state.lock();
        assert!(state.queue.is_empty() && !state.running);
    }
}
