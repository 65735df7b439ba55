//! What a reconcile needs ([`Context`], one per leadership term), built from named parts, and
//! the state it keeps between reconciles: retry counters, the objects applied but not seen
//! again by their watch yet, and the owners whose Secret this term already made or found.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::core::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio::sync::watch;

use crate::mpi::objects_for;
use crate::mpi::ssh_secret::{KeyError, SshKeyPair};
use crate::objects::cluster::ClusterObjects;

use super::error::Error;
use super::events::Events;
use super::metrics::ReconcileMetrics;

/// First retry delay after a failed reconcile; doubled on every further failure.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay, and the delay for problems only a change to the owner or its runtime
/// can fix (those changes trigger a reconcile through the watches anyway).
pub(super) const RETRY_MAX: Duration = Duration::from_secs(300);
/// How long a reconcile waits for the owned-object caches before deciding without them (a
/// cache miss then costs a GET and an apply, never a wrong write).
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Spare key pairs kept at most: as many as creates can be in flight at once (the controllers'
/// concurrency, 8 each), so a term's first reconciles over owners whose Secrets all exist (a
/// failover) generate about that many keys, not one per create. With one spare, 8 reconciles
/// at once took it in turns and generated a key in 4,250 of 10,000 such creates.
const SPARE_KEYS: usize = 16;

/// What a [`Context`] is made of: the client, one leadership term's caches and the settings.
pub struct ContextParts {
    /// The client every write goes through.
    pub client: Client,
    /// TrainJob and runtime lookups (watch caches with a GET fallback).
    pub objects: ClusterObjects,
    /// The owners whose Secret this term already created or found (forgotten on every change
    /// of the owner, which its own watch shows it).
    pub ensured: Arc<EnsuredSecrets>,
    /// The ConfigMaps we applied (label-selected).
    pub configmaps: Store<ConfigMap>,
    /// The NetworkPolicies we applied (label-selected).
    pub network_policies: Store<NetworkPolicy>,
    /// ConfigMaps applied but not yet seen again by their watch (which must be shown every
    /// event, after its cache applied it).
    pub applied: Arc<AppliedConfigMaps>,
    /// NetworkPolicies applied but not yet seen again by their watch (the same).
    pub applied_policies: Arc<Applied<NetworkPolicy>>,
    /// Publishes the Events on the owners.
    pub events: Events,
    /// Counts reconciles, writes and failures.
    pub metrics: ReconcileMetrics,
    /// `true` while this replica may write (always, without `--leader-elect`).
    pub leader: watch::Receiver<bool>,
    /// Makes SSH key pairs.
    pub keygen: fn() -> Result<SshKeyPair, KeyError>,
    /// What the objects are configured with (`--network-policy-default`).
    pub object_options: objects_for::Options,
}

/// Everything a reconcile needs. One per leadership term (the caches belong to its watches).
pub struct Context {
    pub(super) client: Client,
    /// TrainJob and runtime lookups (watch caches with a GET fallback).
    pub(super) objects: ClusterObjects,
    /// The owners whose Secret this term already created or found: their reconciles send no
    /// create (Decision 22).
    pub(super) ensured: Arc<EnsuredSecrets>,
    /// The ConfigMaps we applied (label-selected).
    pub(super) configmaps: Store<ConfigMap>,
    pub(super) events: Events,
    pub(super) metrics: ReconcileMetrics,
    pub(super) leader: watch::Receiver<bool>,
    pub(super) retries: Retries,
    pub(super) keygen: fn() -> Result<SshKeyPair, KeyError>,
    /// Key pairs that creates answered AlreadyExists did not store, kept for the next creates
    /// ([`Self::key_pair`]); at most [`SPARE_KEYS`].
    spare_keys: Mutex<Vec<SshKeyPair>>,
    /// Resolves once every cache above holds its initial list. Reconciles wait on clones of
    /// this one future, never on the stores themselves: kube's `Store::wait_until_ready`
    /// keeps only the last waiting task's waker, so when several reconciles waited on a store
    /// at once (the first `CONCURRENCY` after a start) all but one slept until
    /// [`CACHE_SYNC_TIMEOUT`]. `Shared` wakes every clone.
    pub(super) caches_ready: Shared<BoxFuture<'static, ()>>,
    /// ConfigMaps applied but not yet seen again by the ConfigMap watch.
    pub(super) applied: Arc<AppliedConfigMaps>,
    /// The NetworkPolicies we applied (label-selected).
    pub(super) network_policies: Store<NetworkPolicy>,
    /// NetworkPolicies applied but not yet seen again by their watch.
    pub(super) applied_policies: Arc<Applied<NetworkPolicy>>,
    /// What the objects are configured with (`--network-policy-default`).
    pub(super) object_options: objects_for::Options,
}

impl Context {
    /// A context over one leadership term's caches. `leader` gates every write; `keygen`
    /// makes key pairs (tests pass a deterministic one).
    pub fn new(parts: ContextParts) -> Self {
        let ContextParts {
            client,
            objects,
            ensured,
            configmaps,
            network_policies,
            applied,
            applied_policies,
            events,
            metrics,
            leader,
            keygen,
            object_options,
        } = parts;
        let caches_ready = caches_ready(&configmaps, &network_policies, &objects);
        Self {
            client,
            objects,
            ensured,
            configmaps,
            events,
            metrics,
            leader,
            retries: Retries::default(),
            keygen,
            spare_keys: Mutex::default(),
            caches_ready,
            applied,
            network_policies,
            applied_policies,
            object_options,
        }
    }

    /// Checked right before every write, so a replica that lost its Lease stops writing even
    /// while the controller is still shutting down.
    pub(super) fn ensure_leader(&self) -> Result<(), Error> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// A key pair for a Secret create: the spare one when there is one ([`Self::keep_spare`]),
    /// else a new one (counted in `ssh_keys_generated_total`).
    pub(super) fn key_pair(&self) -> Result<SshKeyPair, Error> {
        let spare = self
            .spare_keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        match spare {
            Some(keys) => Ok(keys),
            None => {
                let keys = (self.keygen)().map_err(Error::Keys)?;
                self.metrics.key_generated();
                Ok(keys)
            }
        }
    }

    /// Keeps `keys` for the next create. Only for a pair that no Secret holds: one whose create
    /// was answered AlreadyExists (nothing stored), never one whose create failed otherwise (a
    /// timeout may have stored it), so no two Secrets ever share a key.
    pub(super) fn keep_spare(&self, keys: SshKeyPair) {
        let mut spare = self.spare_keys.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < SPARE_KEYS {
            spare.push(keys);
        }
    }

    pub(super) async fn caches_synced(&self) {
        if tokio::time::timeout(CACHE_SYNC_TIMEOUT, self.caches_ready.clone())
            .await
            .is_err()
        {
            tracing::debug!("caches not synced yet; deciding with GETs");
        }
    }
}

/// One future that resolves once every cache holds its initial list (see `caches_ready`).
fn caches_ready(
    configmaps: &Store<ConfigMap>,
    network_policies: &Store<NetworkPolicy>,
    objects: &ClusterObjects,
) -> Shared<BoxFuture<'static, ()>> {
    let (configmaps, network_policies, objects) = (
        configmaps.clone(),
        network_policies.clone(),
        objects.clone(),
    );
    async move {
        let _ = configmaps.wait_until_ready().await;
        let _ = network_policies.wait_until_ready().await;
        let _ = objects.synced().await;
    }
    .boxed()
    .shared()
}

/// Per-owner (TrainJob or JobSet) failure counters for exponential backoff; reset by a
/// successful reconcile. Keyed by the erased reference, so both controllers share one.
#[derive(Debug, Default)]
pub(super) struct Retries(Mutex<HashMap<ObjectRef<DynamicObject>, u32>>);

impl Retries {
    /// Bound on remembered owners (a deleted failing owner leaves its counter behind).
    const MAX_ENTRIES: usize = 10_000;

    /// The delay before the next attempt for `owner`: [`RETRY_MAX`] for a failure that only a
    /// change can fix ([`Error::retries_slowly`]), else [`RETRY_BASE`] doubled on every
    /// failure in a row, up to [`RETRY_MAX`].
    pub(super) fn next_delay(&self, owner: ObjectRef<DynamicObject>, error: &Error) -> Duration {
        if error.retries_slowly() {
            return RETRY_MAX;
        }
        let mut failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= Self::MAX_ENTRIES {
            failures.clear();
        }
        let count = failures.entry(owner).or_insert(0);
        *count = count.saturating_add(1);
        RETRY_BASE
            .saturating_mul(2u32.saturating_pow(*count - 1))
            .min(RETRY_MAX)
    }

    pub(super) fn forget(&self, owner: &ObjectRef<DynamicObject>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(owner);
    }
}

/// The objects (ConfigMaps, NetworkPolicies) this replica applied since their watch last said
/// anything about them.
///
/// Without it, a reconcile that runs after an apply but before the watch event of that apply
/// reaches the cache applies the same ConfigMap again (a write for nothing).
/// That happens right after a create, when another watch's event (the NetworkPolicy's) triggers
/// the next reconcile before the ConfigMap's event is in (1 to 3% of TrainJobs in the reconciler
/// bench, when the Secret was still watched and its event did that). While an entry is here, the API server holds what we applied (in the
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
    pub(super) fn expect(&self, key: ObjectRef<K>, desired: &K) {
        let mut entries = self.entries();
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, desired.clone());
    }

    /// Whether `desired` is what we last applied and the watch has said nothing since.
    pub(super) fn holds(&self, key: &ObjectRef<K>, desired: &K) -> bool {
        self.entries().get(key) == Some(desired)
    }

    pub(super) fn forget(&self, key: &ObjectRef<K>) {
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

/// The owners (by UID) whose SSH Secret this leadership term already created, or found by the
/// create's AlreadyExists, so that their next reconciles send no create and generate no key
/// (Decision 22). The reconciler cannot read Secrets: this set, not a Secret cache, is how it
/// knows.
///
/// An owner is forgotten whenever its own watch shows it changed or deleted
/// ([`Self::observe`]): its next reconcile sends the create again, which makes a Secret that
/// somebody deleted again and is otherwise answered AlreadyExists. A new term starts with an
/// empty set, so a new leader sends one create per owner.
#[derive(Debug, Default)]
pub struct EnsuredSecrets(Mutex<HashSet<String>>);

impl EnsuredSecrets {
    /// Bound on remembered owners (an owner deleted while its watch was down leaves its entry
    /// behind). Clearing costs one create per live owner, answered AlreadyExists.
    const MAX_ENTRIES: usize = 1 << 20;

    fn entries(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the Secret of the owner with `uid` was created or found in this term.
    pub(super) fn contains(&self, uid: &str) -> bool {
        self.entries().contains(uid)
    }

    /// Records that the Secret of the owner with `uid` exists.
    pub(super) fn record(&self, uid: &str) {
        let mut entries = self.entries();
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(uid.to_string());
    }

    /// Follows the owners' own watch: an owner applied (changed) or deleted is forgotten, before
    /// the reconcile its event asks for. A relist (`InitApply`) forgets nothing: the term's set
    /// starts empty, and what a relist after a broken watch shows is the owners as they are.
    pub fn observe<K: Resource>(&self, event: &watcher::Event<K>) {
        if let watcher::Event::Apply(owner) | watcher::Event::Delete(owner) = event
            && let Some(uid) = owner.meta().uid.as_deref()
        {
            self.entries().remove(uid);
        }
    }
}
