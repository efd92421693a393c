//! Heavy-hitter detection while an input streams (Rödiger, *Scalable Distributed Query Processing in Parallel Main-Memory Database Systems*,
//! 4.2.2-4.2.3).
//!
//! - Each routing thread counts the keys it routes in a private [`SpaceSaving`]
//!   histogram (no locks on the hot path: a thread holds its own histogram's mutex for
//!   a whole morsel, and only the detecting thread takes the others, once per iteration).
//! - [`Schedule`]: detection iterations at fixed fractions of a node's input (first at
//!   ~1%, then periodically), the same number of iterations on every node, so the
//!   coordinator knows when it has every node's report of an iteration.
//! - [`NodeDetector`]: at an iteration point the node merges its threads' histograms
//!   (then clears them: each iteration looks at the window since the last one, so keys
//!   that become heavy late are found) and keeps the keys whose *guaranteed* count
//!   (count minus SpaceSaving's error) exceeds the threshold share of the window.
//! - [`Coordinator`]: sums the reports of one iteration and keeps the keys whose
//!   summed count exceeds the threshold share of the summed windows: the global
//!   heavy-hitter list, announced to everyone once a majority of the nodes reported
//!   the iteration. Waiting for all of them let one node that fell behind hold the
//!   list back from the rest, and the node that falls behind is often the one a
//!   heavy hitter overloads: on 8 emulated hosts the others had routed nearly all
//!   their input by hash before the list came. A late report counts towards the next
//!   iteration not yet announced.
//!
//! - Cost control: only the first window counts every (configured `sample`-th)
//!   tuple, as Rödiger's detection does. After it a node counts one tuple in
//!   [`DENSE_SAMPLE`] while new skew turns up (the candidates it had not reported
//!   before hold [`QUIET_NEW_SHARE`] of the window together), and after a quiet
//!   window only about [`SAMPLED_WINDOW_TUPLES`] of the next one
//!   ([`NodeDetector::step`]). After the last iteration nothing is counted. Updating
//!   SpaceSaving for every tuple of an unskewed input costs more than routing it, and
//!   on a skewed one every tuple of the long tail is an eviction; a key heavy enough
//!   to unbalance the nodes still stands out in a sample of thousands of tuples. On a
//!   Zipf input more keys pass the threshold than the histogram has counters (at
//!   z = 1.25 and 0.01%, hundreds), so a different few just over it turn up as new in
//!   every window. Counting every tuple after such windows cost 8-14% more CPU than
//!   the plain join at Zipf 0.75-1 on 8 emulated hosts, where the plain join is
//!   hardly unbalanced. Reports are scaled back to tuples, so nodes sampling at
//!   different rates add up correctly at the coordinator.
//!
//! Why guaranteed counts: the default threshold (0.01%) is far below SpaceSaving's
//! error bound 1/k (0.8% for k = 128), so on a stream without skew every monitored
//! key's *estimate* passes it; its guaranteed count does not. A heavy key's error is
//! tiny compared with its count, so it still passes.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::space_saving::{DEFAULT_CAPACITY, SpaceSaving};

/// Tuning of skew detection (Rödiger's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct DetectionConfig {
    /// A key is heavy when it has more than this share of the input (0.0001 = 0.01%).
    pub threshold: f64,
    /// First detection after this share of a node's input (0.01 = 1%).
    pub first: f64,
    /// Then again after every further share (iterative detection); 0 = only once.
    pub every: f64,
    /// At most this many candidates per node and iteration.
    pub max_reported: usize,
    /// SpaceSaving counters per thread.
    pub capacity: usize,
    /// Count every `sample`-th tuple only (1 = every tuple, as Rödiger's detection does) in the
    /// first window; later windows count `DENSE_SAMPLE` or more times fewer. Not the
    /// Rödiger's method: a knob to trade detection precision for update cost.
    pub sample: u32,
}

impl Default for DetectionConfig {
    fn default() -> Self {
        DetectionConfig {
            threshold: 0.0001,
            first: 0.01,
            every: 0.1,
            max_reported: DEFAULT_CAPACITY,
            capacity: DEFAULT_CAPACITY,
            sample: 1,
        }
    }
}

impl DetectionConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(format!(
                "skew threshold must be in (0, 1], got {}",
                self.threshold
            ));
        }
        if !(self.first > 0.0 && self.first < 1.0) {
            return Err(format!(
                "first detection point must be in (0, 1), got {}",
                self.first
            ));
        }
        if !(self.every == 0.0 || (self.every >= 0.001 && self.every < 1.0)) {
            return Err(format!(
                "detection period must be 0 or in [0.001, 1), got {}",
                self.every
            ));
        }
        if self.sample == 0 {
            return Err("detection sample rate must be at least 1".into());
        }
        if !(1..=16384).contains(&self.capacity) {
            return Err(format!(
                "histogram capacity must be 1..=16384, got {}",
                self.capacity
            ));
        }
        Ok(())
    }

    /// Fractions of the input at which the iterations run.
    pub fn fractions(&self) -> Vec<f64> {
        let mut out = vec![self.first];
        if self.every > 0.0 {
            let mut f = self.first + self.every;
            while f < 1.0 - 1e-9 {
                out.push(f);
                f += self.every;
            }
        }
        out
    }

    pub fn iterations(&self) -> usize {
        self.fractions().len()
    }
}

/// The tuple counts at which one node runs its iterations.
#[derive(Debug, Clone)]
pub struct Schedule {
    points: Vec<u64>,
}

impl Schedule {
    pub fn new(config: &DetectionConfig, input_rows: u64) -> Self {
        Schedule {
            points: config
                .fractions()
                .iter()
                .map(|f| ((input_rows as f64 * f).ceil() as u64).max(1))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Tuples in the window that iteration `i` looks at (from the previous iteration
    /// on), or `None` if there is no iteration `i`.
    pub fn window(&self, i: usize) -> Option<u64> {
        let end = *self.points.get(i)?;
        Some(end - i.checked_sub(1).map_or(0, |p| self.points[p]))
    }

    /// Iterations due once `processed` tuples were routed, from `next` on.
    pub fn due(&self, next: usize, processed: u64) -> usize {
        self.points[next.min(self.points.len())..]
            .iter()
            .take_while(|&&p| p <= processed)
            .count()
    }
}

/// Longest a router waits, once, for the global list's first announcement after
/// reporting its first iteration (the library's global-list mode and the SQL operator):
/// on hosts with a small CPU share the announcement crosses hosts that run only part of
/// each scheduling period, and routing on by hash meanwhile sends most heavy tuples to
/// their owners. Only a router whose own first report had candidates waits: a key over
/// the threshold overall is over it on at least one node (the one that waits for it),
/// and the others have too few of its tuples to matter. Without skew nobody waits
/// (SQL, 4 hosts at 10 Gbit/s: up to 10 ms of a 0.1 s join).
pub const FIRST_ROUND_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// After the first window, one tuple in this many is counted at least: a key with
/// 0.032% of a window is then seen [`MIN_SAMPLED_COUNT`] times.
pub const DENSE_SAMPLE: usize = 16;

/// A window after a quiet one counts about this many tuples (one in
/// `window / this`) when that is sparser than [`DENSE_SAMPLE`]: what a sample can show depends on how many tuples
/// it counts, not on how long the window is. 4 096 counted tuples show a key with 0.1%
/// of the window ([`MIN_SAMPLED_COUNT`] times) and 1% new skew (about 41 times). On
/// 2M tuples per node (windows of 200 000) this counts one in 48, a third of the
/// updates of one in 16; each is an eviction on uniform keys.
pub const SAMPLED_WINDOW_TUPLES: u64 = 4_096;

/// A window is quiet when the candidates new in it hold less than this share of it
/// together: too little new skew to pay for counting every tuple again.
pub const QUIET_NEW_SHARE: f64 = 0.01;

/// What a node found in one iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeReport {
    pub iteration: u32,
    /// Tuples routed in this iteration's window (counted or not).
    pub window: u64,
    /// `(key, guaranteed count)` above the threshold, largest first; counts scaled
    /// from the counted sample to the window's tuples.
    pub candidates: Vec<(u64, u64)>,
    /// Tuples routed when the iteration ran.
    pub processed: u64,
    /// The candidates this node had not reported before hold less than
    /// [`QUIET_NEW_SHARE`] of the window: the next window is sampled.
    pub quiet: bool,
}

/// Per-thread histograms plus the iteration schedule of one node and one input.
#[derive(Debug)]
pub struct NodeDetector {
    config: DetectionConfig,
    schedule: Schedule,
    hists: Vec<Mutex<SpaceSaving>>,
    processed: AtomicU64,
    step: AtomicUsize,
    progress: Mutex<Progress>,
}

/// Where a node's detection stands (behind one lock: iterations run one at a time).
#[derive(Debug, Default)]
struct Progress {
    /// The next iteration to run.
    next: usize,
    /// Tuples routed when the last iteration ran.
    processed: u64,
    /// Keys this node reported so far.
    reported: HashSet<u64>,
}

impl NodeDetector {
    pub fn new(config: &DetectionConfig, threads: usize, input_rows: u64) -> Self {
        NodeDetector {
            config: config.clone(),
            schedule: Schedule::new(config, input_rows),
            hists: (0..threads.max(1))
                .map(|_| Mutex::new(SpaceSaving::new(config.capacity)))
                .collect(),
            processed: AtomicU64::new(0),
            step: AtomicUsize::new(config.sample.max(1) as usize),
            progress: Mutex::new(Progress::default()),
        }
    }

    /// Count one routed tuple in this many (the configured `sample`, or a sparser
    /// sample after a quiet window), or `None` once the last iteration ran and counting
    /// would find nothing anyone reads; read it at each morsel or batch.
    pub fn step(&self) -> Option<usize> {
        match self.step.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }

    pub fn iterations(&self) -> usize {
        self.schedule.len()
    }

    /// The histogram of routing thread `t` (held for a whole morsel).
    pub fn histogram(&self, t: usize) -> &Mutex<SpaceSaving> {
        &self.hists[t % self.hists.len()]
    }

    /// Tuples routed so far.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Counts `n` more routed tuples; returns the reports of the iterations that became
    /// due (usually none). Iterations run in order, each exactly once.
    pub fn advance(&self, n: u64) -> Vec<NodeReport> {
        let processed = self.processed.fetch_add(n, Ordering::AcqRel) + n;
        let mut progress = self.progress.lock().expect("detector lock");
        let due = self.schedule.due(progress.next, processed);
        self.run(&mut progress, due, processed)
    }

    /// Runs every iteration not run yet (the input ended).
    pub fn finish(&self) -> Vec<NodeReport> {
        let mut progress = self.progress.lock().expect("detector lock");
        let due = self.schedule.len() - progress.next;
        self.run(&mut progress, due, self.processed())
    }

    fn run(&self, progress: &mut Progress, due: usize, processed: u64) -> Vec<NodeReport> {
        (0..due)
            .map(|_| {
                let iteration = progress.next as u32;
                progress.next += 1;
                // Several iterations due at once: the first takes the whole window.
                let window = processed - progress.processed;
                progress.processed = processed;
                let merged = self.merge_and_clear();
                let counted = merged.total();
                let sample = self.config.sample.max(1) as usize;
                let min_count = if self.step().is_some_and(|s| s > sample) {
                    MIN_SAMPLED_COUNT
                } else {
                    MIN_CANDIDATE_COUNT
                };
                let candidates: Vec<(u64, u64)> = candidates(&merged, &self.config, min_count)
                    .into_iter()
                    .map(|(k, c)| (k, scale(c, window, counted)))
                    .collect();
                let new_tuples: u64 = candidates
                    .iter()
                    .filter(|(k, _)| !progress.reported.contains(k))
                    .map(|(_, c)| c)
                    .sum();
                let quiet = (new_tuples as f64) < QUIET_NEW_SHARE * window as f64;
                progress.reported.extend(candidates.iter().map(|c| c.0));
                // 0: no iteration left (see `step`).
                let step = match self.schedule.window(progress.next) {
                    None => 0,
                    Some(next) if quiet => {
                        sample * DENSE_SAMPLE.max((next / SAMPLED_WINDOW_TUPLES) as usize)
                    }
                    Some(_) => sample * DENSE_SAMPLE,
                };
                self.step.store(step, Ordering::Relaxed);
                NodeReport {
                    iteration,
                    window,
                    candidates,
                    processed,
                    quiet,
                }
            })
            .collect()
    }

    fn merge_and_clear(&self) -> SpaceSaving {
        let mut merged = SpaceSaving::new(self.config.capacity);
        for h in &self.hists {
            let mut h = h.lock().expect("histogram lock");
            merged.merge(&h);
            h.clear();
        }
        merged
    }
}

/// `count` of `counted` sampled tuples, as tuples of a window of `window`.
fn scale(count: u64, window: u64, counted: u64) -> u64 {
    if counted == 0 || counted == window {
        count
    } else {
        (count as u128 * window as u128 / counted as u128) as u64
    }
}

/// A key seen fewer times than this in a window is never a candidate: in a small
/// window (a build side of a few thousand rows, 1% of it) the threshold share is below
/// one tuple, and every unique key would pass it.
pub const MIN_CANDIDATE_COUNT: u64 = 2;

/// The same guard in a sampled (quiet) window: a key sampled twice there stands for
/// `2 * DENSE_SAMPLE` tuples, far above the threshold of a small window, yet among
/// many uniform keys some are sampled twice by chance. Four times is rare by chance
/// (a key with 1% of the window is sampled about 19 times in 1,900 samples).
pub const MIN_SAMPLED_COUNT: u64 = 4;

/// Keys of a (merged) histogram whose guaranteed count exceeds the threshold share of
/// its window and is at least `min_count` ([`MIN_CANDIDATE_COUNT`], or
/// [`MIN_SAMPLED_COUNT`] in a sampled window), largest first, at most `max_reported`.
pub fn candidates(h: &SpaceSaving, config: &DetectionConfig, min_count: u64) -> Vec<(u64, u64)> {
    let bar = config.threshold * h.total() as f64;
    let mut out: Vec<(u64, u64)> = h
        .entries()
        .map(|c| (c.key, c.guaranteed()))
        .filter(|&(_, g)| g >= min_count && g as f64 > bar)
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.truncate(config.max_reported);
    out
}

/// One iteration's new heavy hitters: `(iteration, [(key, estimated frequency)])`.
pub type Announcement = (u32, Vec<(u64, u64)>);

#[derive(Debug, Default)]
struct IterationSum {
    reports: usize,
    window: u64,
    total: u64,
    counts: HashMap<u64, u64>,
}

/// The node that forms the global heavy-hitter list of one input from the nodes'
/// reports (pure logic; `exec` carries the messages).
#[derive(Debug)]
pub struct Coordinator {
    nodes: usize,
    /// Reports of an iteration that announce it: a majority of the nodes.
    quorum: usize,
    threshold: f64,
    iterations: Vec<IterationSum>,
    announced: usize,
    known: HashSet<u64>,
}

impl Coordinator {
    pub fn new(nodes: usize, iterations: usize, threshold: f64) -> Self {
        Coordinator {
            nodes,
            quorum: nodes / 2 + 1,
            threshold,
            iterations: (0..iterations).map(|_| IterationSum::default()).collect(),
            announced: 0,
            known: HashSet::new(),
        }
    }

    /// Adds one node's report; returns the announcements that became due, in
    /// iteration order: `(iteration, new heavy keys with estimated global frequency)`.
    /// An iteration is due once a majority of the nodes reported it and every earlier
    /// one was announced; it is announced exactly once, even without new keys. A
    /// report for an iteration already announced is added to the first one not
    /// announced yet (after the last, it changes nothing).
    pub fn add(
        &mut self,
        iteration: u32,
        window: u64,
        total: u64,
        candidates: &[(u64, u64)],
    ) -> Result<Vec<Announcement>, String> {
        let Some(it) = self.iterations.get_mut(iteration as usize) else {
            return Err(format!(
                "report for iteration {iteration}, but only {} run",
                self.iterations.len()
            ));
        };
        if it.reports == self.nodes {
            return Err(format!(
                "more than {} reports for iteration {iteration}",
                self.nodes
            ));
        }
        it.reports += 1;
        if let Some(sum) = self
            .iterations
            .get_mut((iteration as usize).max(self.announced))
        {
            sum.window += window;
            sum.total += total;
            for &(k, c) in candidates {
                *sum.counts.entry(k).or_default() += c;
            }
        }
        let mut out = vec![];
        while self.announced < self.iterations.len()
            && self.iterations[self.announced].reports >= self.quorum
        {
            let it = &self.iterations[self.announced];
            let bar = self.threshold * it.window as f64;
            let mut keys: Vec<(u64, u64)> = it
                .counts
                .iter()
                .filter(|&(k, &c)| c as f64 > bar && !self.known.contains(k))
                .map(|(&k, &c)| {
                    let est = (c as f64 / it.window.max(1) as f64 * it.total as f64) as u64;
                    (k, est.max(c))
                })
                .collect();
            keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            self.known.extend(keys.iter().map(|k| k.0));
            out.push((self.announced as u32, keys));
            self.iterations[self.announced].counts = HashMap::new();
            self.announced += 1;
        }
        Ok(out)
    }

    /// Whether every iteration was announced.
    pub fn complete(&self) -> bool {
        self.announced == self.iterations.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zipf::Zipf;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn schedule_runs_first_at_one_percent_then_periodically() {
        let c = DetectionConfig::default();
        let f = c.fractions();
        assert_eq!(f.len(), 10);
        assert!((f[0] - 0.01).abs() < 1e-12 && (f[9] - 0.91).abs() < 1e-9);
        let s = Schedule::new(&c, 10_000);
        assert_eq!(s.due(0, 99), 0);
        assert_eq!(s.due(0, 100), 1);
        assert_eq!(s.due(1, 2_200), 2);
        assert_eq!(s.window(0), Some(100));
        assert_eq!(s.window(1), Some(1_000));
        assert_eq!(s.window(10), None);
        // An empty input still runs every iteration (at once).
        let e = Schedule::new(&c, 0);
        assert_eq!(e.due(0, 0), 0);
        assert!(c.validate().is_ok());
        assert!(
            DetectionConfig {
                threshold: 0.0,
                ..c
            }
            .validate()
            .is_err()
        );
    }

    /// New keys just over the threshold (as in a Zipf tail) are reported but keep the
    /// next window sparsely sampled; a new key with a few percent of a window makes the
    /// next one denser (one in 16).
    #[test]
    fn only_new_candidates_a_sample_would_show_end_sampling() {
        let c = DetectionConfig::default();
        let det = NodeDetector::new(&c, 1, 2_000_000);
        let feed = |counts: &[(u64, u64)]| {
            let mut h = det.histogram(0).lock().unwrap();
            for &(k, n) in counts {
                (0..n).for_each(|_| h.update(k));
            }
        };
        // Window 0 (1% = 20 000 tuples): key 1 is new and large.
        feed(&[(1, 20_000)]);
        let r = det.advance(20_000);
        assert!(!r[0].quiet);
        // After the first window never every tuple again.
        assert_eq!(det.step(), Some(DENSE_SAMPLE));
        // Window 1 (200 000 tuples, 12 500 counted): keys 2 and 3 are new, counted 4
        // and 119 times (64 and 1 904 tuples), over the threshold (20 tuples) but less
        // than 1% of the window together.
        let mut window = vec![(1, 12_500 - 4 - 119 - 70), (2, 4), (3, 119)];
        window.extend((100..170).map(|k| (k, 1)));
        feed(&window);
        let r = det.advance(200_000);
        let keys: Vec<u64> = r[0].candidates.iter().map(|c| c.0).collect();
        assert_eq!(keys, [1, 3, 2]);
        assert!(r[0].quiet, "{:?}", r[0]);
        // The next window has 200 000 tuples: one in 48 gives about 4 096.
        assert_eq!(det.step(), Some(48));
        // Window 2, sampled (4 166 of ~200 000 counted): key 4, new, sampled 166 times
        // (4% of the window). (A few tuples more than 200 000: the point is 21% of the
        // input, rounded up.)
        feed(&[(1, 4_000), (4, 166)]);
        let r = det.advance(200_010);
        let keys: Vec<u64> = r[0].candidates.iter().map(|c| c.0).collect();
        assert_eq!(keys, [1, 4]);
        assert!(!r[0].quiet);
        assert_eq!(det.step(), Some(DENSE_SAMPLE));
    }

    /// Small windows are sampled one in DENSE_SAMPLE; after the last iteration nothing
    /// is counted any more.
    #[test]
    fn sampling_follows_the_next_window_and_stops_after_the_last() {
        let c = DetectionConfig {
            every: 0.5,
            ..DetectionConfig::default()
        };
        // Iterations at 1% and 51% of 100 000 tuples.
        let det = NodeDetector::new(&c, 1, 100_000);
        let r = det.advance(1_000);
        assert!(r[0].quiet);
        // The next window has 50 000 tuples: 50 000 / 4 096 = 12 is denser than 16.
        assert_eq!(det.step(), Some(DENSE_SAMPLE));
        assert_eq!(det.advance(50_000).len(), 1);
        assert_eq!(det.step(), None);
        assert!(det.advance(49_000).is_empty());
        assert!(det.finish().is_empty());
    }

    #[test]
    fn uniform_input_reports_nothing_and_zipf_reports_the_top_keys() {
        let c = DetectionConfig::default();
        let det = NodeDetector::new(&c, 2, 2_000_000);
        let mut rng = SmallRng::seed_from_u64(3);
        {
            // 20 000 distinct keys: every guaranteed count is at most 1, below the bar
            // of 0.01% of the window (2); the estimates (about 156) would all pass.
            let mut h = det.histogram(0).lock().unwrap();
            for i in 0..20_000u64 {
                h.update(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            assert!(h.entries().all(|e| e.count > 100));
        }
        let r = det.advance(20_000);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].window, 20_000);
        assert!(r[0].candidates.is_empty(), "{:?}", r[0].candidates);
        // Nothing new: the next window counts a sample only.
        assert!(r[0].quiet);
        assert_eq!(det.step(), Some(48));
        // A small window of unique keys (guaranteed counts 1 > 0.01% of 50) neither.
        let mut h = SpaceSaving::new(128);
        (0..50u64).for_each(|k| h.update(k));
        assert!(candidates(&h, &c, MIN_CANDIDATE_COUNT).is_empty());
        h.update(3);
        assert_eq!(candidates(&h, &c, MIN_CANDIDATE_COUNT), vec![(3, 2)]);
        // In a sampled window twice is not enough.
        assert!(candidates(&h, &c, MIN_SAMPLED_COUNT).is_empty());
        let z = Zipf::new(100_000, 1.25);
        for t in 0..2 {
            let mut h = det.histogram(t).lock().unwrap();
            for _ in 0..10_000 {
                h.update(z.sample(&mut rng));
            }
        }
        let r = det.advance(200_000);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].iteration, 1);
        let keys: Vec<u64> = r[0].candidates.iter().map(|c| c.0).collect();
        assert_eq!(&keys[..3], &[1, 2, 3]);
        // 20 000 tuples counted of 200 000 routed: counts are scaled by 10 (key 1 has
        // about 22% of a Zipf 1.25 stream).
        assert_eq!(r[0].window, 200_000);
        assert!(
            (35_000..55_000).contains(&r[0].candidates[0].1),
            "{:?}",
            r[0]
        );
        // New candidates: the next window counts one in 16 again.
        assert!(!r[0].quiet);
        assert_eq!(det.step(), Some(DENSE_SAMPLE));
        // The rest of the schedule runs at the end.
        assert_eq!(det.finish().len(), 8);
        assert!(det.finish().is_empty());
    }

    #[test]
    fn coordinator_sums_nodes_and_announces_each_iteration_once() {
        let mut c = Coordinator::new(2, 2, 0.1);
        assert!(c.add(0, 100, 1000, &[(7, 8), (9, 30)]).unwrap().is_empty());
        // Key 7: 8 + 15 = 23 > 0.1 * 200; key 9: 30 > 20; key 5: 5 < 20.
        let a = c.add(0, 100, 1000, &[(7, 15), (5, 5)]).unwrap();
        assert_eq!(a.len(), 1);
        let mut keys: Vec<u64> = a[0].1.iter().map(|k| k.0).collect();
        keys.sort();
        assert_eq!(keys, vec![7, 9]);
        // Estimates scale to the whole input: 30 / 200 * 2000.
        assert!(a[0].1.contains(&(9, 300)));
        c.add(1, 50, 1000, &[(7, 50)]).unwrap();
        let a = c.add(1, 50, 1000, &[(8, 50)]).unwrap();
        // 7 is known already; 8 is new.
        assert_eq!(a, vec![(1, vec![(8, 1000)])]);
        assert!(c.complete());
        assert!(c.add(1, 1, 1, &[]).is_err());
        assert!(c.add(5, 1, 1, &[]).is_err());
    }

    /// With 4 nodes an iteration is announced after 3 reports; the last node's report
    /// of it counts towards the next iteration, and after the last it changes nothing.
    #[test]
    fn a_majority_announces_and_late_reports_count_later() {
        let mut c = Coordinator::new(4, 2, 0.1);
        assert!(c.add(0, 100, 1000, &[(7, 40)]).unwrap().is_empty());
        assert!(c.add(1, 100, 1000, &[]).unwrap().is_empty());
        assert!(c.add(0, 100, 1000, &[]).unwrap().is_empty());
        // Third report of iteration 0: 40 > 0.1 * 300.
        let a = c.add(0, 100, 1000, &[]).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].0, 0);
        assert_eq!(a[0].1.iter().map(|k| k.0).collect::<Vec<_>>(), [7]);
        // The fourth node's iteration 0 (key 9) joins iteration 1's sums: 9 has 60 of
        // 200 tuples there once two more reports came.
        assert!(c.add(0, 100, 1000, &[(9, 60)]).unwrap().is_empty());
        assert!(c.add(1, 0, 1000, &[]).unwrap().is_empty());
        let a = c.add(1, 0, 1000, &[]).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].0, 1);
        assert_eq!(a[0].1.iter().map(|k| k.0).collect::<Vec<_>>(), [9]);
        assert!(c.complete());
        // The last report after everything was announced: accepted, nothing new.
        assert!(c.add(1, 100, 1000, &[(11, 100)]).unwrap().is_empty());
        assert!(
            c.add(1, 1, 1, &[]).is_err(),
            "a fifth report of iteration 1"
        );
        // One or two nodes: every node must report.
        let mut two = Coordinator::new(2, 1, 0.1);
        assert!(two.add(0, 10, 10, &[]).unwrap().is_empty());
        assert_eq!(two.add(0, 10, 10, &[]).unwrap().len(), 1);
    }
}
