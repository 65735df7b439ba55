//! `mpi-webhook reconcile`: the only part of mpi-webhook that writes to the cluster.
//!
//! For every TrainJob whose runtime has an MPI policy it creates the SSH Secret once (immutable,
//! never updated or rotated; an existing one, Kubeflow Trainer's or ours, is used as is; spec D.1)
//! and server-side applies the hostfile ConfigMap with field manager `mpi-webhook`, so edits and
//! drift are repaired (D.2), but never over Kubeflow Trainer's manager `trainer` (Decision 16): the
//! apply is sent without `force`, and retried with it only when no conflicting manager is Trainer's.
//! Which TrainJobs get objects, and
//! what the ConfigMap holds, is decided by [`crate::mpi::objects_for::hostfile_for`], the same code as
//! `render` and the webhook's JobSet patch (all start from [`crate::mpi::plan::MpiPlan`]).
//!
//! With `--network-policy-default` (TrainJobs, and JobSet-mode JobSets without the
//! `mpi-webhook.io/network-policy` annotation) or that annotation set to `true`, it also
//! server-side applies the NetworkPolicy `<name>-mpi` the same way as the ConfigMap,
//! before the Secret and the ConfigMap, so the job's pods (which wait for those two volumes)
//! never run unprotected. A policy that is no longer wanted is left in place, never deleted:
//! deleting a live job's isolation on a flag change is not the reconciler's to decide.
//!
//! [`reconcile`] and [`error_policy`] are the controller's two callbacks; [`run`] wires the
//! watches, leader election and the probe server.

mod conflict;
mod jobset;
mod leader;
mod metrics;
mod run;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch;

use crate::api::TrainJob;
use crate::mpi::objects_for::{Problem, hostfile_for, runtime_ref, train_job_network_policy};
use crate::mpi::ssh_secret::{KeyError, SshKeyPair, ssh_secret};
use crate::mpi::{
    HOSTFILE_NAME, MANAGER, Owner, hostfile_configmap_name, network_policy_name, ssh_secret_name,
};
use crate::objects::cluster::ClusterObjects;
use crate::objects::{LookupError, ObjectSource};

pub use leader::{LeaseSettings, TermEnd, run_while_leader};
pub use metrics::{Probes, ReconcileMetrics, probes_router};
pub use run::{ReconcileError, run};

/// First retry delay after a failed reconcile; doubled on every further failure.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay, and the delay for problems only a change to the TrainJob or its runtime
/// can fix (those changes trigger a reconcile through the watches anyway).
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How long a reconcile waits for the owned-object caches before deciding without them (a
/// cache miss then costs a GET and an apply, never a wrong write).
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream's Event reason for a TrainJob whose objects could not be built.
const FAILED_REASON: &str = "TrainJobResourcesCreationFailed";
/// Event reason for a hostfile ConfigMap left to Kubeflow Trainer (see [`HostfileConflict`]).
const HOSTFILE_CONFLICT_REASON: &str = "HostfileConflict";
/// Kubeflow Trainer's field manager: it applies the same hostfile ConfigMap on every reconcile
/// (with force), so forcing over it would make the two managers overwrite each other forever.
pub const TRAINER_MANAGER: &str = "trainer";

/// Why one reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime could not be looked up (API server error, not "not found").
    #[error("looking up the runtime: {0}")]
    RuntimeLookup(#[source] LookupError),
    /// No objects can be built: runtime missing, unsupported, or the hostfile too large.
    #[error("{0}")]
    Policy(#[source] Problem),
    /// GET of the Secret failed.
    #[error("failed to get the SSH auth Secret: {0}")]
    GetSecret(#[source] kube::Error),
    /// Key generation failed.
    #[error("failed to build SSH Auth secret: {0}")]
    Keys(#[source] KeyError),
    /// Creating the Secret failed (other than "already exists").
    #[error("failed to create the SSH auth Secret: {0}")]
    CreateSecret(#[source] kube::Error),
    /// Server-side apply of the ConfigMap failed.
    #[error("failed to apply the hostfile ConfigMap: {0}")]
    ApplyConfigMap(#[source] kube::Error),
    /// Server-side apply of the NetworkPolicy failed.
    #[error("failed to apply the NetworkPolicy: {0}")]
    ApplyNetworkPolicy(#[source] kube::Error),
    /// Reading Kubeflow Trainer's ConfigMap after a conflict failed.
    #[error("failed to get the hostfile ConfigMap: {0}")]
    GetConfigMap(#[source] kube::Error),
    /// Kubeflow Trainer's manager holds fields of the ConfigMap with other values: left as is.
    #[error("{0}")]
    HostfileConflict(HostfileConflict),
    /// This replica stopped being the leader: the reconcile stopped before writing.
    #[error("not the leader")]
    NotLeader,
}

impl Error {
    /// A short fixed label for the `reconcile_errors_total` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::RuntimeLookup(_) => "runtime_lookup",
            Error::Policy(Problem::RuntimeNotFound { .. }) => "runtime_not_found",
            Error::Policy(_) => "policy",
            Error::GetSecret(_) => "get_secret",
            Error::Keys(_) => "keys",
            Error::CreateSecret(_) => "create_secret",
            Error::ApplyConfigMap(_) => "apply_configmap",
            Error::ApplyNetworkPolicy(_) => "apply_networkpolicy",
            Error::GetConfigMap(_) => "get_configmap",
            Error::HostfileConflict(_) => "hostfile_conflict",
            Error::NotLeader => "not_leader",
        }
    }

    /// Whether only a change to the TrainJob or its runtime can fix this (no point retrying
    /// fast). A missing runtime is not: it is often created right after its TrainJob. Nor is a
    /// conflict with Trainer fixed by retrying: it is retried at the longest delay, in case
    /// Trainer's text changes.
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::Policy(
                Problem::UnsupportedRuntime(_)
                    | Problem::UnusableRuntime(_)
                    | Problem::HostfileTooLarge(_)
            ) | Error::HostfileConflict(_)
        )
    }

    /// The reason of the Warning Event published on the owner: `failed`, the owner kind's reason
    /// for objects that could not be built or written, unless the hostfile was left to Trainer.
    fn event_reason(&self, failed: &'static str) -> &'static str {
        match self {
            Error::HostfileConflict(_) => HOSTFILE_CONFLICT_REASON,
            _ => failed,
        }
    }
}

/// Kubeflow Trainer's field manager holds fields of the hostfile ConfigMap (normally
/// `.data.hostfile`) with values other than ours. Both are computed from the same TrainJob, so
/// this means Trainer's hostfile differs from ours (an implementation or version Trainer words
/// differently). Trainer re-applies its own on every reconcile, so mpi-webhook leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostfileConflict {
    /// The ConfigMap's name.
    pub configmap: String,
    /// The conflicting field paths, as the API server names them (`.data.hostfile`).
    pub fields: Vec<String>,
    /// Bytes of our `data.hostfile`.
    pub ours: usize,
    /// Bytes of the stored `data.hostfile` (0 when absent).
    pub theirs: usize,
}

impl std::fmt::Display for HostfileConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConfigMap {}: Kubeflow Trainer's field manager \"{TRAINER_MANAGER}\" holds {} with \
             other values, left as is: our hostfile is {} bytes, Trainer's is {} bytes",
            self.configmap,
            self.fields.join(", "),
            self.ours,
            self.theirs
        )
    }
}

/// What a successful reconcile wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The Secret was created.
    pub secret: bool,
    /// The ConfigMap was applied (created, changed or repaired).
    pub configmap: bool,
    /// The NetworkPolicy was applied (created, changed or repaired).
    pub network_policy: bool,
}

/// Everything a reconcile needs. One per leadership term (the caches belong to its watches).
pub struct Context {
    client: Client,
    /// TrainJob and runtime lookups (watch caches with a GET fallback).
    objects: ClusterObjects,
    /// Metadata of the Secrets we created (label-selected; never Secret data).
    secrets: Store<PartialObjectMeta<Secret>>,
    /// The ConfigMaps we applied (label-selected).
    configmaps: Store<ConfigMap>,
    recorder: Recorder,
    metrics: ReconcileMetrics,
    leader: watch::Receiver<bool>,
    retries: Retries,
    keygen: fn() -> Result<SshKeyPair, KeyError>,
    /// Resolves once every cache above holds its initial list. Reconciles wait on clones of
    /// this one future, never on the stores themselves: kube's `Store::wait_until_ready`
    /// keeps only the last waiting task's waker, so when several reconciles waited on a store
    /// at once (the first `CONCURRENCY` after a start) all but one slept until
    /// [`CACHE_SYNC_TIMEOUT`]. `Shared` wakes every clone.
    caches_ready: Shared<BoxFuture<'static, ()>>,
    /// ConfigMaps applied but not yet seen again by the ConfigMap watch.
    applied: Arc<AppliedConfigMaps>,
    /// The NetworkPolicies we applied (label-selected).
    network_policies: Store<NetworkPolicy>,
    /// NetworkPolicies applied but not yet seen again by their watch.
    applied_policies: Arc<Applied<NetworkPolicy>>,
    /// `--network-policy-default`.
    network_policy_default: bool,
}

impl Context {
    /// A context over the given caches. `leader` gates every write; `keygen` makes key pairs
    /// (tests pass a deterministic one).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        objects: ClusterObjects,
        secrets: Store<PartialObjectMeta<Secret>>,
        configmaps: Store<ConfigMap>,
        recorder: Recorder,
        metrics: ReconcileMetrics,
        leader: watch::Receiver<bool>,
        keygen: fn() -> Result<SshKeyPair, KeyError>,
    ) -> Self {
        let network_policies = ready_empty_store();
        let caches_ready = caches_ready(&secrets, &configmaps, &network_policies, &objects);
        Self {
            client,
            objects,
            secrets,
            configmaps,
            recorder,
            metrics,
            leader,
            retries: Retries::default(),
            keygen,
            caches_ready,
            applied: Arc::default(),
            network_policies,
            applied_policies: Arc::default(),
            network_policy_default: false,
        }
    }

    /// The same context with a cache of our NetworkPolicies and `--network-policy-default`
    /// (without it: an empty cache and `false`).
    #[must_use]
    pub fn with_network_policies(mut self, store: Store<NetworkPolicy>, default: bool) -> Self {
        self.caches_ready = caches_ready(&self.secrets, &self.configmaps, &store, &self.objects);
        self.network_policies = store;
        self.network_policy_default = default;
        self
    }

    /// What the NetworkPolicy watch must be shown, as [`Self::applied_configmaps`].
    pub fn applied_network_policies(&self) -> Arc<Applied<NetworkPolicy>> {
        Arc::clone(&self.applied_policies)
    }

    /// What the ConfigMap watch must be shown (every event, after the cache applied it), so
    /// that a reconcile can tell its own recent applies from a cache that missed a change.
    pub fn applied_configmaps(&self) -> Arc<AppliedConfigMaps> {
        Arc::clone(&self.applied)
    }

    /// Checked right before every write, so a replica that lost its Lease stops writing even
    /// while the controller is still shutting down.
    fn ensure_leader(&self) -> Result<(), Error> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    async fn caches_synced(&self) {
        if tokio::time::timeout(CACHE_SYNC_TIMEOUT, self.caches_ready.clone())
            .await
            .is_err()
        {
            tracing::debug!("caches not synced yet; deciding with GETs");
        }
    }

    /// Publishes an Event on `regarding` (the TrainJob, or in JobSet mode the JobSet).
    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        regarding: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &regarding.object_ref(&()))
            .await
        {
            tracing::warn!(%error, reason, "publishing an Event failed");
        }
    }
}

/// One future that resolves once every cache holds its initial list (see `caches_ready`).
fn caches_ready(
    secrets: &Store<PartialObjectMeta<Secret>>,
    configmaps: &Store<ConfigMap>,
    network_policies: &Store<NetworkPolicy>,
    objects: &ClusterObjects,
) -> Shared<BoxFuture<'static, ()>> {
    let (secrets, configmaps, network_policies, objects) = (
        secrets.clone(),
        configmaps.clone(),
        network_policies.clone(),
        objects.clone(),
    );
    async move {
        let _ = secrets.wait_until_ready().await;
        let _ = configmaps.wait_until_ready().await;
        let _ = network_policies.wait_until_ready().await;
        let _ = objects.synced().await;
    }
    .boxed()
    .shared()
}

/// A store that is empty and ready (its writer saw a complete, empty list).
fn ready_empty_store<K>() -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut writer = kube::runtime::reflector::store::Writer::<K>::new(());
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    writer.as_reader()
}

/// Per-object (TrainJob, or JobSet in JobSet mode) retry counters for exponential backoff;
/// reset by a successful reconcile.
#[derive(Debug)]
struct Retries<K = ObjectRef<TrainJob>>(Mutex<HashMap<K, u32>>);

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K: std::hash::Hash + Eq> Retries<K> {
    /// Bound on remembered TrainJobs (a deleted failing TrainJob leaves its counter behind).
    const MAX_ENTRIES: usize = 10_000;

    fn next_delay(&self, key: K) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= Self::MAX_ENTRIES {
            failures.clear();
        }
        let count = failures.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        RETRY_BASE
            .saturating_mul(2u32.saturating_pow(*count - 1))
            .min(RETRY_MAX)
    }

    fn forget(&self, key: &K) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// The objects (ConfigMaps, NetworkPolicies) this replica applied since their watch last said
/// anything about them.
///
/// Without it, a reconcile that runs after an apply but before the watch event of that apply
/// reaches the cache applies the same ConfigMap again and publishes a second `Created` Event.
/// That is the common case right after a create: the Secret's own watch event triggers the
/// next reconcile, often before the ConfigMap's event is in (1 to 3% of TrainJobs in the
/// reconciler bench). While an entry is here, the API server holds what we applied (in the
/// fields we own): it is recorded before the apply is sent, removed if the apply fails, and
/// removed by any watch event for that ConfigMap (an edit, a deletion, or our own apply
/// arriving); a relist, which may have missed deletions, removes them all. So a change by
/// anybody else still reaches the cache, removes the entry and is repaired as before.
/// The same holds for the NetworkPolicy ([`Applied`] of each kind).
#[derive(Debug)]
pub struct Applied<K: Resource<DynamicType = ()>>(Mutex<HashMap<ObjectRef<K>, K>>);

/// The ConfigMaps this replica applied (see [`Applied`]).
pub type AppliedConfigMaps = Applied<ConfigMap>;

impl<K: Resource<DynamicType = ()>> Default for Applied<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K: Resource<DynamicType = ()> + Clone + PartialEq> Applied<K> {
    /// Bound on remembered ConfigMaps (an apply that changes nothing has no event to remove
    /// its entry). Forgetting costs at most one more apply each.
    const MAX_ENTRIES: usize = 10_000;

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<K>, K>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `desired` as about to be applied.
    fn expect(&self, key: ObjectRef<K>, desired: &K) {
        let mut entries = self.entries();
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, desired.clone());
    }

    /// Whether `desired` is what we last applied and the watch has said nothing since.
    fn holds(&self, key: &ObjectRef<K>, desired: &K) -> bool {
        self.entries().get(key) == Some(desired)
    }

    fn forget(&self, key: &ObjectRef<K>) {
        self.entries().remove(key);
    }

    /// Follows the object's watch (after its cache applied `event`).
    pub fn observe(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object)
            | watcher::Event::Delete(object)
            | watcher::Event::InitApply(object) => {
                self.forget(&ObjectRef::from_obj(object));
            }
            watcher::Event::Init => self.entries().clear(),
            watcher::Event::InitDone => {}
        }
    }
}

/// Reconciles one TrainJob: Secret if absent, then the ConfigMap if it differs from the cache.
/// Publishes a Normal Event when it wrote something and a Warning Event when it failed.
///
/// # Errors
/// [`Error`] for anything that should be retried; [`error_policy`] decides when.
pub async fn reconcile(train_job: Arc<TrainJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start_reconcile();
    if train_job.metadata.deletion_timestamp.is_some() {
        // Garbage collection deletes the owned objects.
        return Ok(Action::await_change());
    }
    let result = reconcile_children(&train_job, &ctx).await;
    if result.is_ok() {
        ctx.retries.forget(&ObjectRef::from_obj(train_job.as_ref()));
    }
    report(
        &ctx,
        train_job.as_ref(),
        train_job.name(),
        result,
        FAILED_REASON,
    )
    .await
}

/// The outcome of one owner's reconcile as Events and the controller's answer: a Normal Event
/// `Created` for what was written; a Warning Event for a failure, with `failed` (the owner
/// kind's reason) or `HostfileConflict`; nothing when this replica is no longer the leader.
async fn report<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    name: &str,
    result: Result<Written, Error>,
    failed: &'static str,
) -> Result<Action, Error> {
    match result {
        Ok(written) => {
            if let Some(note) = written_note(name, written) {
                ctx.publish(owner, EventType::Normal, "Created", note).await;
            }
            Ok(Action::await_change())
        }
        Err(Error::NotLeader) => Ok(Action::await_change()),
        Err(error) => {
            let note = error.to_string();
            ctx.publish(owner, EventType::Warning, error.event_reason(failed), note)
                .await;
            Err(error)
        }
    }
}

/// Logs and counts the failure, then requeues: quickly at first, doubling up to 5 minutes.
pub fn error_policy(train_job: Arc<TrainJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failure(error.metric_label());
    let key = ObjectRef::from_obj(train_job.as_ref());
    let delay = if error.is_permanent() {
        RETRY_MAX
    } else {
        ctx.retries.next_delay(key)
    };
    tracing::warn!(
        namespace = train_job.namespace(),
        name = train_job.name(),
        %error,
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// The note of the `Created` Event for the objects of the TrainJob or JobSet named `owner`, in
/// the order they were written: `Applied NetworkPolicy <owner>-mpi, created Secret … and applied
/// ConfigMap …`.
fn written_note(owner: &str, written: Written) -> Option<String> {
    let parts: Vec<String> = [
        (
            written.network_policy,
            format!("applied NetworkPolicy {}", network_policy_name(owner)),
        ),
        (
            written.secret,
            format!("created Secret {}", ssh_secret_name(owner)),
        ),
        (
            written.configmap,
            format!("applied ConfigMap {}", hostfile_configmap_name(owner)),
        ),
    ]
    .into_iter()
    .filter_map(|(written, part)| written.then_some(part))
    .collect();
    let (last, rest) = parts.split_last()?;
    let note = if rest.is_empty() {
        last.clone()
    } else {
        format!("{} and {last}", rest.join(", "))
    };
    let mut chars = note.chars();
    let first = chars.next()?;
    Some(first.to_uppercase().chain(chars).collect())
}

async fn reconcile_children(train_job: &TrainJob, ctx: &Context) -> Result<Written, Error> {
    let (kind, runtime_name) = runtime_ref(train_job).map_err(Error::Policy)?;
    let runtime = ctx
        .objects
        .runtime(kind, train_job.namespace(), runtime_name)
        .await
        .map_err(Error::RuntimeLookup)?;
    let Some(configmap) =
        hostfile_for(train_job, kind, runtime.as_deref()).map_err(Error::Policy)?
    else {
        tracing::debug!(name = train_job.name(), "runtime has no MPI policy");
        return Ok(Written::default());
    };
    ctx.caches_synced().await;
    let network_policy = match train_job_network_policy(train_job, ctx.network_policy_default) {
        Some(policy) => apply_network_policy(&policy, ctx).await?,
        None => false,
    };
    // Upstream order (spec D): a Secret GET error emits nothing, not even the ConfigMap.
    let secret = ensure_secret(&Owner::from(train_job), ctx).await?;
    let configmap = apply_configmap(&configmap, ctx).await?;
    Ok(Written {
        secret,
        configmap,
        network_policy,
    })
}

/// Creates `owner`'s Secret unless the cache or a GET shows it exists; keys are generated only
/// then. Returns whether it was created.
async fn ensure_secret(owner: &Owner, ctx: &Context) -> Result<bool, Error> {
    let (namespace, name) = (owner.namespace.as_str(), ssh_secret_name(&owner.name));
    if ctx
        .secrets
        .get(&ObjectRef::new(&name).within(namespace))
        .is_some()
    {
        return Ok(false);
    }
    let api = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    // Metadata only: the reconciler never needs to read key material.
    if api
        .get_metadata_opt(&name)
        .await
        .map_err(Error::GetSecret)?
        .is_some()
    {
        return Ok(false);
    }
    let secret = ssh_secret(owner.clone(), &(ctx.keygen)().map_err(Error::Keys)?);
    ctx.ensure_leader()?;
    let params = PostParams {
        field_manager: Some(MANAGER.to_string()),
        ..PostParams::default()
    };
    match api.create(&params, &secret).await {
        Ok(_) => {
            ctx.metrics.write("secret");
            Ok(true)
        }
        // Another replica (during a Lease handover) won the race: the Secret is there.
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
        Err(error) => Err(Error::CreateSecret(error)),
    }
}

/// An object the reconciler server-side applies, and how to tell that it is already in place.
trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + PartialEq
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The `object` label of `writes_total`.
    const OBJECT: &'static str;

    /// Whether applying `desired` would change nothing in `cached`.
    fn in_place(cached: &Self, desired: &Self) -> bool;
}

impl Owned for ConfigMap {
    const OBJECT: &'static str = "configmap";

    fn in_place(cached: &Self, desired: &Self) -> bool {
        applied(cached, desired)
    }
}

impl Owned for NetworkPolicy {
    const OBJECT: &'static str = "networkpolicy";

    /// Our metadata is there and the spec is ours. Its lists (`policyTypes`, `ingress`) are
    /// atomic for server-side apply, so any other value in them is drift.
    fn in_place(cached: &Self, desired: &Self) -> bool {
        metadata_in_place(&cached.metadata, &desired.metadata) && cached.spec == desired.spec
    }
}

/// Why [`apply_owned`] wrote nothing.
enum Refused {
    /// Kubeflow Trainer's manager holds fields with other values: never forced (Decision 16).
    Trainer {
        conflicts: Vec<conflict::FieldConflict>,
        error: kube::Error,
    },
    /// The API server refused the apply.
    Api(kube::Error),
    /// This replica is no longer the leader.
    NotLeader,
}

/// Server-side applies `desired` unless the cached one (in `cache`) already has every field we
/// own, or we applied exactly this one and the watch has not shown it yet ([`Applied`]).
/// Returns whether it applied.
///
/// The apply is sent without `force`. When another manager holds a field with another value the
/// API server refuses it (409): if none of those managers is Kubeflow Trainer's, the apply is
/// sent again with `force`, which takes the fields over (a `kubectl edit` is repaired); if one is,
/// nothing is written ([`Refused::Trainer`]).
async fn apply_owned<K: Owned>(
    desired: &K,
    cache: &Store<K>,
    applied: &Applied<K>,
    ctx: &Context,
) -> Result<bool, Refused> {
    let namespace = desired.meta().namespace.as_deref().unwrap_or_default();
    let name = desired.meta().name.as_deref().unwrap_or_default();
    let key = ObjectRef::new(name).within(namespace);
    if cache
        .get(&key)
        .is_some_and(|cached| K::in_place(&cached, desired))
        || applied.holds(&key, desired)
    {
        return Ok(false);
    }
    ctx.ensure_leader().map_err(|_| Refused::NotLeader)?;
    // Before sending: the watch event of this apply may arrive before its response.
    applied.expect(key.clone(), desired);
    let result = match apply_with(desired, ctx, false).await {
        Err(kube::Error::Api(status)) => match conflict::apply_conflicts(&status) {
            Some(conflicts) if conflicts.iter().any(|c| c.manager == TRAINER_MANAGER) => {
                applied.forget(&key);
                let error = kube::Error::Api(status);
                return Err(Refused::Trainer { conflicts, error });
            }
            Some(conflicts) => {
                tracing::info!(
                    namespace,
                    name,
                    kind = K::OBJECT,
                    ?conflicts,
                    "taking over fields others changed"
                );
                apply_with(desired, ctx, true).await
            }
            None => Err(kube::Error::Api(status)),
        },
        other => other,
    };
    if let Err(error) = result {
        applied.forget(&key);
        return Err(Refused::Api(error));
    }
    ctx.metrics.write(K::OBJECT);
    Ok(true)
}

/// Applies the hostfile ConfigMap ([`apply_owned`]); a conflict with Kubeflow Trainer's manager
/// is [`Error::HostfileConflict`].
async fn apply_configmap(desired: &ConfigMap, ctx: &Context) -> Result<bool, Error> {
    match apply_owned(desired, &ctx.configmaps, &ctx.applied, ctx).await {
        Ok(applied) => Ok(applied),
        Err(Refused::Trainer { conflicts, .. }) => {
            Err(trainer_conflict(desired, conflicts, ctx).await)
        }
        Err(Refused::Api(error)) => Err(Error::ApplyConfigMap(error)),
        Err(Refused::NotLeader) => Err(Error::NotLeader),
    }
}

/// Applies the NetworkPolicy ([`apply_owned`]). Kubeflow Trainer makes none; should its manager
/// hold fields of ours anyway, it is not forced over either, and the refusal is the error.
async fn apply_network_policy(desired: &NetworkPolicy, ctx: &Context) -> Result<bool, Error> {
    match apply_owned(desired, &ctx.network_policies, &ctx.applied_policies, ctx).await {
        Ok(applied) => Ok(applied),
        Err(Refused::Trainer { error, .. } | Refused::Api(error)) => {
            Err(Error::ApplyNetworkPolicy(error))
        }
        Err(Refused::NotLeader) => Err(Error::NotLeader),
    }
}

async fn apply_with<K: Owned>(desired: &K, ctx: &Context, force: bool) -> Result<(), kube::Error> {
    let namespace = desired.meta().namespace.as_deref().unwrap_or_default();
    let name = desired.meta().name.as_deref().unwrap_or_default();
    let mut params = PatchParams::apply(MANAGER);
    params.force = force;
    Api::<K>::namespaced(ctx.client.clone(), namespace)
        .patch(name, &params, &Patch::Apply(desired))
        .await
        .map(drop)
}

/// Builds the [`Error::HostfileConflict`] for a refused apply: reads the stored hostfile (a GET;
/// Trainer's ConfigMap carries no label of ours, so it is not in the cache) and counts it.
async fn trainer_conflict(
    desired: &ConfigMap,
    conflicts: Vec<conflict::FieldConflict>,
    ctx: &Context,
) -> Error {
    let namespace = desired.metadata.namespace.as_deref().unwrap_or_default();
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    let stored = match Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
    {
        Ok(stored) => stored,
        Err(error) => return Error::GetConfigMap(error),
    };
    let hostfile_len = |configmap: Option<&ConfigMap>| {
        configmap
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(HOSTFILE_NAME))
            .map_or(0, String::len)
    };
    let mut fields: Vec<String> = conflicts
        .into_iter()
        .filter(|c| c.manager == TRAINER_MANAGER)
        .map(|c| c.field)
        .collect();
    fields.dedup();
    ctx.metrics.hostfile_conflict();
    Error::HostfileConflict(HostfileConflict {
        configmap: name.to_string(),
        fields,
        ours: hostfile_len(Some(desired)),
        theirs: hostfile_len(stored.as_ref()),
    })
}

/// Whether applying `desired` would change nothing: every data key, label and owner reference
/// we set is present with our value. Keys others added are not ours to remove (server-side
/// apply keeps them too), so they do not count as drift.
fn applied(cached: &ConfigMap, desired: &ConfigMap) -> bool {
    contains(cached.data.as_ref(), desired.data.as_ref())
        && metadata_in_place(&cached.metadata, &desired.metadata)
}

/// Every entry of `want` is in `have` with the same value.
fn contains<K: Ord, V: PartialEq>(
    have: Option<&std::collections::BTreeMap<K, V>>,
    want: Option<&std::collections::BTreeMap<K, V>>,
) -> bool {
    want.into_iter()
        .flatten()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

/// Every label and owner reference we set is present with our value (others' additions are
/// not ours to remove, so they are not drift).
fn metadata_in_place(cached: &ObjectMeta, desired: &ObjectMeta) -> bool {
    let owners = cached.owner_references.as_deref().unwrap_or_default();
    contains(cached.labels.as_ref(), desired.labels.as_ref())
        && desired
            .owner_references
            .iter()
            .flatten()
            .all(|o| owners.contains(o))
}
