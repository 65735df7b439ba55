//! Background reloading for `serve`: the swappable object snapshot behind `--objects-dir`, the
//! poller that reloads it, and the supervisor that restarts any reload task that dies.
//!
//! `--objects-dir` is polled by content (a hash of every file `Snapshot::load_dir` would read),
//! so edits, new files, deletions and a ConfigMap volume's `..data` symlink swap are all seen. A
//! change is loaded off the async workers; a broken file keeps the last good snapshot and is
//! logged once per distinct content.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use crate::api::{RuntimeKind, TrainJob, TrainingRuntime};
use crate::metrics::Metrics;
use crate::objects::dir::object_files;
use crate::objects::{LoadError, LookupError, ObjectSource, Snapshot};
use crate::server::Readiness;

/// Pause before a dead task is restarted, so a task that dies at once does not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// A [`Snapshot`] that can be replaced while requests read it. Reads are lock-free.
#[derive(Debug, Default)]
pub struct LiveSnapshot {
    current: ArcSwap<Snapshot>,
}

impl LiveSnapshot {
    /// Starts with `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self {
            current: ArcSwap::from_pointee(snapshot),
        }
    }

    /// Replaces the snapshot.
    pub fn store(&self, snapshot: Snapshot) {
        self.current.store(Arc::new(snapshot));
    }

    /// The current snapshot.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }
}

impl ObjectSource for LiveSnapshot {
    async fn runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainingRuntime>>, LookupError> {
        Ok(self.current.load().get_runtime(kind, namespace, name))
    }

    async fn train_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainJob>>, LookupError> {
        Ok(self.current.load().get_train_job(namespace, name))
    }
}

/// Keeps a [`LiveSnapshot`] in step with a directory.
#[derive(Debug)]
pub struct DirReloader {
    dir: PathBuf,
    objects: Arc<LiveSnapshot>,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    /// Fingerprint of the content last loaded or last found broken.
    seen: Option<u64>,
}

impl DirReloader {
    /// A reloader of `dir` into `objects`; sets `readiness` after the first successful load.
    pub fn new(
        dir: PathBuf,
        objects: Arc<LiveSnapshot>,
        readiness: Readiness,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            dir,
            objects,
            readiness,
            metrics,
            seen: None,
        }
    }

    /// Loads the directory if its content changed since the last check; logs the result.
    pub async fn check(&mut self) {
        let dir = self.dir.clone();
        let seen = self.seen;
        let loaded = tokio::task::spawn_blocking(move || load_if_changed(&dir, seen)).await;
        match loaded {
            Ok(Change::None) => {}
            Ok(Change::Loaded(fingerprint, snapshot)) => {
                tracing::info!(dir = %self.dir.display(), objects = snapshot.len(), "loaded --objects-dir");
                self.objects.store(snapshot);
                self.seen = Some(fingerprint);
                self.readiness.set_objects_loaded();
                self.metrics.objects_reload("reloaded");
            }
            Ok(Change::Broken(fingerprint, e)) => {
                self.seen = Some(fingerprint);
                self.metrics.objects_reload("failed");
                tracing::error!(error = %e, "--objects-dir cannot be loaded; keeping the last good objects");
            }
            Err(e) => {
                self.metrics.objects_reload("failed");
                tracing::error!(error = %e, "loading --objects-dir panicked; keeping the last good objects");
            }
        }
    }
}

enum Change {
    None,
    Loaded(u64, Snapshot),
    Broken(u64, LoadError),
}

fn load_if_changed(dir: &Path, seen: Option<u64>) -> Change {
    let fingerprint = match fingerprint(dir) {
        Ok(f) => f,
        // Unreadable directory: report it once (fingerprint 0) through the loader's own error.
        Err(_) if seen == Some(0) => return Change::None,
        Err(e) => return Change::Broken(0, e),
    };
    if seen == Some(fingerprint) {
        return Change::None;
    }
    match Snapshot::load_dir(dir) {
        Ok(snapshot) => Change::Loaded(fingerprint, snapshot),
        Err(e) => Change::Broken(fingerprint, e),
    }
}

/// A hash of the paths and content of the files `Snapshot::load_dir` reads (the same rules:
/// hidden entries skipped, `*.yaml`, `*.yml`, `*.json`, symlinks followed).
fn fingerprint(dir: &Path) -> Result<u64, LoadError> {
    let mut hasher = DefaultHasher::new();
    for path in object_files(dir)? {
        let content = std::fs::read(&path).map_err(|source| LoadError::Read {
            path: path.clone(),
            source,
        })?;
        path.hash(&mut hasher);
        content.hash(&mut hasher);
    }
    Ok(hasher.finish())
}

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
