//! The HTTPS admission server in-process, over real TLS on 127.0.0.1: every route allowing,
//! denying and patching; the bad inputs (400, 413, fail-closed denials, deadline); readiness;
//! metrics; TLS versions; certificate rotation by a Secret-volume symlink swap under load; and
//! `--objects-dir` reloads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tls_support;

use std::io::{Read, Write};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use base64::Engine;
use mpi_webhook::admission::Route;
use mpi_webhook::api::{RuntimeKind, TrainJob, TrainingRuntime};
use mpi_webhook::objects::{LookupError, ObjectSource};
use mpi_webhook::serve::metrics::Metrics;
use mpi_webhook::serve::{
    self, MAX_BODY_BYTES, Running, ServeObjects, ServeOptions, TIMEOUT_MESSAGE,
};
use mpi_webhook::tls::TlsFiles;
use serde_json::{Value, json};
use tls_support::*;

const WAIT: Duration = Duration::from_secs(20);

fn options(tls: TlsFiles) -> ServeOptions {
    let mut options = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        tls,
    );
    options.tls_poll_interval = Duration::from_millis(100);
    options.objects_poll_interval = Duration::from_millis(100);
    options.shutdown_grace = Duration::from_secs(5);
    options
}

/// A server on `manifests/` (shipped runtimes and sample TrainJobs) with a fresh test CA.
struct Fixture {
    _dir: tempfile::TempDir,
    ca: TestCa,
    server: Running,
}

impl Fixture {
    async fn start() -> Self {
        Self::start_on(ServeObjects::Dir(repo().join("manifests"))).await
    }

    async fn start_on(objects: ServeObjects) -> Self {
        init();
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::write(dir.path());
        let server = serve::start(options(ca.files.clone()), objects)
            .await
            .unwrap();
        Self {
            _dir: dir,
            ca,
            server,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.https_addr()
    }

    fn client(&self) -> Arc<rustls::ClientConfig> {
        client_config(&[&self.ca.certs.ca_cert_pem])
    }

    async fn post(&self, route: Route, body: Vec<u8>) -> Reply {
        post(self.addr(), self.client(), route.path(), body).await
    }

    async fn post_json(&self, route: Route, body: &Value) -> Reply {
        self.post(route, serde_json::to_vec(body).unwrap()).await
    }

    async fn metrics(&self) -> String {
        let (status, text) = get_plain(self.server.metrics_addr(), "/metrics").await;
        assert_eq!(status, 200);
        text
    }
}

fn uid(review: &Value) -> String {
    review["request"]["uid"].as_str().unwrap().to_string()
}

fn patch_of(response: &Value) -> Vec<Value> {
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// A review of `object` on `route`, built from the allowed TrainJob sample's envelope.
fn review_of(route: Route, object: Value, uid: &str) -> Value {
    let (group, kind) = route.group_kind();
    let mut review = sample_json("trainjob-create-allowed.json");
    let request = &mut review["request"];
    request["uid"] = json!(uid);
    request["kind"] = json!({"group": group, "version": "v1alpha1", "kind": kind});
    request["requestKind"] = request["kind"].clone();
    request["name"] = object["metadata"]["name"].clone();
    match object["metadata"].get("namespace") {
        Some(ns) => request["namespace"] = ns.clone(),
        None => {
            request.as_object_mut().unwrap().remove("namespace");
        }
    }
    request["object"] = object;
    review
}

fn shipped_runtime() -> Value {
    let text =
        std::fs::read_to_string(repo().join("manifests/runtimes/mpich_distributed.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[tokio::test]
async fn validate_trainjob_allows_and_denies() {
    let f = Fixture::start().await;
    let review = sample_json("trainjob-create-allowed.json");
    let reply = f.post_json(Route::ValidateTrainJob, &review).await;
    assert_eq!(reply.version, rustls::ProtocolVersion::TLSv1_3);
    let response = response_for(&reply, &uid(&review));
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());

    let review = sample_json("trainjob-create-denied-reserved-env.json");
    let response = response_for(
        &f.post_json(Route::ValidateTrainJob, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["reason"], "Forbidden");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("OMPI_MCA_orte_default_hostfile"),
        "{message}"
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn validate_runtimes_allow_and_deny() {
    let f = Fixture::start().await;
    let cluster_runtime = shipped_runtime();
    let review = review_of(
        Route::ValidateClusterTrainingRuntime,
        cluster_runtime.clone(),
        "ctr-ok",
    );
    let response = response_for(
        &f.post_json(Route::ValidateClusterTrainingRuntime, &review)
            .await,
        "ctr-ok",
    );
    assert_eq!(response["allowed"], true, "{response}");

    let mut bad = cluster_runtime.clone();
    bad["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] = json!(0);
    let review = review_of(Route::ValidateClusterTrainingRuntime, bad, "ctr-bad");
    let response = response_for(
        &f.post_json(Route::ValidateClusterTrainingRuntime, &review)
            .await,
        "ctr-bad",
    );
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("numProcPerNode"),
        "{response}"
    );

    let mut namespaced = cluster_runtime;
    namespaced["kind"] = json!("TrainingRuntime");
    namespaced["metadata"]["namespace"] = json!("default");
    let review = review_of(Route::ValidateTrainingRuntime, namespaced.clone(), "tr-ok");
    let response = response_for(
        &f.post_json(Route::ValidateTrainingRuntime, &review).await,
        "tr-ok",
    );
    assert_eq!(response["allowed"], true, "{response}");
    namespaced["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] = json!(0);
    let review = review_of(Route::ValidateTrainingRuntime, namespaced, "tr-bad");
    let response = response_for(
        &f.post_json(Route::ValidateTrainingRuntime, &review).await,
        "tr-bad",
    );
    assert_eq!(response["allowed"], false);
    f.server.shutdown().await;
}

#[tokio::test]
async fn mutate_jobset_patches_allows_and_denies() {
    let f = Fixture::start().await;
    let review = sample_json("jobset-create-owned-by-trainjob.json");
    let response = response_for(
        &f.post_json(Route::MutateJobSet, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], true, "{response}");
    let patch = patch_of(&response);
    assert!(
        patch
            .iter()
            .any(|op| op.to_string().contains("mpi-ssh-auth")),
        "{patch:?}"
    );

    // Not owned by a TrainJob: allowed unchanged.
    let mut unowned = review.clone();
    unowned["request"]["uid"] = json!("unowned");
    unowned["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    let response = response_for(&f.post_json(Route::MutateJobSet, &unowned).await, "unowned");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());

    // Owned by a TrainJob that does not exist: denied, naming it.
    let mut orphan = review;
    orphan["request"]["uid"] = json!("orphan");
    orphan["request"]["object"]["metadata"]["ownerReferences"][0]["name"] = json!("no-such-job");
    let response = response_for(&f.post_json(Route::MutateJobSet, &orphan).await, "orphan");
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-job"),
        "{response}"
    );
    f.server.shutdown().await;
}

/// JobSet mode over real TLS: the sample's CREATE is patched on the mutating route (the
/// generated ssh setup) and admitted by the validating route; a broken label is denied by both with the same
/// message; an UPDATE changing the label is denied as immutable; the metrics count the new route.
#[tokio::test]
async fn jobset_mode_is_patched_validated_and_fixed_after_creation() {
    let f = Fixture::start().await;
    let review = sample_json("jobset-mode-create-mpich.json");
    let response = response_for(
        &f.post_json(Route::MutateJobSet, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], true, "{response}");
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(patch_of(&response))).expect("RFC 6902");
    let mut patched = review["request"]["object"].clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies");
    let pod =
        |i: usize| &patched["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"];
    // The generated ssh setup (the default): the key projected read-only for the
    // `mpi-ssh-setup` init container, which copies it 0600 for the running UID.
    assert_eq!(pod(0)["volumes"][0]["secret"]["defaultMode"], 292);
    assert_eq!(
        pod(0)["volumes"][0]["secret"]["items"][0],
        json!({"key": "ssh-privatekey", "path": "id_rsa"})
    );
    assert_eq!(pod(0)["initContainers"][0]["name"], "mpi-ssh-setup");
    let envs: Vec<&Value> = (0..2)
        .flat_map(|i| pod(i)["containers"].as_array().into_iter().flatten())
        .flat_map(|c| c["env"].as_array().into_iter().flatten())
        .collect();
    assert!(
        envs.contains(&&json!({"name": "HYDRA_IFACE", "value": "eth0"})),
        "{patched}"
    );
    let response = response_for(
        &f.post_json(Route::ValidateJobSet, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none(), "{response}");

    let mut broken = review.clone();
    broken["request"]["uid"] = json!("broken");
    broken["request"]["object"]["metadata"]["labels"]["mpi-webhook.io/implementation"] =
        json!("LAM");
    let expected = r#"metadata.labels[mpi-webhook.io/implementation]: Unsupported value: "LAM": supported values: "OpenMPI", "Intel", "MPICH""#;
    for route in [Route::MutateJobSet, Route::ValidateJobSet] {
        let response = response_for(&f.post_json(route, &broken).await, "broken");
        assert_eq!(response["allowed"], false, "{route:?}");
        assert_eq!(response["status"]["code"], 403);
        assert_eq!(response["status"]["message"], expected, "{route:?}");
    }

    let mut update = review.clone();
    update["request"]["uid"] = json!("update");
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = review["request"]["object"].clone();
    update["request"]["object"]["metadata"]["labels"]["mpi-webhook.io/implementation"] =
        json!("Intel");
    let response = response_for(&f.post_json(Route::ValidateJobSet, &update).await, "update");
    assert_eq!(
        response["status"]["message"],
        r#"metadata.labels[mpi-webhook.io/implementation]: Invalid value: "Intel": field is immutable"#
    );
    let text = f.metrics().await;
    for line in [
        r#"mpi_webhook_admission_requests_total{route="validate-jobset",outcome="allowed"} 1"#,
        r#"mpi_webhook_admission_requests_total{route="validate-jobset",outcome="denied"} 2"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    f.server.shutdown().await;
}

#[tokio::test]
async fn http2_is_served() {
    let f = Fixture::start().await;
    let config = client_config_with(
        &[&f.ca.certs.ca_cert_pem],
        rustls::DEFAULT_VERSIONS,
        &[b"h2".as_slice()],
    );
    let review = sample_json("trainjob-create-allowed.json");
    let reply = post(
        f.addr(),
        config,
        Route::ValidateTrainJob.path(),
        serde_json::to_vec(&review).unwrap(),
    )
    .await;
    assert_eq!(response_for(&reply, &uid(&review))["allowed"], true);
    f.server.shutdown().await;
}

fn assert_bad_request(reply: &Reply, needle: &str) {
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let json = reply.json();
    assert_eq!(json["code"], 400);
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains(needle),
        "{message:?} should name {needle:?}"
    );
}

#[tokio::test]
async fn bodies_that_are_not_admission_reviews_get_400() {
    let f = Fixture::start().await;
    let route = Route::ValidateTrainJob;
    assert_bad_request(&f.post(route, b"not json".to_vec()).await, "not JSON");
    assert_bad_request(&f.post(route, Vec::new()).await, "not JSON");
    assert_bad_request(&f.post(route, b"[1,2]".to_vec()).await, "JSON object");
    assert_bad_request(
        &f.post_json(route, &json!({"apiVersion": "v1", "kind": "Pod"}))
            .await,
        "AdmissionReview",
    );
    let mut v1beta1 = sample_json("trainjob-create-allowed.json");
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    assert_bad_request(&f.post_json(route, &v1beta1).await, "admission.k8s.io/v1");
    let mut no_request = sample_json("trainjob-create-allowed.json");
    no_request.as_object_mut().unwrap().remove("request");
    assert_bad_request(&f.post_json(route, &no_request).await, "no request");
    let mut bad_uid = sample_json("trainjob-create-allowed.json");
    bad_uid["request"]["uid"] = json!(42);
    assert_bad_request(&f.post_json(route, &bad_uid).await, "uid");

    let metrics = f.metrics().await;
    assert!(
        metrics.contains(
            r#"mpi_webhook_admission_requests_total{route="validate-trainjob",outcome="bad_request"} 7"#
        ),
        "{metrics}"
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn unreadable_objects_and_wrong_kinds_are_denied_with_the_uid() {
    let f = Fixture::start().await;
    let mut review = sample_json("trainjob-create-allowed.json");
    review["request"]["object"]["spec"]["trainer"]["numNodes"] = json!("three");
    let response = response_for(
        &f.post_json(Route::ValidateTrainJob, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("numNodes"), "{message}");

    // A TrainJob review sent to the JobSet route.
    let review = sample_json("trainjob-create-allowed.json");
    let response = response_for(
        &f.post_json(Route::MutateJobSet, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], false);

    // No object on CREATE.
    let mut review = sample_json("trainjob-create-allowed.json");
    review["request"].as_object_mut().unwrap().remove("object");
    let response = response_for(
        &f.post_json(Route::ValidateTrainJob, &review).await,
        &uid(&review),
    );
    assert_eq!(response["allowed"], false);
    f.server.shutdown().await;
}

/// Reads an HTTP/1.1 response until its `content-length` body is complete (or the peer closes).
async fn read_http_response<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buffer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                return text;
            }
        }
        match tokio::time::timeout(WAIT, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
            _ => return String::from_utf8_lossy(&buffer).into_owned(),
        }
    }
}

#[tokio::test]
async fn bodies_over_7_mib_get_413() {
    let f = Fixture::start().await;
    // Refused from the Content-Length alone: the client sends only the headers, so no unread body
    // is left on the server's side when it answers.
    let mut tls = connect(f.addr(), f.client()).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        Route::ValidateTrainJob.path(),
        MAX_BODY_BYTES + 1
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let text = read_http_response(&mut tls).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains(r#""code":413"#), "{text}");

    // Exactly at the limit is read (and then judged: not an AdmissionReview).
    let mut body = Vec::with_capacity(MAX_BODY_BYTES);
    body.push(b'"');
    body.resize(MAX_BODY_BYTES - 1, b'a');
    body.push(b'"');
    assert_bad_request(&f.post(Route::ValidateTrainJob, body).await, "JSON object");
    f.server.shutdown().await;
}

#[tokio::test]
async fn bodies_over_7_mib_without_content_length_get_413() {
    init();
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let state = Arc::new(mpi_webhook::serve::AppState::new(
        Arc::new(mpi_webhook::objects::Snapshot::default()),
        serve::readiness(),
        Arc::new(Metrics::new()),
    ));
    // No Content-Length header (as with chunked encoding): the limit applies while reading.
    let request = axum::http::Request::post(Route::ValidateTrainJob.path())
        .body(axum::body::Body::from(vec![b' '; MAX_BODY_BYTES + 1]))
        .unwrap();
    assert!(request.headers().get("content-length").is_none());
    let response = mpi_webhook::serve::router(state)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["code"], 413);
}

#[tokio::test]
async fn other_methods_and_paths_are_refused() {
    let f = Fixture::start().await;
    let reply = request(
        f.addr(),
        f.client(),
        "GET",
        Route::ValidateTrainJob.path(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 405);
    let reply = request(f.addr(), f.client(), "POST", "/validate", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 404);
    let reply = request(f.addr(), f.client(), "GET", "/healthz", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    f.server.shutdown().await;
}

/// An object source whose lookups never finish, to exercise the deadline.
struct StuckSource;

impl ObjectSource for StuckSource {
    async fn runtime(
        &self,
        _: RuntimeKind,
        _: &str,
        _: &str,
    ) -> Result<Option<Arc<TrainingRuntime>>, LookupError> {
        std::future::pending().await
    }

    async fn train_job(&self, _: &str, _: &str) -> Result<Option<Arc<TrainJob>>, LookupError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn an_expired_deadline_is_a_denial_with_the_uid() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::write(dir.path());
    let readiness = serve::readiness();
    readiness.pass(serve::OBJECTS_LOADED);
    let server = serve::start_with(
        options(ca.files.clone()),
        Arc::new(StuckSource),
        readiness,
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let review = sample_json("trainjob-create-allowed.json");
    let reply = post(
        server.https_addr(),
        client_config(&[&ca.certs.ca_cert_pem]),
        &format!("{}?timeout=300ms", Route::ValidateTrainJob.path()),
        serde_json::to_vec(&review).unwrap(),
    )
    .await;
    let response = response_for(&reply, &uid(&review));
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["message"], TIMEOUT_MESSAGE);
    // Validation of a runtime needs no lookup: not affected by the stuck source.
    let runtime_review = review_of(
        Route::ValidateClusterTrainingRuntime,
        shipped_runtime(),
        "r",
    );
    let reply = post(
        server.https_addr(),
        client_config(&[&ca.certs.ca_cert_pem]),
        &format!(
            "{}?timeout=300ms",
            Route::ValidateClusterTrainingRuntime.path()
        ),
        serde_json::to_vec(&runtime_review).unwrap(),
    )
    .await;
    assert_eq!(response_for(&reply, "r")["allowed"], true);
    server.shutdown().await;
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_outcome() {
    let f = Fixture::start().await;
    f.post(
        Route::ValidateTrainJob,
        sample("trainjob-create-allowed.json"),
    )
    .await;
    f.post(
        Route::ValidateTrainJob,
        sample("trainjob-create-denied-reserved-env.json"),
    )
    .await;
    f.post(
        Route::MutateJobSet,
        sample("jobset-create-owned-by-trainjob.json"),
    )
    .await;
    let text = f.metrics().await;
    for line in [
        r#"mpi_webhook_admission_requests_total{route="validate-trainjob",outcome="allowed"} 1"#,
        r#"mpi_webhook_admission_requests_total{route="validate-trainjob",outcome="denied"} 1"#,
        r#"mpi_webhook_admission_requests_total{route="mutate-jobset",outcome="patched"} 1"#,
        r#"mpi_webhook_admission_request_duration_seconds_count{route="mutate-jobset"} 1"#,
        r#"mpi_webhook_admission_patch_operations_total{route="mutate-jobset"}"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    assert!(
        !text.contains("pi-deepspeed") && !text.contains("0a7c3f0e"),
        "no object names or uids in labels"
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn tls_1_2_is_accepted() {
    let f = Fixture::start().await;
    let config = client_config_with(
        &[&f.ca.certs.ca_cert_pem],
        &[&rustls::version::TLS12],
        &[b"http/1.1".as_slice()],
    );
    let reply = request(f.addr(), config, "GET", "/healthz", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.version, rustls::ProtocolVersion::TLSv1_2);
    f.server.shutdown().await;
}

/// A TLS 1.1 ClientHello (record and client version 0x0302, no supported_versions extension).
fn tls11_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x02];
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    // ECDHE-ECDSA-AES128-GCM-SHA256 (which the server has), ECDHE-ECDSA-AES128-SHA, AES128-SHA:
    // the version is the only thing wrong with this hello.
    let suites: [u8; 6] = [0xc0, 0x2b, 0xc0, 0x09, 0x00, 0x2f];
    body.extend_from_slice(&(suites.len() as u16).to_be_bytes());
    body.extend_from_slice(&suites);
    body.extend_from_slice(&[1, 0]); // compression: null
    let mut extensions = Vec::new();
    let host = b"localhost";
    let mut sni = Vec::new();
    sni.extend_from_slice(&((host.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&(host.len() as u16).to_be_bytes());
    sni.extend_from_slice(host);
    extensions.extend_from_slice(&[0x00, 0x00]);
    extensions.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    extensions.extend_from_slice(&sni);
    // supported_groups: secp256r1; ec_point_formats: uncompressed
    extensions.extend_from_slice(&[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17]);
    extensions.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
    // signature_algorithms: ecdsa_secp256r1_sha256
    extensions.extend_from_slice(&[0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04, 0x03]);
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(&extensions);

    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x02];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn a_tls_1_1_client_is_refused() {
    let f = Fixture::start().await;
    let addr = f.addr();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.write_all(&tls11_client_hello()).unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        answer
    })
    .await
    .unwrap();
    // An alert record (21) with level fatal (2) and protocol_version (70); never a ServerHello.
    assert!(answer.len() >= 7, "expected an alert, got {answer:02x?}");
    assert_eq!(answer[0], 21, "record type: {answer:02x?}");
    assert_eq!(&answer[5..7], &[2, 70], "alert: {answer:02x?}");
    f.server.shutdown().await;
}

#[tokio::test]
async fn certificates_rotate_by_symlink_swap_without_failed_requests() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let (mut volume, first) = SecretVolume::new(dir.path());
    let server = serve::start(
        options(volume.files()),
        ServeObjects::Dir(repo().join("manifests")),
    )
    .await
    .unwrap();
    let addr = server.https_addr();

    // The next CA is generated up front so the client (like the apiserver during a rotation with
    // both CAs in caBundle) trusts old and new.
    let next_dir = tempfile::tempdir().unwrap();
    let next = TestCa::write(next_dir.path());
    let client = client_config(&[&first.certs.ca_cert_pem, &next.certs.ca_cert_pem]);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let seen_leaves = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = {
        let (stop, sent, seen_leaves, client) = (
            stop.clone(),
            sent.clone(),
            seen_leaves.clone(),
            client.clone(),
        );
        tokio::spawn(async move {
            let body = sample("trainjob-create-allowed.json");
            let mut failures = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match request(
                    addr,
                    client.clone(),
                    "POST",
                    Route::ValidateTrainJob.path(),
                    body.clone(),
                )
                .await
                {
                    Ok(reply) if reply.status == 200 => {
                        seen_leaves.lock().unwrap().push(reply.leaf);
                    }
                    Ok(reply) => failures.push(format!("HTTP {}", reply.status)),
                    Err(e) => failures.push(e),
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
            failures
        })
    };
    eventually("requests with the first certificate", WAIT, || async {
        (seen_leaves.lock().unwrap().contains(&first.leaf_der())).then_some(())
    })
    .await;

    // Swap in the next certificate: copy `next`'s files as the new version.
    volume.publish_files(next_dir.path());

    eventually("the new certificate to be served", WAIT, || async {
        (seen_leaves.lock().unwrap().contains(&next.leaf_der())).then_some(())
    })
    .await;
    let before = sent.load(Ordering::SeqCst);
    eventually("more requests after the swap", WAIT, || async {
        (sent.load(Ordering::SeqCst) > before + 5).then_some(())
    })
    .await;

    // A broken swap (key of another pair) keeps the current certificate.
    let failed = r#"mpi_webhook_tls_reloads_total{result="failed"}"#;
    let metrics_addr = server.metrics_addr();
    let failed_before = metric(&get_plain(metrics_addr, "/metrics").await.1, failed);
    volume.publish(Some(&first));
    eventually("the failed reload to be counted", WAIT, || async {
        let (_, text) = get_plain(metrics_addr, "/metrics").await;
        (metric(&text, failed) > failed_before).then_some(())
    })
    .await;
    let reply = request(addr, client.clone(), "GET", "/healthz", Vec::new())
        .await
        .unwrap();
    assert_eq!(
        reply.leaf,
        next.leaf_der(),
        "the last good pair is still served"
    );

    stop.store(true, Ordering::SeqCst);
    let failures = load.await.unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {failures:?}",
        failures.len(),
        sent.load(Ordering::SeqCst)
    );
    server.shutdown().await;
}

/// Copies a repository file into `dir` atomically (a hidden temporary name, then a rename), so
/// the poller never reads half a file.
fn copy_into(dir: &Path, from: &str) {
    let source = repo().join(from);
    let name = source.file_name().unwrap().to_str().unwrap().to_string();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(&source, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// The value of the first sample line starting with `series` (0 when absent).
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn objects_dir_changes_are_picked_up_and_broken_files_keep_the_last_good_state() {
    let objects = tempfile::tempdir().unwrap();
    std::fs::write(objects.path().join("broken.yaml"), "kind: [unclosed").unwrap();
    let f = Fixture::start_on(ServeObjects::Dir(objects.path().to_path_buf())).await;
    let readyz = || async {
        request(f.addr(), f.client(), "GET", "/readyz", Vec::new())
            .await
            .unwrap()
    };
    let reply = readyz().await;
    assert_eq!(reply.status, 503, "not ready before a first good load");
    assert!(String::from_utf8_lossy(&reply.body).contains("objects"));

    // Good files first, then the broken one goes: the first good load has them all.
    copy_into(
        objects.path(),
        "manifests/runtimes/deepspeed_distributed.yaml",
    );
    copy_into(
        objects.path(),
        "manifests/samples/trainjob-pi-deepspeed.yaml",
    );
    std::fs::remove_file(objects.path().join("broken.yaml")).unwrap();
    eventually("readiness", WAIT, || async {
        (readyz().await.status == 200).then_some(())
    })
    .await;
    let jobset = sample("jobset-create-owned-by-trainjob.json");
    let reply = f.post(Route::MutateJobSet, jobset.clone()).await;
    let response = response_for(&reply, "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e03");
    assert_eq!(response["allowed"], true);
    assert!(!patch_of(&response).is_empty());

    // A broken file: the last good objects stay.
    let failed = r#"mpi_webhook_objects_reloads_total{result="failed"}"#;
    let failed_before = metric(&f.metrics().await, failed);
    std::fs::write(objects.path().join("zz-broken.yaml"), "{ not: [yaml").unwrap();
    eventually("the failed load to be counted", WAIT, || async {
        (metric(&f.metrics().await, failed) > failed_before).then_some(())
    })
    .await;
    let response = response_for(
        &f.post(Route::MutateJobSet, jobset.clone()).await,
        "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e03",
    );
    assert_eq!(response["allowed"], true);
    assert_eq!(readyz().await.status, 200);

    // Fixed, and the TrainJob removed: the JobSet is now denied.
    std::fs::remove_file(objects.path().join("zz-broken.yaml")).unwrap();
    std::fs::remove_file(objects.path().join("trainjob-pi-deepspeed.yaml")).unwrap();
    eventually("the TrainJob to disappear", WAIT, || async {
        let reply = f.post(Route::MutateJobSet, jobset.clone()).await;
        (reply.json()["response"]["allowed"] == false).then_some(())
    })
    .await;
    f.server.shutdown().await;
}

#[tokio::test]
async fn shipped_runtimes_serve_and_are_ready_at_once() {
    let f = Fixture::start_on(ServeObjects::Shipped).await;
    let reply = request(f.addr(), f.client(), "GET", "/readyz", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let review = sample_json("trainjob-create-allowed.json");
    assert_eq!(
        response_for(
            &f.post_json(Route::ValidateTrainJob, &review).await,
            &uid(&review)
        )["allowed"],
        true
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn a_missing_objects_dir_or_certificate_fails_startup() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::write(dir.path());
    let error = serve::start(
        options(ca.files.clone()),
        ServeObjects::Dir(dir.path().join("absent")),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("absent"), "{error}");

    let mut files = ca.files.clone();
    files.key = dir.path().join("ca.key"); // the CA's key does not fit the serving certificate
    let error = serve::start(options(files), ServeObjects::Shipped)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("does not fit"), "{error}");
}

/// Between `begin_shutdown` (SIGTERM) and `shutdown` (the end of `--shutdown-delay`)
/// `/readyz` fails, kept-alive and new connections are still answered, every HTTP/1.1 answer
/// says `Connection: close` and HTTP/2 connections are sent away (GOAWAY) after their requests;
/// after `shutdown` nothing is accepted.
#[tokio::test]
async fn the_shutdown_delay_answers_everyone_and_tells_each_connection_to_close() {
    let f = Fixture::start().await;
    let ca = f.ca.certs.ca_cert_pem.clone();
    let h1 = f.client();
    let h2 = client_config_with(&[&ca], rustls::DEFAULT_VERSIONS, &[b"h2".as_slice()]);
    let review = sample("trainjob-create-allowed.json");
    let uid = "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e01";
    let path = Route::ValidateTrainJob.path();
    let assert_allowed = |reply: &KeptReply| {
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let json: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(json["response"]["uid"], uid);
        assert_eq!(json["response"]["allowed"], true);
    };

    let mut kept_h1 = KeptConnection::open(f.addr(), h1.clone()).await.unwrap();
    let mut kept_h2 = KeptConnection::open(f.addr(), h2.clone()).await.unwrap();
    let before = kept_h1.send("POST", path, review.clone()).await.unwrap();
    assert_allowed(&before);
    assert!(!before.close, "keep-alive while serving");
    assert_allowed(&kept_h2.send("POST", path, review.clone()).await.unwrap());

    f.server.begin_shutdown();

    // The kept HTTP/1.1 connection: answered, and told to close.
    let during = kept_h1.send("POST", path, review.clone()).await.unwrap();
    assert_allowed(&during);
    assert!(during.close, "Connection: close during the shutdown delay");
    eventually("the HTTP/1.1 connection to close", WAIT, || async {
        kept_h1.has_ended().then_some(())
    })
    .await;
    // The kept HTTP/2 connection: GOAWAY, and closed since it has no request in flight.
    eventually("the HTTP/2 connection to go away", WAIT, || async {
        kept_h2.has_ended().then_some(())
    })
    .await;
    assert!(!kept_h2.is_usable());

    // New connections are still accepted and answered, and told to close too.
    let mut fresh_h1 = KeptConnection::open(f.addr(), h1.clone()).await.unwrap();
    let readyz = fresh_h1.send("GET", "/readyz", Vec::new()).await.unwrap();
    assert_eq!(readyz.status, 503);
    assert_eq!(readyz.body, "shutting down");
    assert!(readyz.close);
    let mut fresh_h2 = KeptConnection::open(f.addr(), h2.clone()).await.unwrap();
    assert_allowed(&fresh_h2.send("POST", path, review.clone()).await.unwrap());
    eventually("the new HTTP/2 connection to go away", WAIT, || async {
        fresh_h2.has_ended().then_some(())
    })
    .await;

    let addr = f.addr();
    f.server.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
