//! Prometheus metrics of `serve` (prometheus-client), served on `--metrics-listen` by the shell's
//! [`metrics_route`](crate::shell::probes::metrics_route).
//!
//! Labels are small fixed sets (route name, outcome, result): never object names, namespaces or
//! uids, so cardinality stays bounded however busy the cluster is.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::objects::cluster::CacheMetrics;

/// How one admission request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Allowed without a patch.
    Allowed,
    /// Allowed with a JSON patch.
    Patched,
    /// Denied by the policy.
    Denied,
    /// Denied because evaluation failed internally (fail closed).
    Error,
    /// The deadline expired (fail closed, or 408 while the body was still arriving).
    Timeout,
    /// HTTP 400: the body is not an AdmissionReview.
    BadRequest,
    /// HTTP 413: the body is over the limit.
    TooLarge,
    /// HTTP 503: too many large bodies already being reviewed until the deadline.
    Busy,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLarge => "too_large",
            Outcome::Busy => "busy",
        }
    }
}

impl From<&crate::admission::Outcome> for Outcome {
    /// The label of a review answered: the admission outcome, as the response and the log have it.
    fn from(outcome: &crate::admission::Outcome) -> Self {
        use crate::admission::Outcome as Answered;
        match outcome {
            Answered::Allowed => Outcome::Allowed,
            Answered::Patched { .. } => Outcome::Patched,
            Answered::Denied { .. } => Outcome::Denied,
            Answered::InternalError { .. } => Outcome::Error,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

/// Latency buckets in seconds: fine below the 2 ms target, coarse up to the 10 s deadline.
const LATENCY_BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// What a reload was of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The serving certificate (`tls_reloads`).
    Tls,
    /// `--objects-dir` (`objects_reloads`).
    ObjectsDir,
}

/// The metrics of one `serve` process.
pub struct Metrics {
    registry: Arc<Registry>,
    requests: Family<RequestLabels, Counter>,
    duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    patch_operations: Family<RouteLabels, Counter>,
    tls_reloads: Family<ResultLabels, Counter>,
    objects_reloads: Family<ResultLabels, Counter>,
    task_restarts: Family<TaskLabels, Counter>,
    ready: Gauge,
    cache: CacheMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `mpi_webhook` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mpi_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by route and outcome",
            requests.clone(),
        );
        let duration = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "admission_request_duration_seconds",
            "Time from the request's arrival to its response, by route",
            duration.clone(),
        );
        let patch_operations = Family::<RouteLabels, Counter>::default();
        registry.register(
            "admission_patch_operations",
            "JSON patch operations returned, by route",
            patch_operations.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Serving certificate changes seen on disk, by result (reloaded, failed)",
            tls_reloads.clone(),
        );
        let objects_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "objects_reloads",
            "--objects-dir changes seen, by result (reloaded, failed)",
            objects_reloads.clone(),
        );
        let task_restarts = Family::<TaskLabels, Counter>::default();
        registry.register(
            "task_restarts",
            "Background tasks restarted after a panic, by task",
            task_restarts.clone(),
        );
        let ready = Gauge::default();
        registry.register("ready", "1 when /readyz answers 200", ready.clone());
        let cache = CacheMetrics::register(&mut registry);
        Self {
            registry: Arc::new(registry),
            requests,
            duration,
            patch_operations,
            tls_reloads,
            objects_reloads,
            task_restarts,
            ready,
            cache,
        }
    }

    /// The watch-cache metrics (`watch_errors_total`, `cache_misses_total`) of the cluster source.
    pub fn cache(&self) -> &CacheMetrics {
        &self.cache
    }

    /// Records one admission request.
    pub fn observe_request(
        &self,
        route: &'static str,
        outcome: Outcome,
        seconds: f64,
        patch_operations: usize,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                outcome: outcome.as_str(),
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabels { route })
            .observe(seconds);
        if patch_operations > 0 {
            self.patch_operations
                .get_or_create(&RouteLabels { route })
                .inc_by(u64::try_from(patch_operations).unwrap_or(u64::MAX));
        }
    }

    /// Records a reload attempt (`"reloaded"` or `"failed"`).
    pub fn reload(&self, what: Reloaded, result: &'static str) {
        let family = match what {
            Reloaded::Tls => &self.tls_reloads,
            Reloaded::ObjectsDir => &self.objects_reloads,
        };
        family.get_or_create(&ResultLabels { result }).inc();
    }

    /// Records a background task restart.
    pub fn task_restart(&self, task: &'static str) {
        self.task_restarts.get_or_create(&TaskLabels { task }).inc();
    }

    /// The readiness gauge, which `/readyz` sets.
    pub fn ready(&self) -> Gauge {
        self.ready.clone()
    }

    /// Every metric, for `/metrics`.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }
}
