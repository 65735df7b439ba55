//! Where TrainJobs and runtimes come from (`--objects-dir`, the cluster, or the shipped runtimes).
//!
//! The admission logic asks an [`ObjectSource`]; [`Snapshot`] is the in-memory implementation
//! loaded from `--objects-dir` (see [`dir`]), and the cluster implementation wraps watch-backed
//! caches. Lookups are async only because a cluster source may fall back to a GET.
//!
//! [`runtime_of`] is the one lookup of a TrainJob's runtime (admission and the reconciler);
//! [`Snapshot::runtime_of`] answers the same at once, for `render`. Both end in the policy's
//! [`Resolved::found`], so they agree on which runtime a TrainJob runs on.

pub mod cluster;
pub mod dir;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::mpi::objects_for::{Problem, Resolved, runtime_ref};

pub use dir::LoadError;

/// A lookup failed for a reason other than "not found" (e.g. the API server is unreachable).
/// Only the cluster source can fail; the in-memory ones always answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The GET that a cache miss falls back to failed.
    #[error("getting {what}: {source}")]
    Api {
        /// The object asked for: `TrainJob namespace/name`, `TrainingRuntime namespace/name`,
        /// `ClusterTrainingRuntime name`.
        what: String,
        /// The API server's (or the connection's) error.
        #[source]
        source: kube::Error,
    },
}

/// Why a TrainJob's runtime is not at hand.
#[derive(Debug, thiserror::Error)]
pub enum Unresolved {
    /// `spec.runtimeRef` names neither runtime kind, or the runtime does not exist.
    #[error(transparent)]
    Problem(#[from] Problem),
    /// The lookup itself failed.
    #[error(transparent)]
    Lookup(#[from] LookupError),
}

/// The runtime `train_job` refers to, looked up in `objects` in `namespace` (ignored for a
/// ClusterTrainingRuntime).
///
/// # Errors
/// [`Unresolved`]: [`Problem::UnsupportedRuntime`], [`Problem::RuntimeNotFound`], or the
/// lookup's error.
pub async fn runtime_of<S: ObjectSource>(
    objects: &S,
    train_job: &TrainJob,
    namespace: &str,
) -> Result<Resolved, Unresolved> {
    let (kind, name) = runtime_ref(train_job)?;
    let found = objects.runtime(kind, namespace, name).await?;
    Ok(Resolved::found(kind, name, found)?)
}

/// Read access to TrainJobs and runtimes.
pub trait ObjectSource: Send + Sync {
    /// A TrainingRuntime (`namespace` is used) or ClusterTrainingRuntime (`namespace` ignored).
    fn runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<TrainingRuntime>>, LookupError>> + Send;

    /// A TrainJob.
    fn train_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<TrainJob>>, LookupError>> + Send;
}

/// An immutable set of objects, keyed by namespace and name.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    train_jobs: BTreeMap<(String, String), Arc<TrainJob>>,
    training_runtimes: BTreeMap<(String, String), Arc<TrainingRuntime>>,
    cluster_training_runtimes: BTreeMap<String, Arc<TrainingRuntime>>,
    /// JobSet-mode JobSets, which only `render` reads (admission gets its JobSet in the review).
    jobsets: BTreeMap<(String, String), Arc<JobSet>>,
}

impl Snapshot {
    /// Adds or replaces a TrainJob; returns whether one with the same key was replaced.
    pub fn insert_train_job(&mut self, train_job: TrainJob) -> bool {
        let key = (
            train_job.namespace().to_string(),
            train_job.name().to_string(),
        );
        self.train_jobs.insert(key, Arc::new(train_job)).is_some()
    }

    /// Adds or replaces a JobSet; returns whether one with the same key was replaced.
    pub fn insert_jobset(&mut self, jobset: JobSet) -> bool {
        let key = (jobset.namespace().to_string(), jobset.name().to_string());
        self.jobsets.insert(key, Arc::new(jobset)).is_some()
    }

    /// Every JobSet-mode JobSet in namespace/name order.
    pub fn jobsets(&self) -> impl Iterator<Item = &Arc<JobSet>> {
        self.jobsets.values()
    }

    /// Adds or replaces a runtime; returns whether one with the same key was replaced.
    pub fn insert_runtime(&mut self, kind: RuntimeKind, runtime: TrainingRuntime) -> bool {
        let name = runtime.name().to_string();
        match kind {
            RuntimeKind::TrainingRuntime => {
                let namespace = runtime.namespace().to_string();
                self.training_runtimes
                    .insert((namespace, name), Arc::new(runtime))
                    .is_some()
            }
            RuntimeKind::ClusterTrainingRuntime => self
                .cluster_training_runtimes
                .insert(name, Arc::new(runtime))
                .is_some(),
        }
    }

    /// Every TrainJob in namespace/name order.
    pub fn train_jobs(&self) -> impl Iterator<Item = &Arc<TrainJob>> {
        self.train_jobs.values()
    }

    /// Number of objects held, for logs.
    pub fn len(&self) -> usize {
        self.train_jobs.len()
            + self.training_runtimes.len()
            + self.cluster_training_runtimes.len()
            + self.jobsets.len()
    }

    /// Whether no object is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Synchronous runtime lookup.
    pub fn get_runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<TrainingRuntime>> {
        match kind {
            RuntimeKind::TrainingRuntime => self
                .training_runtimes
                .get(&(namespace.to_string(), name.to_string()))
                .cloned(),
            RuntimeKind::ClusterTrainingRuntime => {
                self.cluster_training_runtimes.get(name).cloned()
            }
        }
    }

    /// The runtime `train_job` refers to, in its namespace: [`runtime_of`], answered at once.
    ///
    /// # Errors
    /// [`Problem::UnsupportedRuntime`] or [`Problem::RuntimeNotFound`].
    pub fn runtime_of(&self, train_job: &TrainJob) -> Result<Resolved, Problem> {
        let (kind, name) = runtime_ref(train_job)?;
        let found = self.get_runtime(kind, train_job.namespace(), name);
        Resolved::found(kind, name, found)
    }

    /// Synchronous TrainJob lookup.
    pub fn get_train_job(&self, namespace: &str, name: &str) -> Option<Arc<TrainJob>> {
        self.train_jobs
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

/// An in-memory object source: its lookups read a [`Snapshot`] and never fail. Every such
/// source is an [`ObjectSource`] through this one implementation.
pub trait SnapshotReader: Send + Sync {
    /// Calls `read` with the current snapshot.
    fn with_snapshot<R>(&self, read: impl FnOnce(&Snapshot) -> R) -> R;
}

impl SnapshotReader for Snapshot {
    fn with_snapshot<R>(&self, read: impl FnOnce(&Snapshot) -> R) -> R {
        read(self)
    }
}

impl<T: SnapshotReader> ObjectSource for T {
    async fn runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainingRuntime>>, LookupError> {
        Ok(self.with_snapshot(|snapshot| snapshot.get_runtime(kind, namespace, name)))
    }

    async fn train_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainJob>>, LookupError> {
        Ok(self.with_snapshot(|snapshot| snapshot.get_train_job(namespace, name)))
    }
}
