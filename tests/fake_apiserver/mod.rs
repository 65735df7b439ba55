//! An in-process fake Kubernetes API server (plain HTTP/1.1 on 127.0.0.1, objects in memory), for
//! the reconciler's process tests (`tests/reconcile_process.rs`) and its benchmark
//! (`benches/reconciler.rs`, which includes this module by `#[path]`).
//!
//! It serves the resources of [`KINDS`] by their REST paths (adding one, e.g. JobSets, is one
//! [`Kind`] constant) and implements the calls the reconciler makes (`src/api_calls.rs`):
//! - LIST (pages of `limit`, `continue`) and WATCH (from a resourceVersion, one JSON event per
//!   line, for every change), both with equality label selectors and the metadata-only
//!   `as=PartialObjectMetadata[List]` Accept header; GET; POST (409 AlreadyExists); PATCH as a
//!   merge patch (strategic merge taken as JSON merge), and as server-side apply;
//! - **server-side apply with field ownership** ([`ssa`]): `metadata.managedFields` per manager,
//!   409 Conflict without `force` worded and structured as the API server's `NewConflictError`,
//!   `force=true` taking the fields over, fields the applier no longer sets removed unless
//!   another manager owns them, and updates (create, merge patch) owning what they changed;
//! - **resourceVersion** that changes only when the object (or its ownership) really changes: a
//!   no-op apply or patch keeps it and sends no watch event; a patch or apply whose body carries
//!   `metadata.resourceVersion` is a precondition: another version is a 409 Conflict worded as
//!   the API server's optimistic-lock error;
//! - an apply body without `metadata.name` (kube-lease-manager's Lease patches) is the object the
//!   URL names, as the API server takes it; a different name is a 400;
//! - optionally **RBAC** ([`Authorizer`], e.g. from `manifests/base/rbac.yaml`): every HTTP
//!   request is taken to come from the ServiceAccount `mpi-webhook/mpi-webhook` and is refused
//!   403 as the API server words it unless granted; in-process calls (`FakeApi::apply`, …) play
//!   other controllers (Kubeflow Trainer, `kubectl edit`) and are not checked;
//! - optionally the **OwnerReferencesPermissionEnforcement** admission plugin on HTTP writes
//!   ([`authz::owner_references_permission`]);
//! - **garbage collection** ([`FakeApi::delete`], in process only: a `kubectl delete` with the
//!   default background propagation): dependents whose owners are all gone are deleted, in
//!   cascade; a dependent with an owner left loses only its dangling references, as the
//!   garbage collector of kube-controller-manager does.
//!
//! Not modelled: validation, defaulting, other admission, generateName, HTTP DELETE, PUT, JSON patch,
//! subresources, bookmarks, watch cache expiry (410). A request it does not implement is
//! answered 404, 405 or 501 and recorded in [`Stats::unexpected`].
//!
//! Its own tests are `tests/fake_apiserver/tests.rs`, run by `tests/reconcile_process.rs`.

#![allow(dead_code)]

pub mod authz;
pub mod ssa;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use authz::Attributes;
pub use authz::Authorizer;
use ssa::{Entry, Manager};

/// Response body type.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body the fake server reads.
const MAX_BODY: usize = 3 << 20;

// ---------------------------------------------------------------------------------------------
// Resources

/// A resource the fake server serves.
#[derive(Debug)]
pub struct Kind {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name (the REST path segment).
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl Kind {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// TrainJobs.
pub const TRAINJOBS: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "trainjobs",
    kind: "TrainJob",
    namespaced: true,
};
/// TrainingRuntimes.
pub const TRAINING_RUNTIMES: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "trainingruntimes",
    kind: "TrainingRuntime",
    namespaced: true,
};
/// ClusterTrainingRuntimes.
pub const CLUSTER_RUNTIMES: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "clustertrainingruntimes",
    kind: "ClusterTrainingRuntime",
    namespaced: false,
};
/// JobSets (JobSet mode).
pub const JOBSETS: &Kind = &Kind {
    group: "jobset.x-k8s.io",
    version: "v1alpha2",
    plural: "jobsets",
    kind: "JobSet",
    namespaced: true,
};
/// Secrets.
pub const SECRETS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "secrets",
    kind: "Secret",
    namespaced: true,
};
/// ConfigMaps.
pub const CONFIGMAPS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
    namespaced: true,
};
/// NetworkPolicies (networking.k8s.io). Stored and served like any other object: the
/// fake enforces no traffic rules (that is the network plugin's job, not the API server's).
pub const NETWORK_POLICIES: &Kind = &Kind {
    group: "networking.k8s.io",
    version: "v1",
    plural: "networkpolicies",
    kind: "NetworkPolicy",
    namespaced: true,
};
/// Events (events.k8s.io).
pub const EVENTS: &Kind = &Kind {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
};

/// Leases (`reconcile --leader-elect`).
pub const LEASES: &Kind = &Kind {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    namespaced: true,
};

/// Every resource of `src/api_calls.rs` for `reconcile`.
pub const KINDS: &[&Kind] = &[
    LEASES,
    TRAINJOBS,
    TRAINING_RUNTIMES,
    CLUSTER_RUNTIMES,
    JOBSETS,
    SECRETS,
    CONFIGMAPS,
    NETWORK_POLICIES,
    EVENTS,
];

/// The resource (plural) of `kind` in `group`, for owner references.
pub fn resource_of(group: &str, kind: &str) -> Option<&'static str> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.kind == kind)
        .map(|k| k.plural)
}

/// The field manager of the garbage collector's patches (kube-controller-manager's).
pub const GC_MANAGER: &str = "generic-garbage-collector";

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// One entry of a resource's change log, which watches replay from a resourceVersion.
pub struct Change {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub type_: &'static str,
    /// The object after it.
    pub object: Arc<Value>,
    /// When it happened (for the bench's timings).
    pub at: Instant,
}

#[derive(Default)]
struct Collection {
    objects: BTreeMap<Key, Arc<Value>>,
    /// `metadata.managedFields` of each object, as sets.
    managed: HashMap<Key, Vec<Entry>>,
    /// Every change, in resourceVersion order (never compacted: a run is short).
    log: Vec<Change>,
}

#[derive(Default)]
struct State {
    rv: u64,
    collections: HashMap<&'static str, Collection>,
}

/// Requests seen, for reports, assertions and deciding that a client is quiet.
#[derive(Clone)]
pub struct Stats {
    /// `(verb, resource)` → count. Verbs: list, watch, get, create, apply, apply-force, patch.
    pub requests: BTreeMap<(&'static str, String), u64>,
    /// Requests being answered (not counting open watches).
    pub in_flight: usize,
    /// When the last request was answered.
    pub last_done: Instant,
    /// Requests the fake server does not implement.
    pub unexpected: Vec<String>,
}

impl Stats {
    /// Requests since `before`, by `(verb, resource)`.
    pub fn since(&self, before: &Stats) -> BTreeMap<(&'static str, String), u64> {
        self.requests
            .iter()
            .map(|(key, n)| {
                (
                    key.clone(),
                    n - before.requests.get(key).copied().unwrap_or(0),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Requests of one verb on one resource so far.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.requests
            .iter()
            .filter(|((v, r), _)| *v == verb && r == resource)
            .map(|(_, n)| n)
            .sum()
    }
}

/// What the fake checks on HTTP requests.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// RBAC of the caller; `None` allows everything.
    pub authorizer: Option<Authorizer>,
    /// The OwnerReferencesPermissionEnforcement admission plugin (needs `authorizer`).
    pub owner_references_permission_enforcement: bool,
}

/// The fake API server's state; serve it with [`serve`] or [`FakeApi::start`].
pub struct FakeApi {
    state: Mutex<State>,
    /// The latest resourceVersion; wakes the watches.
    changed: watch::Sender<u64>,
    stats: Mutex<Stats>,
    options: Options,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A Kubernetes `Status` failure.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub code: StatusCode,
    /// `reason`.
    pub reason: &'static str,
    /// `message`.
    pub message: String,
    /// `details`, when the API server sends some.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// Something the fake API server does not implement.
    fn unsupported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "NotImplemented", message)
    }

    fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} {name:?} not found", kind.plural),
        )
    }

    /// The Status object.
    pub fn status(&self) -> Value {
        let mut status = json!({"apiVersion": "v1", "kind": "Status", "metadata": {},
                                "status": "Failure", "message": self.message,
                                "reason": self.reason, "code": self.code.as_u16()});
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    fn response(&self) -> Response<Body> {
        json_response(self.code, &self.status())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn metadata_mut(object: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    object
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body is not a JSON object"))?
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata is not an object"))
}

/// The string at a JSON pointer.
pub fn str_at<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// `metadata.managedFields` timestamps: seconds, UTC.
fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The object without what the server maintains, for "did anything change" comparisons.
fn content(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "resourceVersion",
            "managedFields",
            "uid",
            "creationTimestamp",
        ] {
            metadata.remove(key);
        }
    }
    object
}

/// Ownership without timestamps, for "did anything change" comparisons.
fn ownership(entries: &[Entry]) -> Vec<(Manager, ssa::FieldSet)> {
    let mut out: Vec<_> = entries
        .iter()
        .map(|e| (e.manager.clone(), e.fields.clone()))
        .collect();
    out.sort();
    out
}

impl State {
    fn collection(&mut self, kind: &Kind) -> &mut Collection {
        self.collections.entry(kind.plural).or_default()
    }

    fn current(&mut self, kind: &Kind, key: &Key) -> Option<(Arc<Value>, Vec<Entry>)> {
        let collection = self.collection(kind);
        let object = collection.objects.get(key)?.clone();
        Some((
            object,
            collection.managed.get(key).cloned().unwrap_or_default(),
        ))
    }

    /// Stores `object` with `entries` under a new resourceVersion and logs the change for the
    /// watches, unless neither the object nor its ownership changed (then returns the stored
    /// object and `false`).
    fn write(
        &mut self,
        kind: &Kind,
        key: Key,
        mut object: Value,
        entries: Vec<Entry>,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let before = self.current(kind, &key);
        if let Some((stored, stored_entries)) = &before
            && content(stored) == content(&object)
            && ownership(stored_entries) == ownership(&entries)
        {
            return Ok((stored.clone(), false));
        }
        let rv = self.rv + 1;
        let metadata = metadata_mut(&mut object)?;
        metadata.insert("resourceVersion".into(), json!(rv.to_string()));
        let (uid, created) = match &before {
            Some((stored, _)) => (
                stored["metadata"]["uid"].clone(),
                stored["metadata"]["creationTimestamp"].clone(),
            ),
            None => (
                metadata
                    .get("uid")
                    .cloned()
                    .unwrap_or_else(|| json!(format!("00000000-0000-4000-9000-{rv:012}"))),
                json!(now()),
            ),
        };
        metadata.insert("uid".into(), uid);
        metadata.insert("creationTimestamp".into(), created);
        if entries.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".into(), ssa::managed_fields(&entries));
        }
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(kind.api_version()));
            map.insert("kind".into(), json!(kind.kind));
        }
        self.rv = rv;
        let type_ = if before.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let object = Arc::new(object);
        let collection = self.collection(kind);
        collection.objects.insert(key.clone(), object.clone());
        collection.managed.insert(key, entries);
        collection.log.push(Change {
            rv,
            type_,
            object: object.clone(),
            at: Instant::now(),
        });
        Ok((object, true))
    }
}

impl State {
    /// Removes the object under a new resourceVersion and logs a DELETED change.
    fn remove(&mut self, kind: &Kind, key: &Key) -> Option<Arc<Value>> {
        let rv = self.rv + 1;
        let collection = self.collection(kind);
        let stored = collection.objects.remove(key)?;
        collection.managed.remove(key);
        let mut object = stored.as_ref().clone();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let object = Arc::new(object);
        collection.log.push(Change {
            rv,
            type_: "DELETED",
            object: object.clone(),
            at: Instant::now(),
        });
        self.rv = rv;
        Some(object)
    }

    /// Whether the owner `reference` of an object in `namespace` exists: an object of its kind,
    /// name and uid (a namespaced owner is looked up in the dependent's namespace).
    fn owner_exists(&mut self, namespace: &str, reference: &Value) -> bool {
        let api_version = reference["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let kind = reference["kind"].as_str().unwrap_or_default();
        let Some(owner_kind) = KINDS.iter().find(|k| k.group == group && k.kind == kind) else {
            // An owner of a kind the server does not serve cannot be found: absent.
            return false;
        };
        let owner_namespace = if owner_kind.namespaced { namespace } else { "" };
        let key = (
            owner_namespace.to_string(),
            reference["name"].as_str().unwrap_or_default().to_string(),
        );
        self.collection(owner_kind)
            .objects
            .get(&key)
            .is_some_and(|o| o["metadata"]["uid"] == reference["uid"])
    }

    /// One pass of the garbage collector over every object with owner references: a dependent
    /// whose owners are all gone is deleted; one with an owner left loses the dangling
    /// references. Returns whether anything changed.
    fn collect_garbage(&mut self, deleted: &mut Vec<(&'static str, Key)>) -> bool {
        let mut changed = false;
        for kind in KINDS {
            let dependents: Vec<(Key, Arc<Value>)> = self
                .collection(kind)
                .objects
                .iter()
                .filter(|(_, o)| {
                    o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
                })
                .map(|(key, o)| (key.clone(), o.clone()))
                .collect();
            for (key, object) in dependents {
                let references = object["metadata"]["ownerReferences"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let (solid, dangling): (Vec<Value>, Vec<Value>) = references
                    .into_iter()
                    .partition(|r| self.owner_exists(&key.0, r));
                if dangling.is_empty() {
                    continue;
                }
                changed = true;
                if solid.is_empty() {
                    self.remove(kind, &key);
                    deleted.push((kind.plural, key));
                } else {
                    // The collector's patch is an update like any other: it owns what it
                    // changed, and the references it removed leave their managers' sets.
                    let mut kept = object.as_ref().clone();
                    kept["metadata"]["ownerReferences"] = Value::Array(solid);
                    let kept = scrub(kept);
                    let entries = self
                        .collection(kind)
                        .managed
                        .get(&key)
                        .cloned()
                        .unwrap_or_default();
                    let manager = Manager::update(GC_MANAGER, &kind.api_version());
                    let entries = ssa::update(Some((&object, &entries)), &kept, &manager, &now());
                    let _ = self.write(kind, key, kept, entries);
                }
            }
        }
        changed
    }
}

/// The key of `object` (its name, and its namespace from the URL or the body).
fn key_of(kind: &Kind, url_namespace: Option<&str>, object: &Value) -> Result<Key, ApiError> {
    let name = str_at(object, "/metadata/name")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("metadata.name is required (no generateName)"))?;
    if !kind.namespaced {
        return Ok((String::new(), name.to_string()));
    }
    let namespace = match (url_namespace, str_at(object, "/metadata/namespace")) {
        (Some(url), Some(body)) if url != body => {
            return Err(ApiError::bad_request(format!(
                "namespace {body:?} does not match the URL's {url:?}"
            )));
        }
        (Some(ns), _) | (None, Some(ns)) => ns,
        (None, None) => return Err(ApiError::bad_request("no namespace")),
    };
    Ok((namespace.to_string(), name.to_string()))
}

/// Who writes: the HTTP caller (checked by RBAC and admission) or an in-process controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    ServiceAccount,
    InProcess,
}

/// A body without what clients may not set: `managedFields` (the server keeps them) and
/// `resourceVersion` (checked first by [`precondition`], never stored as sent).
/// The optimistic-lock check of a write whose `body` carries `metadata.resourceVersion`: it
/// must be the stored object's, else 409 Conflict as the API server words it
/// (`OptimisticLockErrorMsg` in k8s.io/apiserver's registry store).
fn precondition(kind: &Kind, key: &Key, stored: &Value, body: &Value) -> Result<(), ApiError> {
    let Some(sent) = str_at(body, "/metadata/resourceVersion").filter(|rv| !rv.is_empty()) else {
        return Ok(());
    };
    if str_at(stored, "/metadata/resourceVersion") == Some(sent) {
        return Ok(());
    }
    let resource = if kind.group.is_empty() {
        kind.plural.to_string()
    } else {
        format!("{}.{}", kind.plural, kind.group)
    };
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {resource} {:?}: the object has been modified; \
             please apply your changes to the latest version and try again",
            key.1
        ),
    )
    .with_details(json!({"name": key.1, "group": kind.group, "kind": kind.plural})))
}

fn scrub(mut object: Value) -> Value {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
        metadata.remove("resourceVersion");
    }
    object
}

impl FakeApi {
    /// An empty server that checks nothing.
    pub fn new() -> Arc<Self> {
        Self::with(Options::default())
    }

    /// An empty server with these checks.
    pub fn with(options: Options) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            stats: Mutex::new(Stats {
                requests: BTreeMap::new(),
                in_flight: 0,
                last_done: Instant::now(),
                unexpected: Vec::new(),
            }),
            options,
        })
    }

    /// Serves on a fresh 127.0.0.1 port; returns the address.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(self: &Arc<Self>) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(serve(listener, self.clone()));
        Ok(addr)
    }

    fn notify(&self) {
        let rv = lock(&self.state).rv;
        self.changed.send_replace(rv);
    }

    /// The admission the fake runs on a write by `caller`.
    fn admit(
        &self,
        caller: Caller,
        kind: &Kind,
        key: &Key,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(authorizer) = &self.options.authorizer else {
            return Ok(());
        };
        if caller != Caller::ServiceAccount || !self.options.owner_references_permission_enforcement
        {
            return Ok(());
        }
        let target = Attributes {
            verb: if old.is_some() { "update" } else { "create" },
            group: kind.group,
            resource: kind.plural,
            subresource: "",
            namespace: kind.namespaced.then_some(key.0.as_str()),
            name: Some(key.1.as_str()),
        };
        authz::owner_references_permission(authorizer, &target, new, old, &resource_of)
    }

    /// Creates `object` as an update by `manager` (as `kubectl create` or a controller's POST).
    ///
    /// # Errors
    /// 409 AlreadyExists, or a malformed object.
    pub fn create(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        object: Value,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.create_as(Caller::InProcess, kind, namespace, object, manager)
    }

    fn create_as(
        &self,
        caller: Caller,
        kind: &Kind,
        namespace: Option<&str>,
        object: Value,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let mut object = scrub(object);
        let key = key_of(kind, namespace, &object)?;
        if kind.namespaced {
            metadata_mut(&mut object)?.insert("namespace".into(), json!(key.0));
        }
        let created = {
            let mut state = lock(&self.state);
            if state.collection(kind).objects.contains_key(&key) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{} {:?} already exists", kind.plural, key.1),
                )
                .with_details(json!({"name": key.1, "group": kind.group, "kind": kind.plural})));
            }
            self.admit(caller, kind, &key, &object, None)?;
            let manager = Manager::update(manager, &kind.api_version());
            let entries = ssa::update(None, &object, &manager, &now());
            state.write(kind, key, object, entries)?.0
        };
        self.notify();
        Ok(created)
    }

    /// The stored object.
    ///
    /// # Errors
    /// 404.
    pub fn get(&self, kind: &Kind, key: &Key) -> Result<Arc<Value>, ApiError> {
        lock(&self.state)
            .collection(kind)
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, &key.1))
    }

    /// Server-side apply of `body` by `manager` (as Kubeflow Trainer's controller does).
    /// Returns the object and whether it was created.
    ///
    /// # Errors
    /// 409 Conflict (without `force`), or a malformed body.
    pub fn apply(
        &self,
        kind: &Kind,
        key: Key,
        body: Value,
        manager: &str,
        force: bool,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        self.apply_as(Caller::InProcess, kind, key, body, manager, force)
    }

    fn apply_as(
        &self,
        caller: Caller,
        kind: &Kind,
        key: Key,
        body: Value,
        manager: &str,
        force: bool,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let mut body = body;
        // The API server applies a body without a name to the object the URL names.
        if str_at(&body, "/metadata/name").is_none() {
            metadata_mut(&mut body)?.insert("name".into(), json!(key.1));
        }
        match str_at(&body, "/metadata/name") {
            Some(name) if name != key.1 => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({name}) does not match the name on the URL ({})",
                    key.1
                )));
            }
            _ => {}
        }
        if key_of(kind, Some(&key.0), &body)? != key {
            return Err(ApiError::bad_request(
                "the body's namespace does not match the URL",
            ));
        }
        let sent = body.clone();
        let body = scrub(body);
        let manager = Manager::apply(manager, &kind.api_version());
        let (object, changed, created) = {
            let mut state = lock(&self.state);
            let current = state.current(kind, &key);
            if let Some((stored, _)) = &current {
                precondition(kind, &key, stored, &sent)?;
            }
            let live = current
                .as_ref()
                .map(|(object, entries)| (object.as_ref(), entries.as_slice()));
            let (mut object, entries) = ssa::apply(live, &body, &manager, force, &now())
                .map_err(|conflicts| conflict_error(&conflicts))?;
            if kind.namespaced {
                metadata_mut(&mut object)?.insert("namespace".into(), json!(key.0));
            }
            self.admit(
                caller,
                kind,
                &key,
                &object,
                current.as_ref().map(|(o, _)| o.as_ref()),
            )?;
            let created = current.is_none();
            let (object, changed) = state.write(kind, key, object, entries)?;
            (object, changed, created)
        };
        if changed {
            self.notify();
        }
        Ok((object, created))
    }

    /// A JSON merge patch by `manager` (an update: `kubectl edit`, `kubectl label`).
    ///
    /// # Errors
    /// 404, or a malformed patch.
    pub fn merge_patch(
        &self,
        kind: &Kind,
        key: Key,
        patch: &Value,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.merge_patch_as(Caller::InProcess, kind, key, patch, manager)
    }

    fn merge_patch_as(
        &self,
        caller: Caller,
        kind: &Kind,
        key: Key,
        patch: &Value,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let manager = Manager::update(manager, &kind.api_version());
        let (object, changed) = {
            let mut state = lock(&self.state);
            let (current, entries) = state
                .current(kind, &key)
                .ok_or_else(|| ApiError::not_found(kind, &key.1))?;
            precondition(kind, &key, &current, patch)?;
            let mut merged = current.as_ref().clone();
            json_patch::merge(&mut merged, &scrub(patch.clone()));
            let merged = scrub(merged);
            self.admit(caller, kind, &key, &merged, Some(&current))?;
            let entries = ssa::update(Some((&current, &entries)), &merged, &manager, &now());
            state.write(kind, key, merged, entries)?
        };
        if changed {
            self.notify();
        }
        Ok(object)
    }

    /// One page of a list: the matching objects after `after`, at most `limit`.
    fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        after: Option<&Key>,
    ) -> (Vec<Arc<Value>>, u64, Option<Key>) {
        let mut state = lock(&self.state);
        let rv = state.rv;
        let collection = state.collection(kind);
        let start = after.map_or(std::ops::Bound::Unbounded, |k| {
            std::ops::Bound::Excluded(k.clone())
        });
        let mut items = Vec::new();
        let mut more = None;
        for (key, object) in collection
            .objects
            .range((start, std::ops::Bound::Unbounded))
        {
            if namespace.is_some_and(|ns| ns != key.0) || !selector.matches(object) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = items.last().and_then(|last: &Arc<Value>| {
                    Some((
                        str_at(last, "/metadata/namespace")
                            .unwrap_or_default()
                            .to_string(),
                        str_at(last, "/metadata/name")?.to_string(),
                    ))
                });
                break;
            }
            items.push(object.clone());
        }
        (items, rv, more)
    }

    /// Writes every object of `kind` again with `annotation` added (by manager `bench`): a
    /// MODIFIED event each, with the spec unchanged. Returns how many.
    ///
    /// # Errors
    /// A stored object that is not a JSON object.
    pub fn annotate_all(&self, kind: &Kind, annotation: &str) -> Result<usize, ApiError> {
        let keys: Vec<Key> = lock(&self.state)
            .collection(kind)
            .objects
            .keys()
            .cloned()
            .collect();
        let patch = json!({"metadata": {"annotations": {annotation: "1"}}});
        for key in &keys {
            self.merge_patch(kind, key.clone(), &patch, "bench")?;
        }
        Ok(keys.len())
    }

    /// Every stored object of `kind`.
    pub fn objects(&self, kind: &Kind) -> Vec<Arc<Value>> {
        lock(&self.state)
            .collection(kind)
            .objects
            .values()
            .cloned()
            .collect()
    }

    /// How many objects of `kind` are stored.
    pub fn count(&self, kind: &Kind) -> usize {
        lock(&self.state).collection(kind).objects.len()
    }

    /// When each object of `kind` was added (first ADDED change).
    pub fn added(&self, kind: &Kind) -> HashMap<Key, Instant> {
        let mut state = lock(&self.state);
        let mut out = HashMap::new();
        for change in state
            .collection(kind)
            .log
            .iter()
            .filter(|c| c.type_ == "ADDED")
        {
            let key = (
                str_at(&change.object, "/metadata/namespace")
                    .unwrap_or_default()
                    .to_string(),
                str_at(&change.object, "/metadata/name")
                    .unwrap_or_default()
                    .to_string(),
            );
            out.entry(key).or_insert(change.at);
        }
        out
    }

    /// Deletes an object as `kubectl delete` does with the default (background) propagation:
    /// it goes at once, then the garbage collector deletes its dependents, in cascade. Returns
    /// what the collector deleted, as `(plural, key)`, in the order it did.
    ///
    /// # Errors
    /// 404.
    pub fn delete(&self, kind: &Kind, key: &Key) -> Result<Vec<(&'static str, Key)>, ApiError> {
        let mut collected = Vec::new();
        {
            let mut state = lock(&self.state);
            state
                .remove(kind, key)
                .ok_or_else(|| ApiError::not_found(kind, &key.1))?;
            while state.collect_garbage(&mut collected) {}
        }
        self.notify();
        Ok(collected)
    }

    /// A copy of the request counts.
    pub fn stats(&self) -> Stats {
        lock(&self.stats).clone()
    }
}

fn conflict_error(conflicts: &[ssa::Conflict]) -> ApiError {
    let status = ssa::conflict_status(conflicts);
    ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        status["message"].as_str().unwrap_or_default(),
    )
    .with_details(status["details"].clone())
}

/// A kubeconfig for the server at `addr` (plain HTTP, no credentials), written to `dir`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: fake\n  user: {{}}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n"
        ),
    )?;
    Ok(path)
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// An equality-based label selector (`a=b`, `a==b`, `a!=b`, `a`, `!a`; comma = and).
#[derive(Clone, Default)]
struct Selector(Vec<(String, Option<String>, bool)>);

impl Selector {
    fn parse(text: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if term.contains(" in ") || term.contains(" notin ") || term.contains('(') {
                return Err(ApiError::unsupported(format!(
                    "the fake API server supports only equality selectors: {term:?}"
                )));
            }
            let parsed = if let Some((k, v)) = term.split_once("!=") {
                (k.trim().to_string(), Some(v.trim().to_string()), false)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k.trim().to_string(), Some(v.trim().to_string()), true)
            } else if let Some(k) = term.strip_prefix('!') {
                (k.trim().to_string(), None, false)
            } else {
                (term.to_string(), None, true)
            };
            terms.push(parsed);
        }
        Ok(Self(terms))
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|(key, value, equal)| {
            let have = labels.get(key).and_then(Value::as_str);
            match value {
                Some(v) => (have == Some(v.as_str())) == *equal,
                None => have.is_some() == *equal,
            }
        })
    }
}

/// What a metadata-only client sees of an object.
fn partial_metadata(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": object["metadata"].clone()})
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_params(request: &Request<Incoming>) -> HashMap<String, String> {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// A request's target: resource, namespace (from the URL) and object name.
struct Target {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
}

fn target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
            (Some(percent_decode(namespace)), rest)
        }
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] => (*plural, Some(percent_decode(name))),
        _ => return None,
    };
    let kind = *KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
    // A cluster-scoped resource has no namespace; a namespaced object needs one.
    if (!kind.namespaced && namespace.is_some())
        || (kind.namespaced && name.is_some() && namespace.is_none())
    {
        return None;
    }
    Some(Target {
        kind,
        namespace,
        name,
    })
}

/// Counts the request while it is being answered (not while a watch streams).
struct InFlight<'a>(&'a FakeApi);

impl<'a> InFlight<'a> {
    fn start(api: &'a FakeApi) -> Self {
        lock(&api.stats).in_flight += 1;
        Self(api)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut stats = lock(&self.0.stats);
        stats.in_flight = stats.in_flight.saturating_sub(1);
        stats.last_done = Instant::now();
    }
}

async fn handle(api: Arc<FakeApi>, request: Request<Incoming>) -> Response<Body> {
    let _in_flight = InFlight::start(&api);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let params = query_params(&request);
    let Some(target) = target(&path) else {
        let error = ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        );
        return unexpected(&api, &method, request.uri(), error);
    };
    let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let forced = matches!(params.get("force").map(String::as_str), Some("true" | "1"));
    let verb = match (&method, target.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PATCH, true) if content_type.starts_with("application/apply-patch") => {
            if forced {
                "apply-force"
            } else {
                "apply"
            }
        }
        (&Method::PATCH, true) => "patch",
        _ => {
            let error = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path} is not implemented by the fake API server"),
            );
            return unexpected(&api, &method, request.uri(), error);
        }
    };
    *lock(&api.stats)
        .requests
        .entry((verb, target.kind.plural.to_string()))
        .or_default() += 1;
    if let Err(error) = authorize(&api, verb, &target) {
        return error.response();
    }
    let metadata_only = request
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadata"));
    let uri = request.uri().to_string();
    match answer(&api, request, verb, &target, &params, metadata_only).await {
        Ok(response) => response,
        Err(error) if error.code == StatusCode::NOT_IMPLEMENTED => {
            unexpected(&api, &method, &uri, error)
        }
        Err(error) => error.response(),
    }
}

/// RBAC on the request itself (the API server's authorization filter). An apply is a `patch`;
/// one that creates the object also needs `create` (checked where the object is looked up).
fn authorize(api: &FakeApi, verb: &str, target: &Target) -> Result<(), ApiError> {
    let verb = match verb {
        "apply" | "apply-force" => "patch",
        verb => verb,
    };
    authorize_verb(api, verb, target)
}

/// `create` for an apply of an object that does not exist yet.
fn authorize_apply_create(api: &FakeApi, target: &Target, key: &Key) -> Result<(), ApiError> {
    if api.options.authorizer.is_none() || api.get(target.kind, key).is_ok() {
        return Ok(());
    }
    authorize_verb(api, "create", target)
}

/// Whether the authorizer, if there is one, allows `verb` on `target`.
fn authorize_verb(api: &FakeApi, verb: &str, target: &Target) -> Result<(), ApiError> {
    let Some(authorizer) = &api.options.authorizer else {
        return Ok(());
    };
    let attributes = Attributes {
        verb,
        group: target.kind.group,
        resource: target.kind.plural,
        subresource: "",
        namespace: target.namespace.as_deref(),
        name: target.name.as_deref(),
    };
    if authorizer.allows(&attributes) {
        Ok(())
    } else {
        Err(Authorizer::forbidden(&attributes))
    }
}

/// The field manager of a write: `fieldManager`, else (as the API server derives it from the
/// User-Agent) the client's program name.
fn field_manager(params: &HashMap<String, String>, user_agent: &str) -> String {
    params
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            user_agent
                .split('/')
                .next()
                .filter(|m| !m.is_empty())
                .unwrap_or("unknown")
                .to_string()
        })
}

/// Answers a request the fake does not implement with `error`, and records it: any such
/// request fails the run.
fn unexpected(
    api: &FakeApi,
    method: &Method,
    uri: impl std::fmt::Display,
    error: ApiError,
) -> Response<Body> {
    lock(&api.stats)
        .unexpected
        .push(format!("{method} {uri}: {}", error.message));
    error.response()
}

async fn read_body(request: Request<Incoming>, content_type: &str) -> Result<Value, ApiError> {
    let bytes = Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    match serde_json::from_slice(&bytes) {
        Ok(value) => Ok(value),
        // An apply body may be YAML.
        Err(_) if content_type.contains("yaml") => std::str::from_utf8(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("the body is not YAML: {e}"))),
        Err(e) => Err(ApiError::bad_request(format!("the body is not JSON: {e}"))),
    }
}

async fn answer(
    api: &Arc<FakeApi>,
    request: Request<Incoming>,
    verb: &'static str,
    target: &Target,
    params: &HashMap<String, String>,
    metadata_only: bool,
) -> Result<Response<Body>, ApiError> {
    let kind = target.kind;
    let view = |object: &Value| {
        if metadata_only {
            partial_metadata(object)
        } else {
            object.clone()
        }
    };
    let selector = Selector::parse(params.get("labelSelector").map_or("", String::as_str))?;
    if params.get("fieldSelector").is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::unsupported(
            "the fake API server does not implement field selectors",
        ));
    }
    let object_key = || -> Key {
        (
            target.namespace.clone().unwrap_or_default(),
            target.name.clone().unwrap_or_default(),
        )
    };
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let user_agent = request
        .headers()
        .get(hyper::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let manager = field_manager(params, &user_agent);
    match verb {
        "get" => Ok(json_response(
            StatusCode::OK,
            &view(api.get(kind, &object_key())?.as_ref()),
        )),
        "list" => {
            let limit = match params.get("limit") {
                Some(l) => Some(
                    l.parse::<usize>()
                        .map_err(|e| ApiError::bad_request(format!("limit {l:?}: {e}")))?,
                )
                .filter(|l| *l > 0),
                None => None,
            };
            let after: Option<Key> = params
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(|c| {
                    c.split_once('/')
                        .map(|(ns, name)| (ns.to_string(), name.to_string()))
                        .ok_or_else(|| ApiError::bad_request(format!("continue {c:?}")))
                })
                .transpose()?;
            let (items, rv, more) = api.list(
                kind,
                target.namespace.as_deref(),
                &selector,
                limit,
                after.as_ref(),
            );
            let mut metadata = json!({"resourceVersion": rv.to_string()});
            if let Some((ns, name)) = more {
                metadata["continue"] = json!(format!("{ns}/{name}"));
            }
            let (api_version, list_kind) = if metadata_only {
                (
                    "meta.k8s.io/v1".to_string(),
                    "PartialObjectMetadataList".to_string(),
                )
            } else {
                (kind.api_version(), format!("{}List", kind.kind))
            };
            let items: Vec<Value> = items.iter().map(|o| view(o)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"apiVersion": api_version, "kind": list_kind, "metadata": metadata,
                        "items": items}),
            ))
        }
        "watch" => watch_response(api, target, params, selector, metadata_only),
        "create" => {
            let body = read_body(request, &content_type).await?;
            let created = api.create_as(
                Caller::ServiceAccount,
                kind,
                target.namespace.as_deref(),
                body,
                &manager,
            )?;
            Ok(json_response(StatusCode::CREATED, &view(&created)))
        }
        "apply" | "apply-force" => {
            if params.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::bad_request(
                    "PATCH: fieldManager is required for apply requests",
                ));
            }
            authorize_apply_create(api, target, &object_key())?;
            let body = read_body(request, &content_type).await?;
            let (object, created) = api.apply_as(
                Caller::ServiceAccount,
                kind,
                object_key(),
                body,
                &manager,
                verb == "apply-force",
            )?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &view(&object)))
        }
        "patch" => {
            if !content_type.starts_with("application/merge-patch+json")
                && !content_type.starts_with("application/strategic-merge-patch+json")
            {
                return Err(ApiError::unsupported(format!(
                    "the fake API server does not implement PATCH {content_type:?}"
                )));
            }
            let body = read_body(request, &content_type).await?;
            let patched =
                api.merge_patch_as(Caller::ServiceAccount, kind, object_key(), &body, &manager)?;
            Ok(json_response(StatusCode::OK, &view(patched.as_ref())))
        }
        _ => Err(ApiError::bad_request(format!("verb {verb}"))),
    }
}

/// One watch: the changes after `since`, as newline-delimited JSON, until the client leaves or
/// `timeoutSeconds` passes.
struct Watch {
    api: Arc<FakeApi>,
    kind: &'static Kind,
    namespace: Option<String>,
    selector: Selector,
    metadata_only: bool,
    since: u64,
    /// For a watch without a resourceVersion: the current objects, sent as ADDED first.
    initial: Vec<Arc<Value>>,
    changed: watch::Receiver<u64>,
    deadline: tokio::time::Instant,
}

impl Watch {
    fn line(&self, out: &mut Vec<u8>, type_: &str, object: &Value) {
        let wanted = self
            .namespace
            .as_deref()
            .is_none_or(|ns| str_at(object, "/metadata/namespace") == Some(ns))
            && self.selector.matches(object);
        if !wanted {
            return;
        }
        let object = if self.metadata_only {
            partial_metadata(object)
        } else {
            object.clone()
        };
        if let Ok(bytes) = serde_json::to_vec(&json!({"type": type_, "object": object})) {
            out.extend_from_slice(&bytes);
            out.push(b'\n');
        }
    }

    /// Everything new since the last call (possibly nothing).
    fn pending(&mut self) -> Vec<u8> {
        // Mark the current version seen before reading, so a later write wakes `changed()`.
        self.changed.borrow_and_update();
        let mut out = Vec::new();
        for object in std::mem::take(&mut self.initial) {
            self.line(&mut out, "ADDED", &object);
        }
        let changes: Vec<(&'static str, Arc<Value>)> = {
            let state = lock(&self.api.state);
            let Some(collection) = state.collections.get(self.kind.plural) else {
                return out;
            };
            let start = collection.log.partition_point(|c| c.rv <= self.since);
            if let Some(last) = collection.log.last() {
                self.since = self.since.max(last.rv);
            }
            collection.log[start..]
                .iter()
                .map(|c| (c.type_, c.object.clone()))
                .collect()
        };
        for (type_, object) in changes {
            self.line(&mut out, type_, &object);
        }
        out
    }
}

fn watch_response(
    api: &Arc<FakeApi>,
    target: &Target,
    params: &HashMap<String, String>,
    selector: Selector,
    metadata_only: bool,
) -> Result<Response<Body>, ApiError> {
    let since = match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|e| ApiError::bad_request(format!("resourceVersion {rv:?}: {e}")))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let (since, initial) = match since {
        Some(rv) => (rv, Vec::new()),
        None => {
            let mut state = lock(&api.state);
            let rv = state.rv;
            let objects = state
                .collection(target.kind)
                .objects
                .values()
                .cloned()
                .collect();
            (rv, objects)
        }
    };
    let watch = Watch {
        api: api.clone(),
        kind: target.kind,
        namespace: target.namespace.clone(),
        selector,
        metadata_only,
        since,
        initial,
        changed: api.changed.subscribe(),
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
    };
    let stream = futures::stream::unfold(watch, |mut watch| async move {
        loop {
            let chunk = watch.pending();
            if !chunk.is_empty() {
                return Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), watch));
            }
            tokio::select! {
                changed = watch.changed.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(watch.deadline) => return None,
            }
        }
    });
    let mut response = Response::new(StreamBody::new(stream.boxed()).boxed_unsync());
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn serve(listener: TcpListener, api: Arc<FakeApi>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                eprintln!("fake API server: accept: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let api = api.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(handle(api, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
