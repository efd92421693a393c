//! The progress line of `gyre sql` and `gyre local`: on stderr, only when it is a
//! terminal, from one second into a statement, redrawn five times a second and erased
//! when the statement ends.

use futures::future::BoxFuture;
use gyre_cluster::progress::ProgressReport;
use parking_lot::Mutex;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a statement runs before its progress shows.
const SHOW_AFTER: Duration = Duration::from_secs(1);
const REDRAW_EVERY: Duration = Duration::from_millis(200);
/// Erases the current terminal line.
const ERASE: &str = "\r\x1b[2K";

/// Runs `work`, showing `poll`'s reports on stderr meanwhile (see the module doc).
pub async fn with_progress<T, P>(work: impl Future<Output = T>, poll: P) -> T
where
    P: FnMut() -> BoxFuture<'static, Option<ProgressReport>> + Send + 'static,
{
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    show_progress(
        work,
        poll,
        Arc::new(Mutex::new(std::io::stderr())),
        SHOW_AFTER,
    )
    .await
}

/// [`with_progress`] drawing on `out` from `after` on.
async fn show_progress<T, P, W>(
    work: impl Future<Output = T>,
    mut poll: P,
    out: Arc<Mutex<W>>,
    after: Duration,
) -> T
where
    P: FnMut() -> BoxFuture<'static, Option<ProgressReport>> + Send + 'static,
    W: Write + Send + 'static,
{
    // `stopped` and `shown` change under `out`'s lock: no line is drawn after the erase.
    let shown = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let (drawn, ended, screen) = (Arc::clone(&shown), Arc::clone(&stopped), Arc::clone(&out));
    let ticker = tokio::spawn(async move {
        tokio::time::sleep(after).await;
        loop {
            if let Some(report) = poll().await {
                let mut w = screen.lock();
                if ended.load(Ordering::SeqCst) {
                    return;
                }
                let _ = write!(w, "{ERASE}{}", report.line());
                let _ = w.flush();
                drawn.store(true, Ordering::SeqCst);
            }
            tokio::time::sleep(REDRAW_EVERY).await;
        }
    });
    let result = work.await;
    ticker.abort();
    let mut w = out.lock();
    stopped.store(true, Ordering::SeqCst);
    if shown.load(Ordering::SeqCst) {
        let _ = write!(w, "{ERASE}");
        let _ = w.flush();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll() -> impl FnMut() -> BoxFuture<'static, Option<ProgressReport>> + Send + 'static {
        let mut rows = 0;
        move || {
            rows += 1000;
            let report = ProgressReport {
                rows,
                files_total: 3,
                ..Default::default()
            };
            Box::pin(async move { Some(report) })
        }
    }

    #[tokio::test]
    async fn a_long_statement_shows_its_progress_and_erases_it() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let slow = tokio::time::sleep(Duration::from_millis(700));
        show_progress(slow, poll(), Arc::clone(&out), Duration::from_millis(50)).await;
        let text = String::from_utf8(out.lock().clone()).unwrap();
        assert!(
            text.contains("\r\x1b[2K1.0 K rows, 0 B, 0/3 files"),
            "{text:?}"
        );
        assert!(text.ends_with(ERASE), "{text:?}");
        // Redrawn while it ran.
        assert!(text.matches(ERASE).count() >= 3, "{text:?}");
    }

    #[tokio::test]
    async fn a_short_statement_shows_nothing() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let quick = tokio::time::sleep(Duration::from_millis(10));
        show_progress(quick, poll(), Arc::clone(&out), Duration::from_millis(500)).await;
        assert!(out.lock().is_empty());
    }
}
