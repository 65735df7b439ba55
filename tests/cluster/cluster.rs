//! A single-node Kubernetes cluster on this machine, started once per test binary: the control
//! plane of tests/envtest (etcd, kube-apiserver) plus kube-controller-manager with every default
//! controller, kube-scheduler, one node (`node.sh`: a CNI bridge, containerd, the kubelet and
//! cluster DNS for pod host names), the JobSet controller behind its own webhooks, and
//! `mpi-webhook serve` + `reconcile` as `manifests/` deploys them: the shipped webhook
//! configurations (as `url:` webhooks, the shipped namespaceSelectors kept), the shipped RBAC
//! (both run as the shipped ServiceAccount's user) and the Deployment's flags, the pre-flight image
//! being the mpi-webhook image built from the binary under test.
//!
//! Nothing outlives the test binary: every process runs under the envtest watchdog, and
//! `node.sh` tears the node down (in order: kubelet, containers, containerd, mounts, network,
//! sysctls) when the pipe from this process closes, which the kernel does however this process
//! ends. The logs of every component are kept under `target/cluster/logs/` (the node's are
//! copied there at teardown), and a failed scenario writes what it saw next to them.
//!
//! Prerequisites (root, the node binaries beside `KUBEBUILDER_ASSETS`, the Debian packages and the
//! images of `scripts/install-test-deps.sh`): when one is missing every scenario fails saying
//! what, unless `SKIP_TEST_SUITES=cluster` opts out (`tests/support/prerequisites.rs`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::control_plane::{
    self, Assets, ControlPlane, Options, Process, RECONCILER, free_port, lock, log_tail,
};
use crate::support::{BIN, api_for, apply, documents, repo, serving_certs};

/// How long the node may take to be Ready (images are imported first: about a minute cold).
const NODE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the JobSet controller and the webhooks may take to answer.
const COMPONENT_TIMEOUT: Duration = Duration::from_secs(120);
/// The node binaries that must sit beside the control plane's in `KUBEBUILDER_ASSETS`.
const NODE_BINARIES: [&str; 3] = ["kube-controller-manager", "kube-scheduler", "kubelet"];
/// Where `scripts/install-neighbours.sh` puts the controllers it builds from their Go modules,
/// each in a folder of its own with the YAML its release ships.
const NEIGHBOURS: &str = "target/neighbours";
/// The JobSet webhooks as upstream generates them, and the pod webhooks' objectSelector
/// (upstream's kustomize patches).
const JOBSET_WEBHOOKS: &str =
    "tests/fixtures/upstream/jobset/config/components/webhook/manifests.yaml";
/// The images every scenario may use, as `scripts/build-test-images.sh` names them.
pub const OPENMPI_IMAGE: &str = "localhost/mpi-openmpi:test";
pub const MPICH_IMAGE: &str = "localhost/mpi-mpich:test";
pub const INTEL_IMAGE: &str = "localhost/mpi-intel:test";
pub const WEBHOOK_IMAGE: &str = "localhost/mpi-webhook:test";
/// `localhost/mpi-openmpi:test` with what Kubeflow Trainer's MPI runtime images bring.
pub const TRAINER_IMAGE: &str = "localhost/mpi-trainer:test";

/// The running cluster.
pub struct Cluster {
    pub plane: ControlPlane,
    /// Where every component's log is (kept after the run).
    pub logs: PathBuf,
    /// The node process and the pipe whose closing tears it down.
    node: Mutex<(Child, Option<ChildStdin>)>,
    /// The node's folder (`node.sh`'s `NODE_DIR`: its containerd's socket is there).
    node_dir: PathBuf,
    /// Controller manager, scheduler, JobSet, serve, reconcile.
    processes: Mutex<Vec<Process>>,
}

/// The cluster, or why it is skipped; `Err` when it failed to start.
static CLUSTER: OnceCell<Result<Result<Cluster, String>, String>> = OnceCell::const_new();
static SKIP_NOTICE: std::sync::Once = std::sync::Once::new();

/// The cluster of this test binary, started on first use; `None` (after one line on stderr) when a
/// prerequisite is missing and `SKIP_TEST_SUITES` names `cluster`.
///
/// # Panics
/// When it does not start, or a prerequisite is missing and not opted out of.
pub async fn shared() -> Option<&'static Cluster> {
    let result = CLUSTER
        .get_or_init(|| async {
            let missing = missing_prerequisites();
            if !missing.is_empty() {
                return Ok(Err(format!(
                    "the single-node cluster cannot start here: {}",
                    missing.join("; ")
                )));
            }
            Cluster::start().await.map(Ok)
        })
        .await;
    match result {
        Ok(Ok(cluster)) => Some(cluster),
        Ok(Err(why)) => {
            crate::prerequisites::skip_or_fail(
                "cluster",
                why,
                "scripts/install-test-deps.sh, as root, installs what it needs",
                &SKIP_NOTICE,
            );
            None
        }
        Err(e) => panic!("cluster: {e}"),
    }
}

/// What this machine lacks for the cluster, in words.
fn missing_prerequisites() -> Vec<String> {
    let mut missing = Vec::new();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        missing.push("not root (containerd and the kubelet need it)".into());
    }
    match control_plane::assets() {
        Ok(Assets::Found(dir)) => {
            for binary in NODE_BINARIES {
                if !dir.join(binary).is_file() {
                    missing.push(format!("no {binary} in {}", dir.display()));
                }
            }
            if jobset_controller(&dir).is_none() {
                missing.push(format!(
                    "no jobset-controller in {} (scripts/install-neighbours.sh builds it) nor in {}",
                    neighbour("jobset").display(),
                    dir.display()
                ));
            }
        }
        Ok(Assets::Absent) => missing.push("KUBEBUILDER_ASSETS is unset".into()),
        Err(e) => missing.push(e),
    }
    for command in ["containerd", "ctr", "runc", "dnsmasq", "kubectl", "umoci"] {
        if !on_path(command) {
            missing.push(format!("no {command} on PATH"));
        }
    }
    if !images_list().is_file() {
        missing.push(format!(
            "no {} (scripts/build-test-images.sh makes it)",
            images_list().display()
        ));
    }
    missing
}

/// The folder of neighbour `name` under [`NEIGHBOURS`].
pub fn neighbour(name: &str) -> PathBuf {
    repo().join(NEIGHBOURS).join(name)
}

/// The JobSet controller: the one built from its Go module (`scripts/install-neighbours.sh`),
/// else the team's copy beside the control plane's binaries (`scripts/install-envtest.sh`).
fn jobset_controller(assets: &Path) -> Option<PathBuf> {
    [
        neighbour("jobset").join("jobset-controller"),
        assets.join("jobset-controller"),
    ]
    .into_iter()
    .find(|path| path.is_file())
}

fn on_path(command: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(command).is_file()))
        .unwrap_or(false)
}

/// `target/cluster-images/images.txt`, the images `scripts/build-test-images.sh` built.
fn images_list() -> PathBuf {
    repo().join("target/cluster-images/images.txt")
}

impl Cluster {
    async fn start() -> Result<Self, String> {
        let started = Instant::now();
        let logs = repo().join("target/cluster/logs");
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;

        // The mpi-webhook image from the binary under test: the launchers' pre-flight runs it.
        let built = Command::new(repo().join("scripts/build-test-images.sh"))
            .arg("webhook")
            .arg(BIN)
            .output()
            .map_err(|e| format!("scripts/build-test-images.sh: {e}"))?;
        if !built.status.success() {
            return Err(format!(
                "scripts/build-test-images.sh webhook failed:\n{}",
                String::from_utf8_lossy(&built.stderr)
            ));
        }

        // The kubelet trusts a CA of its own for client certificates; the apiserver presents one
        // it signed (for logs).
        let pki = logs.join("../pki");
        std::fs::create_dir_all(&pki).map_err(|e| e.to_string())?;
        let (ca, client_cert, client_key) = kubelet_client_pki()?;
        let kubelet_ca = pki.join("kubelet-client-ca.crt");
        std::fs::write(&kubelet_ca, ca).map_err(|e| e.to_string())?;
        std::fs::write(pki.join("apiserver-kubelet-client.crt"), client_cert)
            .map_err(|e| e.to_string())?;
        std::fs::write(pki.join("apiserver-kubelet-client.key"), client_key)
            .map_err(|e| e.to_string())?;
        let pki = pki.canonicalize().map_err(|e| e.to_string())?;
        let options = Options {
            garbage_collector: false,
            extra_apiserver_args: vec![
                format!(
                    "--kubelet-client-certificate={}",
                    pki.join("apiserver-kubelet-client.crt").display()
                ),
                format!(
                    "--kubelet-client-key={}",
                    pki.join("apiserver-kubelet-client.key").display()
                ),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ],
        };
        let plane = ControlPlane::start(options)
            .await?
            .ok_or("KUBEBUILDER_ASSETS is unset")?;
        let assets = match control_plane::assets()? {
            Assets::Found(dir) => dir,
            Assets::Absent => return Err("KUBEBUILDER_ASSETS is unset".into()),
        };
        let kubeconfig = plane.dir().join("admin.kubeconfig");

        // The node, started early: importing the images takes a while.
        let node_dir = tempfile::Builder::new()
            .prefix("mpi-webhook-node-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep();
        let images = node_dir.join("images.txt");
        std::fs::copy(images_list(), &images).map_err(|e| format!("images.txt: {e}"))?;
        let node_log =
            std::fs::File::create(logs.join("node.sh.log")).map_err(|e| e.to_string())?;
        let mut node = Command::new("bash")
            .arg(repo().join("tests/cluster/node.sh"))
            .env("NODE_DIR", &node_dir)
            .env("NODE_KEEP_LOGS", logs.join("node"))
            .env("KUBECONFIG", &kubeconfig)
            .env("CLIENT_CA", &kubelet_ca)
            .env("KUBELET", assets.join("kubelet"))
            .env("IMAGES", &images)
            .stdin(Stdio::piped())
            .stdout(node_log.try_clone().map_err(|e| e.to_string())?)
            .stderr(node_log)
            .spawn()
            .map_err(|e| format!("start node.sh: {e}"))?;
        let lifeline = node.stdin.take();

        let cluster = Self {
            plane,
            logs: logs.clone(),
            node: Mutex::new((node, lifeline)),
            node_dir: node_dir.clone(),
            processes: Mutex::new(Vec::new()),
        };
        cluster.start_controllers(&assets, &kubeconfig)?;
        cluster.start_jobset(&assets, &kubeconfig).await?;
        cluster.start_mpi_webhook().await?;
        cluster.wait_for_node(&node_dir).await?;
        let _ = writeln!(
            std::io::stderr(),
            "cluster: ready in {:.0?} (logs in {})",
            started.elapsed(),
            logs.display()
        );
        Ok(cluster)
    }

    /// A client as the cluster administrator.
    pub fn admin(&self) -> Client {
        self.plane.admin()
    }

    /// Kills container `container_id` (a Pod status's `containerID`, `containerd://` and all)
    /// with SIGKILL through the node's containerd, as the kernel's OOM killer or a crash would
    /// end it: the kubelet sees the container exit 137.
    pub fn kill_container(&self, container_id: &str) -> Result<(), String> {
        let id = container_id
            .strip_prefix("containerd://")
            .ok_or_else(|| format!("not a containerd container: {container_id}"))?;
        let socket = self.node_dir.join("containerd/containerd.sock");
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id])
            .output()
            .map_err(|e| format!("ctr: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr tasks kill {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> Result<(), String> {
        let process = Process::spawn(
            name,
            program,
            args,
            envs,
            &self.logs.join(format!("{name}.log")),
        )?;
        lock(&self.processes).push(process);
        Ok(())
    }

    /// kube-controller-manager with every default controller (the namespace's ServiceAccount, the
    /// root CA ConfigMap, the node's not-ready taint, Jobs, garbage collection) and
    /// kube-scheduler.
    fn start_controllers(&self, assets: &Path, kubeconfig: &Path) -> Result<(), String> {
        let kubeconfig = kubeconfig.display().to_string();
        let pki = self.plane.dir().join("pki");
        self.spawn(
            "kube-controller-manager",
            &assets.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--controllers=*".into(),
                format!("--root-ca-file={}", pki.join("ca.crt").display()),
                format!(
                    "--service-account-private-key-file={}",
                    pki.join("sa.key").display()
                ),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
                "--allocate-node-cidrs=false".into(),
                "--v=1".into(),
            ],
            &[],
        )?;
        self.spawn(
            "kube-scheduler",
            &assets.join("kube-scheduler"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ],
            &[],
        )
    }

    /// The JobSet CRD, its controller, and its webhooks as `url:` webhooks on 127.0.0.1 (its
    /// defaults, e.g. `network.enableDNSHostnames`, come from the mutating webhook).
    async fn start_jobset(&self, assets: &Path, kubeconfig: &Path) -> Result<(), String> {
        self.plane.apply_crds(&control_plane::CRDS).await;
        let dir = self.logs.join("../jobset");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let certs = serving_certs(&dir)?;
        let webhook_port = free_port()?;
        let health_port = free_port()?;
        let config = format!(
            "apiVersion: config.jobset.x-k8s.io/v1alpha1\nkind: Configuration\n\
             leaderElection: {{leaderElect: false}}\ninternalCertManagement: {{enable: false}}\n\
             webhook: {{host: 127.0.0.1, port: {webhook_port}, certDir: {}}}\n\
             metrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{health_port}\"}}\n",
            dir.canonicalize().map_err(|e| e.to_string())?.display()
        );
        std::fs::write(dir.join("config.yaml"), config).map_err(|e| e.to_string())?;
        let controller = jobset_controller(assets).ok_or("no jobset-controller")?;
        eprintln!("cluster: JobSet controller {}", controller.display());
        self.spawn(
            "jobset-controller",
            &controller,
            &[
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--config={}", dir.join("config.yaml").display()),
                "--zap-devel=false".into(),
            ],
            &[],
        )?;
        let health = std::net::SocketAddr::from(([127, 0, 0, 1], health_port));
        self.wait(
            "the JobSet controller's /readyz",
            COMPONENT_TIMEOUT,
            || async move {
                crate::support::get_plain(health, "/readyz")
                    .await
                    .filter(|body| body.trim() == "ok")
            },
        )
        .await?;

        let url = format!("https://127.0.0.1:{webhook_port}");
        self.register_webhooks(
            documents(JOBSET_WEBHOOKS),
            "jobset-",
            &url,
            &certs.ca_bundle(),
            |webhook, path| {
                // Upstream's kustomize patches: the pod webhooks see only JobSet's pods.
                if path.ends_with("-v1-pod") {
                    webhook["objectSelector"] = json!({"matchExpressions": [
                    {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]});
                }
            },
        )
        .await;
        Ok(())
    }

    /// Applies the webhook `configurations` (names prefixed with `prefix`), each webhook pointed
    /// at `url` plus its shipped path and trusting `ca_bundle`, then edited by `edit` (given the
    /// path).
    pub async fn register_webhooks(
        &self,
        configurations: Vec<Value>,
        prefix: &str,
        url: &str,
        ca_bundle: &str,
        edit: impl Fn(&mut Value, &str),
    ) {
        let admin = self.admin();
        for mut configuration in configurations {
            for webhook in configuration["webhooks"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                let path = crate::support::to_url(webhook, url, ca_bundle);
                edit(webhook, &path);
            }
            let name = configuration["metadata"]["name"]
                .as_str()
                .unwrap_or_default();
            configuration["metadata"]["name"] = json!(format!("{prefix}{name}"));
            apply(&admin, &configuration, "cluster").await;
        }
    }

    /// `mpi-webhook serve` and `reconcile` with the Deployment's flags, as the shipped
    /// ServiceAccount, behind the shipped webhook configurations.
    async fn start_mpi_webhook(&self) -> Result<(), String> {
        crate::support::install(&self.plane).await;
        let dir = self.logs.join("../mpi-webhook");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let certs = serving_certs(&dir)?;
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        let kubeconfig = self
            .plane
            .write_kubeconfig(&dir.join("kubeconfig"), RECONCILER)?
            .display()
            .to_string();
        let port = free_port()?;
        self.spawn(
            "serve",
            Path::new(BIN),
            &[
                "serve".into(),
                format!("--listen=127.0.0.1:{port}"),
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-key-file={}", key.display()),
                format!("--metrics-listen=127.0.0.1:{}", free_port()?),
                "--shutdown-delay=5s".into(),
            ],
            &[
                ("KUBECONFIG", &kubeconfig),
                ("RUST_LOG", "info"),
                ("NO_COLOR", "1"),
                ("MPI_WEBHOOK_PREFLIGHT_IMAGE", WEBHOOK_IMAGE),
            ],
        )?;
        self.spawn(
            "reconcile",
            Path::new(BIN),
            &[
                "reconcile".into(),
                "--leader-elect".into(),
                format!("--metrics-listen=127.0.0.1:{}", free_port()?),
            ],
            &[
                ("KUBECONFIG", &kubeconfig),
                ("RUST_LOG", "info"),
                ("NO_COLOR", "1"),
                ("HOSTNAME", "cluster-reconciler"),
                ("MPI_WEBHOOK_LEASE_NAMESPACE", "mpi-webhook"),
            ],
        )?;

        let url = format!("https://127.0.0.1:{port}");
        self.register_webhooks(
            documents("manifests/base/webhooks.yaml"),
            "",
            &url,
            &certs.ca_bundle(),
            |_, _| {},
        )
        .await;
        let admin = self.admin();

        // Both webhooks answer: a JobSet-mode JobSet with an unknown implementation is denied by
        // ours, after passing JobSet's own mutating webhook.
        self.plane.create_namespace("cluster-probe").await;
        let probe = json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "probe", "namespace": "cluster-probe",
                         "labels": {"mpi-webhook.io/implementation": "Probe"}},
            "spec": {"replicatedJobs": [{"name": "launcher", "template": {"spec": {"template":
                {"spec": {"restartPolicy": "Never",
                          "containers": [{"name": "launcher", "image": WEBHOOK_IMAGE}]}}}}}]}
        });
        let api = api_for(&admin, &probe, None);
        let typed: DynamicObject = serde_json::from_value(probe).map_err(|e| e.to_string())?;
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let api = &api;
        let typed = &typed;
        let dry_run = &dry_run;
        self.wait(
            "mpi-webhook's and JobSet's webhooks",
            COMPONENT_TIMEOUT,
            || async move {
                match api.create(dry_run, typed).await {
                    Err(kube::Error::Api(e))
                        if e.message.contains("mpi-webhook") && e.message.contains("denied") =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            },
        )
        .await
    }

    async fn wait_for_node(&self, node_dir: &Path) -> Result<(), String> {
        let deadline = Instant::now() + NODE_TIMEOUT;
        loop {
            if node_dir.join("ready").exists() {
                return Ok(());
            }
            let exited = lock(&self.node).0.try_wait().ok().flatten();
            if exited.is_some() || node_dir.join("failed").exists() {
                return Err(format!(
                    "the node did not start ({exited:?}):\n{}",
                    log_tail(&self.logs.join("node.sh.log"), 40)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the node was not Ready within {NODE_TIMEOUT:?}:\n{}",
                    log_tail(&self.logs.join("node.sh.log"), 40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Polls `check` until `Some`, failing after `limit` or when a component has exited.
    async fn wait<T, F, Fut>(&self, what: &str, limit: Duration, mut check: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(value) = check().await {
                return Ok(value);
            }
            for process in lock(&self.processes).iter_mut() {
                if let Some(status) = process.exited() {
                    return Err(format!(
                        "{} exited ({status}) while waiting for {what}:\n{}",
                        process.log().display(),
                        process.log_tail()
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no {what} within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// A CA, and a client certificate it signed for the apiserver's calls to the kubelet (PEM).
fn kubelet_client_pki() -> Result<(String, String, String), String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let e = |e: rcgen::Error| e.to_string();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "mpi-webhook cluster kubelet-client CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_key = KeyPair::generate().map_err(e)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(e)?;
    let issuer = Issuer::new(ca, ca_key);
    let mut client = CertificateParams::default();
    client
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver-kubelet-client");
    client
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().map_err(e)?;
    let cert = client.signed_by(&key, &issuer).map_err(e)?;
    Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
}
