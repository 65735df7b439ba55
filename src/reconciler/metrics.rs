//! Prometheus metrics of `reconcile`, served on `--metrics-listen` with `/healthz` and `/readyz`
//! by the [shell](crate::shell).
//!
//! Labels are small fixed sets (error kind, object kind): never object names or namespaces.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::mpi::failed_run::Kind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabel {
    object: &'static str,
}

/// The reconciler's metrics. Cheap to clone (the metric handles are shared).
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    reconciles: Counter,
    failures: Family<ErrorLabel, Counter>,
    duration: Histogram,
    writes: Family<WriteLabel, Counter>,
    hostfile_conflicts: Counter,
    keys_generated: Counter,
    secrets_found: Counter,
    preflight_failures: Counter,
    launcher_failures: Counter,
    lost_workers: Counter,
    leader: Gauge,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            failures: Family::default(),
            // 1 ms .. ~16 s: a no-op reconcile is sub-millisecond, one with writes a few RTTs.
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            writes: Family::default(),
            hostfile_conflicts: Counter::default(),
            keys_generated: Counter::default(),
            secrets_found: Counter::default(),
            preflight_failures: Counter::default(),
            launcher_failures: Counter::default(),
            lost_workers: Counter::default(),
            leader: Gauge::default(),
        }
    }
}

impl ReconcileMetrics {
    /// New metrics registered into `registry` (expected to carry the `mpi_webhook` prefix):
    /// `reconciles_total`, `reconcile_errors_total{error}`, `reconcile_duration_seconds`,
    /// `writes_total{object}`, `hostfile_conflicts_total`, `ssh_keys_generated_total`,
    /// `secrets_found_total`, `preflight_failures_total`,
    /// `launcher_failures_total`, `lost_workers_total` and `leader`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "reconciles",
            "Reconciles started, of MPI TrainJobs and JobSet-mode JobSets",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error kind",
            metrics.failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles",
            metrics.duration.clone(),
        );
        registry.register(
            "writes",
            "Writes to the API server by object kind (secret, configmap, networkpolicy)",
            metrics.writes.clone(),
        );
        registry.register(
            "hostfile_conflicts",
            "Hostfile ConfigMap applies left undone because Kubeflow Trainer's field manager holds different values",
            metrics.hostfile_conflicts.clone(),
        );
        registry.register(
            "ssh_keys_generated",
            "SSH key pairs generated for Secret creates (a pair an AlreadyExists left unused is kept for the next create)",
            metrics.keys_generated.clone(),
        );
        registry.register(
            "secrets_found",
            "Secret creates answered AlreadyExists: the Secret was there (ours, Kubeflow Trainer's or a user's) and is used as is",
            metrics.secrets_found.clone(),
        );
        registry.register(
            "preflight_failures",
            "Failed launcher pre-flights (JobSet mode) recorded as PreflightFailed Events",
            metrics.preflight_failures.clone(),
        );
        registry.register(
            "launcher_failures",
            "Failed launcher runs recorded as LauncherFailed Events",
            metrics.launcher_failures.clone(),
        );
        registry.register(
            "lost_workers",
            "Workers lost before their launcher finished, recorded as WorkerLost Events (one per attempt of a job)",
            metrics.lost_workers.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the reconciler Lease and reconciles",
            metrics.leader.clone(),
        );
        metrics
    }

    /// Counts a reconcile and returns a guard that records its duration when dropped.
    pub fn start_reconcile(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.duration.clone(),
        }
    }

    /// Counts a failed reconcile.
    pub fn failure(&self, error: &'static str) {
        self.failures.get_or_create(&ErrorLabel { error }).inc();
    }

    /// Counts one write (`secret`, `configmap`).
    pub fn write(&self, object: &'static str) {
        self.writes.get_or_create(&WriteLabel { object }).inc();
    }

    /// Counts one hostfile ConfigMap left to Kubeflow Trainer (its manager holds other values).
    pub fn hostfile_conflict(&self) {
        self.hostfile_conflicts.inc();
    }

    /// Counts one SSH key pair generated.
    pub fn key_generated(&self) {
        self.keys_generated.inc();
    }

    /// SSH key pairs generated so far.
    pub fn keys_generated(&self) -> u64 {
        self.keys_generated.get()
    }

    /// Counts one Secret create answered AlreadyExists.
    pub fn secret_found(&self) {
        self.secrets_found.inc();
    }

    /// Secret creates answered AlreadyExists so far.
    pub fn secrets_found(&self) -> u64 {
        self.secrets_found.get()
    }

    /// Counts one failed run of a launcher Pod's container recorded as an Event.
    pub fn failed_run(&self, kind: Kind) {
        match kind {
            Kind::Preflight => self.preflight_failures.inc(),
            Kind::Launcher => self.launcher_failures.inc(),
        };
    }

    /// Counts one lost worker recorded as an Event.
    pub fn lost_worker(&self) {
        self.lost_workers.inc();
    }

    /// Lost workers recorded so far.
    pub fn lost_workers(&self) -> u64 {
        self.lost_workers.get()
    }

    /// Failed pre-flight runs recorded so far.
    pub fn preflight_failures(&self) -> u64 {
        self.preflight_failures.get()
    }

    /// Failed launcher runs recorded so far.
    pub fn launcher_failures(&self) -> u64 {
        self.launcher_failures.get()
    }

    /// Records whether this replica is the leader.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Failed reconciles of one error kind so far.
    pub fn failures(&self, error: &'static str) -> u64 {
        self.failures.get_or_create(&ErrorLabel { error }).get()
    }

    /// Hostfile conflicts with Kubeflow Trainer so far.
    pub fn hostfile_conflicts(&self) -> u64 {
        self.hostfile_conflicts.get()
    }

    /// Writes of one object kind so far.
    pub fn writes(&self, object: &'static str) -> u64 {
        self.writes.get_or_create(&WriteLabel { object }).get()
    }
}

/// Records a reconcile's duration on drop, whatever path the reconcile returned by.
#[derive(Debug)]
pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
