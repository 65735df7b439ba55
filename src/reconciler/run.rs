//! Wiring of `mpi-webhook reconcile`: the kube client, the probe server, leader election and,
//! for each leadership term, fresh [`Controller`]s over TrainJobs and JobSet-mode JobSets.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::cli::ReconcileArgs;
use crate::mpi::jobset_mode::IMPLEMENTATION_LABEL;
use crate::mpi::objects_for::{self, runtime_ref};
use crate::mpi::ssh_secret::generate_key_pair;
use crate::mpi::{MANAGED_BY_LABEL, MANAGER};
use crate::objects::cluster::{
    CacheMetrics, ClusterObjects, identity, reflect, retried, watch_config,
};
use crate::shell::probes::{self, Gate, Readiness};

use super::context::{Context, ContextParts};
use super::error::Error;
use super::events::Events;
use super::launcher_pods::LauncherPods;
use super::leader::{LeaseSettings, TermEnd, elect, run_while_leader};
use super::metrics::ReconcileMetrics;
use super::reconcile::{error_policy, reconcile};

/// Timeout of every Lease request: below the renewal grace, so a hung renewal fails (and the
/// replica steps down) before the Lease can expire and be taken by another replica.
const LEASE_REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// TrainJobs reconciled at once.
const CONCURRENCY: u16 = 8;
/// What `/readyz` waits for: the probe server and the election (or the only writer) started.
const STARTED: Gate = Gate("starting");

/// `reconcile` could not start, or its probe server failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("Kubernetes configuration: {0}")]
    Config(#[source] kube::config::InferConfigError),
    /// The kube client could not be built.
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The probe listener could not be bound or failed.
    #[error("--metrics-listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for SIGTERM could not be set up.
    #[error("installing the signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

impl ReconcileError {
    /// A short fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Config(_) => "config",
            ReconcileError::Client(_) => "client",
            ReconcileError::Listen { .. } => "listen",
            ReconcileError::Signal(_) => "signal",
        }
    }
}

/// What every leadership term shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) client: Client,
    /// Writes every Event, as this replica.
    pub(super) events: Events,
    pub(super) metrics: ReconcileMetrics,
    pub(super) cache_metrics: CacheMetrics,
    /// What the objects are configured with (`--network-policy-default`).
    pub(super) object_options: objects_for::Options,
}

/// Runs `mpi-webhook reconcile` until SIGTERM / Ctrl-C: probes on `--metrics-listen`, and the
/// controller while this replica leads (always, without `--leader-elect`).
///
/// # Errors
/// [`ReconcileError`] when the cluster configuration, the listener or the signal handler cannot
/// be set up.
pub async fn run(args: ReconcileArgs) -> Result<(), ReconcileError> {
    let config = kube::Config::infer()
        .await
        .map_err(ReconcileError::Config)?;
    let client = Client::try_from(config.clone()).map_err(ReconcileError::Client)?;
    let settings = lease_settings(&args, &client);
    let mut registry = Registry::with_prefix("mpi_webhook");
    let shared = Shared {
        events: Events::new(client.clone(), reporter(&settings.holder)),
        metrics: ReconcileMetrics::register(&mut registry),
        cache_metrics: CacheMetrics::register(&mut registry),
        object_options: objects_for::Options::from(&args.objects),
        client,
    };
    let readiness = Readiness::waiting_for(&[STARTED]);
    let (stop_tx, stop_rx) = watch::channel(false);
    let probe_server = serve_probes(
        args.metrics_listen,
        Arc::new(registry),
        readiness.clone(),
        stop_rx.clone(),
    )
    .await?;
    // The Lease is released only after the controller stopped, so a standby never starts
    // writing while this replica's last reconciles are still finishing.
    let (release_tx, release_rx) = watch::channel(false);
    let (leader, election) = if args.leader_elect {
        let lease_client = lease_client(config)?;
        let (tx, rx) = watch::channel(false);
        tracing::info!(lease = %settings.name, namespace = %settings.namespace, holder = %settings.holder, "leader election on");
        let election = tokio::spawn(elect(lease_client, settings, tx, release_rx));
        (rx, Some(election))
    } else {
        tracing::info!("leader election off: reconciling as the only writer");
        (leader_always(stop_rx.clone()), None)
    };
    readiness.pass(STARTED);
    let signal = crate::shutdown::shutdown_signal().map_err(ReconcileError::Signal)?;
    tokio::spawn(async move {
        signal.await;
        tracing::info!("shutting down");
        stop_tx.send_replace(true);
    });
    run_while_leader(leader.clone(), stop_rx, |stop| {
        lead(&shared, leader.clone(), stop)
    })
    .await;
    release_tx.send_replace(true);
    if let Some(election) = election
        && tokio::time::timeout(LEASE_REQUEST_TIMEOUT * 2, election)
            .await
            .is_err()
    {
        tracing::warn!("releasing the Lease timed out; it expires on its own");
    }
    let _ = probe_server.await;
    Ok(())
}

fn lease_settings(args: &ReconcileArgs, client: &Client) -> LeaseSettings {
    LeaseSettings {
        name: args.lease_name.clone(),
        namespace: args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string()),
        holder: args.lease_holder.clone().unwrap_or_else(hostname),
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("mpi-webhook-{}", std::process::id()))
}

fn reporter(holder: &str) -> Reporter {
    Reporter {
        controller: MANAGER.to_string(),
        instance: Some(holder.to_string()),
    }
}

/// A client whose requests fail fast: Lease renewals must not hang past the Lease's expiry.
fn lease_client(mut config: kube::Config) -> Result<Client, ReconcileError> {
    config.connect_timeout = Some(LEASE_REQUEST_TIMEOUT);
    config.read_timeout = Some(LEASE_REQUEST_TIMEOUT);
    config.write_timeout = Some(LEASE_REQUEST_TIMEOUT);
    Client::try_from(config).map_err(ReconcileError::Client)
}

/// Without leader election this replica always leads; the sender lives until shutdown.
fn leader_always(mut shutdown: watch::Receiver<bool>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
        tx.send_replace(false);
    });
    rx
}

/// `/healthz`, `/readyz` and `/metrics` on `addr`, until `stop`.
async fn serve_probes(
    addr: std::net::SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, ReconcileError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ReconcileError::Listen { addr, source })?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    let routes = probes::metrics_route(registry).merge(probes::probe_routes(readiness, None));
    Ok(probes::serve(
        "probe server",
        listener,
        routes,
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ))
}

/// One leadership term: fresh watches and caches, reconciling TrainJobs and JobSet-mode JobSets,
/// and reporting their launchers' failed runs, until `stop` resolves.
pub(super) async fn lead(shared: &Shared, leader: watch::Receiver<bool>, stop: TermEnd) {
    shared.metrics.set_leader(true);
    let (controller, ctx) = controller(shared, leader.clone());
    let ctx = Arc::new(ctx);
    let stop = stop.shared();
    let train_jobs = controller
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(logged);
    // The launcher-Pod watch reads the TrainJob controller's caches, once they are listed.
    let (objects, caches_ready) = (ctx.objects.clone(), ctx.caches_ready.clone());
    let (jobset_controller, jobsets, jobsets_listed) =
        jobset_controller(&shared.client, &shared.cache_metrics);
    let jobset_reconciles = jobset_controller
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(logged);
    let launcher_pods = LauncherPods {
        client: shared.client.clone(),
        jobsets,
        jobsets_listed,
        objects,
        caches_ready,
        leader,
        events: shared.events.clone(),
        metrics: shared.metrics.clone(),
        cache_metrics: shared.cache_metrics.clone(),
    };
    // Ends with the term; the controllers end once their reconciles in flight are done.
    let preflights = async {
        futures::future::select(std::pin::pin!(launcher_pods.run()), stop).await;
    };
    futures::future::join3(train_jobs, jobset_reconciles, preflights).await;
    shared.metrics.set_leader(false);
}

fn logged<K: kube::Resource>(
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<Error, watcher::Error>>,
) -> futures::future::Ready<()>
where
    K::DynamicType: std::fmt::Debug,
{
    match result {
        Ok((object, _)) => tracing::debug!(%object, "reconciled"),
        Err(controller::Error::ReconcilerFailed(..)) => {} // logged by the error policy
        Err(error) => tracing::debug!(%error, "controller"),
    }
    futures::future::ready(())
}

/// The JobSet-mode controller: JobSets carrying the label (selected by the API server, so no
/// other JobSet is cached), triggered again by our labelled Secrets (metadata only),
/// ConfigMaps and NetworkPolicies they own. It shares the TrainJob controller's context, caches included; these
/// watches only map owned objects to their JobSet. Each watch backs off on its own, as in
/// [`controller`]. Also returns its JobSet cache, and a flag raised once that cache holds its
/// first list (kube's `Store::wait_until_ready` wakes only one waiter, and the controller is
/// one already).
fn jobset_controller(
    client: &Client,
    metrics: &CacheMetrics,
) -> (Controller<JobSet>, Store<JobSet>, watch::Receiver<bool>) {
    let owned = watch_config().labels(&managed_selector());
    let jobsets = Writer::<JobSet>::new(());
    let store = jobsets.as_reader();
    let (listed_tx, listed) = watch::channel(false);
    let jobsets = reflect(
        watcher(
            Api::<JobSet>::all(client.clone()),
            watch_config().labels(IMPLEMENTATION_LABEL),
        ),
        jobsets,
        "jobsets",
        metrics,
    )
    .inspect_ok(move |event| {
        if matches!(event, watcher::Event::InitDone) {
            listed_tx.send_replace(true);
        }
    })
    .applied_objects();
    let secrets = retried(
        watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            owned.clone(),
        ),
        "secrets",
        metrics,
    );
    let configmaps = retried(
        watcher(Api::<ConfigMap>::all(client.clone()), owned.clone()),
        "configmaps",
        metrics,
    );
    let policies = retried(
        watcher(Api::<NetworkPolicy>::all(client.clone()), owned),
        "networkpolicies",
        metrics,
    );
    let controller = Controller::for_stream(jobsets, store.clone())
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .trigger_backoff(NoTriggerBackoff)
        .owns_stream(secrets.touched_objects())
        .owns_stream(configmaps.touched_objects())
        .owns_stream(policies.touched_objects());
    (controller, store, listed)
}

/// The controllers' trigger backoff: none, since every watch already backs off on its own
/// ([`retried`]). kube's default pauses the merged stream of all of a controller's watches on
/// any one watch's error; after an API server restart the watches' 410 Expired answers then
/// came one per pause of up to a minute, and no watch (not even the TrainJobs') was read, nor
/// relisted, for minutes.
#[derive(Clone, Copy, Debug)]
struct NoTriggerBackoff;

impl Iterator for NoTriggerBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoTriggerBackoff {
    fn reset(&mut self) {}
}

/// The label selector of everything the reconciler creates, so its Secret, ConfigMap and
/// NetworkPolicy watches never see (or cache) anybody else's.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGER}")
}

/// Builds the controller and its context: TrainJobs drive it; our labelled Secrets (metadata
/// only), ConfigMaps and NetworkPolicies trigger their owner; a changed runtime triggers the TrainJobs using it.
fn controller(shared: &Shared, leader: watch::Receiver<bool>) -> (Controller<TrainJob>, Context) {
    let (client, metrics) = (&shared.client, &shared.cache_metrics);
    let owned = watch_config().labels(&managed_selector());
    let jobs = Writer::<TrainJob>::new(());
    let jobs_store = jobs.as_reader();
    let secrets = Writer::<PartialObjectMeta<Secret>>::new(());
    let secrets_store = secrets.as_reader();
    let configmaps = Writer::<ConfigMap>::new(());
    let configmaps_store = configmaps.as_reader();
    let policies = Writer::<NetworkPolicy>::new(());
    let policies_store = policies.as_reader();
    let (local_store, local_stream) = runtimes(client, RuntimeKind::TrainingRuntime, metrics);
    let (cluster_store, cluster_stream) =
        runtimes(client, RuntimeKind::ClusterTrainingRuntime, metrics);
    let objects = ClusterObjects::from_stores(
        client.clone(),
        jobs_store.clone(),
        local_store,
        cluster_store,
        metrics.clone(),
    );
    let ctx = Context::new(ContextParts {
        client: client.clone(),
        objects,
        secrets: secrets_store,
        configmaps: configmaps_store,
        network_policies: policies_store,
        events: shared.events.clone(),
        metrics: shared.metrics.clone(),
        leader,
        keygen: generate_key_pair,
        object_options: shared.object_options,
    });
    let jobs_stream = reflect(
        watcher(Api::all(client.clone()), watch_config()).modify(identity),
        jobs,
        "trainjobs",
        metrics,
    )
    .applied_objects();
    let secrets_stream = reflect(
        watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            owned.clone(),
        )
        .modify(identity),
        secrets,
        "secrets",
        metrics,
    )
    .touched_objects();
    let applied = ctx.applied_configmaps();
    let configmaps_stream = reflect(
        watcher(Api::<ConfigMap>::all(client.clone()), owned.clone()).modify(identity),
        configmaps,
        "configmaps",
        metrics,
    )
    .inspect_ok(move |event| applied.observe(event))
    .touched_objects();
    let applied_policies = ctx.applied_network_policies();
    let policies_stream = reflect(
        watcher(Api::<NetworkPolicy>::all(client.clone()), owned).modify(identity),
        policies,
        "networkpolicies",
        metrics,
    )
    .inspect_ok(move |event| applied_policies.observe(event))
    .touched_objects();
    let controller = Controller::for_stream(jobs_stream, jobs_store.clone())
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .trigger_backoff(NoTriggerBackoff)
        .owns_stream(secrets_stream)
        .owns_stream(configmaps_stream)
        .owns_stream(policies_stream)
        .watches_stream_with(
            local_stream,
            users_of(jobs_store.clone(), RuntimeKind::TrainingRuntime),
            RuntimeKind::TrainingRuntime,
        )
        .watches_stream_with(
            cluster_stream,
            users_of(jobs_store, RuntimeKind::ClusterTrainingRuntime),
            RuntimeKind::ClusterTrainingRuntime,
        );
    (controller, ctx)
}

type RuntimeStream = futures::stream::BoxStream<'static, Result<TrainingRuntime, watcher::Error>>;

fn runtimes(
    client: &Client,
    kind: RuntimeKind,
    metrics: &CacheMetrics,
) -> (Store<TrainingRuntime>, RuntimeStream) {
    let writer = Writer::<TrainingRuntime>::new(kind);
    let store = writer.as_reader();
    let api = Api::<TrainingRuntime>::all_with(client.clone(), &kind);
    let stream = reflect(
        watcher(api, watch_config()),
        writer,
        kind.resource(),
        metrics,
    )
    .applied_objects()
    .boxed();
    (store, stream)
}

/// Maps a changed runtime of `kind` to the TrainJobs that use it.
pub fn users_of(
    jobs: Store<TrainJob>,
    kind: RuntimeKind,
) -> impl Fn(TrainingRuntime) -> Vec<ObjectRef<TrainJob>> + Send + Sync + 'static {
    move |runtime| {
        jobs.state()
            .iter()
            .filter(|job| uses(job, kind, &runtime))
            .map(|job| ObjectRef::from_obj(job.as_ref()))
            .collect()
    }
}

fn uses(job: &TrainJob, kind: RuntimeKind, runtime: &TrainingRuntime) -> bool {
    let same_namespace = kind == RuntimeKind::ClusterTrainingRuntime
        || runtime.metadata.namespace.as_deref() == Some(job.namespace());
    same_namespace && runtime_ref(job).is_ok_and(|r| r == (kind, runtime.name()))
}
