//! Mock API server scenarios for the reconciler: a tower-test pair behind a real `kube::Client`.
//! Each test scripts the whole conversation (method, URI, exact JSON body, reply) and awaits
//! both the reconcile and the script with a timeout. A reconcile that makes a call the script
//! does not expect hangs waiting for its reply and fails on the timeout; a script that expects
//! a call the reconcile never makes fails the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::sync::watch;

use kube::runtime::reflector::ObjectRef;

use super::cached::{cached_data, jobset_as_read, jobset_read};
use super::context::RETRY_MAX;
use super::run::{Shared, Triggers, lead, managed_selector, users_of};
use super::writes::applied;
use super::*;
use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::mpi::objects_for;
use crate::mpi::ssh_secret::{KeyError, SshKeyPair};
use crate::objects::cluster::tests::synced_store;
use crate::objects::cluster::{CacheMetrics, ClusterObjects};

const TIMEOUT: Duration = Duration::from_secs(2);
const SECRET_URL: &str = "/api/v1/namespaces/team/secrets";
/// The apply is always sent without `force` first (Decision 16).
const CONFIGMAP_URL: &str =
    "/api/v1/namespaces/team/configmaps/pi-mpi-hostfile?&fieldManager=mpi-webhook";
const CONFIGMAP_FORCE_URL: &str =
    "/api/v1/namespaces/team/configmaps/pi-mpi-hostfile?&force=true&fieldManager=mpi-webhook";
const EVENTS_URL: &str = "/apis/events.k8s.io/v1/namespaces/team/events?";
const NETWORK_POLICY_URL: &str =
    "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/pi-mpi?&fieldManager=mpi-webhook";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

fn fixed_keys() -> Result<SshKeyPair, KeyError> {
    Ok(SshKeyPair {
        private_key_pem: "-----BEGIN EC PRIVATE KEY-----\nKEY\n-----END EC PRIVATE KEY-----\n"
            .into(),
        public_key_line: "ecdsa-sha2-nistp521 AAAA\n".into(),
    })
}

fn train_job() -> TrainJob {
    serde_json::from_value(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "pi", "namespace": "team", "uid": "uid-1"},
        "spec": {"runtimeRef": {"name": "deepspeed"}, "trainer": {"numNodes": 3}}
    }))
    .expect("TrainJob")
}

fn runtime(mpi: Option<Value>) -> TrainingRuntime {
    let node = |name: &str| {
        json!({"name": name, "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "node", "image": "mpi"}]}}}}})
    };
    let mut ml_policy = json!({"numNodes": 1});
    if let Some(mpi) = mpi {
        ml_policy["mpi"] = mpi;
    }
    serde_json::from_value(json!({
        "metadata": {"name": "deepspeed"},
        "spec": {"mlPolicy": ml_policy, "template": {"spec": {
            "replicatedJobs": [node("node"), node("launcher")]}}}
    }))
    .expect("runtime")
}

fn mpi_runtime() -> TrainingRuntime {
    runtime(Some(
        json!({"numProcPerNode": 1, "runLauncherAsNode": true}),
    ))
}

/// The exact ConfigMap the reconciler must apply for [`train_job`] on [`mpi_runtime`].
fn expected_configmap() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "pi-mpi-hostfile",
            "namespace": "team",
            "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"},
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
                "uid": "uid-1", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "data": {"hostfile": "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n"}
    })
}

fn expected_secret() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "pi-mpi-ssh-auth",
            "namespace": "team",
            "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"},
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
                "uid": "uid-1", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "type": "kubernetes.io/ssh-auth",
        "immutable": true,
        "data": {
            "ssh-privatekey": "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCktFWQotLS0tLUVORCBFQyBQUklWQVRFIEtFWS0tLS0tCg==",
            "ssh-publickey": "ZWNkc2Etc2hhMi1uaXN0cDUyMSBBQUFBCg=="
        }
    })
}

/// The exact NetworkPolicy the reconciler must apply for [`train_job`].
fn expected_network_policy() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "pi-mpi",
            "namespace": "team",
            "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"},
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
                "uid": "uid-1", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "podSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {
                "matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}}}]}]
        }
    })
}

/// `configmap` as the ConfigMap cache keeps it: its identity and its hostfile's digest.
fn cached(mut configmap: ConfigMap) -> ConfigMap {
    crate::objects::cluster::identity(&mut configmap);
    cached_data(&mut configmap);
    configmap
}

/// What is in the caches when the reconcile runs.
#[derive(Default)]
struct Caches {
    runtime: Option<TrainingRuntime>,
    /// This term already created or found the owner's Secret (the reconciler reads no Secret:
    /// this is all it knows of one).
    secret: bool,
    configmap: Option<ConfigMap>,
    network_policy: Option<NetworkPolicy>,
    /// `--network-policy-default`.
    object_options: objects_for::Options,
}

struct Fixture {
    ctx: Arc<Context>,
    server: ApiServer,
    leader: watch::Sender<bool>,
    metrics: ReconcileMetrics,
}

/// A fixture whose only cached object is the MPI runtime: every other object is looked up.
fn mpi_fixture() -> Fixture {
    fixture(Caches {
        runtime: Some(mpi_runtime()),
        ..Caches::default()
    })
}

fn fixture(caches: Caches) -> Fixture {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let objects = ClusterObjects::from_stores(
        client.clone(),
        synced_store((), vec![]),
        synced_store(RuntimeKind::TrainingRuntime, vec![]),
        synced_store(
            RuntimeKind::ClusterTrainingRuntime,
            caches.runtime.into_iter().collect(),
        ),
        CacheMetrics::default(),
    );
    let (leader, leader_rx) = watch::channel(true);
    let metrics = ReconcileMetrics::default();
    let reporter = Reporter {
        controller: "mpi-webhook".into(),
        instance: Some("test".into()),
    };
    let ctx = Context::new(ContextParts {
        client: client.clone(),
        objects,
        ensured: Arc::default(),
        configmaps: synced_store((), caches.configmap.map(cached).into_iter().collect()),
        network_policies: synced_store((), caches.network_policy.into_iter().collect()),
        applied: Arc::default(),
        applied_policies: Arc::default(),
        events: Events::new(client, reporter),
        metrics: metrics.clone(),
        leader: leader_rx,
        keygen: fixed_keys,
        object_options: caches.object_options,
    });
    if caches.secret {
        // The TrainJob's and the JobSet's of the tests.
        ctx.ensured.record("uid-1");
        ctx.ensured.record("js-uid");
    }
    Fixture {
        ctx: Arc::new(ctx),
        server: ApiServer(handle),
        leader,
        metrics,
    }
}

/// The other end of the client: asserts each request and answers it.
struct ApiServer(Handle);

impl ApiServer {
    /// Takes the next request, asserts its method and URI, returns its JSON body (Null if none).
    async fn expect(&mut self, method: Method, uri: &str) -> (Value, Reply) {
        let (request, reply) = self.0.next_request().await.expect("a request");
        assert_eq!(request.method(), method, "{}", request.uri());
        assert_eq!(request.uri().to_string(), uri);
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        (body, reply)
    }

    async fn secret_create(&mut self, status: u16) {
        let uri = format!("{SECRET_URL}?&fieldManager=mpi-webhook");
        let (body, reply) = self.expect(Method::POST, &uri).await;
        assert_eq!(body, expected_secret());
        match status {
            201 => respond(reply, 201, &body),
            code => respond(reply, code, &status_body(code)),
        }
    }

    async fn configmap_apply(&mut self) {
        let (body, reply) = self.expect(Method::PATCH, CONFIGMAP_URL).await;
        assert_eq!(body, expected_configmap());
        respond(reply, 200, &body);
    }

    /// The apply without force, refused: `manager` (an applier) holds `.data.hostfile`.
    async fn configmap_apply_conflict(&mut self, manager: &str) {
        let (body, reply) = self.expect(Method::PATCH, CONFIGMAP_URL).await;
        assert_eq!(body, expected_configmap());
        respond(reply, 409, &apply_conflict(manager, ".data.hostfile"));
    }

    async fn configmap_force_apply(&mut self) {
        let (body, reply) = self.expect(Method::PATCH, CONFIGMAP_FORCE_URL).await;
        assert_eq!(body, expected_configmap());
        respond(reply, 200, &body);
    }

    async fn configmap_get(&mut self, stored: &Value) {
        let uri = "/api/v1/namespaces/team/configmaps/pi-mpi-hostfile";
        let (_, reply) = self.expect(Method::GET, uri).await;
        respond(reply, 200, stored);
    }

    /// The NetworkPolicy apply (without force), answered with `status`.
    async fn network_policy_apply(&mut self, expected: &Value, status: u16) {
        let (body, reply) = self.expect(Method::PATCH, NETWORK_POLICY_URL).await;
        assert_eq!(&body, expected);
        match status {
            200 => respond(reply, 200, &body),
            code => respond(reply, code, &status_body(code)),
        }
    }

    /// An Event on the TrainJob; returns (type, reason, note).
    /// A repeated Event is a PATCH of the first one's series (the Recorder aggregates).
    async fn event(&mut self) -> (String, String, String) {
        let (request, reply) = self.0.next_request().await.expect("a request");
        let uri = request.uri().to_string();
        let repeated =
            request.method() == Method::PATCH && uri.starts_with(EVENTS_URL.trim_end_matches('?'));
        assert!(
            (request.method() == Method::POST && uri == EVENTS_URL) || repeated,
            "{} {uri}",
            request.method()
        );
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body: Value = serde_json::from_slice(&bytes).expect("JSON body");
        assert_eq!(body["regarding"]["name"], "pi");
        assert_eq!(body["regarding"]["kind"], "TrainJob");
        assert_eq!(body["reportingController"], "mpi-webhook");
        let text = |key: &str| body[key].as_str().unwrap_or_default().to_string();
        let seen = (text("type"), text("reason"), text("note"));
        respond(reply, 201, &body);
        seen
    }
}

fn respond(reply: Reply, status: u16, body: &Value) {
    let bytes = serde_json::to_vec(body).expect("json");
    let response = Response::builder()
        .status(status)
        .body(Body::from(bytes))
        .expect("response");
    reply.send_response(response);
}

fn status_body(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "AlreadyExists",
        _ => "InternalError",
    };
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
           "message": format!("scripted {code}"), "reason": reason, "code": code})
}

/// The API server's answer to an apply refused because `manager`, an applier, holds `field`
/// (k8s.io/apimachinery `managedfields/internal/conflict.go`, `NewConflictError`).
fn apply_conflict(manager: &str, field: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("Apply failed with 1 conflict: conflict with \"{manager}\": {field}"),
           "reason": "Conflict",
           "details": {"causes": [{"reason": "FieldManagerConflict",
                                   "message": format!("conflict with \"{manager}\""),
                                   "field": field}]},
           "code": 409})
}

/// Runs a reconcile beside the script of the API calls it must make; both must finish within
/// [`TIMEOUT`]. Their outputs.
async fn scripted<R, T>(
    reconcile: impl Future<Output = R>,
    script: impl Future<Output = T> + Send + 'static,
) -> (R, T)
where
    T: Send + 'static,
{
    let script = tokio::spawn(script);
    let result = tokio::time::timeout(TIMEOUT, reconcile)
        .await
        .expect("reconcile finished (an unscripted call would hang here)");
    let script = tokio::time::timeout(TIMEOUT, script)
        .await
        .expect("script finished (a scripted call was never made)")
        .expect("script passed");
    (result, script)
}

/// Runs one reconcile of the TrainJob against a script.
async fn converse<S, F>(ctx: &Arc<Context>, server: ApiServer, script: S) -> Result<Action, Error>
where
    S: FnOnce(ApiServer) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    scripted(
        reconcile(Arc::new(train_job()), ctx.clone()),
        script(server),
    )
    .await
    .0
}

/// Like [`converse`], but the script hands the server back for the next reconcile.
async fn converse_again<S, F>(
    ctx: &Arc<Context>,
    server: ApiServer,
    script: S,
) -> (Result<Action, Error>, ApiServer)
where
    S: FnOnce(ApiServer) -> F + Send + 'static,
    F: Future<Output = ApiServer> + Send + 'static,
{
    scripted(
        reconcile(Arc::new(train_job()), ctx.clone()),
        script(server),
    )
    .await
}

/// The cache keeps no labels (their watch selects ours by the managed-by label): a cached
/// ConfigMap without it is in place; one missing a label we set besides it is not.
#[test]
fn the_selector_label_is_taken_as_present_in_the_cache() {
    let desired: ConfigMap = serde_json::from_value(expected_configmap()).expect("cm");
    let cached = cached(desired.clone());
    assert_eq!(cached.metadata.labels, None);
    assert!(applied(&cached, &desired));
    let mut more = desired.clone();
    more.metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "a".into());
    assert!(!applied(&cached, &more));
}

/// The Secret is made with a create alone (201: used), never looked up first: a GET before it
/// would fail the script, which expects the POST first (Decision 22).
#[tokio::test]
async fn absent_secret_is_created_with_exact_fields_then_configmap_applied() {
    let f = mpi_fixture();
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.secret_create(201).await;
        api.configmap_apply().await;
        // No Event for a success: the objects say it (and a third write per job is not worth it).
    })
    .await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (f.metrics.writes("secret"), f.metrics.writes("configmap")),
        (1, 1)
    );
    assert_eq!(
        (f.metrics.keys_generated(), f.metrics.secrets_found()),
        (1, 0)
    );
}

/// An existing Secret (ours from an earlier term, another replica's during a Lease handover)
/// is found by the create's AlreadyExists and used as is: no GET before or after it, nothing
/// written to it, the ConfigMap applied.
#[tokio::test]
async fn an_existing_secret_is_found_by_already_exists_with_no_get() {
    let f = mpi_fixture();
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.secret_create(409).await;
        api.configmap_apply().await;
    })
    .await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (f.metrics.writes("secret"), f.metrics.secrets_found()),
        (0, 1)
    );
}

/// Once a create was answered (201 or 409) the owner's reconciles send none, and generate no
/// key, until its own watch shows it changed; then one create is sent again, which makes a
/// deleted Secret again. A key pair an AlreadyExists left unused is the next create's.
#[tokio::test]
async fn a_secret_made_or_found_is_not_created_again_until_its_owner_changes() {
    let f = mpi_fixture();
    let owner_changed = || f.ctx.ensured.observe(&watcher::Event::Apply(train_job()));
    let create = |status: u16| {
        move |mut api: ApiServer| async move {
            api.secret_create(status).await;
            api
        }
    };
    let quiet = |api: ApiServer| async move { api };
    let first = |mut api: ApiServer| async move {
        api.secret_create(201).await;
        api.configmap_apply().await;
        api
    };
    let (result, server) = converse_again(&f.ctx, f.server, first).await;
    assert!(result.is_ok());
    // Triggered again (its ConfigMap's watch event, a runtime change): nothing sent.
    let (result, server) = converse_again(&f.ctx, server, quiet).await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.keys_generated(), 1);

    owner_changed();
    let (result, server) = converse_again(&f.ctx, server, create(409)).await;
    assert!(result.is_ok());
    let (_, server) = converse_again(&f.ctx, server, quiet).await;
    assert_eq!(
        (f.metrics.keys_generated(), f.metrics.secrets_found()),
        (2, 1),
        "a new pair for that create, kept after the AlreadyExists"
    );
    owner_changed();
    let (_, server) = converse_again(&f.ctx, server, create(409)).await;
    // Somebody deleted the Secret; the owner's next change makes it again, with the spare pair.
    owner_changed();
    let (result, _) = converse_again(&f.ctx, server, create(201)).await;
    assert!(result.is_ok());
    assert_eq!(
        (
            f.metrics.keys_generated(),
            f.metrics.secrets_found(),
            f.metrics.writes("secret")
        ),
        (2, 2, 2)
    );
}

/// A create that failed otherwise may still have stored its Secret (a timeout), so its key
/// pair is never used again, and the owner is not recorded: the retry creates with a new pair.
#[tokio::test]
async fn a_failed_create_keeps_no_key_pair_and_records_nothing() {
    let f = mpi_fixture();
    let failing = |mut api: ApiServer| async move {
        api.secret_create(500).await;
        let (type_, _, _) = api.event().await;
        assert_eq!(type_, "Warning");
        api
    };
    let (result, server) = converse_again(&f.ctx, f.server, failing).await;
    assert!(result.is_err());
    let retry = |mut api: ApiServer| async move {
        api.secret_create(201).await;
        api.configmap_apply().await;
        api
    };
    let (result, _) = converse_again(&f.ctx, server, retry).await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.keys_generated(), 2);
}

/// The owners' own watch forgets an owner that changed or went, and nothing else: not a
/// relist (the term's record starts empty), not another owner.
#[test]
fn only_a_change_or_deletion_of_the_owner_forgets_its_secret() {
    let ensured = EnsuredSecrets::default();
    let other: TrainJob = serde_json::from_value(
        json!({"metadata": {"name": "other", "namespace": "team", "uid": "uid-2"}}),
    )
    .expect("TrainJob");
    for (event, forgotten) in [
        (watcher::Event::InitApply(train_job()), false),
        (watcher::Event::Init, false),
        (watcher::Event::InitDone, false),
        (watcher::Event::Apply(other.clone()), false),
        (watcher::Event::Delete(other), false),
        (watcher::Event::Apply(train_job()), true),
        (watcher::Event::Delete(train_job()), true),
    ] {
        ensured.record("uid-1");
        ensured.observe(&event);
        assert_eq!(!ensured.contains("uid-1"), forgotten, "{event:?}");
    }
}

#[tokio::test]
async fn up_to_date_caches_mean_no_calls_at_all() {
    let cached: ConfigMap = serde_json::from_value(expected_configmap()).expect("cm");
    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        configmap: Some(cached),
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |_api| async {}).await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (f.metrics.writes("secret"), f.metrics.writes("configmap")),
        (0, 0)
    );
}

#[tokio::test]
async fn edited_configmap_is_repaired_but_foreign_additions_are_not_drift() {
    let mut edited: ConfigMap = serde_json::from_value(expected_configmap()).expect("cm");
    let data = edited.data.get_or_insert_default();
    data.insert("hostfile".into(), "edited\n".into());
    let mut added = edited.clone();
    added.data.get_or_insert_default().insert(
        "hostfile".into(),
        expected_configmap()["data"]["hostfile"]
            .as_str()
            .unwrap_or_default()
            .into(),
    );
    added
        .data
        .get_or_insert_default()
        .insert("extra".into(), "theirs".into());
    assert!(applied(
        &cached(added),
        &serde_json::from_value(expected_configmap()).expect("cm")
    ));

    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        configmap: Some(edited),
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.configmap_apply().await;
    })
    .await;
    assert!(result.is_ok());
}

/// A reconcile that runs before the ConfigMap watch has shown our own apply (right after a
/// create, another watch's event may trigger one) does not apply again. Any watch event for the ConfigMap, a relist, or a failed apply ends that.
#[tokio::test]
async fn own_apply_not_yet_in_the_cache_is_not_repeated() {
    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        ..Caches::default()
    });
    let apply = |mut api: ApiServer| async move {
        api.configmap_apply().await;
        api
    };
    let quiet = |api: ApiServer| async move { api };
    let configmap: ConfigMap = serde_json::from_value(expected_configmap()).expect("cm");
    let applied = Arc::clone(&f.ctx.applied);

    let (result, server) = converse_again(&f.ctx, f.server, apply).await;
    assert!(result.is_ok());
    // The cache still lacks it: no second apply.
    let (result, server) = converse_again(&f.ctx, server, quiet).await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.writes("configmap"), 1);

    // Somebody deleted it (the cache saw the deletion): repaired.
    applied.observe(&watcher::Event::Delete(configmap.clone()));
    let (_, server) = converse_again(&f.ctx, server, apply).await;
    let (_, server) = converse_again(&f.ctx, server, quiet).await;
    // A relist may have missed a deletion: applied again.
    applied.observe(&watcher::Event::Init);
    let (_, server) = converse_again(&f.ctx, server, apply).await;
    assert_eq!(f.metrics.writes("configmap"), 3);

    // A failed apply is not remembered.
    applied.observe(&watcher::Event::Apply(configmap));
    let failing = |mut api: ApiServer| async move {
        let (_, reply) = api.expect(Method::PATCH, CONFIGMAP_URL).await;
        respond(reply, 500, &status_body(500));
        let (type_, _, _) = api.event().await;
        assert_eq!(type_, "Warning");
        api
    };
    let (result, server) = converse_again(&f.ctx, server, failing).await;
    assert_eq!(
        result.expect_err("apply failed").metric_label(),
        "apply_configmap"
    );
    let (result, _) = converse_again(&f.ctx, server, apply).await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.writes("configmap"), 4);
}

#[tokio::test]
async fn secret_create_error_applies_nothing_and_is_retried_with_backoff() {
    let f = mpi_fixture();
    let job = Arc::new(train_job());
    let mut server = f.server;
    for expected_delay in [1, 2] {
        let (script_server, result) = {
            let script = tokio::spawn(async move {
                server.secret_create(500).await;
                let (type_, reason, note) = server.event().await;
                assert_eq!(
                    (type_.as_str(), reason.as_str()),
                    ("Warning", TrainJob::FAILED_REASON)
                );
                assert!(
                    note.starts_with("failed to create the SSH auth Secret"),
                    "{note}"
                );
                server
            });
            let result = tokio::time::timeout(TIMEOUT, reconcile(job.clone(), f.ctx.clone()))
                .await
                .expect("reconcile finished");
            (script.await.expect("script"), result)
        };
        server = script_server;
        let error = result.expect_err("the create failed");
        assert_eq!(error.metric_label(), "create_secret");
        let action = error_policy(job.clone(), &error, f.ctx.clone());
        assert_eq!(action, Action::requeue(Duration::from_secs(expected_delay)));
    }
    assert_eq!(f.metrics.failures("create_secret"), 2);
    // The retry succeeds, which resets the backoff.
    let result = converse(&f.ctx, server, |mut api| async move {
        api.secret_create(201).await;
        api.configmap_apply().await;
    })
    .await;
    assert!(result.is_ok());
    let error = Error::NotLeader;
    assert_eq!(
        error_policy(job, &error, f.ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
}

#[tokio::test]
async fn runtime_without_mpi_policy_means_no_calls() {
    let f = fixture(Caches {
        runtime: Some(runtime(None)),
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |_api| async {}).await;
    assert_eq!(result.expect("ok"), Action::await_change());
}

#[tokio::test]
async fn missing_runtime_publishes_a_warning_and_requeues() {
    let f = fixture(Caches::default());
    let result = converse(&f.ctx, f.server, |mut api| async move {
        let uri = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/deepspeed";
        let (_, reply) = api.expect(Method::GET, uri).await;
        respond(reply, 404, &status_body(404));
        let (type_, reason, note) = api.event().await;
        assert_eq!(
            (type_.as_str(), reason.as_str()),
            ("Warning", TrainJob::FAILED_REASON)
        );
        assert_eq!(note, r#"ClusterTrainingRuntime "deepspeed" not found"#);
    })
    .await;
    let error = result.expect_err("runtime missing");
    assert_eq!(error.metric_label(), "runtime_not_found");
    let action = error_policy(Arc::new(train_job()), &error, f.ctx.clone());
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
}

#[tokio::test]
async fn unsupported_implementation_is_reported_and_retried_slowly() {
    let f = fixture(Caches {
        runtime: Some(runtime(Some(json!({"mpiImplementation": ""})))),
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |mut api| async move {
        let (type_, _, note) = api.event().await;
        assert_eq!(type_, "Warning");
        assert!(note.contains("deepspeed"), "{note}");
    })
    .await;
    let error = result.expect_err("unsupported");
    assert_eq!(error.metric_label(), "policy");
    let action = error_policy(Arc::new(train_job()), &error, f.ctx.clone());
    assert_eq!(action, Action::requeue(RETRY_MAX));
}

#[tokio::test]
async fn lost_lease_means_no_writes() {
    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        ..Caches::default()
    });
    f.leader.send_replace(false);
    // The Secret is cached and the ConfigMap missing: a leader would apply it.
    let result = converse(&f.ctx, f.server, |_api| async {}).await;
    assert_eq!(result.expect("ok"), Action::await_change());

    let f = mpi_fixture();
    f.leader.send_replace(false);
    // No Secret in the cache: a leader would create it; this replica sends nothing.
    let result = converse(&f.ctx, f.server, |_api| async {}).await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (f.metrics.writes("secret"), f.metrics.writes("configmap")),
        (0, 0)
    );
}

/// kube's `Store::wait_until_ready` wakes only the last task that waited: reconciles that
/// start together before the owned-object caches are ready (the first `CONCURRENCY` after a
/// start) must all go on once they are, not sleep until the 30 s cache-sync timeout.
#[tokio::test]
async fn concurrent_reconciles_all_resume_when_the_caches_become_ready() {
    let (service, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let objects = ClusterObjects::from_stores(
        client.clone(),
        synced_store((), vec![]),
        synced_store(RuntimeKind::TrainingRuntime, vec![]),
        synced_store(RuntimeKind::ClusterTrainingRuntime, vec![mpi_runtime()]),
        CacheMetrics::default(),
    );
    let mut configmaps = Writer::<ConfigMap>::new(());
    let (_leader, leader_rx) = watch::channel(true);
    let ctx = Arc::new(Context::new(ContextParts {
        client: client.clone(),
        objects,
        ensured: Arc::default(),
        configmaps: configmaps.as_reader(),
        network_policies: synced_store((), vec![]),
        applied: Arc::default(),
        applied_policies: Arc::default(),
        events: Events::new(client, Reporter::from("mpi-webhook")),
        metrics: ReconcileMetrics::default(),
        leader: leader_rx,
        keygen: fixed_keys,
        object_options: objects_for::Options {
            network_policy_default: false,
        },
    }));
    ctx.ensured.record("uid-1");
    let waiting: Vec<_> = (0..3)
        .map(|_| tokio::spawn(reconcile(Arc::new(train_job()), ctx.clone())))
        .collect();
    // Let all three reach the wait for the caches.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let configmap = serde_json::from_value(expected_configmap()).expect("cm");
    configmaps.apply_watcher_event(&watcher::Event::Init);
    configmaps.apply_watcher_event(&watcher::Event::InitApply(cached(configmap)));
    configmaps.apply_watcher_event(&watcher::Event::InitDone);
    // Caches up to date: each reconcile finishes without a call.
    for task in waiting {
        let result = tokio::time::timeout(TIMEOUT, task)
            .await
            .expect("every waiting reconcile resumed")
            .expect("no panic");
        assert_eq!(result.expect("ok"), Action::await_change());
    }
}

#[tokio::test]
async fn deleted_train_job_is_left_to_garbage_collection() {
    let f = fixture(Caches::default());
    let mut job = train_job();
    job.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    let result = tokio::time::timeout(TIMEOUT, reconcile(Arc::new(job), f.ctx.clone()))
        .await
        .expect("no calls");
    assert_eq!(result.expect("ok"), Action::await_change());
    drop(f.server);
}

#[test]
fn runtime_changes_map_to_the_train_jobs_using_them() {
    let job = |name: &str, namespace: &str, kind: &str, runtime: &str| -> TrainJob {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"name": runtime, "kind": kind}}}))
        .expect("TrainJob")
    };
    let jobs = synced_store(
        (),
        vec![
            job("a", "team", "ClusterTrainingRuntime", "deepspeed"),
            job("b", "other", "ClusterTrainingRuntime", "deepspeed"),
            job("c", "team", "TrainingRuntime", "deepspeed"),
            job("d", "other", "TrainingRuntime", "deepspeed"),
            job("e", "team", "ClusterTrainingRuntime", "mlx"),
        ],
    );
    let names = |refs: Vec<kube::runtime::reflector::ObjectRef<TrainJob>>| {
        let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    };
    let cluster = users_of(jobs.clone(), RuntimeKind::ClusterTrainingRuntime);
    assert_eq!(names(cluster(&mpi_runtime())), ["a", "b"]);
    let mut local_runtime = mpi_runtime();
    local_runtime.metadata.namespace = Some("team".into());
    let local = users_of(jobs, RuntimeKind::TrainingRuntime);
    assert_eq!(names(local(&local_runtime)), ["c"]);
}

/// Shared settings over a mock API server.
fn shared(client: Client) -> Shared {
    Shared {
        events: Events::new(client.clone(), Reporter::from("mpi-webhook")),
        client,
        metrics: ReconcileMetrics::default(),
        cache_metrics: CacheMetrics::default(),
        object_options: objects_for::Options {
            network_policy_default: false,
        },
    }
}

#[tokio::test]
async fn owned_watches_are_label_selected_and_no_secret_is_ever_listed_or_watched() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let shared = shared(Client::new(service, "default"));
    let (leader, leader_rx) = watch::channel(true);
    let controller = tokio::spawn(async move {
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let stop = Box::pin(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        });
        let run = lead(&shared, leader_rx, stop);
        tokio::pin!(run);
        // Keep `stop_tx` alive while the controller runs.
        let _keep = stop_tx;
        run.await;
    });
    let (mut seen, mut open) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        let (request, reply) = tokio::time::timeout(TIMEOUT, handle.next_request())
            .await
            .expect("a watch request")
            .expect("open");
        let accept = request
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        seen.push((
            request.uri().path().to_string(),
            request.uri().query().unwrap_or_default().to_string(),
            accept,
        ));
        open.push(reply); // unanswered, so no watch retries
    }
    seen.sort();
    let selector = format!(
        "labelSelector={}",
        managed_selector().replace('/', "%2F").replace('=', "%3D")
    );
    let paths: Vec<&str> = seen.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api/v1/configmaps",
            "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
            "/apis/networking.k8s.io/v1/networkpolicies",
            "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes",
            "/apis/trainer.kubeflow.org/v1alpha1/trainingruntimes",
            "/apis/trainer.kubeflow.org/v1alpha1/trainjobs",
        ]
    );
    for (path, query, accept) in &seen {
        let owned = path.starts_with("/api/v1/") || path.contains("/networking.k8s.io/");
        assert_eq!(query.contains(&selector), owned, "{path}?{query}");
        assert!(
            !accept.contains("PartialObjectMetadata"),
            "{path}: {accept}"
        );
    }
    // Every watch is open: nothing else is asked for, a Secret least of all (Decision 22).
    let more = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
    if let Ok(Some((request, _))) = more {
        panic!("a seventh request: {}", request.uri());
    }
    leader.send_replace(false);
    drop(leader);
    controller.abort();
}

/// One watch that keeps failing (every NetworkPolicy watch is answered 410 Expired, as after an
/// API server restart) never holds up another's events: a TrainJob that then arrives on its
/// watch is reconciled at once, not after a backoff of the whole controller (which reached a
/// minute after a few such failures).
#[tokio::test(start_paused = true)]
async fn a_failing_watch_does_not_hold_up_the_train_job_watch() {
    const FAILURES: u32 = 12;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let shared = shared(Client::new(service, "default"));
    let (_leader, leader_rx) = watch::channel(true);
    let controller = tokio::spawn(async move {
        lead(&shared, leader_rx, Box::pin(futures::future::pending())).await;
    });
    let line = |kind: &str, object: Value| {
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
        line.push(b'\n');
        line
    };
    let train_job = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "pi", "namespace": "team", "uid": "uid-1", "resourceVersion": "8"},
        "spec": {"runtimeRef": {"name": "deepspeed"}, "trainer": {"numNodes": 3}}});
    let (mut failures, mut held, mut trainjobs_watch, mut answered) = (0, Vec::new(), None, None);
    let first_reconcile_call = loop {
        let (request, reply) = tokio::time::timeout(RETRY_MAX, handle.next_request())
            .await
            .expect("a request")
            .expect("open");
        let (path, query) = (
            request.uri().path(),
            request.uri().query().unwrap_or_default(),
        );
        if !query.contains("watch=true") && !query.contains("limit=") {
            break path.to_string();
        }
        if !query.contains("watch=true") {
            respond(
                reply,
                200,
                &json!({"apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": "7"}, "items": []}),
            );
        } else if path.ends_with("/networkpolicies") {
            failures += 1;
            let expired = line("ERROR", status_body(410));
            reply.send_response(Response::new(Body::from(expired)));
        } else if query.contains("sendInitialEvents=true") {
            // A streamed initial list: empty, then its end; the watch resumes from there.
            let end = json!({"apiVersion": "v1", "kind": "Bookmark", "metadata": {
                "resourceVersion": "7", "annotations": {"k8s.io/initial-events-end": "true"}}});
            reply.send_response(Response::new(Body::from(line("BOOKMARK", end))));
        } else if path.ends_with("/trainjobs") && answered.is_none() && trainjobs_watch.is_none() {
            trainjobs_watch = Some(reply);
        } else {
            held.push(reply); // kept open, never answered
        }
        if failures >= FAILURES
            && let Some(reply) = trainjobs_watch.take()
        {
            answered = Some(tokio::time::Instant::now());
            let added = line("ADDED", train_job.clone());
            reply.send_response(Response::new(Body::from(added)));
        }
    };
    let waited = answered.expect("the TrainJob was sent").elapsed();
    assert_eq!(
        first_reconcile_call,
        "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/deepspeed"
    );
    // Mock time: a controller-wide backoff would have grown to seconds by then.
    assert!(
        waited < Duration::from_secs(1),
        "reconciled after {waited:?}"
    );
    controller.abort();
}

#[tokio::test]
async fn controller_runs_only_while_leading() {
    let (leader, leader_rx) = watch::channel(false);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let gate = tokio::spawn(run_while_leader(leader_rx, shutdown_rx, move |end| {
        let terms = terms_tx.clone();
        async move {
            let _ = terms.send("started");
            end.await;
            let _ = terms.send("stopped");
        }
    }));
    let next = |terms: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>| {
        let pending = terms.try_recv();
        pending.ok()
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(next(&mut terms), None, "not leader: nothing runs");
    leader.send_replace(true);
    assert_eq!(terms.recv().await, Some("started"));
    leader.send_replace(false);
    assert_eq!(
        terms.recv().await,
        Some("stopped"),
        "lost lease: the term ends"
    );
    leader.send_replace(true);
    assert_eq!(
        terms.recv().await,
        Some("started"),
        "re-elected: a fresh term"
    );
    shutdown.send_replace(true);
    assert_eq!(terms.recv().await, Some("stopped"));
    tokio::time::timeout(TIMEOUT, gate)
        .await
        .expect("gate returns on shutdown")
        .expect("no panic");
}

/// A Secret Kubeflow Trainer made first (no label of ours) is found the same way: the create
/// is answered AlreadyExists and the Secret is used as is, nothing written to it, the ConfigMap
/// applied.
#[tokio::test]
async fn unlabelled_secret_made_by_trainer_is_used_as_is() {
    let f = mpi_fixture();
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.secret_create(409).await;
        api.configmap_apply().await;
    })
    .await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (f.metrics.writes("secret"), f.metrics.writes("configmap")),
        (0, 1)
    );
}

/// Somebody other than Trainer (here `kubectl edit`, an updater) changed the hostfile: the
/// apply without force is refused, and the one with force repairs it.
#[tokio::test]
async fn conflict_with_another_manager_is_forced() {
    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |mut api| async move {
        let (_, reply) = api.expect(Method::PATCH, CONFIGMAP_URL).await;
        let mut conflict = apply_conflict("kubectl-edit", ".data.hostfile");
        conflict["details"]["causes"][0]["message"] =
            json!("conflict with \"kubectl-edit\" using v1");
        respond(reply, 409, &conflict);
        api.configmap_force_apply().await;
    })
    .await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(
        (
            f.metrics.writes("configmap"),
            f.metrics.hostfile_conflicts()
        ),
        (1, 0)
    );
}

/// Trainer's manager holds `.data.hostfile` with other text: no forced apply, one Warning
/// Event naming both sizes, the metric counted, and a retry only at the longest delay.
#[tokio::test]
async fn conflict_with_trainer_is_left_reported_counted_and_retried_slowly() {
    let f = fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret: true,
        ..Caches::default()
    });
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.configmap_apply_conflict("trainer").await;
        let mut theirs = expected_configmap();
        theirs["data"]["hostfile"] = json!("pi-node-0-0.pi slots=1\n");
        theirs["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("labels");
        api.configmap_get(&theirs).await;
        let (type_, reason, note) = api.event().await;
        assert_eq!(
            (type_.as_str(), reason.as_str(), note.as_str()),
            (
                "Warning",
                "HostfileConflict",
                "ConfigMap pi-mpi-hostfile: Kubeflow Trainer's field manager \"trainer\" holds \
                 .data.hostfile with other values, left as is: our hostfile is 73 bytes, \
                 Trainer's is 23 bytes"
            )
        );
    })
    .await;
    let error = result.expect_err("left to Trainer");
    assert_eq!(error.metric_label(), "hostfile_conflict");
    assert_eq!(
        error_policy(Arc::new(train_job()), &error, f.ctx.clone()),
        Action::requeue(RETRY_MAX)
    );
    assert_eq!(
        (
            f.metrics.writes("configmap"),
            f.metrics.hostfile_conflicts()
        ),
        (0, 1)
    );
    // Not remembered as applied: the next reconcile tries again (without force).
    let key = ObjectRef::new("pi-mpi-hostfile").within("team");
    let desired: ConfigMap = serde_json::from_value(expected_configmap()).expect("cm");
    assert!(!f.ctx.applied.holds(&key, &desired));
}

// ---------------------------------------------------------------------------------------------
// The NetworkPolicy

/// A fixture with the MPI runtime cached and `--network-policy-default` on.
fn network_policy_fixture(secret: bool, cached: Option<Value>) -> Fixture {
    fixture(Caches {
        runtime: Some(mpi_runtime()),
        secret,
        network_policy: cached.map(|v| serde_json::from_value(v).expect("NetworkPolicy")),
        object_options: objects_for::Options {
            network_policy_default: true,
        },
        ..Caches::default()
    })
}

#[tokio::test]
async fn with_the_default_on_the_network_policy_is_applied_first_with_exact_fields() {
    let f = network_policy_fixture(false, None);
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.network_policy_apply(&expected_network_policy(), 200)
            .await;
        api.secret_create(201).await;
        api.configmap_apply().await;
    })
    .await;
    assert_eq!(result.expect("ok"), Action::await_change());
    assert_eq!(f.metrics.writes("networkpolicy"), 1);
}

#[tokio::test]
async fn a_network_policy_in_place_is_not_applied_again_and_drift_is_repaired() {
    let in_cache = |policy: Value| {
        fixture(Caches {
            runtime: Some(mpi_runtime()),
            secret: true,
            configmap: Some(serde_json::from_value(expected_configmap()).expect("cm")),
            network_policy: Some(serde_json::from_value(policy).expect("NetworkPolicy")),
            object_options: objects_for::Options {
                network_policy_default: true,
            },
        })
    };
    let f = in_cache(expected_network_policy());
    let result = converse(&f.ctx, f.server, |_api| async {}).await;
    assert!(result.is_ok(), "in place: no call at all");
    assert_eq!(f.metrics.writes("networkpolicy"), 0);

    // Somebody opened it to every pod (`ingress: [{}]`): applied again, taken back.
    let mut opened = expected_network_policy();
    opened["spec"]["ingress"] = json!([{}]);
    let f = in_cache(opened);
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.network_policy_apply(&expected_network_policy(), 200)
            .await;
    })
    .await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.writes("networkpolicy"), 1);
}

#[tokio::test]
async fn with_the_default_off_no_network_policy_is_applied() {
    // The script has no NetworkPolicy call: one would hang the reconcile into the timeout.
    let f = mpi_fixture();
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.secret_create(201).await;
        api.configmap_apply().await;
    })
    .await;
    assert!(result.is_ok());
    assert_eq!(f.metrics.writes("networkpolicy"), 0);
}

#[tokio::test]
async fn a_failed_network_policy_apply_writes_nothing_else_and_is_retried() {
    let f = network_policy_fixture(false, None);
    let result = converse(&f.ctx, f.server, |mut api| async move {
        api.network_policy_apply(&expected_network_policy(), 403)
            .await;
        let (type_, _, note) = api.event().await;
        assert_eq!(type_, "Warning");
        assert!(
            note.starts_with("failed to apply the NetworkPolicy: "),
            "{note}"
        );
    })
    .await;
    assert_eq!(
        result.expect_err("refused").metric_label(),
        "apply_networkpolicy"
    );
    assert_eq!(f.metrics.writes("secret"), 0);
}

// ---------------------------------------------------------------------------------------------
// JobSet mode

mod jobset_mode {
    use super::*;
    use crate::api::JobSet;
    use pretty_assertions::assert_eq;

    fn jobset(implementation: &str) -> JobSet {
        let rjob = |name: &str, parallelism: i32| {
            json!({"name": name, "template": {"spec": {"parallelism": parallelism, "template": {"spec": {
                "containers": [{"name": "mpi", "image": "mpi"}]}}}}})
        };
        serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": "pi", "namespace": "team", "uid": "js-uid",
                "labels": {"mpi-webhook.io/implementation": implementation}
            },
            "spec": {"replicatedJobs": [rjob("node", 2), rjob("launcher", 1)]}
        }))
        .expect("JobSet")
    }

    fn owned_by_the_jobset() -> Value {
        json!([{
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "pi",
            "uid": "js-uid", "controller": true, "blockOwnerDeletion": true
        }])
    }

    async fn run(
        ctx: &Arc<Context>,
        jobset: JobSet,
        script: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Action, Error> {
        scripted(reconcile(Arc::new(jobset), Arc::clone(ctx)), script)
            .await
            .0
    }

    /// An Event on the JobSet; returns (type, reason, note).
    async fn jobset_event(api: &mut ApiServer) -> (String, String, String) {
        let (body, reply) = api.expect(Method::POST, EVENTS_URL).await;
        assert_eq!(body["regarding"]["kind"], "JobSet");
        assert_eq!(body["regarding"]["name"], "pi");
        let text = |key: &str| body[key].as_str().unwrap_or_default().to_string();
        let seen = (text("type"), text("reason"), text("note"));
        respond(reply, 201, &body);
        seen
    }

    #[tokio::test]
    async fn a_jobset_mode_jobset_gets_its_secret_and_hostfile_owned_by_it() {
        let f = fixture(Caches::default());
        let result = run(&f.ctx, jobset("MPICH"), {
            let mut api = f.server;
            async move {
                let uri = format!("{SECRET_URL}?&fieldManager=mpi-webhook");
                let (body, reply) = api.expect(Method::POST, &uri).await;
                let mut secret = expected_secret();
                secret["metadata"]["ownerReferences"] = owned_by_the_jobset();
                assert_eq!(body, secret);
                respond(reply, 201, &body);
                let (body, reply) = api.expect(Method::PATCH, CONFIGMAP_URL).await;
                let mut configmap = expected_configmap();
                configmap["metadata"]["ownerReferences"] = owned_by_the_jobset();
                configmap["data"]["hostfile"] = json!("pi-node-0-0.pi:1\npi-node-0-1.pi:1\n");
                assert_eq!(body, configmap);
                respond(reply, 200, &body);
            }
        })
        .await;
        assert_eq!(result.expect("ok"), Action::await_change());
        assert_eq!(f.metrics.writes("secret"), 1);
    }

    fn annotated(network_policy: &str) -> JobSet {
        let mut js = jobset("MPICH");
        js.metadata.annotations = Some(
            [(
                "mpi-webhook.io/network-policy".to_string(),
                network_policy.to_string(),
            )]
            .into(),
        );
        js
    }

    #[tokio::test]
    async fn the_annotation_turns_the_network_policy_on_over_the_default() {
        let f = fixture(Caches {
            secret: true,
            ..Caches::default()
        });
        let result = run(&f.ctx, annotated("true"), {
            let mut api = f.server;
            async move {
                let mut policy = expected_network_policy();
                policy["metadata"]["ownerReferences"] = owned_by_the_jobset();
                api.network_policy_apply(&policy, 200).await;
                let (_, reply) = api.expect(Method::PATCH, CONFIGMAP_URL).await;
                respond(reply, 200, &json!({}));
            }
        })
        .await;
        assert_eq!(result.expect("ok"), Action::await_change());
        assert_eq!(f.metrics.writes("networkpolicy"), 1);
    }

    #[tokio::test]
    async fn the_annotation_turns_the_network_policy_off_over_the_default() {
        let f = fixture(Caches {
            secret: true,
            object_options: objects_for::Options {
                network_policy_default: true,
            },
            ..Caches::default()
        });
        // No NetworkPolicy call in the script: one would hang the reconcile.
        let result = run(&f.ctx, annotated("false"), {
            let mut api = f.server;
            async move {
                let (_, reply) = api.expect(Method::PATCH, CONFIGMAP_URL).await;
                respond(reply, 200, &json!({}));
            }
        })
        .await;
        assert!(result.is_ok());
        assert_eq!(f.metrics.writes("networkpolicy"), 0);
    }

    #[tokio::test]
    async fn a_jobset_a_trainjob_controls_is_left_to_trainjob_mode() {
        let f = fixture(Caches::default());
        let mut owned = jobset("OpenMPI");
        owned.metadata.owner_references = serde_json::from_value(json!([{
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "name": "pi", "uid": "tj-uid", "controller": true
        }]))
        .expect("owner");
        // The script expects no call: any request would hang the reconcile into the timeout.
        let result = run(&f.ctx, owned, async {}).await;
        assert_eq!(result.expect("ok"), Action::await_change());
        assert_eq!(f.metrics.writes("secret"), 0);
    }

    #[tokio::test]
    async fn settings_that_do_not_parse_are_a_warning_event_and_no_write() {
        let f = fixture(Caches::default());
        let result = run(&f.ctx, jobset("LAM"), {
            let mut api = f.server;
            async move {
                let (type_, reason, note) = jobset_event(&mut api).await;
                assert_eq!(
                    (type_.as_str(), reason.as_str()),
                    ("Warning", "MPIResourcesCreationFailed")
                );
                assert_eq!(
                    note,
                    r#"metadata.labels[mpi-webhook.io/implementation]: Unsupported value: "LAM": supported values: "OpenMPI", "Intel", "MPICH""#
                );
            }
        })
        .await;
        let error = result.expect_err("policy");
        assert_eq!(error.metric_label(), "policy");
        // Settings are fixed at creation: retrying soon cannot help.
        assert_eq!(
            error_policy(Arc::new(jobset("LAM")), &error, f.ctx.clone()),
            Action::requeue(RETRY_MAX)
        );
    }

    #[tokio::test]
    async fn a_jobset_and_a_trainjob_of_the_same_name_back_off_apart() {
        let f = fixture(Caches::default());
        let error = Error::NotLeader;
        let delays = [
            error_policy(Arc::new(train_job()), &error, f.ctx.clone()),
            error_policy(Arc::new(train_job()), &error, f.ctx.clone()),
            error_policy(Arc::new(jobset("OpenMPI")), &error, f.ctx.clone()),
        ];
        assert_eq!(
            delays,
            [1, 2, 1].map(|s| Action::requeue(Duration::from_secs(s)))
        );
    }
}

/// The JobSet cache keeps what JobSet mode reads: its identity, our label and annotations, and
/// the counts and containers of its replicatedJobs.
#[test]
fn cached_jobsets_keep_only_what_jobset_mode_reads() {
    let mut jobset: JobSet = serde_json::from_value(json!({
        "metadata": {"name": "pi", "namespace": "team", "uid": "u", "resourceVersion": "9",
            "generation": 2, "creationTimestamp": "2026-12-06T10:00:00Z",
            "labels": {"mpi-webhook.io/implementation": "OpenMPI", "team": "a"},
            "annotations": {"mpi-webhook.io/ssh-port": "2222", "note": "x",
                            "mpi-webhook.io/implementation": "read by nobody"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1"}]},
        "spec": {"network": {"subdomain": "s"}, "replicatedJobs": [
            {"name": "node", "replicas": 1, "dependsOn": [{"name": "x", "status": "Ready"}],
             "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"parallelism": 3,
                "template": {"spec": {"containers": [{"name": "node",
                    "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}}]}
    }))
    .expect("JobSet");
    jobset_read(&mut jobset);
    assert_eq!(
        serde_json::to_value(&jobset.metadata).expect("json"),
        json!({"name": "pi", "namespace": "team", "uid": "u",
               "annotations": {"mpi-webhook.io/implementation": "OpenMPI",
                               "mpi-webhook.io/ssh-port": "2222"},
               "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1"}]})
    );
    // Its readers see our label and annotations where the settings read them.
    assert_eq!(
        serde_json::to_value(&jobset_as_read(&jobset).metadata).expect("json"),
        json!({"name": "pi", "namespace": "team", "uid": "u",
               "labels": {"mpi-webhook.io/implementation": "OpenMPI"},
               "annotations": {"mpi-webhook.io/ssh-port": "2222"},
               "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1"}]})
    );
    let (_, node) = jobset.replicated_job("node").expect("node");
    assert!(node.depends_on.is_none() && node.template.metadata.labels.is_none());
    assert_eq!(node.template.spec.parallelism, Some(3));
    assert_eq!(node.containers()[0].name, "node");
    assert!(node.containers()[0].resources.is_some());
    assert_eq!(jobset.spec.subdomain(), Some("s"));
}

/// Each watch's observer sends the owners to reconcile to the controller of their kind: an
/// owned object deleted by somebody else too, so that it is made again.
#[test]
fn owned_objects_trigger_their_owner_in_its_controller() {
    let (triggers, mut train_jobs, mut jobsets) = Triggers::channels();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let observe = triggers.owners::<ConfigMap>(move |event| {
        let kind = match event {
            watcher::Event::Delete(_) => "delete",
            _ => "other",
        };
        record.lock().expect("lock").push(kind);
    });
    let owned_by = |kind: &str, api_version: &str| -> ConfigMap {
        serde_json::from_value(
            json!({"metadata": {"name": "pi-mpi-hostfile", "namespace": "team",
            "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "pi",
                                 "uid": "u", "controller": true}]}}),
        )
        .expect("ConfigMap")
    };
    let by_job = owned_by("TrainJob", "trainer.kubeflow.org/v1alpha1");
    observe(&watcher::Event::Apply(by_job.clone()));
    observe(&watcher::Event::Delete(by_job));
    observe(&watcher::Event::Delete(owned_by(
        "JobSet",
        "jobset.x-k8s.io/v1alpha2",
    )));
    observe(&watcher::Event::Apply(owned_by("Deployment", "apps/v1")));
    observe(&watcher::Event::InitDone);
    for _ in 0..2 {
        let job = train_jobs.try_recv().expect("the TrainJob");
        assert_eq!(
            (job.name.as_str(), job.namespace.as_deref()),
            ("pi", Some("team"))
        );
    }
    assert!(train_jobs.try_recv().is_err());
    assert_eq!(jobsets.try_recv().expect("the JobSet").name, "pi");
    assert!(jobsets.try_recv().is_err());
    assert_eq!(seen.lock().expect("lock").len(), 5, "every event is shown");
    // The owners' own watch: an applied JobSet is its own request, a deleted one is not.
    let applied = triggers.applied::<JobSet>(|t| &t.jobsets);
    let jobset: JobSet =
        serde_json::from_value(json!({"metadata": {"name": "js", "namespace": "team"}}))
            .expect("JobSet");
    applied(&watcher::Event::InitApply(jobset.clone()));
    applied(&watcher::Event::Delete(jobset));
    assert_eq!(jobsets.try_recv().expect("the JobSet").name, "js");
    assert!(jobsets.try_recv().is_err());
}
