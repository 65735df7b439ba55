//! What the scenarios share: the CRDs, runtimes and RBAC they install, bounded polling, a spawned
//! `mpi-webhook serve` behind the shipped webhook configurations, and a spawned
//! `mpi-webhook reconcile` as the shipped ServiceAccount.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

use crate::control_plane::{ControlPlane, Process, RECONCILER, User, free_port};

/// Longest any awaited state may take; generous for a loaded 2-core machine.
pub const TIMEOUT: Duration = Duration::from_secs(90);
/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
/// Finished reconciles, from the reconciler's `/metrics`.
pub const FINISHED: &str = "mpi_webhook_reconcile_duration_seconds_count";

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The YAML documents of a repository file.
pub fn documents(path: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"));
    mpi_webhook::objects::dir::parse_documents(&text, false)
        .unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

/// A JSON file of the repository.
pub fn json_file(path: &str) -> Value {
    let text =
        std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

/// The REST resource of an object, by its `apiVersion` and `kind`.
pub fn resource(object: &Value) -> ApiResource {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    resource_of(api_version, kind)
}

/// The REST resource of `kind` in `api_version`.
pub fn resource_of(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    // English plurals as the CRDs and the core kinds the tests use spell them.
    let lower = kind.to_lowercase();
    let plural = if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

/// Whether `kind` is namespaced, for the kinds the tests write.
fn namespaced(kind: &str) -> bool {
    !matches!(
        kind,
        "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "ClusterTrainingRuntime"
            | "ClusterQueue"
            | "ResourceFlavor"
            | "WorkloadPriorityClass"
            | "CustomResourceDefinition"
            | "ValidatingWebhookConfiguration"
            | "MutatingWebhookConfiguration"
    )
}

/// The dynamic API of `object`'s kind in `namespace` (its own when `None`).
pub fn api_for(client: &Client, object: &Value, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = resource(object);
    let kind = object["kind"].as_str().unwrap_or_default();
    if namespaced(kind) {
        let ns = namespace
            .or_else(|| object["metadata"]["namespace"].as_str())
            .unwrap_or("default");
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

/// Server-side applies `object` as `manager` (with force: the tests own these objects).
pub async fn apply(client: &Client, object: &Value, manager: &str) -> Value {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api = api_for(client, object, None);
    let applied = api
        .patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", object["kind"]));
    serde_json::to_value(applied).expect("an object as JSON")
}

/// Creates `object` as `client`; the stored object or the apiserver's refusal.
pub async fn create(client: &Client, object: &Value) -> Result<Value, kube::Error> {
    let api = api_for(client, object, None);
    let typed: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
    let created = api.create(&Default::default(), &typed).await?;
    Ok(serde_json::to_value(created).expect("an object as JSON"))
}

/// The stored object of `kind` `name` in `namespace`, if it exists.
pub async fn get(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Option<Value> {
    let ar = resource_of(api_version, kind);
    let api: Api<DynamicObject> = if namespaced(kind) {
        Api::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {kind} {namespace}/{name}: {e}"))
        .map(|o| serde_json::to_value(o).expect("an object as JSON"))
}

/// The CRDs, the shipped namespace and RBAC, and the shipped runtimes: idempotent, so every test
/// calls it.
pub async fn install(plane: &ControlPlane) {
    plane.apply_crds(&crate::control_plane::CRDS).await;
    let admin = plane.admin();
    for path in ["manifests/base/namespace.yaml", "manifests/base/rbac.yaml"] {
        for object in documents(path) {
            apply(&admin, &object, "envtest").await;
        }
    }
    for runtime in documents("manifests/runtimes/deepspeed_distributed.yaml") {
        apply(&admin, &runtime, "envtest").await;
    }
}

/// Polls `check` every 100 ms until it returns `Some`; panics naming `what` after [`TIMEOUT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "no {what} within {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The field managers of a stored object, in order.
pub fn managers(object: &Value) -> Vec<String> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["manager"].as_str().map(String::from))
        .collect()
}

/// The objects of `kind` in `namespace`, as JSON.
pub async fn list(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
) -> Result<Vec<Value>, kube::Error> {
    let ar = resource_of(api_version, kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("an object as JSON"))
        .collect())
}

/// The Events (events.k8s.io/v1) in `namespace` with `reason`.
pub async fn events(client: &Client, namespace: &str, reason: &str) -> Vec<Value> {
    list(client, "events.k8s.io/v1", "Event", namespace)
        .await
        .expect("list Events")
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// A new CA and a serving certificate for `localhost` and 127.0.0.1, the certificate and its key
/// written to `dir` as `tls.crt` and `tls.key` (the names controller-runtime and the Deployment
/// use).
pub fn serving_certs(dir: &Path) -> Result<mpi_webhook::certs::GeneratedCerts, String> {
    let certs = mpi_webhook::certs::generate(
        &["localhost".to_owned()],
        &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
    )
    .map_err(|e| e.to_string())?;
    for (file, pem) in [("tls.crt", &certs.cert_pem), ("tls.key", &certs.key_pem)] {
        let path = dir.join(file);
        std::fs::write(&path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(certs)
}

/// A plain-HTTP GET of `path` on `addr`, bounded.
pub async fn get_plain(addr: SocketAddr, path: &str) -> Option<String> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .ok()?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .ok()?;
        let body = sender.send_request(request).await.ok()?.into_body();
        let bytes = body.collect().await.ok()?.to_bytes();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Points `webhook` (one entry of a webhook configuration's `webhooks`) at `url` plus the path
/// of its shipped `service` reference, trusting `ca_bundle`; its path.
pub fn to_url(webhook: &mut Value, url: &str, ca_bundle: &str) -> String {
    let path = webhook["clientConfig"]["service"]["path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    webhook["clientConfig"] = json!({"url": format!("{url}{path}"), "caBundle": ca_bundle});
    path
}

/// Labels namespace `ns` to enforce the `restricted` Pod Security Standard.
pub async fn enforce_restricted(client: &Client, ns: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("label namespace {ns} restricted: {e}"));
}

// ---------------------------------------------------------------------------------------------
// `mpi-webhook serve` behind the shipped webhook configurations

/// A spawned `serve` and the shipped webhook configurations pointing at it, limited to one
/// namespace so that tests running alongside are not sent to it.
pub struct Webhook {
    pub process: Process,
    names: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Webhook {
    /// Starts `serve` (as the shipped ServiceAccount, which the serve ClusterRole lets read
    /// TrainJobs and runtimes) and registers `manifests/base/webhooks.yaml` for `namespace`:
    /// each webhook's clientConfig becomes `url:` at the server with the CA in `caBundle`, and
    /// its namespaceSelector also requires `namespace`. The ClusterTrainingRuntime validator is
    /// left out: a cluster-scoped kind has no namespace to confine it to.
    pub async fn start(plane: &ControlPlane, namespace: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = serving_certs(dir.path()).expect("serving certificate");
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let kubeconfig = plane
            .write_kubeconfig(&dir.path().join("kubeconfig"), RECONCILER)
            .expect("kubeconfig");
        let port = free_port().expect("a port");
        let metrics = free_port().expect("a port");
        let args: Vec<String> = vec![
            "serve".into(),
            format!("--listen=127.0.0.1:{port}"),
            format!("--metrics-listen=127.0.0.1:{metrics}"),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-key-file={}", key.display()),
        ];
        let process = Process::spawn(
            "serve",
            Path::new(BIN),
            &args,
            &[
                ("KUBECONFIG", &kubeconfig.display().to_string()),
                ("RUST_LOG", "info"),
                ("NO_COLOR", "1"),
            ],
            &dir.path().join("serve.log"),
        )
        .expect("start serve");

        let admin = plane.admin();
        let url = format!("https://127.0.0.1:{port}");
        let mut names = Vec::new();
        for mut configuration in documents("manifests/base/webhooks.yaml") {
            let kind = configuration["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let name = format!(
                "{}-{namespace}",
                configuration["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
            );
            configuration["metadata"]["name"] = json!(name);
            let webhooks = configuration["webhooks"].as_array_mut().expect("webhooks");
            webhooks.retain(|w| {
                !w["name"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("cluster")
            });
            for webhook in webhooks.iter_mut() {
                to_url(webhook, &url, &certs.ca_bundle());
                let expressions = webhook["namespaceSelector"]["matchExpressions"]
                    .as_array_mut()
                    .expect("the shipped namespaceSelector");
                expressions.push(json!({"key": "kubernetes.io/metadata.name",
                                        "operator": "In", "values": [namespace]}));
            }
            apply(&admin, &configuration, "envtest").await;
            names.push((kind, name));
        }
        let webhook = Self {
            process,
            names,
            _dir: dir,
        };
        webhook.wait_until_called(plane, namespace).await;
        webhook
    }

    /// The apiserver picks up new configurations a moment later and `serve` needs its caches:
    /// waits until a dry-run TrainJob with a reserved env is denied by it.
    async fn wait_until_called(&self, plane: &ControlPlane, namespace: &str) {
        let admin = plane.admin();
        let mut probe = json_file(
            "manifests/samples/reviews/trainjob-create-denied-reserved-env.json",
        )["request"]["object"]
            .clone();
        probe["metadata"] = json!({"name": "webhook-probe", "namespace": namespace});
        let api = api_for(&admin, &probe, None);
        let typed: DynamicObject = serde_json::from_value(probe).expect("a TrainJob");
        let dry_run = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match api.create(&dry_run, &typed).await {
                Err(kube::Error::Api(e)) if e.message.contains("denied the request") => return,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "the webhook was not called within {TIMEOUT:?}\n--- serve log ---\n{}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Removes the configurations, then stops the server.
    pub async fn stop(mut self, plane: &ControlPlane) {
        let admin = plane.admin();
        for (kind, name) in &self.names {
            let object = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                                "metadata": {"name": name}});
            let _ = api_for(&admin, &object, None)
                .delete(name, &Default::default())
                .await;
        }
        self.process.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// `mpi-webhook reconcile`

/// The reconciler watches the whole cluster, so two at once would both act on every test's jobs:
/// reconciler tests take turns.
pub static RECONCILER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A spawned `mpi-webhook reconcile` running as the shipped ServiceAccount.
pub struct Reconciler {
    pub process: Process,
    pub metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Reconciler {
    /// `mpi-webhook reconcile FLAGS` against `plane`, as the shipped ServiceAccount.
    pub fn start(plane: &ControlPlane, flags: &[&str]) -> Self {
        Self::start_as(plane, RECONCILER, flags)
    }

    /// `mpi-webhook reconcile FLAGS` against `plane`, as `user`.
    pub fn start_as(plane: &ControlPlane, user: User, flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig: PathBuf = plane
            .write_kubeconfig(&dir.path().join("kubeconfig"), user)
            .expect("kubeconfig");
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port().expect("a port")));
        let mut args: Vec<String> = vec!["reconcile".into(), format!("--metrics-listen={metrics}")];
        args.extend(flags.iter().map(|f| (*f).to_owned()));
        let process = Process::spawn(
            "reconcile",
            Path::new(BIN),
            &args,
            &[
                ("KUBECONFIG", &kubeconfig.display().to_string()),
                ("HOSTNAME", "envtest"),
                ("RUST_LOG", "info"),
                ("NO_COLOR", "1"),
            ],
            &dir.path().join("reconcile.log"),
        )
        .expect("start reconcile");
        Self {
            process,
            metrics,
            _dir: dir,
        }
    }

    /// The value of one metric (summed over labels), 0 while `/metrics` is not up.
    pub async fn metric(&self, name: &str) -> u64 {
        get_plain(self.metrics, "/metrics")
            .await
            .map_or(0, |text| crate::prometheus::sum(&text, name))
    }

    /// Polls `check` until `Some`; panics with the reconciler's log after [`TIMEOUT`] or when it
    /// exits.
    pub async fn wait_for<T, F, Fut>(&mut self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.wait_for_within(what, TIMEOUT, check).await
    }

    /// [`wait_for`](Self::wait_for) with a bound of `limit`.
    pub async fn wait_for_within<T, F, Fut>(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if let Some(status) = self.process.exited() {
                panic!(
                    "reconcile exited ({status}) while waiting for {what}\n{}",
                    self.process.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {limit:?}\n--- reconciler log ---\n{}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until more than `after` reconciles have finished.
    pub async fn reconciled_past(&mut self, after: u64) -> u64 {
        let metrics = self.metrics;
        self.wait_for(&format!("a reconcile past {after}"), || async move {
            let now = get_plain(metrics, "/metrics")
                .await
                .map_or(0, |t| crate::prometheus::sum(&t, FINISHED));
            (now > after).then_some(now)
        })
        .await
    }
}
