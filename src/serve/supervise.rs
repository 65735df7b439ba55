//! Keeping `serve`'s background tasks alive: a task that panics or ends is logged, counted and
//! started again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::metrics::Metrics;

/// Pause before a dead task is restarted, so a task that dies at once does not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Aborts the task when dropped, so cancelling a supervisor also stops what it supervises.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the task that `start` makes, forever: if it panics (or returns), the failure is logged at
/// error level, counted in `mpi_webhook_task_restarts`, and a new one is started after a short
/// pause. Aborting the returned handle stops the task too.
pub fn supervise<F, Fut>(name: &'static str, metrics: Arc<Metrics>, mut start: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let mut task = AbortOnDrop(tokio::spawn(start()));
            match (&mut task.0).await {
                Ok(()) => tracing::error!(task = name, "background task ended; restarting it"),
                Err(e) if e.is_panic() => {
                    tracing::error!(task = name, "background task panicked; restarting it");
                }
                Err(_) => return,
            }
            metrics.task_restart(name);
            tokio::time::sleep(RESTART_DELAY).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_panicking_task_is_restarted() {
        tokio::time::pause();
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let handle = supervise("test", Arc::new(Metrics::new()), move || {
            let counter = Arc::clone(&counter);
            async move {
                if counter.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("boom");
                }
                std::future::pending::<()>().await;
            }
        });
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        handle.abort();
    }
}
