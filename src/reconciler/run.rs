//! Wiring of `mpi-webhook reconcile`: the kube client, the probe server, leader election and,
//! for each leadership term, fresh [`Controller`]s over TrainJobs and JobSet-mode JobSets.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::cli::ReconcileArgs;
use crate::mpi::jobset_mode::IMPLEMENTATION_LABEL;
use crate::mpi::objects_for::{self, runtime_ref};
use crate::mpi::ssh_secret::generate_key_pair;
use crate::mpi::{MANAGED_BY_LABEL, MANAGER};
use crate::objects::cluster::{CacheMetrics, Observer, Watch, Watches, identity, watch_config};
use crate::shell::probes::{self, Gate, Readiness};

use super::cached::{configmap_read, jobset_read};
use super::context::{Applied, AppliedConfigMaps, Context, ContextParts, EnsuredSecrets};
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

/// One leadership term: its watches (each kind once, [`Watches`]) and the two controllers
/// over them, reconciling TrainJobs and JobSet-mode JobSets, and reporting their
/// launchers' failed runs, until `stop` resolves.
///
/// The watches live for the term, not for the process: a standby caches nothing (no memory
/// for jobs it does not reconcile, and no watch on the API server), and a new leader lists
/// everything once (from the API server's watch cache), which also tells its fresh controllers
/// of every owner, as before. Watches that outlived the term would need the new controllers
/// told of every cached owner at the start of each term, and their observers rewired.
pub(super) async fn lead(shared: &Shared, leader: watch::Receiver<bool>, stop: TermEnd) {
    shared.metrics.set_leader(true);
    let Term {
        watches,
        ctx,
        train_jobs,
        jobsets,
        jobset_store,
        jobsets_listed,
    } = term(shared, leader.clone());
    let stop = stop.shared();
    let train_jobs = train_jobs
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(logged);
    // The launcher-Pod watch reads the TrainJob controller's caches, once they are listed.
    let (objects, caches_ready) = (ctx.objects.clone(), ctx.caches_ready.clone());
    let jobset_reconciles = jobsets
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(logged);
    let launcher_pods = LauncherPods {
        client: shared.client.clone(),
        jobsets: jobset_store,
        jobsets_listed,
        objects,
        caches_ready,
        leader,
        events: shared.events.clone(),
        metrics: shared.metrics.clone(),
        cache_metrics: shared.cache_metrics.clone(),
    };
    // Ends with the term; the controllers end once their reconciles in flight are done.
    let failed_runs = async {
        futures::future::select(std::pin::pin!(launcher_pods.run()), stop).await;
    };
    let controllers = futures::future::join3(train_jobs, jobset_reconciles, failed_runs);
    // The watches run until the controllers are done (a reconcile in flight may still wait
    // for a cache), then stop with the term.
    futures::future::select(std::pin::pin!(controllers), std::pin::pin!(watches.run())).await;
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

/// The label selector of everything the reconciler creates, so its ConfigMap and NetworkPolicy
/// watches never see (or cache) anybody else's. Secrets are not watched at all (Decision 22).
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGER}")
}

/// One term's watches, the context over their caches, and the two controllers.
struct Term {
    watches: Watches,
    ctx: Arc<Context>,
    train_jobs: Controller<TrainJob>,
    jobsets: Controller<JobSet>,
    /// The JobSet-mode JobSets (the JobSet controller's cache).
    jobset_store: Store<JobSet>,
    /// Raised once `jobset_store` holds its first list (kube's `Store::wait_until_ready` wakes
    /// only one waiter, and the controller is one already).
    jobsets_listed: watch::Receiver<bool>,
}

/// Builds a term: one watch of each kind ([`Watches`]), the TrainJob controller (TrainJobs
/// drive it; our labelled ConfigMaps and NetworkPolicies trigger their owner; a changed runtime
/// triggers the TrainJobs using it; no Secret is watched or read, Decision 22) and the JobSet-mode controller
/// (JobSets carrying the label, selected by the API server so no other JobSet is cached, and
/// the same owned objects). Both controllers read the same caches and hear of changes from the
/// same watches ([`Triggers`]), and share one context.
fn term(shared: &Shared, leader: watch::Receiver<bool>) -> Term {
    let client = &shared.client;
    let (triggers, train_job_triggers, jobset_triggers) = Triggers::channels();
    let mut watches = Watches::new(client.clone(), shared.cache_metrics.clone());
    // An owner that changed is forgotten before its reconcile is asked for: that reconcile
    // sends the Secret's create again (Decision 22).
    let ensured = Arc::<EnsuredSecrets>::default();
    let jobs = watches.train_jobs(Some(forgetting(
        &ensured,
        triggers.applied(|t| &t.train_jobs),
    )));
    let runtimes = |watches: &mut Watches, kind| {
        let users = users_of(jobs.clone(), kind);
        watches.runtimes(kind, Some(triggers.users(users)))
    };
    let local = runtimes(&mut watches, RuntimeKind::TrainingRuntime);
    let cluster = runtimes(&mut watches, RuntimeKind::ClusterTrainingRuntime);
    let objects = watches.objects(jobs.clone(), local, cluster);
    let (listed_tx, jobsets_listed) = watch::channel(false);
    let jobset_applied = forgetting(&ensured, triggers.applied(|t| &t.jobsets));
    let jobset_store = watches.watch(
        Watch {
            api: Api::<JobSet>::all(client.clone()),
            dyntype: (),
            config: watch_config().labels(IMPLEMENTATION_LABEL),
            resource: "jobsets",
            trim: jobset_read,
        },
        Some(Box::new(move |event| {
            jobset_applied(event);
            if matches!(event, watcher::Event::InitDone) {
                listed_tx.send_replace(true);
            }
        })),
    );
    let applied = Arc::<AppliedConfigMaps>::default();
    let applied_policies = Arc::<Applied<NetworkPolicy>>::default();
    let owned = watch_config().labels(&managed_selector());
    let seen = Arc::clone(&applied);
    let configmaps = watches.watch(
        Watch {
            api: Api::<ConfigMap>::all(client.clone()),
            dyntype: (),
            config: owned.clone(),
            resource: "configmaps",
            trim: configmap_read,
        },
        Some(triggers.owners(move |event| seen.observe(event))),
    );
    let seen = Arc::clone(&applied_policies);
    let network_policies = watches.watch(
        Watch {
            api: Api::<NetworkPolicy>::all(client.clone()),
            dyntype: (),
            config: owned,
            resource: "networkpolicies",
            trim: identity,
        },
        Some(triggers.owners(move |event| seen.observe(event))),
    );
    let ctx = Arc::new(Context::new(ContextParts {
        client: client.clone(),
        objects,
        ensured,
        configmaps,
        network_policies,
        applied,
        applied_policies,
        events: shared.events.clone(),
        metrics: shared.metrics.clone(),
        leader,
        keygen: generate_key_pair,
        object_options: shared.object_options,
    }));
    let config = controller::Config::default().concurrency(CONCURRENCY);
    let train_jobs = Controller::for_stream(futures::stream::empty(), jobs)
        .with_config(config.clone())
        .reconcile_on(train_job_triggers);
    let jobsets = Controller::for_stream(futures::stream::empty(), jobset_store.clone())
        .with_config(config)
        .reconcile_on(jobset_triggers);
    Term {
        watches,
        ctx,
        train_jobs,
        jobsets,
        jobset_store,
        jobsets_listed,
    }
}

/// How the controllers hear of changes: each watch's [`Observer`] sends the owners to reconcile
/// to the controller of their kind. A TrainJob or JobSet that is added, changed or listed again
/// is its own; a ConfigMap or NetworkPolicy of ours that is added, changed, deleted (by
/// somebody else: its owner makes it again) or listed again names its owners (a Secret is not
/// watched: a deleted one is made again at its owner's next change, Decision 22); a changed runtime,
/// the TrainJobs using it. The channels are unbounded, but the controllers drain them at once
/// into their queues, which merge requests for the same owner; they never fail, so no watch's
/// error or backoff holds up another watch's events.
#[derive(Clone)]
pub(super) struct Triggers {
    pub(super) train_jobs: mpsc::UnboundedSender<ObjectRef<TrainJob>>,
    pub(super) jobsets: mpsc::UnboundedSender<ObjectRef<JobSet>>,
}

/// The owners one controller is asked to reconcile.
pub(super) type Requests<K> = mpsc::UnboundedReceiver<ObjectRef<K>>;

impl Triggers {
    /// The senders, and the requests of each controller.
    pub(super) fn channels() -> (Self, Requests<TrainJob>, Requests<JobSet>) {
        let (train_jobs, train_job_requests) = mpsc::unbounded();
        let (jobsets, jobset_requests) = mpsc::unbounded();
        let triggers = Self {
            train_jobs,
            jobsets,
        };
        (triggers, train_job_requests, jobset_requests)
    }

    /// An observer of the owners' own watch: an applied (or listed) object is reconciled by the
    /// controller `to` picks. A closed channel is a term that is ending: nothing to do.
    pub(super) fn applied<K>(
        &self,
        to: fn(&Self) -> &mpsc::UnboundedSender<ObjectRef<K>>,
    ) -> Observer<K>
    where
        K: Resource<DynamicType = ()> + 'static,
    {
        let triggers = self.clone();
        Box::new(move |event| {
            if let watcher::Event::Apply(owner) | watcher::Event::InitApply(owner) = event {
                let _ = to(&triggers).unbounded_send(bare(ObjectRef::from_obj(owner)));
            }
        })
    }

    /// An observer of a runtime kind's watch: `users` of an applied runtime are reconciled.
    pub(super) fn users(
        &self,
        users: impl Fn(&TrainingRuntime) -> Vec<ObjectRef<TrainJob>> + Send + Sync + 'static,
    ) -> Observer<TrainingRuntime> {
        let triggers = self.clone();
        Box::new(move |event| {
            if let watcher::Event::Apply(runtime) | watcher::Event::InitApply(runtime) = event {
                for job in users(runtime) {
                    let _ = triggers.train_jobs.unbounded_send(bare(job));
                }
            }
        })
    }

    /// An observer of an owned kind's watch: `also` is shown every event first (the
    /// [`Applied`] records, which a reconcile reads), then the owners of an object that is
    /// applied, listed or deleted are reconciled.
    pub(super) fn owners<K: Resource>(
        &self,
        also: impl Fn(&watcher::Event<K>) + Send + Sync + 'static,
    ) -> Observer<K> {
        let triggers = self.clone();
        Box::new(move |event| {
            also(event);
            if let watcher::Event::Apply(child)
            | watcher::Event::InitApply(child)
            | watcher::Event::Delete(child) = event
            {
                triggers.owners_of(child.meta());
            }
        })
    }

    fn owners_of(&self, child: &ObjectMeta) {
        let namespace = child.namespace.as_deref();
        for owner in child.owner_references.iter().flatten() {
            if let Some(job) = ObjectRef::<TrainJob>::from_owner_ref(namespace, owner, ()) {
                let _ = self.train_jobs.unbounded_send(bare(job));
            } else if let Some(jobset) = ObjectRef::<JobSet>::from_owner_ref(namespace, owner, ()) {
                let _ = self.jobsets.unbounded_send(bare(jobset));
            }
        }
    }
}

/// A request without the UID and resource version kube's references carry: the controllers'
/// queues hold one per owner (10,000 at a start), and they find the owner by namespace and name
/// alone (a reference's equality and hash ignore the rest).
fn bare<K: Resource>(mut request: ObjectRef<K>) -> ObjectRef<K> {
    request.extra = Default::default();
    request
}

/// `then`, after `ensured` forgot an owner its event shows changed or deleted.
fn forgetting<K: Resource + 'static>(
    ensured: &Arc<EnsuredSecrets>,
    then: Observer<K>,
) -> Observer<K> {
    let ensured = Arc::clone(ensured);
    Box::new(move |event| {
        ensured.observe(event);
        then(event);
    })
}

/// Maps a changed runtime of `kind` to the TrainJobs that use it.
pub fn users_of(
    jobs: Store<TrainJob>,
    kind: RuntimeKind,
) -> impl Fn(&TrainingRuntime) -> Vec<ObjectRef<TrainJob>> + Send + Sync + 'static {
    move |runtime| {
        jobs.state()
            .iter()
            .filter(|job| uses(job, kind, runtime))
            .map(|job| ObjectRef::from_obj(job.as_ref()))
            .collect()
    }
}

fn uses(job: &TrainJob, kind: RuntimeKind, runtime: &TrainingRuntime) -> bool {
    let same_namespace = kind == RuntimeKind::ClusterTrainingRuntime
        || runtime.metadata.namespace.as_deref() == Some(job.namespace());
    same_namespace && runtime_ref(job).is_ok_and(|r| r == (kind, runtime.name()))
}
