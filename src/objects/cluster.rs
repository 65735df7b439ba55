//! The watches of both processes ([`Watches`]: each kind watched once per process, into one
//! cache), and the cluster [`ObjectSource`] over three of them: caches of TrainJobs,
//! TrainingRuntimes and ClusterTrainingRuntimes, so admission answers from memory; a cache miss
//! falls back to one GET (the TrainJob that owns a new JobSet is often only milliseconds old and
//! not yet in the cache).
//!
//! A broken watch reconnects with kube's default exponential backoff; every failure is logged
//! and counted in `mpi_webhook_watch_errors_total{resource}`.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;

use crate::api::{RuntimeKind, TrainJob, TrainingRuntime};

use super::{LookupError, ObjectSource};

/// Label set of the cache metrics: the watched resource (plural name), never an object name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// Plural resource name, e.g. `trainjobs`.
    pub resource: &'static str,
}

/// Metrics of the watch-backed caches (shared by `serve` and `reconcile`). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct CacheMetrics {
    /// Watch failures; each one is followed by a reconnect after a backoff.
    pub watch_errors: Family<ResourceLabel, Counter>,
    /// Lookups the cache could not answer, served by a GET instead.
    pub cache_misses: Family<ResourceLabel, Counter>,
}

impl CacheMetrics {
    /// New metrics registered into `registry` (expected to carry the `mpi_webhook` prefix) as
    /// `watch_errors_total{resource}` and `cache_misses_total{resource}`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "watch_errors",
            "Watch stream failures; the watch reconnects after a backoff",
            metrics.watch_errors.clone(),
        );
        registry.register(
            "cache_misses",
            "Lookups not found in the watch cache and served by a GET",
            metrics.cache_misses.clone(),
        );
        metrics
    }

    fn watch_error(&self, resource: &'static str) {
        self.watch_errors
            .get_or_create(&ResourceLabel { resource })
            .inc();
    }

    fn cache_miss(&self, resource: &'static str) {
        self.cache_misses
            .get_or_create(&ResourceLabel { resource })
            .inc();
    }
}

/// A watcher stream whose failures are logged, counted and retried with kube's default backoff.
/// The backoff pauses this watch only, so every watch needs its own.
pub fn retried<K, S>(
    stream: S,
    resource: &'static str,
    metrics: &CacheMetrics,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static + use<K, S>
where
    K: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let metrics = metrics.clone();
    stream
        .inspect_err(move |error| {
            metrics.watch_error(resource);
            tracing::warn!(resource, %error, "watch failed; reconnecting with backoff");
        })
        .default_backoff()
}

/// The annotation `kubectl apply` keeps a whole copy of the object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What no cache reads, dropped before an object is stored: `managedFields` (often bigger than
/// the rest of the metadata) and kubectl's last-applied copy of the object. Conflicts with other
/// field managers are read from the API server's answers, never from a cached object.
pub fn trimmed<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Trims a cached object to its identity: name, namespace, UID, owner references and deletion
/// timestamp, and whatever is not metadata (a TrainJob's spec, a ConfigMap's data). For the
/// objects whose labels and annotations no cache reads: TrainJobs, and the reconciler's own
/// objects (its watches select them by their one label, so every one of them carries it). Each
/// label or annotation map costs a B-tree node of about 540 bytes, however few its entries.
pub fn identity<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        owner_references: meta.owner_references.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// How a watch lists when the API server cannot stream its initial list ([`events`]): pages of
/// [`LIST_PAGE`] objects. Callers add their label selector to it.
///
/// kube sends a paged list without a `resourceVersion` (a consistent read), which the API server
/// serves from its watch cache only when etcd supports watch progress requests, and otherwise
/// from etcd, decoding every object again. Pages of [`LIST_PAGE`], not client-go's 500: a page
/// is decoded whole, each object with its `managedFields` (as `serde_json` values, a map per
/// field) before they are dropped, and a page of 500 JobSets was most of the reconciler's heap
/// peak (docs/operations.md "Memory and the number of jobs").
pub fn watch_config() -> watcher::Config {
    watcher::Config::default()
        .any_semantic()
        .page_size(LIST_PAGE)
}

/// Objects per page of a watch's list when it cannot be streamed (see [`watch_config`]).
const LIST_PAGE: u32 = 100;

/// The events of a watch of `api` selected by `config` ([`watch_config`]), its initial list
/// **streamed** from the API server's watch cache (a watch with `sendInitialEvents`, Kubernetes'
/// WatchList, on by default since 1.32), one object at a time: no page is decoded whole, and
/// nothing is read from etcd. At 10,000 TrainJobs the paged list it replaces was 94 requests read
/// from etcd, and the reconciler's first write came 2.3 s after its start instead of 0.5 s.
///
/// An API server that refuses or breaks a streamed list before its end (Kubernetes before 1.32,
/// WatchList turned off, or etcd older than 3.5.13 or 3.4.31, which cannot tell the watch cache
/// it is fresh) is listed in pages instead, for the rest of the process, as client-go falls back
/// to a list: said once in the log, not counted as a watch failure. Any other failure is passed
/// on to be retried ([`retried`]).
pub fn events<K>(
    api: Api<K>,
    config: watcher::Config,
    resource: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static + use<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Where a watch is: streaming, in an initial list (from its `Init`, or the start, to its
    /// `InitDone`) or past it, with what a paged list would need; or listing in pages, for good.
    enum Phase<K> {
        Streamed {
            initial: bool,
            paged: Box<(Api<K>, watcher::Config)>,
        },
        Paged,
    }
    let streamed: BoxStream<'static, _> =
        watcher(api.clone(), config.clone().streaming_lists()).boxed();
    let start = Phase::Streamed {
        initial: true,
        paged: Box::new((api, config)),
    };
    futures::stream::unfold((streamed, start), move |(mut events, phase)| async move {
        let event = events.next().await?;
        match phase {
            Phase::Streamed {
                initial: true,
                paged,
            } if refused_stream(&event) => {
                if let Err(error) = &event {
                    tracing::warn!(
                        resource,
                        %error,
                        "the API server does not stream initial lists; listing in pages"
                    );
                }
                let (api, config) = *paged;
                let mut listed = watcher(api, config).boxed();
                let event = listed.next().await?;
                Some((event, (listed, Phase::Paged)))
            }
            Phase::Streamed { initial, paged } => {
                let initial = match &event {
                    Ok(watcher::Event::Init) => true,
                    Ok(watcher::Event::InitDone) => false,
                    _ => initial,
                };
                Some((event, (events, Phase::Streamed { initial, paged })))
            }
            Phase::Paged => Some((event, (events, Phase::Paged))),
        }
    })
}

/// Whether `event`, before a streamed list's end, says the API server cannot stream it: it
/// refused the watch (422 where WatchList is off) or answered it with an error event (500 when
/// etcd cannot request watch progress). A failure to connect, or a 5xx before the watch
/// started, is not such an answer: it is retried as any watch failure is.
fn refused_stream<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    match event {
        // The request itself refused (an unknown or forbidden `sendInitialEvents`); other
        // answers (403, 429, 5xx) would refuse the list as well, or pass.
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) => {
            matches!(status.code, 400 | 422)
        }
        // 410 Gone makes kube list again, which streams again: no refusal.
        Err(watcher::Error::WatchError(status)) => status.code != 410,
        _ => false,
    }
}

/// Called with each event of a watch once its cache applied the event: how a controller
/// hears of the objects (see [`Watches`]).
pub type Observer<K> = Box<dyn Fn(&watcher::Event<K>) + Send + Sync>;

/// What one watch is of: every `K` in the cluster (its API and dynamic type) selected by
/// `config`, named `resource` in logs and metrics, each object cut by `trim` (besides
/// [`trimmed`]) before it is stored.
pub struct Watch<K: Resource> {
    /// The cluster-wide API of the kind.
    pub api: Api<K>,
    /// Its dynamic type (the runtime kind, or `()`).
    pub dyntype: K::DynamicType,
    /// The list and watch parameters: [`watch_config`], with a label selector or not.
    pub config: watcher::Config,
    /// The plural resource name, for logs and metrics.
    pub resource: &'static str,
    /// What the cache drops of each object besides [`trimmed`]'s.
    pub trim: fn(&mut K),
}

/// **The one owner of a process's watches**: each kind is watched once, into one cache, and
/// whoever needs the kind reads that cache and hears of its changes from that watch's
/// [`Observer`] instead of opening a watch of its own. `serve` and `reconcile` both build
/// theirs here; [`Self::run`] drives them all.
///
/// Not kube's shared-stream subscriptions (`store_shared`, `for_shared_stream`): a subscriber
/// there is shown no deletion (kube-rs#1590), so a deleted ConfigMap of ours would not make its
/// owner make it again; subscribers are taken only before the watch starts (kube-rs#1630); and
/// a subscriber whose object is deleted before it reads it returns `Pending` without waiting for
/// the next one, which leaves it, and then through the shared buffer the watch, stalled.
pub struct Watches {
    client: Client,
    metrics: CacheMetrics,
    drivers: Vec<BoxFuture<'static, ()>>,
}

impl Watches {
    /// No watch yet, over `client`, counting failures and misses in `metrics`.
    pub fn new(client: Client, metrics: CacheMetrics) -> Self {
        Self {
            client,
            metrics,
            drivers: Vec::new(),
        }
    }

    /// Adds the watch `what`, with `observe` called with each of its events after the cache
    /// applied it; returns the cache.
    pub fn watch<K>(&mut self, what: Watch<K>, observe: Option<Observer<K>>) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        self.watch_stored(what, None, observe)
    }

    /// [`Self::watch`], with `stored` (if any) cutting the cache's copy of each object further
    /// than [`Watch::trim`]: for a kind whose cache is read for less than its events are (the
    /// observer is shown each object as `trim` left it). Costs a copy of each event's object.
    pub fn watch_stored<K>(
        &mut self,
        what: Watch<K>,
        stored: Option<fn(&mut K)>,
        observe: Option<Observer<K>>,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        let mut writer = Writer::new(what.dyntype);
        let store = writer.as_reader();
        let events = retried(
            events(what.api, what.config, what.resource).modify(what.trim),
            what.resource,
            &self.metrics,
        )
        .modify(trimmed);
        // What kube's `reflect` does with a store nobody subscribes to: apply, then pass on.
        let driver = events.for_each(move |event| {
            if let Ok(event) = &event {
                match stored {
                    Some(cut) => writer.apply_watcher_event(&event.clone().modify(cut)),
                    None => writer.apply_watcher_event(event),
                }
                if let Some(observe) = &observe {
                    observe(event);
                }
            }
            futures::future::ready(())
        });
        self.drivers.push(driver.boxed());
        store
    }

    /// TrainJobs in every namespace, keeping their identity and spec (what admission and the
    /// reconciler read).
    pub fn train_jobs(&mut self, observe: Option<Observer<TrainJob>>) -> Store<TrainJob> {
        let api = Api::all(self.client.clone());
        self.watch(
            Watch {
                api,
                dyntype: (),
                config: watch_config(),
                resource: "trainjobs",
                trim: identity,
            },
            observe,
        )
    }

    /// The runtimes of `kind`, whole (their labels and annotations are read).
    pub fn runtimes(
        &mut self,
        kind: RuntimeKind,
        observe: Option<Observer<TrainingRuntime>>,
    ) -> Store<TrainingRuntime> {
        let api = Api::<TrainingRuntime>::all_with(self.client.clone(), &kind);
        self.watch(
            Watch {
                api,
                dyntype: kind,
                config: watch_config(),
                resource: kind.resource(),
                trim: |_| {},
            },
            observe,
        )
    }

    /// A [`ClusterObjects`] over these caches.
    pub fn objects(
        &self,
        train_jobs: Store<TrainJob>,
        training_runtimes: Store<TrainingRuntime>,
        cluster_training_runtimes: Store<TrainingRuntime>,
    ) -> ClusterObjects {
        ClusterObjects::from_stores(
            self.client.clone(),
            train_jobs,
            training_runtimes,
            cluster_training_runtimes,
            self.metrics.clone(),
        )
    }

    /// Drives every watch until the future is dropped (a failed watch reconnects with backoff
    /// inside it, so it never ends): the caches stay empty until it runs.
    pub fn run(self) -> impl Future<Output = ()> + Send + 'static {
        futures::future::join_all(self.drivers).map(|_| ())
    }
}

/// Watch-backed TrainJob and runtime lookups with a GET fallback. Cheap to clone.
#[derive(Clone)]
pub struct ClusterObjects {
    client: Client,
    train_jobs: Store<TrainJob>,
    training_runtimes: Store<TrainingRuntime>,
    cluster_training_runtimes: Store<TrainingRuntime>,
    metrics: CacheMetrics,
}

impl ClusterObjects {
    /// `serve`'s watches: TrainJobs, TrainingRuntimes and ClusterTrainingRuntimes in every
    /// namespace, observed by nobody. Returns the source and the future
    /// that drives the three watches: spawn it (the caches stay empty, and [`Self::synced`]
    /// pending, until it runs).
    pub fn watch(
        client: Client,
        metrics: CacheMetrics,
    ) -> (Self, impl Future<Output = ()> + Send + 'static + use<>) {
        let mut watches = Watches::new(client, metrics);
        let jobs = watches.train_jobs(None);
        let local = watches.runtimes(RuntimeKind::TrainingRuntime, None);
        let cluster = watches.runtimes(RuntimeKind::ClusterTrainingRuntime, None);
        let objects = watches.objects(jobs, local, cluster);
        (objects, watches.run())
    }

    /// A source over stores filled elsewhere ([`Watches::objects`], or a test's).
    pub fn from_stores(
        client: Client,
        train_jobs: Store<TrainJob>,
        training_runtimes: Store<TrainingRuntime>,
        cluster_training_runtimes: Store<TrainingRuntime>,
        metrics: CacheMetrics,
    ) -> Self {
        Self {
            client,
            train_jobs,
            training_runtimes,
            cluster_training_runtimes,
            metrics,
        }
    }

    /// Resolves once all three caches hold their initial list (the `/readyz` condition).
    ///
    /// # Errors
    /// When a watch driver was dropped before its first list completed.
    pub async fn synced(&self) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        self.train_jobs.wait_until_ready().await?;
        self.training_runtimes.wait_until_ready().await?;
        self.cluster_training_runtimes.wait_until_ready().await
    }

    /// Whether all three caches hold their initial list, without waiting.
    #[cfg(test)]
    pub fn is_synced(&self) -> bool {
        matches!(self.synced().now_or_never(), Some(Ok(())))
    }

    /// A TrainJob from the cache alone, never a GET: for lookups of names that are mostly not
    /// TrainJobs (a launcher Pod's JobSet).
    pub fn cached_train_job(&self, namespace: &str, name: &str) -> Option<Arc<TrainJob>> {
        self.train_jobs.get(&ObjectRef::new(name).within(namespace))
    }

    fn runtime_store(&self, kind: RuntimeKind) -> &Store<TrainingRuntime> {
        match kind {
            RuntimeKind::TrainingRuntime => &self.training_runtimes,
            RuntimeKind::ClusterTrainingRuntime => &self.cluster_training_runtimes,
        }
    }

    async fn get_runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<TrainingRuntime>, LookupError> {
        self.metrics.cache_miss(kind.resource());
        let (api, what) = match kind {
            RuntimeKind::TrainingRuntime => (
                Api::namespaced_with(self.client.clone(), namespace, &kind),
                format!("{} {namespace}/{name}", kind.as_str()),
            ),
            RuntimeKind::ClusterTrainingRuntime => (
                Api::all_with(self.client.clone(), &kind),
                format!("{} {name}", kind.as_str()),
            ),
        };
        api.get_opt(name)
            .await
            .map_err(|source| LookupError::Api { what, source })
    }
}

impl ObjectSource for ClusterObjects {
    async fn runtime(
        &self,
        kind: RuntimeKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainingRuntime>>, LookupError> {
        let key = match kind {
            RuntimeKind::TrainingRuntime => ObjectRef::new_with(name, kind).within(namespace),
            RuntimeKind::ClusterTrainingRuntime => ObjectRef::new_with(name, kind),
        };
        if let Some(runtime) = self.runtime_store(kind).get(&key) {
            return Ok(Some(runtime));
        }
        Ok(self.get_runtime(kind, namespace, name).await?.map(Arc::new))
    }

    async fn train_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<TrainJob>>, LookupError> {
        if let Some(train_job) = self.train_jobs.get(&ObjectRef::new(name).within(namespace)) {
            return Ok(Some(train_job));
        }
        self.metrics.cache_miss("trainjobs");
        Api::<TrainJob>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map(|found| found.map(Arc::new))
            .map_err(|source| LookupError::Api {
                what: format!("TrainJob {namespace}/{name}"),
                source,
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use http::{Request, Response};
    use kube::ResourceExt;
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);
    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    #[test]
    fn caches_keep_no_managed_fields_nor_kubectls_copy_and_identity_keeps_who_and_whose() {
        let mut job: TrainJob = serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "team", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "b"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}",
                                "keep": "me"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1"}],
                "deletionTimestamp": "2026-12-06T10:00:00Z",
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"runtimeRef": {"name": "deepspeed"}}
        }))
        .expect("TrainJob");
        trimmed(&mut job);
        let meta = serde_json::to_value(&job.metadata).expect("json");
        assert_eq!(meta["managedFields"], Value::Null);
        assert_eq!(meta["annotations"], json!({"keep": "me"}));
        assert_eq!(meta["labels"], json!({"a": "b"}));
        identity(&mut job);
        assert_eq!(
            serde_json::to_value(&job.metadata).expect("json"),
            json!({"name": "pi", "namespace": "team", "uid": "u",
                   "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1"}],
                   "deletionTimestamp": "2026-12-06T10:00:00Z"})
        );
        assert_eq!(job.spec.runtime_ref.name, "deepspeed");
    }

    /// A store that has seen its initial list holding `objects`.
    pub(crate) fn synced_store<K>(dyntype: K::DynamicType, objects: Vec<K>) -> Store<K>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + Hash + Clone,
    {
        let mut writer = Writer::new(dyntype);
        writer.apply_watcher_event(&watcher::Event::Init);
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        writer.as_reader()
    }

    fn train_job_json() -> Value {
        json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "metadata": {"name": "pi", "namespace": "team", "uid": "u"},
               "spec": {"runtimeRef": {"name": "deepspeed"}}})
    }

    fn respond(reply: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: &Value) {
        let bytes = serde_json::to_vec(body).expect("json");
        let response = Response::builder().status(code).body(Body::from(bytes));
        reply.send_response(response.expect("response"));
    }

    fn status(code: u16) -> Value {
        let reason = if code == 404 {
            "NotFound"
        } else {
            "InternalError"
        };
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "message": "scripted", "reason": reason, "code": code})
    }

    /// A source with empty (synced) caches, or with one TrainJob cached.
    fn source(cached: Option<TrainJob>) -> (ClusterObjects, Handle, CacheMetrics) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let metrics = CacheMetrics::default();
        let objects = ClusterObjects::from_stores(
            Client::new(service, "default"),
            synced_store((), cached.into_iter().collect()),
            synced_store(RuntimeKind::TrainingRuntime, vec![]),
            synced_store(RuntimeKind::ClusterTrainingRuntime, vec![]),
            metrics.clone(),
        );
        (objects, handle, metrics)
    }

    /// Answers the next request, which must be a GET of `path`.
    async fn answer_get(handle: &mut Handle, path: &str, code: u16, body: Value) {
        let (request, reply) = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("a request")
            .expect("open");
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(request.uri().path(), path);
        respond(reply, code, &body);
    }

    fn misses(metrics: &CacheMetrics, resource: &'static str) -> u64 {
        metrics
            .cache_misses
            .get_or_create(&ResourceLabel { resource })
            .get()
    }

    #[tokio::test]
    async fn cached_train_job_is_answered_from_memory() {
        let cached = serde_json::from_value(train_job_json()).expect("TrainJob");
        let (objects, _handle, metrics) = source(Some(cached));
        let found = tokio::time::timeout(TIMEOUT, objects.train_job("team", "pi"))
            .await
            .expect("no request made");
        assert_eq!(found.expect("ok").expect("found").uid(), "u");
        assert_eq!(misses(&metrics, "trainjobs"), 0);
    }

    #[tokio::test]
    async fn cache_miss_falls_back_to_one_get() {
        let (objects, mut handle, metrics) = source(None);
        let path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/pi";
        let server = tokio::spawn(async move {
            answer_get(&mut handle, path, 200, train_job_json()).await;
            answer_get(&mut handle, path, 404, status(404)).await;
            answer_get(&mut handle, path, 500, status(500)).await;
        });
        let found = objects.train_job("team", "pi").await.expect("ok");
        assert_eq!(found.expect("found").name(), "pi");
        assert!(objects.train_job("team", "pi").await.expect("ok").is_none());
        let error = objects.train_job("team", "pi").await.expect_err("500");
        assert!(
            error.to_string().starts_with("getting TrainJob team/pi: "),
            "{error}"
        );
        let LookupError::Api { what, source } = &error;
        assert_eq!(what, "TrainJob team/pi");
        assert!(
            matches!(source, kube::Error::Api(status) if status.code == 500),
            "the cause is kept: {source:?}"
        );
        server.await.expect("script");
        assert_eq!(misses(&metrics, "trainjobs"), 3);
    }

    #[tokio::test]
    async fn runtime_miss_gets_the_right_kind_and_scope() {
        let (objects, mut handle, metrics) = source(None);
        let server = tokio::spawn(async move {
            let base = "/apis/trainer.kubeflow.org/v1alpha1";
            let runtime = json!({"metadata": {"name": "rt", "namespace": "team"}, "spec": {}});
            let local = format!("{base}/namespaces/team/trainingruntimes/rt");
            answer_get(&mut handle, &local, 200, runtime).await;
            let cluster = format!("{base}/clustertrainingruntimes/rt");
            answer_get(&mut handle, &cluster, 404, status(404)).await;
            answer_get(&mut handle, &local, 500, status(500)).await;
            answer_get(&mut handle, &cluster, 500, status(500)).await;
        });
        let local = objects.runtime(RuntimeKind::TrainingRuntime, "team", "rt");
        assert_eq!(local.await.expect("ok").expect("found").name(), "rt");
        let cluster = objects.runtime(RuntimeKind::ClusterTrainingRuntime, "team", "rt");
        assert!(cluster.await.expect("ok").is_none());
        // A failed GET names the object in its scope.
        let local = objects.runtime(RuntimeKind::TrainingRuntime, "team", "rt");
        let LookupError::Api { what, .. } = local.await.expect_err("500");
        assert_eq!(what, "TrainingRuntime team/rt");
        let cluster = objects.runtime(RuntimeKind::ClusterTrainingRuntime, "team", "rt");
        let LookupError::Api { what, .. } = cluster.await.expect_err("500");
        assert_eq!(what, "ClusterTrainingRuntime rt");
        server.await.expect("script");
        assert_eq!(misses(&metrics, "trainingruntimes"), 2);
        assert_eq!(misses(&metrics, "clustertrainingruntimes"), 2);
    }

    fn empty_list() -> Value {
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "7"}, "items": []})
    }

    /// A failed streamed list is counted and retried after a backoff; readiness waits for all
    /// three initial lists.
    #[tokio::test(start_paused = true)]
    async fn watches_sync_and_reconnect_after_errors() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let metrics = CacheMetrics::default();
        let (objects, driver) =
            ClusterObjects::watch(Client::new(service, "default"), metrics.clone());
        let driver = tokio::spawn(driver);
        let mut failed_once = false;
        let mut listed = std::collections::BTreeSet::new();
        while listed.len() < 3 {
            assert!(!objects.is_synced());
            let (request, reply) = handle.next_request().await.expect("a watch");
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or_default();
            if !query.contains("sendInitialEvents=true") {
                continue; // a resumed watch: kept open, never answered
            }
            if path.ends_with("/trainjobs") && !failed_once {
                failed_once = true;
                respond(reply, 500, &status(500));
                continue;
            }
            reply.send_response(Response::new(Body::from(lines(&[initial_events_end()]))));
            listed.insert(path);
        }
        tokio::time::timeout(TIMEOUT, objects.synced())
            .await
            .expect("synced")
            .expect("writers alive");
        assert!(objects.is_synced());
        let errors = metrics
            .watch_errors
            .get_or_create(&ResourceLabel {
                resource: "trainjobs",
            })
            .get();
        assert_eq!(errors, 1);
        driver.abort();
    }

    /// Watch events as the API server writes them, a JSON object per line.
    fn lines(events: &[Value]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for event in events {
            bytes.extend(serde_json::to_vec(event).expect("json"));
            bytes.push(b'\n');
        }
        bytes
    }

    /// The bookmark that ends a streamed initial list.
    fn initial_events_end() -> Value {
        json!({"type": "BOOKMARK", "object": {"apiVersion": "trainer.kubeflow.org/v1alpha1",
               "kind": "TrainJob", "metadata": {"resourceVersion": "7",
               "annotations": {"k8s.io/initial-events-end": "true"}}}})
    }

    /// Drives [`events`] of TrainJobs over the mock until `count` events came, answering each
    /// request with `answer`; returns the events (errors as their text) and each request's
    /// query.
    async fn events_answered(
        count: usize,
        answer: impl Fn(&str, tower_test::mock::SendResponse<Response<Body>>) + Send + 'static,
    ) -> (Vec<String>, Vec<String>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (queries_tx, mut queries_rx) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let query = request.uri().query().unwrap_or_default().to_string();
                answer(&query, reply);
                let _ = queries_tx.send(query);
            }
        });
        let api = Api::<TrainJob>::all(Client::new(service, "default"));
        let seen = events(api, watch_config(), "trainjobs")
            .take(count)
            .map(|event| match event {
                Ok(watcher::Event::Init) => "Init".to_string(),
                Ok(watcher::Event::InitApply(job)) => format!("InitApply {}", job.name_any()),
                Ok(watcher::Event::InitDone) => "InitDone".to_string(),
                Ok(watcher::Event::Apply(job)) => format!("Apply {}", job.name_any()),
                Ok(watcher::Event::Delete(job)) => format!("Delete {}", job.name_any()),
                Err(error) => format!("Err {error}"),
            })
            .collect::<Vec<_>>();
        let seen = tokio::time::timeout(TIMEOUT, seen).await.expect("events");
        server.abort();
        let mut queries = Vec::new();
        while let Ok(query) = queries_rx.try_recv() {
            queries.push(query);
        }
        (seen, queries)
    }

    #[tokio::test]
    async fn an_initial_list_is_streamed_from_one_watch_request() {
        let (seen, queries) = events_answered(3, |query, reply| {
            if query.contains("sendInitialEvents=true") {
                let added = json!({"type": "ADDED", "object": train_job_json()});
                let body = lines(&[added, initial_events_end()]);
                reply.send_response(Response::new(Body::from(body)));
            }
        })
        .await;
        assert_eq!(seen, ["Init", "InitApply pi", "InitDone"]);
        assert!(
            queries[0].contains("watch=true")
                && queries[0].contains("sendInitialEvents=true")
                && queries[0].contains("resourceVersionMatch=NotOlderThan"),
            "{queries:?}"
        );
    }

    /// Kubernetes before 1.32 (or WatchList off) refuses `sendInitialEvents` with 422: listed
    /// in pages instead, and the refusal is no failure of the watch.
    #[tokio::test]
    async fn a_refused_stream_is_listed_in_pages_instead() {
        let (seen, queries) = events_answered(3, |query, reply| {
            if query.contains("sendInitialEvents=true") {
                let mut invalid = status(422);
                invalid["reason"] = json!("Invalid");
                invalid["message"] = json!(
                    "ListOptions.meta.k8s.io \"\" is invalid: \
                    sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch \
                    unless the WatchList feature gate is enabled"
                );
                respond(reply, 422, &invalid);
            } else if !query.contains("watch=true") {
                let mut list = empty_list();
                list["items"] = json!([train_job_json()]);
                respond(reply, 200, &list);
            }
        })
        .await;
        assert_eq!(seen, ["Init", "InitApply pi", "InitDone"]);
        assert!(queries[1].contains("limit=100"), "{queries:?}");
        assert!(!queries[1].contains("watch=true"), "{queries:?}");
    }

    /// An API server whose etcd cannot request watch progress (etcd before 3.5.13) starts the
    /// stream and answers it with an error event: listed in pages instead.
    #[tokio::test]
    async fn an_error_event_before_the_lists_end_lists_in_pages_instead() {
        let (seen, queries) = events_answered(3, |query, reply| {
            if query.contains("sendInitialEvents=true") {
                let mut error = status(500);
                error["message"] = json!(
                    "a watch stream was requested by the client but the \
                    required storage feature RequestWatchProgress is disabled"
                );
                let body = lines(&[json!({"type": "ERROR", "object": error})]);
                reply.send_response(Response::new(Body::from(body)));
            } else if !query.contains("watch=true") {
                respond(reply, 200, &empty_list());
            }
        })
        .await;
        // The stream had begun (`Init`): the paged list begins again, as any relist does.
        assert_eq!(seen, ["Init", "Init", "InitDone"]);
        assert!(
            queries.iter().any(|q| q.contains("limit=100")),
            "{queries:?}"
        );
    }

    /// A 5xx before the watch started says nothing about streaming: the failure is passed on (to
    /// be counted and retried) and the next attempt streams again.
    #[tokio::test]
    async fn a_server_error_is_no_refusal() {
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen, queries) = events_answered(1, move |_query, reply| {
            if answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                respond(reply, 503, &status(503));
            }
        })
        .await;
        assert_eq!(seen.len(), 1);
        assert!(seen[0].starts_with("Err "), "{seen:?}");
        assert!(
            queries.iter().all(|q| q.contains("sendInitialEvents=true")),
            "{queries:?}"
        );
    }
}
