//! A launcher Pod's failed pre-flight (JobSet mode, `PreflightFailed`) or failed launcher run
//! (`LauncherFailed`), and a worker lost before its launcher finished (`WorkerLost`), said on the
//! job's owner as a Warning Event: the JobSet in JobSet mode, the TrainJob in TrainJob mode
//! (what the Events say, and their names, are [`crate::mpi::failed_run`]'s and
//! [`crate::mpi::lost_worker`]'s).
//!
//! One label-selected watch of every JobSet's Pods, read only and uncached: each Pod is looked
//! at when it changes and dropped. A worker that shows a loss is checked against a fresh GET of
//! its JobSet, since JobSet's own teardown (completion, restart, suspension, deletion) ends
//! workers the same way and writes the JobSet's status first. Only Pods of the JobSet-mode JobSets in the JobSet
//! controller's cache, and of the MPI TrainJobs in the TrainJob controller's cache, are
//! reported, so the watch waits for those caches' first lists. An Event is created once per
//! failed run: its name is fixed by the Pod's UID, the container and the run, so a relist, a
//! resync or a restarted reconciler that sees the same failure gets `AlreadyExists` and counts
//! nothing; this term also remembers what it recorded, per Pod, so it does not even ask again.
//! Recording is best effort like every Event: a failed create is logged and tried again on the
//! Pod's next change. It runs within a leadership term, and only writes while leading.

use std::collections::{BTreeSet, HashMap};

use futures::future::{BoxFuture, Shared};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;

use crate::api::{JOBSET_API_VERSION, JobSet, TRAINER_API_VERSION};
use crate::mpi::NODE;
use crate::mpi::failed_run::{
    FailedRun, Watched, failed_runs, has_failed_container, jobset_pod_selector, launcher_pod_jobset,
};
use crate::mpi::jobset_mode::settings;
use crate::mpi::lost_worker::{JobSetProgress, LostWorker, WORKER_LOST, lost_worker, worker_pod};
use crate::mpi::plan::WiredContainer;
use crate::objects::cluster::{CacheMetrics, ClusterObjects, events, retried, watch_config};
use crate::objects::runtime_of;

use super::cached::jobset_as_read;
use super::events::Events;
use super::metrics::ReconcileMetrics;

/// What the launcher-Pod watch needs, for one leadership term.
pub(super) struct LauncherPods {
    pub(super) client: Client,
    /// The JobSet-mode JobSets (the JobSet controller's cache).
    pub(super) jobsets: Store<JobSet>,
    /// Becomes `true` once `jobsets` holds its first list.
    pub(super) jobsets_listed: watch::Receiver<bool>,
    /// The TrainJobs and their runtimes (the TrainJob controller's caches).
    pub(super) objects: ClusterObjects,
    /// Resolves once the TrainJob controller's caches hold their first lists.
    pub(super) caches_ready: Shared<BoxFuture<'static, ()>>,
    /// `true` while this replica may write.
    pub(super) leader: watch::Receiver<bool>,
    /// Creates the Events, once per failed run.
    pub(super) events: Events,
    pub(super) metrics: ReconcileMetrics,
    pub(super) cache_metrics: CacheMetrics,
}

impl LauncherPods {
    /// Watches the launcher Pods until the term ends (the caller drops this future).
    pub(super) async fn run(mut self) {
        // An Event names its owner's UID, and a Pod of a job not in the caches is not
        // reported: before the first lists every job would look like none of ours.
        if self
            .jobsets_listed
            .wait_for(|listed| *listed)
            .await
            .is_err()
        {
            return;
        }
        self.caches_ready.clone().await;
        let pods = Api::<Pod>::all(self.client.clone());
        let config = watch_config().labels(&jobset_pod_selector());
        let events = retried(events(pods, config, "pods"), "pods", &self.cache_metrics);
        self.handle_all(events).await;
    }

    /// Handles every event of the Pod watch, in order.
    pub(super) async fn handle_all(
        &self,
        events: impl Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
    ) {
        let mut recorded = Recorded::default();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => recorded.relist(),
                Ok(watcher::Event::InitApply(pod)) => {
                    recorded.keep(&pod);
                    self.report(&pod, &mut recorded).await;
                }
                Ok(watcher::Event::Apply(pod)) => self.report(&pod, &mut recorded).await,
                Ok(watcher::Event::InitDone) => recorded.listed(),
                Ok(watcher::Event::Delete(pod)) => recorded.forget(&pod),
                Err(_) => {} // logged and backed off by `retried`
            }
        }
    }

    /// Records an Event for each failed run of `pod`, a launcher Pod, or for its loss, a worker
    /// Pod, not recorded yet.
    async fn report(&self, pod: &Pod, recorded: &mut Recorded) {
        if worker_pod(pod).is_some() {
            return self.report_loss(pod, recorded).await;
        }
        // Most launcher Pods never fail: only then are their owners looked up.
        if !has_failed_container(pod) {
            return;
        }
        let Some((regarding, failures)) = self.owner_and_failures(pod).await else {
            return; // not a job of ours
        };
        for failure in failures {
            if recorded.has(&failure.pod_uid, &failure.event_name()) {
                continue;
            }
            if !*self.leader.borrow() {
                return;
            }
            if self.record(&failure, &regarding).await {
                recorded.add(&failure.pod_uid, failure.event_name());
            }
        }
    }

    /// Records the `WorkerLost` Event of `pod`'s attempt when `pod`, a worker of one of our
    /// jobs, was lost while its JobSet ran it. Each Pod is decided once per term.
    async fn report_loss(&self, pod: &Pod, recorded: &mut Recorded) {
        // Most worker Pods are never lost: only then are their owners looked up.
        let Some(lost) = lost_worker(pod) else {
            return;
        };
        if recorded.has(&lost.pod_uid, LOSS_DECIDED) || !*self.leader.borrow() {
            return;
        }
        let Some(regarding) = self.worker_owner(&lost, pod).await else {
            return; // not a worker of ours
        };
        match self.runs_attempt_of(&lost, pod).await {
            Ok(true) => {
                if self.record_loss(&lost, &regarding).await {
                    recorded.add(&lost.pod_uid, LOSS_DECIDED.into());
                }
            }
            // Ended by JobSet itself: nothing to say, and nothing to ask again.
            Ok(false) => recorded.add(&lost.pod_uid, LOSS_DECIDED.into()),
            Err(error) => {
                tracing::warn!(%error, namespace = %lost.namespace, jobset = %lost.jobset,
                    pod = %lost.pod, "reading the JobSet of a lost worker failed");
            }
        }
    }

    /// The owner a lost worker's Event regards, when the Pod is a worker of a JobSet-mode JobSet
    /// (one of its worker groups) or of an MPI TrainJob's JobSet (its `node` replicatedJob).
    async fn worker_owner(&self, lost: &LostWorker, pod: &Pod) -> Option<ObjectReference> {
        let worker = worker_pod(pod)?;
        let name = worker.jobset;
        if let Some(jobset) = self
            .jobsets
            .get(&ObjectRef::new(name).within(&lost.namespace))
        {
            let settings = settings(&jobset_as_read(&jobset).metadata).ok()?;
            return settings
                .worker_groups
                .iter()
                .any(|group| group == worker.replicated_job)
                .then(|| reference(JOBSET_API_VERSION, "JobSet", &jobset.metadata));
        }
        let train_job = self.objects.cached_train_job(&lost.namespace, name)?;
        runtime_of(&self.objects, &train_job, &lost.namespace)
            .await
            .ok()?
            .plan(&train_job)
            .ok()
            .flatten()?;
        (worker.replicated_job == NODE)
            .then(|| reference(TRAINER_API_VERSION, "TrainJob", &train_job.metadata))
    }

    /// Whether the lost worker's JobSet, read now, still runs the attempt `pod` belongs to.
    async fn runs_attempt_of(&self, lost: &LostWorker, pod: &Pod) -> Result<bool, kube::Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &lost.namespace,
            &ApiResource::erase::<JobSet>(&()),
        );
        let Some(jobset) = api.get_opt(&lost.jobset).await? else {
            return Ok(false);
        };
        let progress: JobSetProgress = serde_json::to_value(jobset)
            .and_then(serde_json::from_value)
            .map_err(kube::Error::SerdeError)?;
        Ok(progress.runs_attempt_of(pod))
    }

    /// Creates the `WorkerLost` Event; `true` when it exists now (made here or before).
    async fn record_loss(&self, lost: &LostWorker, regarding: &ObjectReference) -> bool {
        let created = self
            .events
            .create_once(&lost.namespace, |controller, instance| {
                lost.event(
                    regarding.clone(),
                    controller,
                    instance,
                    k8s_openapi::jiff::Timestamp::now(),
                )
            });
        match created.await {
            Ok(true) => {
                self.metrics.lost_worker();
                tracing::info!(namespace = %lost.namespace, jobset = %lost.jobset,
                    pod = %lost.pod, attempt = lost.attempt, cause = ?lost.cause,
                    reason = WORKER_LOST, "recorded a lost worker");
                true
            }
            Ok(false) => true,
            Err(error) => {
                tracing::warn!(%error, namespace = %lost.namespace, jobset = %lost.jobset,
                    pod = %lost.pod, reason = WORKER_LOST, "recording a lost worker failed");
                false
            }
        }
    }

    /// The owner the Events of `pod` regard, and its failed runs: a JobSet-mode JobSet's
    /// pre-flight and wired launcher container, or an MPI TrainJob's launcher container
    /// (Trainer's JobSet, and so its Pods' `jobset-name`, has the TrainJob's name).
    async fn owner_and_failures(&self, pod: &Pod) -> Option<(ObjectReference, Vec<FailedRun>)> {
        let name = launcher_pod_jobset(pod)?;
        let namespace = pod.metadata.namespace.as_deref()?;
        if let Some(jobset) = self.jobsets.get(&ObjectRef::new(name).within(namespace)) {
            let mut failures = failed_runs(pod, Watched::Preflight);
            // Settings that do not parse were denied at admission; then only the pre-flight.
            if let Ok(settings) = settings(&jobset_as_read(&jobset).metadata) {
                let wired = WiredContainer::for_jobset(settings.container.as_deref());
                failures.extend(failed_runs(pod, Watched::Launcher(&wired)));
            }
            return Some((
                reference(JOBSET_API_VERSION, "JobSet", &jobset.metadata),
                failures,
            ));
        }
        // The cache only: a GET for every failed launcher of a plain JobSet would be waste.
        let train_job = self.objects.cached_train_job(namespace, name)?;
        let resolved = runtime_of(&self.objects, &train_job, namespace)
            .await
            .ok()?;
        let plan = resolved.plan(&train_job).ok().flatten()?;
        let failures = failed_runs(pod, Watched::Launcher(&plan.wired_container));
        Some((
            reference(TRAINER_API_VERSION, "TrainJob", &train_job.metadata),
            failures,
        ))
    }

    /// Creates the Event; `true` when it exists now (made here or before).
    async fn record(&self, failure: &FailedRun, regarding: &ObjectReference) -> bool {
        let reason = failure.kind.reason();
        let created = self
            .events
            .create_once(&failure.namespace, |controller, instance| {
                failure.event(
                    regarding.clone(),
                    controller,
                    instance,
                    k8s_openapi::jiff::Timestamp::now(),
                )
            });
        match created.await {
            Ok(true) => {
                self.metrics.failed_run(failure.kind);
                tracing::info!(namespace = %failure.namespace, jobset = %failure.jobset,
                    pod = %failure.pod, container = %failure.container, run = failure.run,
                    reason, "recorded a failed run");
                true
            }
            Ok(false) => true,
            Err(error) => {
                tracing::warn!(%error, namespace = %failure.namespace, jobset = %failure.jobset,
                    pod = %failure.pod, reason, "recording a failed run failed");
                false
            }
        }
    }
}

/// The object reference of an owner, UID included.
fn reference(api_version: &str, kind: &str, metadata: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        name: metadata.name.clone(),
        namespace: metadata.namespace.clone(),
        uid: metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The failed runs this term has recorded (or found recorded), by Pod UID, as their Event
/// names. A deleted Pod's are forgotten; across a relist, which does not say which Pods went
/// away, only the Pods listed again keep theirs.
#[derive(Debug, Default)]
struct Recorded {
    runs: HashMap<String, BTreeSet<String>>,
    before_relist: HashMap<String, BTreeSet<String>>,
}

/// What [`Recorded`] keeps for a worker Pod once its loss is recorded, or found to be JobSet's
/// own teardown: it is not looked at again.
const LOSS_DECIDED: &str = "worker-lost";

impl Recorded {
    fn has(&self, pod_uid: &str, name: &str) -> bool {
        self.runs
            .get(pod_uid)
            .is_some_and(|runs| runs.contains(name))
    }

    fn add(&mut self, pod_uid: &str, name: String) {
        self.runs
            .entry(pod_uid.to_owned())
            .or_default()
            .insert(name);
    }

    fn relist(&mut self) {
        self.before_relist = std::mem::take(&mut self.runs);
    }

    fn keep(&mut self, pod: &Pod) {
        if let Some(runs) = pod
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.before_relist.remove_entry(uid))
        {
            self.runs.insert(runs.0, runs.1);
        }
    }

    fn listed(&mut self) {
        self.before_relist = HashMap::new();
    }

    fn forget(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.runs.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::channel::mpsc;
    use http::{Method, Request, Response};
    use kube::client::Body;
    use kube::runtime::events::Reporter;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    use super::*;
    use crate::api::{RuntimeKind, TrainJob, TrainingRuntime};
    use crate::mpi::failed_run::{LAUNCHER_FAILED, PREFLIGHT_FAILED};
    use crate::mpi::lost_worker::WORKER_LOST;
    use crate::objects::cluster::tests::synced_store;
    use futures::FutureExt;

    const TIMEOUT: Duration = Duration::from_secs(2);
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events?";
    const LINE: &str = "pi-node-0-1.pi: no DNS answer after 300 s";

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
    type PodEvents = mpsc::UnboundedSender<Result<watcher::Event<Pod>, watcher::Error>>;

    fn jobset() -> JobSet {
        serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "pi", "namespace": "team", "uid": "js-1",
                         "labels": {"mpi-webhook.io/implementation": "OpenMPI"}},
            "spec": {}
        }))
        .expect("JobSet")
    }

    /// A launcher Pod of JobSet `jobset` whose `init` is its `mpi-preflight` status.
    fn pod(jobset: &str, uid: &str, init: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{jobset}-launcher-0-0-x"), "namespace": "team",
                "uid": uid, "labels": {"jobset.sigs.k8s.io/jobset-name": jobset,
                                       "jobset.sigs.k8s.io/replicatedjob-name": "launcher"}},
            "status": {"initContainerStatuses": [init]}
        }))
        .expect("Pod")
    }

    fn init_status(name: &str, restarts: i32, code: i32, last_code: Option<i32>) -> Value {
        let terminated = |code: i32, message: &str| json!({"terminated": {"exitCode": code, "reason": "Error", "message": message}});
        json!({"name": name, "image": "i", "imageID": "", "ready": false,
               "restartCount": restarts, "state": terminated(code, LINE),
               "lastState": last_code.map_or(json!({}), |c| terminated(c, "before"))})
    }

    fn failed(restarts: i32) -> Pod {
        let last = (restarts > 0).then_some(1);
        pod("pi", "u-1", init_status("mpi-preflight", restarts, 1, last))
    }

    /// An MPI TrainJob `tj` in `team` on ClusterTrainingRuntime `mpi` (Trainer's launcher
    /// container: `node`).
    fn train_job() -> TrainJob {
        serde_json::from_value(json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "team", "uid": "tj-1"},
            "spec": {"runtimeRef": {"name": "mpi"}}
        }))
        .expect("TrainJob")
    }

    fn mpi_runtime() -> TrainingRuntime {
        let rjob = |name: &str| {
            json!({"name": name, "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "node", "image": "mpi"}]}}}}})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "mpi"},
            "spec": {"mlPolicy": {"numNodes": 2, "mpi": {"numProcPerNode": 1}},
                     "template": {"spec": {"replicatedJobs": [rjob("launcher"), rjob("node")]}}}
        }))
        .expect("runtime")
    }

    /// The launcher-Pod watch as replica `replica-a`, over a mock API server, with [`jobset`]
    /// in its JobSet cache and [`train_job`] on [`mpi_runtime`] in its TrainJob caches.
    fn over_mock(
        leader: watch::Receiver<bool>,
        jobsets_listed: watch::Receiver<bool>,
    ) -> (LauncherPods, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let objects = ClusterObjects::from_stores(
            client.clone(),
            synced_store((), vec![train_job()]),
            synced_store(RuntimeKind::TrainingRuntime, vec![]),
            synced_store(RuntimeKind::ClusterTrainingRuntime, vec![mpi_runtime()]),
            CacheMetrics::default(),
        );
        let pods = LauncherPods {
            client: client.clone(),
            jobsets: synced_store((), vec![jobset()]),
            jobsets_listed,
            objects,
            caches_ready: futures::future::ready(()).boxed().shared(),
            leader,
            events: Events::new(
                client.clone(),
                Reporter {
                    controller: "mpi-webhook".into(),
                    instance: Some("replica-a".into()),
                },
            ),
            metrics: ReconcileMetrics::default(),
            cache_metrics: CacheMetrics::default(),
        };
        (pods, handle)
    }

    /// The watch handler over a mock API server, fed by the returned sender; the task returns the
    /// pre-flight and launcher failures it counted once the sender is dropped.
    fn launcher_pods(
        leader: bool,
    ) -> (
        PodEvents,
        Handle,
        tokio::task::JoinHandle<(u64, u64)>,
        watch::Sender<bool>,
    ) {
        let (leader_tx, leader_rx) = watch::channel(leader);
        let (pods, handle) = over_mock(leader_rx, watch::channel(true).1);
        let (tx, rx) = mpsc::unbounded();
        let task = tokio::spawn(async move {
            pods.handle_all(rx).await;
            (
                pods.metrics.preflight_failures(),
                pods.metrics.launcher_failures(),
            )
        });
        (tx, handle, task, leader_tx)
    }

    fn send(events: &PodEvents, event: watcher::Event<Pod>) {
        events.unbounded_send(Ok(event)).expect("handler alive");
    }

    /// Answers the next request, which must create a `PreflightFailed` Event on [`jobset`];
    /// its name and note.
    async fn event_created(handle: &mut Handle, status: u16) -> (String, String) {
        let regarding = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "name": "pi", "namespace": "team", "uid": "js-1"});
        created(handle, status, PREFLIGHT_FAILED, &regarding).await
    }

    /// Answers the next request, which must create a Warning Event `reason` regarding
    /// `regarding`; its name and note.
    async fn created(
        handle: &mut Handle,
        status: u16,
        reason: &str,
        regarding: &Value,
    ) -> (String, String) {
        let (request, reply) = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("a request")
            .expect("open");
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri().to_string(), EVENTS);
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(body["reason"], reason);
        assert_eq!(body["type"], "Warning");
        assert_eq!(&body["regarding"], regarding);
        assert_eq!(body["reportingInstance"], "replica-a");
        let reply_body = if status == 201 {
            body.clone()
        } else {
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": status,
                   "reason": if status == 409 { "AlreadyExists" } else { "InternalError" },
                   "message": "scripted"})
        };
        let response = Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&reply_body).expect("json")))
            .expect("response");
        reply.send_response(response);
        let text = |key: &str| body[key].as_str().unwrap_or_default().to_string();
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        (name.to_string(), text("note"))
    }

    /// Ends the handler and returns its count; no request may be left.
    async fn finish<T>(
        events: PodEvents,
        mut handle: Handle,
        task: tokio::task::JoinHandle<T>,
    ) -> T {
        drop(events);
        let counted = tokio::time::timeout(TIMEOUT, task)
            .await
            .expect("the handler ends with its stream")
            .expect("no panic");
        let left = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("the client is dropped");
        assert!(
            left.is_none(),
            "an unexpected request: {:?}",
            left.map(|r| r.0.uri().clone())
        );
        counted
    }

    #[tokio::test]
    async fn one_event_per_failed_run_none_for_success_or_other_containers() {
        let (events, mut handle, task, _leader) = launcher_pods(true);
        send(
            &events,
            watcher::Event::Apply(pod("pi", "u-1", init_status("mpi-preflight", 0, 0, None))),
        );
        send(
            &events,
            watcher::Event::Apply(pod("pi", "u-1", init_status("mpi-ssh-setup", 0, 1, None))),
        );
        send(&events, watcher::Event::Apply(failed(0)));
        assert_eq!(
            event_created(&mut handle, 201).await,
            ("u-1.preflight-0".to_string(), LINE.to_string())
        );
        // The same status again, then a relist that lists it again: nothing more.
        send(&events, watcher::Event::Apply(failed(0)));
        send(&events, watcher::Event::Init);
        send(&events, watcher::Event::InitApply(failed(0)));
        send(&events, watcher::Event::InitDone);
        // A failed pre-flight in a JobSet that is not a JobSet-mode one of the cache: nothing.
        send(
            &events,
            watcher::Event::Apply(pod(
                "other",
                "u-2",
                init_status("mpi-preflight", 0, 1, None),
            )),
        );
        // The container restarted and failed again: one more, for run 1 only.
        send(&events, watcher::Event::Apply(failed(1)));
        assert_eq!(
            event_created(&mut handle, 201).await,
            ("u-1.preflight-1".to_string(), LINE.to_string())
        );
        assert_eq!(finish(events, handle, task).await, (2, 0));
    }

    /// A restarted reconciler finds the Event its predecessor made (409): it counts nothing and
    /// does not ask again.
    #[tokio::test]
    async fn an_event_recorded_before_is_not_recorded_or_counted_again() {
        let (events, mut handle, task, _leader) = launcher_pods(true);
        send(&events, watcher::Event::Init);
        send(&events, watcher::Event::InitApply(failed(0)));
        send(&events, watcher::Event::InitDone);
        assert_eq!(event_created(&mut handle, 409).await.0, "u-1.preflight-0");
        send(&events, watcher::Event::Apply(failed(0)));
        assert_eq!(finish(events, handle, task).await, (0, 0));
    }

    /// A create that failed is tried again on the Pod's next change; a deleted Pod is forgotten.
    #[tokio::test]
    async fn a_failed_create_is_tried_again_on_the_next_change() {
        let (events, mut handle, task, _leader) = launcher_pods(true);
        send(&events, watcher::Event::Apply(failed(0)));
        assert_eq!(event_created(&mut handle, 500).await.0, "u-1.preflight-0");
        send(&events, watcher::Event::Apply(failed(0)));
        assert_eq!(event_created(&mut handle, 201).await.0, "u-1.preflight-0");
        send(&events, watcher::Event::Delete(failed(0)));
        assert_eq!(finish(events, handle, task).await, (1, 0));
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_records_nothing() {
        let (events, handle, task, _leader) = launcher_pods(false);
        send(&events, watcher::Event::Apply(failed(0)));
        assert_eq!(finish(events, handle, task).await, (0, 0));
    }

    /// A launcher Pod of `jobset` whose containers are `names` (in order), with the
    /// statuses of `statuses` and a succeeded pre-flight.
    fn launcher(jobset: &str, uid: &str, names: &[&str], statuses: Value) -> Pod {
        let mut pod = pod(jobset, uid, init_status("mpi-preflight", 0, 0, None));
        pod.spec = Some(
            serde_json::from_value(json!({"containers": names.iter()
                .map(|n| json!({"name": n, "image": "mpi"})).collect::<Vec<_>>()}))
            .expect("PodSpec"),
        );
        if let Some(status) = pod.status.as_mut() {
            status.container_statuses = Some(serde_json::from_value(statuses).expect("statuses"));
        }
        pod
    }

    /// The status of container `name`: `restarts`, exit `code` now (with the output `OUT`),
    /// and exit `last` before the last restart.
    fn exited(name: &str, restarts: i32, code: i32, last: Option<i32>) -> Value {
        let mut status = init_status(name, restarts, code, last);
        status["state"]["terminated"]["message"] = json!(OUT);
        status
    }

    const OUT: &str = "mpirun: rank 0 exited with status 3";

    /// [`jobset`]'s reference.
    fn jobset_ref() -> Value {
        json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
               "name": "pi", "namespace": "team", "uid": "js-1"})
    }

    /// JobSet mode: the JobSet's wired container (its first: no `mpi-webhook.io/container`)
    /// fails, once per run; the same status again, a relist, a sidecar failing: nothing more.
    #[tokio::test]
    async fn one_launcher_failed_event_per_failed_run_of_the_wired_container() {
        let (events, mut handle, task, _leader) = launcher_pods(true);
        let names = ["launcher", "sidecar"];
        let run0 = launcher("pi", "u-1", &names, json!([exited("launcher", 0, 3, None)]));
        send(&events, watcher::Event::Apply(run0.clone()));
        let note = format!(
            "launcher in Pod pi-launcher-0-0-x exited with code 3 (Error); its last output:\n{OUT}"
        );
        assert_eq!(
            created(&mut handle, 201, LAUNCHER_FAILED, &jobset_ref()).await,
            ("u-1.launcher-0".to_string(), note)
        );
        send(&events, watcher::Event::Apply(run0.clone()));
        send(&events, watcher::Event::Init);
        send(&events, watcher::Event::InitApply(run0));
        send(&events, watcher::Event::InitDone);
        let sidecar = launcher("pi", "u-1", &names, json!([exited("sidecar", 0, 1, None)]));
        send(&events, watcher::Event::Apply(sidecar));
        // Restarted by kubelet and failed again: run 1 only (run 0 is in lastState).
        let run1 = launcher(
            "pi",
            "u-1",
            &names,
            json!([exited("launcher", 1, 3, Some(3))]),
        );
        send(&events, watcher::Event::Apply(run1));
        assert_eq!(
            created(&mut handle, 201, LAUNCHER_FAILED, &jobset_ref())
                .await
                .0,
            "u-1.launcher-1"
        );
        // A new Pod from the Job: its own run 0.
        let next = launcher("pi", "u-2", &names, json!([exited("launcher", 0, 3, None)]));
        send(&events, watcher::Event::Apply(next));
        assert_eq!(
            created(&mut handle, 201, LAUNCHER_FAILED, &jobset_ref())
                .await
                .0,
            "u-2.launcher-0"
        );
        assert_eq!(finish(events, handle, task).await, (0, 3));
    }

    /// TrainJob mode: the TrainJob's launcher container (`node`) fails; the Event regards the
    /// TrainJob. A launcher Pod of a JobSet that is neither ours nor a TrainJob's: nothing.
    #[tokio::test]
    async fn a_trainjobs_failed_launcher_is_an_event_on_the_trainjob() {
        let (events, mut handle, task, _leader) = launcher_pods(true);
        let failed_node = json!([exited("node", 0, 137, None)]);
        send(
            &events,
            watcher::Event::Apply(launcher("stranger", "u-9", &["node"], failed_node.clone())),
        );
        send(
            &events,
            watcher::Event::Apply(launcher("tj", "u-3", &["node"], failed_node)),
        );
        let train_job = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                               "name": "tj", "namespace": "team", "uid": "tj-1"});
        let (name, note) = created(&mut handle, 201, LAUNCHER_FAILED, &train_job).await;
        assert_eq!(name, "u-3.launcher-0");
        assert_eq!(
            note,
            format!(
                "node in Pod tj-launcher-0-0-x exited with code 137 (Error); its last output:\n{OUT}"
            )
        );
        assert_eq!(finish(events, handle, task).await, (0, 1));
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_records_no_launcher_failure() {
        let (events, handle, task, _leader) = launcher_pods(false);
        let run0 = launcher(
            "pi",
            "u-1",
            &["launcher"],
            json!([exited("launcher", 0, 3, None)]),
        );
        send(&events, watcher::Event::Apply(run0));
        assert_eq!(finish(events, handle, task).await, (0, 0));
    }

    /// A worker Pod of JobSet `jobset`'s replicatedJob `rjob`, attempt 0, deleted.
    fn deleted_worker(jobset: &str, rjob: &str, uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{jobset}-{rjob}-0-1-x"), "namespace": "team",
                "uid": uid, "deletionTimestamp": "2026-12-07T10:01:00Z",
                "labels": {"jobset.sigs.k8s.io/jobset-name": jobset,
                           "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                           "jobset.sigs.k8s.io/restart-attempt": "0"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "node", "image": "mpi"}]},
            "status": {"phase": "Running"}
        }))
        .expect("Pod")
    }

    /// Sends worker `uid` of JobSet `pi`, deleted.
    fn lose(events: &PodEvents, uid: &str) {
        send(
            events,
            watcher::Event::Apply(deleted_worker("pi", "node", uid)),
        );
    }

    /// Answers the next request, which must be a GET of JobSet `pi`, with `status` and `body`.
    async fn jobset_read(handle: &mut Handle, status: u16, body: Value) {
        let (request, reply) = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("a request")
            .expect("open");
        assert_eq!(request.method(), Method::GET);
        assert_eq!(
            request.uri().path(),
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team/jobsets/pi"
        );
        let response = Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response");
        reply.send_response(response);
    }

    /// The handler over a mock API server, fed by the returned sender; the task returns the
    /// lost workers it counted once the sender is dropped.
    fn worker_pods() -> (PodEvents, Handle, tokio::task::JoinHandle<u64>) {
        let (pods, handle) = over_mock(watch::channel(true).1, watch::channel(true).1);
        let (tx, rx) = mpsc::unbounded();
        let task = tokio::spawn(async move {
            pods.handle_all(rx).await;
            pods.metrics.lost_workers()
        });
        (tx, handle, task)
    }

    /// A worker deleted while its JobSet runs its attempt: the JobSet is read once, then one
    /// `WorkerLost` Event for the attempt; the same Pod again asks nothing, and a second worker
    /// of the attempt finds the Event made (409) and counts nothing.
    #[tokio::test]
    async fn a_lost_worker_is_one_event_per_attempt_after_a_fresh_read_of_its_jobset() {
        let (events, mut handle, task) = worker_pods();
        lose(&events, "w-1");
        jobset_read(
            &mut handle,
            200,
            json!({"metadata": {"name": "pi"}, "status": {"restarts": 0}}),
        )
        .await;
        assert_eq!(
            created(&mut handle, 201, WORKER_LOST, &jobset_ref()).await,
            (
                "js-1.worker-lost-0".to_string(),
                "worker Pod pi-node-0-1-x on node n1 was deleted before the launcher finished"
                    .to_string()
            )
        );
        lose(&events, "w-1");
        lose(&events, "w-2");
        jobset_read(&mut handle, 200, json!({"metadata": {"name": "pi"}})).await;
        assert_eq!(
            created(&mut handle, 409, WORKER_LOST, &jobset_ref())
                .await
                .0,
            "js-1.worker-lost-0"
        );
        lose(&events, "w-2");
        assert_eq!(finish(events, handle, task).await, 1);
    }

    /// Workers JobSet ends itself (a restart, the JobSet gone), workers of a JobSet not ours,
    /// a replicatedJob that is no worker group, and a running worker: no Event.
    #[tokio::test]
    async fn workers_jobset_ends_itself_or_not_ours_are_not_lost() {
        let (events, mut handle, task) = worker_pods();
        lose(&events, "w-1");
        jobset_read(
            &mut handle,
            200,
            json!({"metadata": {"name": "pi"}, "status": {"restarts": 1}}),
        )
        .await;
        // Decided: not asked again.
        lose(&events, "w-1");
        lose(&events, "w-2");
        let gone = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404,
                          "reason": "NotFound", "message": "jobsets \"pi\" not found"});
        jobset_read(&mut handle, 404, gone).await;
        send(
            &events,
            watcher::Event::Apply(deleted_worker("other", "node", "w-3")),
        );
        send(
            &events,
            watcher::Event::Apply(deleted_worker("pi", "dataloader", "w-4")),
        );
        let mut running = deleted_worker("pi", "node", "w-5");
        running.metadata.deletion_timestamp = None;
        send(&events, watcher::Event::Apply(running));
        assert_eq!(finish(events, handle, task).await, 0);
    }

    /// The watch starts only once the JobSet cache is listed, and selects every JobSet's Pods.
    #[tokio::test]
    async fn the_pod_watch_waits_for_the_jobset_cache_and_selects_jobset_pods() {
        let (listed_tx, listed) = watch::channel(false);
        let (pods, mut handle) = over_mock(watch::channel(true).1, listed);
        let task = tokio::spawn(pods.run());
        let early = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
        assert!(early.is_err(), "a request before the JobSets were listed");
        listed_tx.send_replace(true);
        let (request, _reply) = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("the Pod list")
            .expect("open");
        assert_eq!(request.uri().path(), "/api/v1/pods");
        let query = request.uri().query().unwrap_or_default();
        assert!(
            query.contains("labelSelector=jobset.sigs.k8s.io%2Freplicatedjob-name&")
                || query.ends_with("labelSelector=jobset.sigs.k8s.io%2Freplicatedjob-name"),
            "{query}"
        );
        task.abort();
    }
}
