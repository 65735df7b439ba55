//! What `serve` reloads while it runs, each through the shell's [`Reloader`](crate::shell::Reloader): the serving
//! certificate ([`CertFiles`]) and `--objects-dir` ([`ObjectsDir`]).
//!
//! `--objects-dir` is fingerprinted by a hash of every file `Snapshot::load_dir` would read, so
//! edits, new files, deletions and a ConfigMap volume's `..data` symlink swap are all seen.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use super::metrics::{Metrics, Reloaded};
use crate::objects::dir::object_files;
use crate::objects::{LoadError, Snapshot, SnapshotReader};
use crate::shell::{Gate, Live, Readiness, Reload};
use crate::tls::{LoadedPair, PairBytes, TlsError, TlsFiles};

/// The [`Snapshot`] `serve` reads, replaced while requests read it.
pub type LiveSnapshot = Live<Snapshot>;

impl SnapshotReader for Live<Snapshot> {
    fn with_snapshot<R>(&self, read: impl FnOnce(&Snapshot) -> R) -> R {
        self.with(read)
    }
}

/// The serving certificate's files.
#[derive(Debug)]
pub struct CertFiles {
    /// The files.
    pub files: TlsFiles,
    /// Counts `tls_reloads`.
    pub metrics: Arc<Metrics>,
}

impl Reload for CertFiles {
    type Value = LoadedPair;
    type Content = PairBytes;
    type Error = TlsError;

    fn read(&self) -> Result<(u64, PairBytes), TlsError> {
        let pair = PairBytes::read(&self.files)?;
        Ok((pair.fingerprint(), pair))
    }

    fn parse(&self, content: PairBytes) -> Result<LoadedPair, TlsError> {
        content.parse(&self.files)
    }

    fn reloaded(&self, _: &LoadedPair) {
        tracing::info!(cert = %self.files.cert.display(), "serving the new TLS certificate");
        self.metrics.reload(Reloaded::Tls, "reloaded");
    }

    fn failed(&self, error: Option<TlsError>) {
        match error {
            Some(error) => tracing::error!(
                %error,
                "TLS certificate files changed but cannot be used; still serving the previous certificate"
            ),
            None => tracing::error!(
                "reading the TLS certificate files panicked; still serving the previous certificate"
            ),
        }
        self.metrics.reload(Reloaded::Tls, "failed");
    }
}

/// `--objects-dir`: loading it passes `gate` of `readiness`.
#[derive(Debug)]
pub struct ObjectsDir {
    /// The directory.
    pub dir: PathBuf,
    /// Counts `objects_reloads`.
    pub metrics: Arc<Metrics>,
    /// Passed at the first good load.
    pub readiness: Readiness,
    /// The gate passed.
    pub gate: Gate,
}

impl Reload for ObjectsDir {
    type Value = Snapshot;
    type Content = ();
    type Error = LoadError;

    /// A hash of the paths and content of the files `Snapshot::load_dir` reads (the same rules:
    /// hidden entries skipped, `*.yaml`, `*.yml`, `*.json`, symlinks followed); `load_dir`
    /// reads them again if they changed.
    fn read(&self) -> Result<(u64, ()), LoadError> {
        let mut hasher = DefaultHasher::new();
        for path in object_files(&self.dir)? {
            let content = std::fs::read(&path).map_err(|source| LoadError::Read {
                path: path.clone(),
                source,
            })?;
            path.hash(&mut hasher);
            content.hash(&mut hasher);
        }
        Ok((hasher.finish(), ()))
    }

    fn parse(&self, (): ()) -> Result<Snapshot, LoadError> {
        Snapshot::load_dir(&self.dir)
    }

    fn reloaded(&self, snapshot: &Snapshot) {
        tracing::info!(dir = %self.dir.display(), objects = snapshot.len(), "loaded --objects-dir");
        self.readiness.pass(self.gate);
        self.metrics.reload(Reloaded::ObjectsDir, "reloaded");
    }

    fn failed(&self, error: Option<LoadError>) {
        match error {
            Some(error) => tracing::error!(
                %error,
                "--objects-dir cannot be loaded; keeping the last good objects"
            ),
            None => {
                tracing::error!("loading --objects-dir panicked; keeping the last good objects")
            }
        }
        self.metrics.reload(Reloaded::ObjectsDir, "failed");
    }
}
