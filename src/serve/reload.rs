//! Reloading `--objects-dir` for `serve`: the swappable object snapshot behind it and the poller
//! that reloads it (run under [`supervise`](super::supervise::supervise)).
//!
//! `--objects-dir` is polled by content (a hash of every file `Snapshot::load_dir` would read),
//! so edits, new files, deletions and a ConfigMap volume's `..data` symlink swap are all seen. A
//! change is loaded off the async workers; a broken file keeps the last good snapshot and is
//! logged once per distinct content.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::metrics::Metrics;
use super::readiness::Readiness;
use crate::objects::dir::object_files;
use crate::objects::{LoadError, Snapshot, SnapshotReader};

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

impl SnapshotReader for LiveSnapshot {
    fn with_snapshot<R>(&self, read: impl FnOnce(&Snapshot) -> R) -> R {
        read(&self.current.load())
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
