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
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch;

use crate::api::TrainJob;
use crate::mpi::objects_for::{Problem, hostfile_for, runtime_ref};
use crate::mpi::ssh_secret::{KeyError, SshKeyPair, ssh_secret};
use crate::mpi::{HOSTFILE_NAME, MANAGER, Owner, hostfile_configmap_name, ssh_secret_name};
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
        let caches_ready = {
            let (secrets, configmaps, objects) =
                (secrets.clone(), configmaps.clone(), objects.clone());
            async move {
                let _ = secrets.wait_until_ready().await;
                let _ = configmaps.wait_until_ready().await;
                let _ = objects.synced().await;
            }
            .boxed()
            .shared()
        };
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
        }
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

/// The ConfigMaps this replica applied since the ConfigMap watch last said anything about them.
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
#[derive(Debug, Default)]
pub struct AppliedConfigMaps(Mutex<HashMap<ObjectRef<ConfigMap>, ConfigMap>>);

impl AppliedConfigMaps {
    /// Bound on remembered ConfigMaps (an apply that changes nothing has no event to remove
    /// its entry). Forgetting costs at most one more apply each.
    const MAX_ENTRIES: usize = 10_000;

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<ConfigMap>, ConfigMap>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `desired` as about to be applied.
    fn expect(&self, key: ObjectRef<ConfigMap>, desired: &ConfigMap) {
        let mut entries = self.entries();
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, desired.clone());
    }

    /// Whether `desired` is what we last applied and the watch has said nothing since.
    fn holds(&self, key: &ObjectRef<ConfigMap>, desired: &ConfigMap) -> bool {
        self.entries().get(key) == Some(desired)
    }

    fn forget(&self, key: &ObjectRef<ConfigMap>) {
        self.entries().remove(key);
    }

    /// Follows the ConfigMap watch (after its cache applied `event`).
    pub fn observe(&self, event: &watcher::Event<ConfigMap>) {
        match event {
            watcher::Event::Apply(configmap)
            | watcher::Event::Delete(configmap)
            | watcher::Event::InitApply(configmap) => {
                self.forget(&ObjectRef::from_obj(configmap));
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

/// The note of the `Created` Event for the objects of the TrainJob or JobSet named `owner`.
fn written_note(owner: &str, written: Written) -> Option<String> {
    let secret = ssh_secret_name(owner);
    let configmap = hostfile_configmap_name(owner);
    match (written.secret, written.configmap) {
        (true, true) => Some(format!(
            "Created Secret {secret} and applied ConfigMap {configmap}"
        )),
        (true, false) => Some(format!("Created Secret {secret}")),
        (false, true) => Some(format!("Applied ConfigMap {configmap}")),
        (false, false) => None,
    }
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
    // Upstream order (spec D): a Secret GET error emits nothing, not even the ConfigMap.
    let secret = ensure_secret(&Owner::from(train_job), ctx).await?;
    let configmap = apply_configmap(&configmap, ctx).await?;
    Ok(Written { secret, configmap })
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

/// Server-side applies the ConfigMap unless the cached one already has every field we own, or
/// we applied exactly this one and the watch has not shown it yet ([`AppliedConfigMaps`]).
/// Returns whether it applied.
///
/// The apply is sent without `force`. When another manager holds a field with another value the
/// API server refuses it (409): if none of those managers is Kubeflow Trainer's, the apply is
/// sent again with `force`, which takes the fields over (a `kubectl edit` is repaired); if one is,
/// nothing is written and the conflict is returned ([`Error::HostfileConflict`]).
async fn apply_configmap(desired: &ConfigMap, ctx: &Context) -> Result<bool, Error> {
    let namespace = desired.metadata.namespace.as_deref().unwrap_or_default();
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    let key = ObjectRef::new(name).within(namespace);
    if ctx
        .configmaps
        .get(&key)
        .is_some_and(|cached| applied(&cached, desired))
        || ctx.applied.holds(&key, desired)
    {
        return Ok(false);
    }
    ctx.ensure_leader()?;
    // Before sending: the watch event of this apply may arrive before its response.
    ctx.applied.expect(key.clone(), desired);
    let result = apply_with(desired, ctx, false).await;
    let result = match result {
        Err(kube::Error::Api(status)) => match conflict::apply_conflicts(&status) {
            Some(conflicts) if conflicts.iter().any(|c| c.manager == TRAINER_MANAGER) => {
                ctx.applied.forget(&key);
                return Err(trainer_conflict(desired, conflicts, ctx).await);
            }
            Some(conflicts) => {
                tracing::info!(
                    namespace,
                    name,
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
        ctx.applied.forget(&key);
        return Err(Error::ApplyConfigMap(error));
    }
    ctx.metrics.write("configmap");
    Ok(true)
}

async fn apply_with(desired: &ConfigMap, ctx: &Context, force: bool) -> Result<(), kube::Error> {
    let namespace = desired.metadata.namespace.as_deref().unwrap_or_default();
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    let mut params = PatchParams::apply(MANAGER);
    params.force = force;
    Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
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
    fn contains<K: Ord, V: PartialEq>(
        have: Option<&std::collections::BTreeMap<K, V>>,
        want: Option<&std::collections::BTreeMap<K, V>>,
    ) -> bool {
        want.into_iter()
            .flatten()
            .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
    }
    let owners = cached
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    contains(cached.data.as_ref(), desired.data.as_ref())
        && contains(
            cached.metadata.labels.as_ref(),
            desired.metadata.labels.as_ref(),
        )
        && desired
            .metadata
            .owner_references
            .iter()
            .flatten()
            .all(|o| owners.contains(o))
}
