//! Scale benchmark of `mpi-webhook reconcile` against an in-process fake API server (issue 6,
//! item 4).
//!
//! `cargo bench --bench reconciler` builds the release binary, then, all on 127.0.0.1:
//! 1. starts a fake Kubernetes API server (plain HTTP/1.1, hyper) that keeps objects in memory
//!    and implements exactly the calls the reconciler makes (`src/api_calls.rs`): LIST (pages of
//!    `limit`, `continue`), WATCH (from a resourceVersion, one JSON event per line, for every
//!    object written through the server, so the reconciler's caches see its own writes), both
//!    with equality label selectors and the metadata-only `as=PartialObjectMetadata[List]`
//!    Accept header; GET; POST (409 AlreadyExists when present); PATCH as server-side apply
//!    (create, or merge the applied fields; an apply that changes nothing keeps the
//!    resourceVersion and sends no watch event, as the real apiserver does) or as a merge patch.
//!    It counts every request by verb and resource. Not modelled: field ownership, admission,
//!    validation, Leases (the reconciler runs without `--leader-elect`). A request it does not
//!    implement is answered 404, 405 or 501 and fails the run, naming the request;
//! 2. seeds it with the ClusterTrainingRuntimes of `manifests/runtimes/` and N TrainJobs made from
//!    the sample TrainJobs of `manifests/samples/` (round robin over the samples, so over the
//!    runtimes; spread over namespaces; each with its own name and uid; numNodes 2 to 8);
//! 3. runs the shipped binary, `mpi-webhook reconcile`, with a kubeconfig pointing at it, and
//!    measures three phases:
//!    - **create**: from spawning the process to the first TrainJob having both its Secret and
//!      its ConfigMap, and to all N having both; then, once the reconciler is quiet (no request
//!      and no finished reconcile for 1 s), the requests made;
//!    - **no-op resync, MODIFIED**: every TrainJob is updated with its spec unchanged (one
//!      annotation added, a new resourceVersion), so the controller reconciles all N again;
//!      time until N more reconciles finished, requests until quiet;
//!    - **no-op resync, restart**: the reconciler is stopped (SIGTERM) and a fresh process is
//!      started against the populated server: it lists everything and reconciles all N again;
//!      time from spawn until N reconciles finished, requests until quiet;
//! 4. checks that every TrainJob has its Secret and ConfigMap, owned by its uid, and prints the
//!    requests per TrainJob of each phase, the times, and each process's peak RSS (`VmHWM`) and
//!    CPU time (user + system) from `/proc/<pid>/`.
//!
//! Every wait is bounded (60 s to converge, 20 s to settle); 1,000 TrainJobs take about 5 s.
//! Knobs (environment): `RECONCILER_JOBS` (default 1000), `RECONCILER_NAMESPACES` (default 10);
//! `RUST_LOG` reaches the reconciler, whose log's end is printed when it fails;
//! `RECONCILER_LOG_DIR` keeps its logs (`reconcile-1.log`, `reconcile-2.log`) there.
//!
//! Without `--bench` (as `cargo test --benches` runs it) it does nothing: benchmarks are never
//! timed tests.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use mpi_webhook::objects::dir::{object_files, parse_documents};
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[path = "support/procfs.rs"]
mod procfs;

type AnyError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, Infallible>;

const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
/// Longest the reconciler may take to create every object, or to reconcile every TrainJob.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// The reconciler counts as done once it made no request, and started no reconcile, this long.
const QUIET: Duration = Duration::from_secs(1);
/// Longest the reconciler may take to become quiet after converging.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest request body the fake server reads.
const MAX_BODY: usize = 3 << 20;
/// The annotation the MODIFIED resync adds to every TrainJob.
const RESYNC_ANNOTATION: &str = "bench.mpi-webhook/resync";

struct Config {
    jobs: usize,
    namespaces: usize,
    /// Where the reconciler's logs go (default: a temporary directory, removed afterwards).
    log_dir: Option<PathBuf>,
}

impl Config {
    fn from_env() -> Result<Self, AnyError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let number = |name: &str, default: usize| -> Result<usize, AnyError> {
            var(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse()
                    .map_err(|e| format!("{name}={v:?}: {e}").into())
            })
        };
        let jobs = number("RECONCILER_JOBS", 1000)?;
        let namespaces = number("RECONCILER_NAMESPACES", 10)?;
        if !(1..=20_000).contains(&jobs) || !(1..=1_000).contains(&namespaces) {
            return Err(
                "RECONCILER_JOBS must be 1..=20000 and RECONCILER_NAMESPACES 1..=1000".into(),
            );
        }
        Ok(Self {
            jobs,
            namespaces,
            log_dir: var("RECONCILER_LOG_DIR").map(PathBuf::from),
        })
    }
}

fn main() -> Result<(), AnyError> {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "reconciler: skipped (a benchmark, not a test: run `cargo bench --bench reconciler`)"
        );
        return Ok(());
    }
    let config = Config::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(&config))
}

// ---------------------------------------------------------------------------------------------
// The fake API server: resources

/// A resource the fake server serves.
#[derive(Debug)]
struct Kind {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
}

impl Kind {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const TRAINJOBS: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "trainjobs",
    kind: "TrainJob",
    namespaced: true,
};
const CLUSTER_RUNTIMES: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "clustertrainingruntimes",
    kind: "ClusterTrainingRuntime",
    namespaced: false,
};
const SECRETS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "secrets",
    kind: "Secret",
    namespaced: true,
};
const CONFIGMAPS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
    namespaced: true,
};
const EVENTS: &Kind = &Kind {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
};

/// Every resource of `src/api_calls.rs` for `reconcile` except Leases (no `--leader-elect`).
const KINDS: &[&Kind] = &[
    TRAINJOBS,
    &Kind {
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        plural: "trainingruntimes",
        kind: "TrainingRuntime",
        namespaced: true,
    },
    CLUSTER_RUNTIMES,
    SECRETS,
    CONFIGMAPS,
    EVENTS,
];

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
type Key = (String, String);

/// One entry of a resource's change log, which watches replay from a resourceVersion.
struct Change {
    rv: u64,
    type_: &'static str,
    object: Arc<Value>,
}

#[derive(Default)]
struct Collection {
    objects: BTreeMap<Key, Arc<Value>>,
    /// Every change, in resourceVersion order (never compacted: a run is short).
    log: Vec<Change>,
}

/// TrainJobs with both their Secret and their ConfigMap, and when that became true.
#[derive(Default)]
struct Progress {
    expected: usize,
    pairs: usize,
    first: Option<Instant>,
    all: Option<Instant>,
}

#[derive(Default)]
struct State {
    rv: u64,
    collections: HashMap<&'static str, Collection>,
    progress: Progress,
}

/// Requests seen, for the report and for deciding that the reconciler is quiet.
#[derive(Clone)]
struct Stats {
    /// `(verb, resource)` → count. Verbs: list, watch, get, create, apply, patch.
    requests: BTreeMap<(&'static str, String), u64>,
    in_flight: usize,
    last_done: Instant,
    /// Requests the fake server does not implement (they invalidate the run).
    unexpected: Vec<String>,
}

impl Stats {
    fn since(&self, before: &Stats) -> BTreeMap<(&'static str, String), u64> {
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
}

struct FakeApi {
    state: Mutex<State>,
    /// The latest resourceVersion; wakes the watches.
    changed: watch::Sender<u64>,
    stats: Mutex<Stats>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A Kubernetes `Status` failure.
#[derive(Debug)]
struct ApiError {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// Something the fake API server does not implement (it fails the run).
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

    fn response(&self) -> Response<Body> {
        json_response(
            self.code,
            &json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                    "message": self.message, "reason": self.reason, "code": self.code.as_u16()}),
        )
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

fn str_at<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

impl State {
    fn collection(&mut self, kind: &Kind) -> &mut Collection {
        self.collections.entry(kind.plural).or_default()
    }

    /// Stores `object` under a new resourceVersion and logs the change for the watches.
    fn write(
        &mut self,
        kind: &Kind,
        key: Key,
        mut object: Value,
        type_: &'static str,
    ) -> Result<Arc<Value>, ApiError> {
        let rv = self.rv + 1;
        let metadata = metadata_mut(&mut object)?;
        metadata.insert("resourceVersion".into(), json!(rv.to_string()));
        metadata
            .entry("uid")
            .or_insert_with(|| json!(format!("00000000-0000-4000-9000-{rv:012}")));
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(kind.api_version()));
            map.insert("kind".into(), json!(kind.kind));
        }
        self.rv = rv;
        let object = Arc::new(object);
        let collection = self.collection(kind);
        collection.objects.insert(key.clone(), object.clone());
        collection.log.push(Change {
            rv,
            type_,
            object: object.clone(),
        });
        if type_ == "ADDED" {
            self.count_pair(kind, &key);
        }
        Ok(object)
    }

    /// Counts a TrainJob whose Secret and ConfigMap both exist once the second one is added.
    fn count_pair(&mut self, kind: &Kind, (namespace, name): &Key) {
        let other = if kind.plural == SECRETS.plural {
            name.strip_suffix("-mpi-ssh-auth")
                .map(|job| (CONFIGMAPS, format!("{job}-mpi-hostfile")))
        } else if kind.plural == CONFIGMAPS.plural {
            name.strip_suffix("-mpi-hostfile")
                .map(|job| (SECRETS, format!("{job}-mpi-ssh-auth")))
        } else {
            None
        };
        let Some((other_kind, other_name)) = other else {
            return;
        };
        let present = self
            .collections
            .get(other_kind.plural)
            .is_some_and(|c| c.objects.contains_key(&(namespace.clone(), other_name)));
        if present {
            let now = Instant::now();
            let progress = &mut self.progress;
            progress.pairs += 1;
            progress.first.get_or_insert(now);
            if progress.pairs == progress.expected {
                progress.all.get_or_insert(now);
            }
        }
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

impl FakeApi {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            stats: Mutex::new(Stats {
                requests: BTreeMap::new(),
                in_flight: 0,
                last_done: Instant::now(),
                unexpected: Vec::new(),
            }),
        })
    }

    fn notify(&self) {
        let rv = lock(&self.state).rv;
        self.changed.send_replace(rv);
    }

    fn create(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        mut object: Value,
    ) -> Result<Arc<Value>, ApiError> {
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
                ));
            }
            state.write(kind, key, object, "ADDED")?
        };
        self.notify();
        Ok(created)
    }

    fn get(&self, kind: &Kind, key: &Key) -> Result<Arc<Value>, ApiError> {
        lock(&self.state)
            .collection(kind)
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, &key.1))
    }

    /// Server-side apply, simplified: creates the object, or merges the applied fields into it
    /// (RFC 7386; no field ownership). Returns the object and whether it was created.
    fn apply(&self, kind: &Kind, key: Key, body: Value) -> Result<(Arc<Value>, bool), ApiError> {
        if key_of(kind, Some(&key.0), &body)? != key {
            return Err(ApiError::bad_request(
                "the body's name does not match the URL",
            ));
        }
        let result = {
            let mut state = lock(&self.state);
            match state.collection(kind).objects.get(&key).cloned() {
                None => (state.write(kind, key, body, "ADDED")?, true),
                Some(current) => {
                    let mut merged = current.as_ref().clone();
                    json_patch::merge(&mut merged, &body);
                    if merged == *current {
                        // A no-op apply: same resourceVersion, no watch event.
                        return Ok((current, false));
                    }
                    (state.write(kind, key, merged, "MODIFIED")?, false)
                }
            }
        };
        self.notify();
        Ok(result)
    }

    fn merge_patch(&self, kind: &Kind, key: Key, patch: &Value) -> Result<Arc<Value>, ApiError> {
        let patched = {
            let mut state = lock(&self.state);
            let current = state
                .collection(kind)
                .objects
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiError::not_found(kind, &key.1))?;
            let mut merged = current.as_ref().clone();
            json_patch::merge(&mut merged, patch);
            if merged == *current {
                return Ok(current);
            }
            state.write(kind, key, merged, "MODIFIED")?
        };
        self.notify();
        Ok(patched)
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

    /// Writes every object of `kind` again with `annotation` added: a MODIFIED event each, with
    /// the spec unchanged. Returns how many.
    fn annotate_all(&self, kind: &Kind, annotation: &str) -> Result<usize, ApiError> {
        let count = {
            let mut state = lock(&self.state);
            let objects: Vec<(Key, Arc<Value>)> = state
                .collection(kind)
                .objects
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (key, object) in &objects {
                let mut object = object.as_ref().clone();
                metadata_mut(&mut object)?
                    .entry("annotations")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .ok_or_else(|| ApiError::bad_request("annotations is not an object"))?
                    .insert(annotation.into(), json!("1"));
                state.write(kind, key.clone(), object, "MODIFIED")?;
            }
            objects.len()
        };
        self.notify();
        Ok(count)
    }

    fn objects(&self, kind: &Kind) -> Vec<Arc<Value>> {
        lock(&self.state)
            .collection(kind)
            .objects
            .values()
            .cloned()
            .collect()
    }

    fn stats(&self) -> Stats {
        lock(&self.stats).clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The fake API server: HTTP

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
    let verb = match (&method, target.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PATCH, true) if content_type.starts_with("application/apply-patch") => "apply",
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
            let created = api.create(kind, target.namespace.as_deref(), body)?;
            Ok(json_response(StatusCode::CREATED, &view(&created)))
        }
        "apply" => {
            if params.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::bad_request(
                    "PATCH: fieldManager is required for apply requests",
                ));
            }
            let body = read_body(request, &content_type).await?;
            let (object, created) = api.apply(kind, object_key(), body)?;
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
            Ok(json_response(
                StatusCode::OK,
                &view(api.merge_patch(kind, object_key(), &body)?.as_ref()),
            ))
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

// ---------------------------------------------------------------------------------------------
// Seeding

fn load_objects(dir: &Path, kind: &str) -> Result<Vec<Value>, AnyError> {
    let mut objects = Vec::new();
    for path in object_files(dir)? {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let json = path.extension().is_some_and(|e| e == "json");
        let documents =
            parse_documents(&text, json).map_err(|e| format!("{}: {e}", path.display()))?;
        objects.extend(
            documents
                .into_iter()
                .filter(|d| d.get("kind").and_then(Value::as_str) == Some(kind)),
        );
    }
    if objects.is_empty() {
        return Err(format!("no {kind} under {}", dir.display()).into());
    }
    Ok(objects)
}

/// `jobs` TrainJobs made from the samples: names `job-00000`..., namespaces `team-00`...,
/// distinct uids, numNodes 2 to 8, the samples (so the runtimes) taken in turn.
fn train_jobs(config: &Config, runtimes: &[Value]) -> Result<Vec<Value>, AnyError> {
    let samples = load_objects(&Path::new(MANIFESTS).join("samples"), "TrainJob")?;
    for sample in &samples {
        let runtime = str_at(sample, "/spec/runtimeRef/name").unwrap_or_default();
        if !runtimes
            .iter()
            .any(|r| str_at(r, "/metadata/name") == Some(runtime))
        {
            return Err(format!(
                "a sample TrainJob refers to runtime {runtime:?}, which manifests/runtimes does not ship"
            )
            .into());
        }
    }
    (0..config.jobs)
        .map(|i| {
            let mut job = samples[i % samples.len()].clone();
            let object = job
                .as_object_mut()
                .ok_or("a sample TrainJob is not a map")?;
            object.insert(
                "metadata".into(),
                json!({
                    "name": format!("job-{i:05}"),
                    "namespace": format!("team-{:02}", i % config.namespaces),
                    "uid": format!("6b1f4a52-0000-4000-8000-{i:012}"),
                }),
            );
            job.pointer_mut("/spec/trainer")
                .and_then(Value::as_object_mut)
                .ok_or("a sample TrainJob has no spec.trainer")?
                .insert("numNodes".into(), json!(2 + i % 7));
            Ok(job)
        })
        .collect()
}

fn write_kubeconfig(dir: &Path, addr: SocketAddr) -> Result<PathBuf, AnyError> {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: bench\n  user: {{}}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: bench\n    namespace: default\n\
             current-context: fake\n"
        ),
    )?;
    Ok(path)
}

// ---------------------------------------------------------------------------------------------
// The reconciler process

/// `mpi-webhook reconcile`, stopped (SIGTERM, then SIGKILL after 10 s) when dropped.
struct Reconciler {
    child: Child,
    metrics: SocketAddr,
    started: Instant,
    log: PathBuf,
}

fn free_port() -> Result<SocketAddr, AnyError> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Reconciler {
    fn start(kubeconfig: &Path, log: PathBuf) -> Result<Self, AnyError> {
        let metrics = free_port()?;
        let log_file = std::fs::File::create(&log)?;
        let started = Instant::now();
        let child = Command::new(BIN)
            .arg("reconcile")
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", "bench")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("MPI_WEBHOOK_LEADER_ELECT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("starting {BIN} reconcile: {e}"))?;
        Ok(Self {
            child,
            metrics,
            started,
            log,
        })
    }

    fn log_tail(&self) -> String {
        let text = strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// An error naming `what` and carrying the end of the reconciler's log.
    fn failure(&self, what: &str) -> AnyError {
        format!(
            "{what}\n--- end of the reconciler's log ---\n{}",
            self.log_tail()
        )
        .into()
    }

    fn ensure_running(&mut self) -> Result<(), AnyError> {
        match self.child.try_wait()? {
            Some(status) => Err(self.failure(&format!("the reconciler exited: {status}"))),
            None => Ok(()),
        }
    }

    /// `(peak RSS in KiB, CPU seconds)` from `/proc/<pid>/`.
    fn usage(&self) -> Result<(u64, f64), AnyError> {
        let pid = self.child.id();
        Ok((
            procfs::status_kib(pid, "VmHWM")?,
            procfs::cpu_time(pid)?.as_secs_f64(),
        ))
    }

    /// SIGTERM and wait (at most 10 s) for a clean exit.
    fn stop(&mut self) -> Result<(), AnyError> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return if status.success() {
                    Ok(())
                } else {
                    Err(self.failure(&format!("the reconciler exited with {status} on SIGTERM")))
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.failure("the reconciler did not stop within 10 s of SIGTERM"))
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The log without its colour codes (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `GET /metrics` of the reconciler.
async fn scrape(addr: SocketAddr) -> Result<String, AnyError> {
    let exchange = async {
        let tcp = TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(connection);
        let request = Request::get("/metrics")
            .header(HOST, addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        if response.status() != StatusCode::OK {
            return Err(format!("/metrics: HTTP {}", response.status()).into());
        }
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, AnyError>(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "/metrics timed out")?
}

/// The sum of every sample of `name` (with or without labels).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Finished reconciles (`reconciles_total` counts started ones; the duration histogram's count
/// only those that returned).
const FINISHED: &str = "mpi_webhook_reconcile_duration_seconds_count";

/// Finished reconciles so far, or 0 while the probe server is not up yet.
async fn reconciles(reconciler: &Reconciler) -> u64 {
    scrape(reconciler.metrics)
        .await
        .map_or(0, |m| metric(&m, FINISHED))
}

// ---------------------------------------------------------------------------------------------
// The run

/// Waits until every TrainJob has its Secret and ConfigMap; returns (first, all) since spawn.
async fn converge(
    api: &FakeApi,
    reconciler: &mut Reconciler,
) -> Result<(Duration, Duration), AnyError> {
    loop {
        {
            let state = lock(&api.state);
            if let (Some(first), Some(all)) = (state.progress.first, state.progress.all) {
                return Ok((first - reconciler.started, all - reconciler.started));
            }
        }
        reconciler.ensure_running()?;
        if reconciler.started.elapsed() > CONVERGE_TIMEOUT {
            let pairs = lock(&api.state).progress.pairs;
            return Err(reconciler.failure(&format!(
                "only {pairs} TrainJobs have both objects after {CONVERGE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the reconciler has finished `target` reconciles.
async fn reconciled(reconciler: &mut Reconciler, target: u64) -> Result<(), AnyError> {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        if reconciles(reconciler).await >= target {
            return Ok(());
        }
        reconciler.ensure_running()?;
        if Instant::now() > deadline {
            return Err(reconciler.failure(&format!(
                "fewer than {target} reconciles finished after {CONVERGE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the reconciler is quiet: no request to the API server and no reconcile finished for
/// [`QUIET`]. Returns `false` if it is still busy after [`SETTLE_TIMEOUT`].
async fn settle(api: &FakeApi, reconciler: &mut Reconciler) -> Result<bool, AnyError> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut last = (reconciles(reconciler).await, Instant::now());
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reconciler.ensure_running()?;
        let now = reconciles(reconciler).await;
        if now != last.0 {
            last = (now, Instant::now());
        }
        let stats = api.stats();
        if stats.in_flight == 0 && stats.last_done.elapsed() >= QUIET && last.1.elapsed() >= QUIET {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every TrainJob has its Secret and ConfigMap, owned (as controller) by its uid.
fn verify(api: &FakeApi, jobs: &[Value]) -> Result<(), AnyError> {
    let index = |kind: &Kind| -> HashMap<(String, String), Arc<Value>> {
        api.objects(kind)
            .into_iter()
            .filter_map(|o| {
                let key = (
                    str_at(&o, "/metadata/namespace")?.to_string(),
                    str_at(&o, "/metadata/name")?.to_string(),
                );
                Some((key, o))
            })
            .collect()
    };
    let (secrets, configmaps) = (index(SECRETS), index(CONFIGMAPS));
    for job in jobs {
        let (Some(namespace), Some(name), Some(uid)) = (
            str_at(job, "/metadata/namespace"),
            str_at(job, "/metadata/name"),
            str_at(job, "/metadata/uid"),
        ) else {
            return Err("a seeded TrainJob lacks namespace, name or uid".into());
        };
        for (objects, suffix) in [(&secrets, "mpi-ssh-auth"), (&configmaps, "mpi-hostfile")] {
            let object = objects
                .get(&(namespace.to_string(), format!("{name}-{suffix}")))
                .ok_or_else(|| format!("{namespace}/{name}-{suffix} is missing"))?;
            let owned = str_at(object, "/metadata/ownerReferences/0/uid") == Some(uid)
                && object.pointer("/metadata/ownerReferences/0/controller") == Some(&json!(true));
            if !owned {
                return Err(format!("{namespace}/{name}-{suffix} is not owned by {uid}").into());
            }
        }
        let hostfile = str_at(
            configmaps
                .get(&(namespace.to_string(), format!("{name}-mpi-hostfile")))
                .map_or(&Value::Null, |c| c.as_ref()),
            "/data/hostfile",
        );
        if hostfile.is_none_or(str::is_empty) {
            return Err(format!("{namespace}/{name}-mpi-hostfile has no hostfile").into());
        }
    }
    Ok(())
}

/// One measured phase.
struct Phase {
    name: &'static str,
    /// Spawn to all objects (create) or to N reconciles (resyncs).
    done: Duration,
    first: Option<Duration>,
    settled: bool,
    reconciles: u64,
    errors: u64,
    requests: BTreeMap<(&'static str, String), u64>,
    /// Peak RSS (KiB) and CPU seconds of the process, when the phase ends its process.
    usage: Option<(u64, f64)>,
}

/// Waits for `process` to settle, then reads what the phase `name` did: the reconciles and
/// errors the process counted beyond `base` (its counts before the phase) and the requests the
/// fake served since `before`.
async fn finish_phase(
    name: &'static str,
    api: &FakeApi,
    process: &mut Reconciler,
    before: &Stats,
    base: (u64, u64),
    done: Duration,
) -> Result<Phase, AnyError> {
    let settled = settle(api, process).await?;
    let metrics = scrape(process.metrics).await?;
    Ok(Phase {
        name,
        done,
        first: None,
        settled,
        reconciles: metric(&metrics, FINISHED) - base.0,
        errors: metric(&metrics, "mpi_webhook_reconcile_errors_total") - base.1,
        requests: api.stats().since(before),
        usage: None,
    })
}

impl Phase {
    fn writes(&self) -> u64 {
        self.requests
            .iter()
            .filter(|((verb, _), _)| !matches!(*verb, "get" | "list" | "watch"))
            .map(|(_, n)| n)
            .sum()
    }
}

async fn run(config: &Config) -> Result<(), AnyError> {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let api = FakeApi::new();
    let runtimes = load_objects(
        &Path::new(MANIFESTS).join("runtimes"),
        CLUSTER_RUNTIMES.kind,
    )?;
    for runtime in &runtimes {
        api.create(CLUSTER_RUNTIMES, None, runtime.clone())?;
    }
    let jobs = train_jobs(config, &runtimes)?;
    for job in &jobs {
        api.create(TRAINJOBS, None, job.clone())?;
    }
    lock(&api.state).progress.expected = config.jobs;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, api.clone()));
    let kubeconfig = write_kubeconfig(tmp.path(), addr)?;
    let log_dir = config.log_dir.as_deref().unwrap_or(tmp.path());
    std::fs::create_dir_all(log_dir)?;
    let n = config.jobs as u64;
    eprintln!(
        "reconciler: {} TrainJobs in {} namespaces on {} ClusterTrainingRuntimes, fake API server on {addr}",
        config.jobs,
        config.namespaces.min(config.jobs),
        runtimes.len()
    );

    // 1. Create.
    let before = api.stats();
    let mut process = Reconciler::start(&kubeconfig, log_dir.join("reconcile-1.log"))?;
    let (first, all) = converge(&api, &mut process).await?;
    eprintln!("  create: all objects after {all:.2?}; settling");
    let mut create = finish_phase("create", &api, &mut process, &before, (0, 0), all).await?;
    create.first = Some(first);
    verify(&api, &jobs)?;

    // 2. No-op resync: every TrainJob MODIFIED, spec unchanged.
    let before = api.stats();
    let base = (create.reconciles, create.errors);
    let start = Instant::now();
    let touched = api.annotate_all(TRAINJOBS, RESYNC_ANNOTATION)? as u64;
    reconciled(&mut process, base.0 + touched).await?;
    let done = start.elapsed();
    eprintln!("  resync (MODIFIED): {touched} reconciles after {done:.2?}; settling");
    let mut modified = finish_phase(
        "no-op resync: MODIFIED",
        &api,
        &mut process,
        &before,
        base,
        done,
    )
    .await?;
    modified.usage = Some(process.usage()?);
    process.stop()?;
    drop(process);

    // 3. No-op resync: a fresh process against the populated server.
    let before = api.stats();
    let mut process = Reconciler::start(&kubeconfig, log_dir.join("reconcile-2.log"))?;
    reconciled(&mut process, n).await?;
    let done = process.started.elapsed();
    eprintln!("  resync (restart): {n} reconciles after {done:.2?}; settling");
    let mut restart = finish_phase(
        "no-op resync: restart",
        &api,
        &mut process,
        &before,
        (0, 0),
        done,
    )
    .await?;
    restart.usage = Some(process.usage()?);
    process.stop()?;
    drop(process);
    verify(&api, &jobs)?;

    let events = api.objects(EVENTS);
    let reasons = |reason: &str| {
        events
            .iter()
            .filter(|e| str_at(e, "/reason") == Some(reason))
            .count()
    };
    report(config, &[create, modified, restart]);
    println!(
        "Events stored: {} ({} Created, {} TrainJobResourcesCreationFailed)",
        events.len(),
        reasons("Created"),
        reasons("TrainJobResourcesCreationFailed")
    );
    println!("total run time {:.0} s", started.elapsed().as_secs_f64());
    let unexpected = api.stats().unexpected;
    if !unexpected.is_empty() {
        return Err(format!(
            "the reconciler made {} request(s) the fake API server does not implement, e.g. {:?}: \
             the figures are not valid until the fake implements them",
            unexpected.len(),
            &unexpected[..unexpected.len().min(3)]
        )
        .into());
    }
    Ok(())
}

fn report(config: &Config, phases: &[Phase]) {
    let n = config.jobs as f64;
    let per_job = |count: u64| format!("{count} ({:.2})", count as f64 / n);
    let mut rows: Vec<(&'static str, String)> = phases
        .iter()
        .flat_map(|p| p.requests.keys().cloned())
        .collect();
    rows.sort_by_key(|(verb, resource)| {
        let read = matches!(*verb, "get" | "list" | "watch");
        (read, resource.clone(), *verb)
    });
    rows.dedup();
    println!();
    println!(
        "Requests to the API server, {} TrainJobs: count (per TrainJob)",
        config.jobs
    );
    println!();
    print!("| request |");
    for p in phases {
        print!(" {} |", p.name);
    }
    println!();
    println!("|---|{}", "---:|".repeat(phases.len()));
    for (verb, resource) in &rows {
        print!("| {verb} {resource} |");
        for p in phases {
            let count = p
                .requests
                .get(&(*verb, resource.clone()))
                .copied()
                .unwrap_or(0);
            print!(" {} |", per_job(count));
        }
        println!();
    }
    let line = |label: &str, cell: &dyn Fn(&Phase) -> String| {
        print!("| {label} |");
        for p in phases {
            print!(" {} |", cell(p));
        }
        println!();
    };
    line("**writes**", &|p| format!("**{}**", per_job(p.writes())));
    line("reconciles (errors)", &|p| {
        format!("{} ({})", p.reconciles, p.errors)
    });
    line("first TrainJob with both objects", &|p| {
        p.first
            .map_or("".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
    });
    line("all done (objects / reconciles)", &|p| {
        format!("{:.2} s", p.done.as_secs_f64())
    });
    line("settled (quiet for 1 s)", &|p| {
        if p.settled { "yes" } else { "**no**" }.into()
    });
    line("reconciler peak RSS / CPU", &|p| {
        p.usage.map_or("".into(), |(kib, cpu)| {
            format!("{:.1} MiB / {cpu:.2} s", kib as f64 / 1024.0)
        })
    });
    println!();
    println!(
        "(peak RSS and CPU are per process: the first process ran create and the MODIFIED resync)"
    );
}
