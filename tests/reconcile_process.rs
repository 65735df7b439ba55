//! The real `mpi-webhook reconcile` process against the fake API server of `fake_apiserver/`
//! (server-side apply with field ownership, the shipped RBAC of `manifests/base/rbac.yaml` and
//! the OwnerReferencesPermissionEnforcement admission plugin on), with Kubeflow Trainer's writes
//! simulated in process: the reconciler never fights Trainer (Decision 16).
//!
//! Every wait is bounded ([`TIMEOUT`]) and polls the fake's state or the reconciler's
//! `/metrics`; nothing asserts a duration. The fake's own tests are included at the end.

mod fake_apiserver;
#[path = "fake_apiserver/tests.rs"]
mod fake_apiserver_tests;
#[path = "support/prometheus.rs"]
mod prometheus;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_apiserver::authz::Authorizer;
use fake_apiserver::{
    CLUSTER_RUNTIMES, CONFIGMAPS, EVENTS, FakeApi, JOBSETS, Key, LEASES, NETWORK_POLICIES, Options,
    SECRETS, TRAINJOBS, str_at, write_kubeconfig,
};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
/// Longest any awaited state may take (a reconcile takes milliseconds).
const TIMEOUT: Duration = Duration::from_secs(30);
/// Our hostfile for [`train_job`] on [`runtime`] (73 bytes).
const HOSTFILE: &str =
    "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n";
/// A hostfile Trainer might word differently (23 bytes).
const TRAINERS_OTHER_HOSTFILE: &str = "pi-node-0-0.pi slots=1\n";
/// Finished reconciles, from the reconciler's `/metrics`.
const FINISHED: &str = "mpi_webhook_reconcile_duration_seconds_count";
/// The shipped Lease and the namespace its Role is in.
const LEASE: &str = "mpi-webhook-reconciler";
const LEASE_NAMESPACE: &str = "mpi-webhook";
/// `leaseDurationSeconds` of the reconciler's Lease (`LEASE_DURATION_SECS` in
/// src/reconciler/leader.rs).
const LEASE_DURATION_SECS: u64 = 15;

fn owner() -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
           "uid": "uid-1", "controller": true, "blockOwnerDeletion": true})
}

fn runtime() -> Value {
    let job = |name: &str| {
        json!({"name": name, "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "node", "image": "mpi"}]}}}}})
    };
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "deepspeed"},
           "spec": {"mlPolicy": {"numNodes": 1,
                                 "mpi": {"numProcPerNode": 1, "runLauncherAsNode": true}},
                    "template": {"spec": {"replicatedJobs": [job("node"), job("launcher")]}}}})
}

fn train_job() -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "pi", "namespace": "team", "uid": "uid-1"},
           "spec": {"runtimeRef": {"name": "deepspeed"}, "trainer": {"numNodes": 3}}})
}

/// The hostfile ConfigMap as Trainer's controller applies it (D.2: no labels).
fn trainers_configmap(hostfile: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "pi-mpi-hostfile", "namespace": "team",
                        "ownerReferences": [owner()]},
           "data": {"hostfile": hostfile}})
}

/// Trainer's controller applying its hostfile ConfigMap with `hostfile` (with force, as it
/// does); the stored object.
fn trainer_applies_hostfile(api: &FakeApi, hostfile: &str) -> Arc<Value> {
    let (stored, _) = api
        .apply(
            CONFIGMAPS,
            configmap_key(),
            trainers_configmap(hostfile),
            "trainer",
            true,
        )
        .expect("Trainer applies its ConfigMap");
    stored
}

/// How many ConfigMap applies the fake served: in all, and with force.
fn configmap_applies(api: &FakeApi) -> (u64, u64) {
    let stats = api.stats();
    (
        stats.count("apply", "configmaps"),
        stats.count("apply-force", "configmaps"),
    )
}

/// The SSH Secret as Trainer's controller applies it (D.1: no labels).
fn trainers_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
           "immutable": true,
           "metadata": {"name": "pi-mpi-ssh-auth", "namespace": "team",
                        "ownerReferences": [owner()]},
           "data": {"ssh-privatekey": "VFJBSU5FUg==", "ssh-publickey": "VFJBSU5FUg=="}})
}

fn configmap_key() -> Key {
    ("team".into(), "pi-mpi-hostfile".into())
}

fn secret_key() -> Key {
    ("team".into(), "pi-mpi-ssh-auth".into())
}

/// A fake cluster with the runtime and the TrainJob, served on 127.0.0.1.
struct Cluster {
    api: Arc<FakeApi>,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

async fn cluster(authorizer: Authorizer) -> Cluster {
    let api = FakeApi::with(Options {
        authorizer: Some(authorizer),
        owner_references_permission_enforcement: true,
    });
    api.create(CLUSTER_RUNTIMES, None, runtime(), "kubectl")
        .expect("runtime");
    api.create(TRAINJOBS, None, train_job(), "kubectl")
        .expect("TrainJob");
    let addr = api.start().await.expect("listen");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = write_kubeconfig(dir.path(), addr).expect("kubeconfig");
    Cluster {
        api,
        kubeconfig,
        dir,
    }
}

/// `mpi-webhook reconcile`, killed when dropped.
struct Reconciler {
    child: Child,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Reconciler {
    fn start(cluster: &Cluster) -> Self {
        Self::start_with(cluster, &[])
    }

    /// `mpi-webhook reconcile` with `flags` added.
    fn start_with(cluster: &Cluster, flags: &[&str]) -> Self {
        Self::start_logged(cluster, "reconcile.log", flags)
    }

    /// A `--leader-elect` replica named `holder` (the shipped Lease, in the shipped namespace).
    fn start_leader(cluster: &Cluster, holder: &str) -> Self {
        Self::start_logged(
            cluster,
            &format!("reconcile-{holder}.log"),
            &[
                "--leader-elect",
                "--lease-namespace",
                LEASE_NAMESPACE,
                "--lease-holder",
                holder,
            ],
        )
    }

    /// `mpi-webhook reconcile` with `flags` added, logging to `log` in the cluster's directory.
    fn start_logged(cluster: &Cluster, log: &str, flags: &[&str]) -> Self {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let log = cluster.dir.path().join(log);
        let child = Command::new(BIN)
            .args(["reconcile", "--metrics-listen", &metrics.to_string()])
            .args(flags)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("HOSTNAME", "test")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("MPI_WEBHOOK_LEADER_ELECT")
            .env_remove("MPI_WEBHOOK_NETWORK_POLICY_DEFAULT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start mpi-webhook reconcile");
        Self {
            child,
            metrics,
            log,
        }
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    async fn exited(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "reconcile did not exit within {TIMEOUT:?}\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until `done` holds; panics naming `what` (with the log's end) after [`TIMEOUT`] or
    /// when the process exits.
    async fn wait_for(&mut self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !done() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "reconcile exited ({status}) while waiting for {what}\n{}",
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {TIMEOUT:?}\n--- reconciler log ---\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The value of one metric (summed over labels), 0 while `/metrics` is not up.
    async fn metric(&self, name: &str) -> u64 {
        let Ok(text) = scrape(self.metrics).await else {
            return 0;
        };
        prometheus::sum(&text, name)
    }

    /// Waits until more than `after` reconciles have finished; returns how many have.
    async fn reconciled_past(&mut self, after: u64) -> u64 {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = self.metric(FINISHED).await;
            if now > after {
                return now;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("reconcile exited ({status})\n{}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "no reconcile past {after} within {TIMEOUT:?}\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn scrape(addr: SocketAddr) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::get("/metrics")
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let body = sender.send_request(request).await?.into_body();
        let bytes = body.collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "/metrics timed out")?
}

fn rv(object: &Value) -> String {
    str_at(object, "/metadata/resourceVersion")
        .unwrap_or_default()
        .to_string()
}

fn managers(object: &Value) -> Vec<String> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["manager"].as_str().map(String::from))
        .collect()
}

fn events(api: &FakeApi, reason: &str) -> Vec<Arc<Value>> {
    api.objects(EVENTS)
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// Touches the TrainJob (an annotation, spec unchanged): the controller reconciles it again.
async fn resync(api: &FakeApi, reconciler: &mut Reconciler, round: usize) {
    let before = reconciler.metric(FINISHED).await;
    api.merge_patch(
        TRAINJOBS,
        ("team".into(), "pi".into()),
        &json!({"metadata": {"annotations": {"test/resync": round.to_string()}}}),
        "kubectl-annotate",
    )
    .expect("annotate");
    reconciler.reconciled_past(before).await;
}

fn ours_applied(api: &FakeApi) -> bool {
    api.get(CONFIGMAPS, &configmap_key())
        .is_ok_and(|c| managers(&c).iter().any(|m| m == "mpi-webhook"))
}

#[tokio::test]
async fn trainer_first_with_the_same_text_means_no_fight_and_a_stable_resource_version() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    trainer_applies_hostfile(api, HOSTFILE);
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("our apply next to Trainer's", || {
            ours_applied(api) && api.get(SECRETS, &secret_key()).is_ok()
        })
        .await;
    let settled = api.get(CONFIGMAPS, &configmap_key()).expect("ConfigMap");
    assert_eq!(managers(&settled), ["trainer", "mpi-webhook"]);
    assert_eq!(settled["data"], json!({"hostfile": HOSTFILE}));
    for round in 0..3 {
        // Trainer re-applies on its every reconcile: nothing changes.
        let again = trainer_applies_hostfile(api, HOSTFILE);
        assert_eq!(rv(&again), rv(&settled), "round {round}");
        resync(api, &mut reconciler, round).await;
    }
    let last = api.get(CONFIGMAPS, &configmap_key()).expect("ConfigMap");
    assert_eq!(rv(&last), rv(&settled));
    assert_eq!(configmap_applies(api), (1, 0));
    let stats = api.stats();
    assert!(events(api, "HostfileConflict").is_empty());
    assert_eq!(stats.unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn trainer_first_with_other_text_keeps_trainers_and_one_warning_event() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let seeded = trainer_applies_hostfile(api, TRAINERS_OTHER_HOSTFILE);
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("a HostfileConflict Event", || {
            !events(api, "HostfileConflict").is_empty()
        })
        .await;
    for round in 0..2 {
        let again = trainer_applies_hostfile(api, TRAINERS_OTHER_HOSTFILE);
        assert_eq!(rv(&again), rv(&seeded), "round {round}");
        resync(api, &mut reconciler, round).await;
    }
    let stored = api.get(CONFIGMAPS, &configmap_key()).expect("ConfigMap");
    assert_eq!(rv(&stored), rv(&seeded));
    assert_eq!(stored["data"], json!({"hostfile": TRAINERS_OTHER_HOSTFILE}));
    assert_eq!(managers(&stored), ["trainer"]);
    let warnings = events(api, "HostfileConflict");
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(
        (
            &warnings[0]["type"],
            &warnings[0]["note"],
            &warnings[0]["regarding"]["name"]
        ),
        (
            &json!("Warning"),
            &json!(
                "ConfigMap pi-mpi-hostfile: Kubeflow Trainer's field manager \"trainer\" holds \
                 .data.hostfile with other values, left as is: our hostfile is 73 bytes, \
                 Trainer's is 23 bytes"
            ),
            &json!("pi")
        )
    );
    assert!(
        reconciler
            .metric("mpi_webhook_hostfile_conflicts_total")
            .await
            >= 3
    );
    let stats = api.stats();
    assert_eq!(stats.count("apply-force", "configmaps"), 0);
    assert_eq!(stats.unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn a_secret_trainer_made_first_is_used_as_is() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let (secret, _) = api
        .apply(SECRETS, secret_key(), trainers_secret(), "trainer", true)
        .expect("Trainer's Secret");
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the ConfigMap", || ours_applied(api))
        .await;
    let before = reconciler.metric(FINISHED).await;
    resync(api, &mut reconciler, 0).await;
    assert!(reconciler.metric(FINISHED).await > before);
    let after = api.get(SECRETS, &secret_key()).expect("Secret");
    assert_eq!(after, secret, "not recreated, not touched");
    assert_eq!(after["metadata"].get("labels"), None);
    let stats = api.stats();
    assert_eq!(stats.count("create", "secrets"), 0);
    assert_eq!(stats.unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn a_kubectl_edit_is_repaired_with_force() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the ConfigMap", || ours_applied(api))
        .await;
    api.merge_patch(
        CONFIGMAPS,
        configmap_key(),
        &json!({"data": {"hostfile": "edited\n"}}),
        "kubectl-edit",
    )
    .expect("edit");
    reconciler
        .wait_for("the edit repaired", || {
            api.get(CONFIGMAPS, &configmap_key())
                .is_ok_and(|c| c["data"]["hostfile"] == HOSTFILE)
        })
        .await;
    let repaired = api.get(CONFIGMAPS, &configmap_key()).expect("ConfigMap");
    assert_eq!(managers(&repaired), ["mpi-webhook"]);
    assert_eq!(configmap_applies(api), (2, 1));
    let stats = api.stats();
    assert!(events(api, "HostfileConflict").is_empty());
    assert_eq!(stats.unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn owner_references_permission_enforcement_passes_with_the_shipped_rbac() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the Secret and the ConfigMap", || {
            api.get(SECRETS, &secret_key()).is_ok() && ours_applied(api)
        })
        .await;
    for key_and_kind in [(SECRETS, secret_key()), (CONFIGMAPS, configmap_key())] {
        let object = api.get(key_and_kind.0, &key_and_kind.1).expect("object");
        assert_eq!(object["metadata"]["ownerReferences"], json!([owner()]));
    }
    assert_eq!(api.stats().unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn without_the_finalizers_grant_the_plugin_refuses_every_object() {
    let rbac = Authorizer::shipped().without(|g| g.resource == "trainjobs/finalizers");
    let cluster = cluster(rbac).await;
    let api = &cluster.api;
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("a TrainJobResourcesCreationFailed Event", || {
            !events(api, "TrainJobResourcesCreationFailed").is_empty()
        })
        .await;
    let failed = events(api, "TrainJobResourcesCreationFailed");
    let note = failed[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("failed to create the SSH auth Secret: ")
            && note.contains(
                "secrets \"pi-mpi-ssh-auth\" is forbidden: cannot set blockOwnerDeletion if an \
                 ownerReference refers to a resource you can't set finalizers on: , <nil>"
            ),
        "{note}"
    );
    assert!(api.get(SECRETS, &secret_key()).is_err());
    assert!(api.get(CONFIGMAPS, &configmap_key()).is_err());
}

/// JobSet mode: the shipped OpenMPI sample JobSet, with the shipped RBAC and
/// OwnerReferencesPermissionEnforcement on, gets its Secret and hostfile owned by the JobSet.
#[tokio::test]
async fn a_jobset_mode_jobset_gets_its_objects_owned_by_the_jobset() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/samples/jobset-pi-openmpi.yaml"
    );
    let text = std::fs::read_to_string(path).expect("sample JobSet");
    let jobset = mpi_webhook::objects::dir::parse_documents(&text, false)
        .expect("sample parses")
        .remove(0);
    let created = api
        .create(JOBSETS, None, jobset, "kubectl")
        .expect("JobSet");
    let owner = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                       "name": "pi-jobset-openmpi", "uid": created["metadata"]["uid"],
                       "controller": true, "blockOwnerDeletion": true});
    let (secret, configmap): (Key, Key) = (
        ("default".into(), "pi-jobset-openmpi-mpi-ssh-auth".into()),
        ("default".into(), "pi-jobset-openmpi-mpi-hostfile".into()),
    );
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the JobSet's Secret and ConfigMap", || {
            api.get(SECRETS, &secret).is_ok() && api.get(CONFIGMAPS, &configmap).is_ok()
        })
        .await;
    for (kind, key) in [(SECRETS, &secret), (CONFIGMAPS, &configmap)] {
        let object = api.get(kind, key).expect("object");
        assert_eq!(object["metadata"]["ownerReferences"], json!([owner]));
    }
    let hostfile = api.get(CONFIGMAPS, &configmap).expect("ConfigMap");
    assert_eq!(
        hostfile["data"]["hostfile"],
        "pi-jobset-openmpi-node-0-0.pi-jobset-openmpi slots=1\n\
         pi-jobset-openmpi-node-0-1.pi-jobset-openmpi slots=1\n"
    );
    assert_eq!(api.stats().unexpected, Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// The NetworkPolicy

fn policy_key() -> Key {
    ("team".into(), "pi-mpi".into())
}

/// The spec of the NetworkPolicy of the job whose JobSet is named `jobset`.
fn policy_spec(jobset: &str) -> Value {
    json!({"podSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": jobset}},
           "policyTypes": ["Ingress"],
           "ingress": [{"from": [{"podSelector": {
               "matchLabels": {"jobset.sigs.k8s.io/jobset-name": jobset}}}]}]})
}

#[tokio::test]
async fn with_the_default_on_the_network_policy_appears_owned_repaired_and_goes_with_its_owner() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let mut reconciler = Reconciler::start_with(&cluster, &["--network-policy-default"]);
    reconciler
        .wait_for("the NetworkPolicy, the Secret and the ConfigMap", || {
            api.get(NETWORK_POLICIES, &policy_key()).is_ok()
                && api.get(SECRETS, &secret_key()).is_ok()
                && ours_applied(api)
        })
        .await;
    let policy = api.get(NETWORK_POLICIES, &policy_key()).expect("policy");
    assert_eq!(policy["spec"], policy_spec("pi"));
    assert_eq!(policy["metadata"]["ownerReferences"], json!([owner()]));
    assert_eq!(
        policy["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "mpi-webhook"})
    );
    assert_eq!(managers(&policy), ["mpi-webhook"]);

    // Somebody opens it to every pod: taken back.
    api.merge_patch(
        NETWORK_POLICIES,
        policy_key(),
        &json!({"spec": {"ingress": [{}]}}),
        "kubectl-edit",
    )
    .expect("edit");
    reconciler
        .wait_for("the edit repaired", || {
            api.get(NETWORK_POLICIES, &policy_key())
                .is_ok_and(|p| p["spec"] == policy_spec("pi"))
        })
        .await;

    // The TrainJob goes: the garbage collector takes its three objects with it.
    let mut collected = api
        .delete(TRAINJOBS, &("team".into(), "pi".into()))
        .expect("TrainJob deleted");
    collected.sort();
    assert_eq!(
        collected,
        [
            ("configmaps", configmap_key()),
            ("networkpolicies", policy_key()),
            ("secrets", secret_key()),
        ]
    );
    assert_eq!(api.count(NETWORK_POLICIES), 0);
    assert_eq!(api.stats().unexpected, Vec::<String>::new());
}

#[tokio::test]
async fn with_the_default_off_no_network_policy_is_made() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the Secret and the ConfigMap", || {
            api.get(SECRETS, &secret_key()).is_ok() && ours_applied(api)
        })
        .await;
    resync(api, &mut reconciler, 1).await;
    assert_eq!(api.count(NETWORK_POLICIES), 0);
    assert_eq!(api.stats().count("apply", "networkpolicies"), 0);
}

/// JobSet mode: the annotation asks for the policy without the flag; it is owned by the
/// JobSet and goes with it.
#[tokio::test]
async fn a_jobset_mode_jobset_asking_for_a_network_policy_gets_one_owned_by_it() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/samples/jobset-pi-openmpi.yaml"
    );
    let text = std::fs::read_to_string(path).expect("sample JobSet");
    let mut jobset = mpi_webhook::objects::dir::parse_documents(&text, false)
        .expect("sample parses")
        .remove(0);
    jobset["metadata"]["annotations"]["mpi-webhook.io/network-policy"] = json!("true");
    let created = api
        .create(JOBSETS, None, jobset, "kubectl")
        .expect("JobSet");
    let owner = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                       "name": "pi-jobset-openmpi", "uid": created["metadata"]["uid"],
                       "controller": true, "blockOwnerDeletion": true});
    let key: Key = ("default".into(), "pi-jobset-openmpi-mpi".into());
    let mut reconciler = Reconciler::start(&cluster);
    reconciler
        .wait_for("the JobSet's NetworkPolicy", || {
            api.get(NETWORK_POLICIES, &key).is_ok()
        })
        .await;
    let policy = api.get(NETWORK_POLICIES, &key).expect("policy");
    assert_eq!(policy["spec"], policy_spec("pi-jobset-openmpi"));
    assert_eq!(policy["metadata"]["ownerReferences"], json!([owner]));
    reconciler
        .wait_for("the JobSet's ConfigMap", || {
            api.get(
                CONFIGMAPS,
                &("default".into(), "pi-jobset-openmpi-mpi-hostfile".into()),
            )
            .is_ok()
        })
        .await;
    let collected = api
        .delete(JOBSETS, &("default".into(), "pi-jobset-openmpi".into()))
        .expect("JobSet deleted");
    assert!(
        collected.contains(&("networkpolicies", key.clone())),
        "{collected:?}"
    );
    assert!(api.get(NETWORK_POLICIES, &key).is_err());
    assert_eq!(api.stats().unexpected, Vec::<String>::new());
}

/// The Lease's holder, if the Lease exists and has one.
fn lease_holder(api: &FakeApi) -> Option<String> {
    api.get(LEASES, &(LEASE_NAMESPACE.into(), LEASE.into()))
        .ok()
        .and_then(|lease| str_at(&lease, "/spec/holderIdentity").map(String::from))
}

/// A MicroTime of the Lease (`2026-01-01T00:00:00.123456Z`).
fn lease_time(lease: &Value, field: &str) -> std::time::SystemTime {
    let text = str_at(lease, &format!("/spec/{field}"))
        .unwrap_or_else(|| panic!("spec.{field} in {lease}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("spec.{field} {text:?}: {e}"))
}

/// On SIGTERM the leading `--leader-elect` replica stops its controller, releases the Lease
/// (holderIdentity cleared, as client-go's ReleaseOnCancel does) and exits 0; the standby takes
/// the Lease at its next recheck and writes (here: repairs an edit made while nobody led),
/// without waiting for the released term to expire.
#[tokio::test]
async fn a_leader_that_gets_sigterm_releases_the_lease_and_the_standby_takes_over() {
    let cluster = cluster(Authorizer::shipped()).await;
    let api = &cluster.api;
    let mut leader = Reconciler::start_leader(&cluster, "replica-a");
    leader
        .wait_for("replica-a to hold the Lease", || {
            lease_holder(api).as_deref() == Some("replica-a")
        })
        .await;
    leader
        .wait_for("replica-a's ConfigMap", || ours_applied(api))
        .await;
    let mut standby = Reconciler::start_leader(&cluster, "replica-b");
    let standby_log = standby.log.clone();
    standby
        .wait_for("replica-b to run as a standby", || {
            std::fs::read_to_string(&standby_log)
                .is_ok_and(|log| log.contains("leader election on"))
        })
        .await;
    assert_eq!(lease_holder(api).as_deref(), Some("replica-a"));
    // When replica-a's term would end at the latest, had it not released the Lease (a renewal
    // after this read only moves that later).
    let term = api
        .get(LEASES, &(LEASE_NAMESPACE.into(), LEASE.into()))
        .expect("the Lease");
    let term_end = lease_time(&term, "renewTime") + Duration::from_secs(LEASE_DURATION_SECS);

    leader.terminate();
    let sigterm = Instant::now();
    let status = leader.exited().await;
    assert!(
        status.success(),
        "exit status {status}\n{}",
        leader.log_tail()
    );
    let log = leader.log_text();
    let released = log
        .find("released the Lease")
        .expect("released, in the log");
    assert!(
        log.find("shutting down").is_some_and(|at| at < released),
        "the controller stopped before the release\n{log}"
    );
    assert_ne!(
        lease_holder(api).as_deref(),
        Some("replica-a"),
        "the leader released its Lease before exiting"
    );
    // Something to write for whoever leads next.
    api.merge_patch(
        CONFIGMAPS,
        configmap_key(),
        &json!({"data": {"hostfile": "edited\n"}}),
        "kubectl-edit",
    )
    .expect("edit");

    standby
        .wait_for("replica-b to take the Lease and repair the edit", || {
            lease_holder(api).as_deref() == Some("replica-b")
                && api
                    .get(CONFIGMAPS, &configmap_key())
                    .is_ok_and(|c| c["data"]["hostfile"] == HOSTFILE)
        })
        .await;
    // A generous bound for a loaded machine: the standby rechecks every 2 s, so it writes within
    // a few seconds; waiting for the released term to expire could take the whole Lease duration.
    let took = sigterm.elapsed();
    assert!(
        took < Duration::from_secs(LEASE_DURATION_SECS),
        "the standby wrote {took:?} after the leader's SIGTERM\n{}",
        standby.log_tail()
    );
    assert!(standby.log_text().contains("is_leader=true"));
    // The standby did not wait for the released term to run out (it ends 5 to 15 s after any
    // moment, since the holder renews 5 s before expiry).
    let taken = api
        .get(LEASES, &(LEASE_NAMESPACE.into(), LEASE.into()))
        .expect("the Lease");
    let acquired = lease_time(&taken, "acquireTime");
    assert!(
        acquired < term_end,
        "replica-b acquired the Lease at {acquired:?}, after replica-a's term would have ended \
         ({term_end:?})"
    );
    assert_eq!(configmap_applies(api).1, 1, "one forced apply: the repair");
    assert_eq!(api.stats().unexpected, Vec::<String>::new());
}
