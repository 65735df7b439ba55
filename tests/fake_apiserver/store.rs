//! The store: objects per resource with their field ownership and change log, the writes the
//! API server makes (create, merge patch, server-side apply, garbage collection) and the
//! errors it answers with. No HTTP here: [`super::rest`] maps requests onto these calls.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::authz::{self, Attributes, Authorizer};
use super::kinds::*;
use super::ssa::{self, Entry, Manager};
use hyper::StatusCode;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

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
pub(crate) struct State {
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
    pub(crate) state: Mutex<State>,
    /// The latest resourceVersion; wakes the watches.
    pub(crate) changed: watch::Sender<u64>,
    pub(crate) stats: Mutex<Stats>,
    pub(crate) options: Options,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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
    pub(crate) fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// Something the fake API server does not implement.
    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
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

    /// The current resourceVersion and every object of `kind`: where a watch without a
    /// resourceVersion starts.
    pub(crate) fn snapshot(&mut self, kind: &Kind) -> (u64, Vec<Arc<Value>>) {
        let rv = self.rv;
        (
            rv,
            self.collection(kind).objects.values().cloned().collect(),
        )
    }

    /// The changes of `kind` after resourceVersion `since`, in order, and the resourceVersion
    /// of the last change logged for `kind` (0 when none).
    pub(crate) fn changes_since(
        &self,
        kind: &Kind,
        since: u64,
    ) -> (Vec<(&'static str, Arc<Value>)>, u64) {
        let Some(collection) = self.collections.get(kind.plural) else {
            return (Vec::new(), 0);
        };
        let start = collection.log.partition_point(|c| c.rv <= since);
        let changes = collection.log[start..]
            .iter()
            .map(|c| (c.type_, c.object.clone()))
            .collect();
        (changes, collection.log.last().map_or(0, |c| c.rv))
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
pub(crate) enum Caller {
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

    pub(crate) fn create_as(
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

    pub(crate) fn apply_as(
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

    pub(crate) fn merge_patch_as(
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
    pub(crate) fn list(
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
// Label selectors

/// An equality-based label selector (`a=b`, `a==b`, `a!=b`, `a`, `!a`; comma = and).
#[derive(Clone, Default)]
pub(crate) struct Selector(Vec<(String, Option<String>, bool)>);

impl Selector {
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
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

    pub(crate) fn matches(&self, object: &Value) -> bool {
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
