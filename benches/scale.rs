//! Scale benchmark of `mpi-webhook reconcile` and `serve` on a real control plane (etcd and
//! kube-apiserver from `KUBEBUILDER_ASSETS`).
//!
//! `cargo bench --bench scale` builds the release binary, then for each case (TrainJobs, and
//! JobSet-mode JobSets; 1,000 and 10,000 of each), on a fresh control plane on 127.0.0.1:
//! 1. installs the CRDs (TrainJob, the two runtimes, JobSet) and the deepspeed
//!    ClusterTrainingRuntime, and creates the N owners (from `manifests/samples/`, numNodes 2 to
//!    8, spread over 10 namespaces);
//! 2. starts `mpi-webhook serve` in cluster mode (a kubeconfig, the shipped flags) and waits for
//!    its caches (its log says `object caches synced`);
//! 3. opens its own watches of the labelled Secrets and ConfigMaps (metadata only), which tell
//!    when every owner has both;
//! 4. starts `mpi-webhook reconcile --leader-elect` (the shipped flags) and times, from its
//!    spawn, until every owner's Secret and ConfigMap exist, then waits until it is quiet (no
//!    reconcile finished for 2 s), and stops it;
//! 5. measures the **floor**: N of the reconciler's own Secrets and ConfigMaps (the library's
//!    builders: the same label, owner reference, field manager and sizes; owners that do not
//!    exist) created by the bench itself, a Secret then a ConfigMap per job, 8 jobs at a time
//!    (the reconciler's concurrency), in namespaces of their own, with the bench's watches still
//!    open, so that what they cost is in both measurements; then the **apply floor**: the same,
//!    with each ConfigMap server-side applied instead of created, as the contract makes the
//!    reconciler write it (interface.md "Reconciler"), which costs the API server more than a
//!    create;
//! 6. restarts `reconcile` (a new leadership term over owners that all have their objects, as
//!    after a failover), waits until every owner was reconciled and it is quiet, and counts what
//!    that term costs: its Secret creates (and how many were answered 409 AlreadyExists), the
//!    key pairs it generated, its CPU time and kube-apiserver's;
//! 7. prints the time beside both floors, the API server's CPU time in each, the writes per job (the apiserver's own
//!    `apiserver_request_total` of POST, PUT, PATCH, APPLY (server-side apply) and DELETE on Secrets, ConfigMaps, Events and
//!    NetworkPolicies during step 4; Lease renewals are left out), the peak RSS (`VmHWM`) of
//!    both processes, and the watches each one opened (the apiserver's own
//!    `apiserver_longrunning_requests{verb="WATCH"}`, by resource, read before and after it
//!    started), and, for the first run and the restart, the Secret creates (POSTs, and of them
//!    409s) and the key pairs generated (`mpi_webhook_ssh_keys_generated_total`; a reconciler
//!    without that metric made one per create).
//!
//! Every process it starts is stopped at the end of its case, on failure too (a guard kills it);
//! every wait is bounded (`SCALE_TIMEOUT_S`, default 300 s, for each step). Without
//! `KUBEBUILDER_ASSETS` (a directory with `etcd` and `kube-apiserver`) it prints that it skipped
//! and how to get them; without `--bench` (as `cargo test --benches` runs it) it does nothing:
//! benchmarks are never timed tests.
//!
//! Knobs (environment): `SCALE_JOBS` (default `1000,10000`), `SCALE_KINDS` (default
//! `trainjobs,jobsets`), `SCALE_LOG_DIR` (keeps the processes' logs there), `RUST_LOG` (reaches
//! both processes), `SCALE_RECONCILE_WRAPPER` (a command `reconcile` runs under, e.g.
//! `heaptrack -o /tmp/reconcile` for a heap profile; the RSS column is then the wrapper's).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use mpi_webhook::api::{JOBSET_API_VERSION, TRAINER_API_VERSION};
use mpi_webhook::mpi::ssh_secret::{generate_key_pair, ssh_secret};
use mpi_webhook::mpi::{HOSTFILE_NAME, MANAGER, Owner, hostfile_configmap_name, owned_metadata};
use mpi_webhook::objects::dir::parse_documents;
use serde_json::{Value, json};
use tokio::net::TcpStream;

#[path = "../tests/envtest/control_plane.rs"]
mod control_plane;
#[path = "../tests/support/prerequisites.rs"]
mod prerequisites;
#[path = "support/procfs.rs"]
mod procfs;
#[path = "../tests/support/prometheus.rs"]
mod prometheus;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The reconciler's concurrency (`CONCURRENCY` in `src/reconciler/run.rs`), used by the floor.
const FLOOR_CONCURRENCY: usize = 8;
/// Owners created at once while seeding (not timed against anything).
const SEED_CONCURRENCY: usize = 16;
const NAMESPACES: usize = 10;
const MANAGED: &str = "app.kubernetes.io/managed-by=mpi-webhook";
/// The reconciler counts as done once no reconcile finished for this long.
const QUIET: Duration = Duration::from_secs(2);
/// The resources whose writes are counted.
const WRITTEN: [&str; 4] = ["secrets", "configmaps", "events", "networkpolicies"];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    TrainJobs,
    JobSets,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::TrainJobs => "TrainJobs",
            Kind::JobSets => "JobSet-mode JobSets",
        }
    }
}

struct Settings {
    cases: Vec<(Kind, usize)>,
    timeout: Duration,
    logs: Option<PathBuf>,
    /// `SCALE_RECONCILE_WRAPPER`: a command `reconcile` runs under (a profiler); its peak RSS is
    /// then the wrapper's.
    reconcile_wrapper: Vec<String>,
}

fn main() -> Result<(), AnyError> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    match control_plane::assets() {
        Ok(control_plane::Assets::Found(_)) => {}
        Ok(control_plane::Assets::Absent) => {
            println!(
                "scale: skipped: no envtest assets; {}",
                control_plane::ASSETS_HINT
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let jobs: Vec<usize> = env("SCALE_JOBS", "1000,10000")
        .split(',')
        .map(|n| n.trim().replace('_', "").parse())
        .collect::<Result<_, _>>()?;
    let mut cases = Vec::new();
    for kind in env("SCALE_KINDS", "trainjobs,jobsets").split(',') {
        let kind = match kind.trim() {
            "trainjobs" => Kind::TrainJobs,
            "jobsets" => Kind::JobSets,
            other => return Err(format!("SCALE_KINDS: unknown {other:?}").into()),
        };
        cases.extend(jobs.iter().map(|&n| (kind, n)));
    }
    let settings = Settings {
        cases,
        timeout: Duration::from_secs(env("SCALE_TIMEOUT_S", "300").parse()?),
        logs: std::env::var_os("SCALE_LOG_DIR").map(PathBuf::from),
        reconcile_wrapper: env("SCALE_RECONCILE_WRAPPER", "")
            .split_whitespace()
            .map(String::from)
            .collect(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    for &(kind, jobs) in &settings.cases {
        println!("scale: {jobs} {} ...", kind.label());
        let result = runtime.block_on(run_case(&settings, kind, jobs))?;
        result.print();
        results.push(result);
    }
    println!("\n{}", table(&results));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Processes

fn free_port() -> Result<u16, AnyError> {
    Ok(control_plane::free_port()?)
}

/// A child process that is killed when dropped (a failed or finished case leaves none behind).
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command, dir: &Path) -> Result<Self, AnyError> {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Self { name, child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak RSS in MiB.
    fn peak_mib(&self) -> Result<f64, AnyError> {
        Ok(procfs::status_kib(self.pid(), "VmHWM")? as f64 / 1024.0)
    }

    fn ensure_running(&mut self) -> Result<(), AnyError> {
        match self.child.try_wait()? {
            Some(status) => Err(self.failure(&format!("{} exited: {status}", self.name))),
            None => Ok(()),
        }
    }

    /// An error naming `what`, with the end of the process's log.
    fn failure(&self, what: &str) -> AnyError {
        let tail = control_plane::log_tail(&self.log, 20);
        format!("{what}\n--- end of {}'s log ---\n{tail}", self.name).into()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The envtest harness's control plane (its processes stop with it), with what the bench adds:
/// an admin kubeconfig file for the spawned processes and kube-apiserver's pid for its CPU time.
struct ControlPlane {
    /// Kept for its processes: dropping it stops them.
    _inner: control_plane::ControlPlane,
    kubeconfig: PathBuf,
    client: Client,
    apiserver_pid: u32,
}

impl ControlPlane {
    async fn start(dir: &Path) -> Result<Self, AnyError> {
        let inner = control_plane::ControlPlane::start(control_plane::Options::default())
            .await?
            .ok_or("no envtest assets")?;
        let kubeconfig = inner.write_kubeconfig(&dir.join("kubeconfig"), control_plane::ADMIN)?;
        let client = inner.admin();
        let apiserver_pid = apiserver_pid(inner.port())?;
        inner.apply_crds(&control_plane::CRDS).await;
        Ok(Self {
            _inner: inner,
            kubeconfig,
            client,
            apiserver_pid,
        })
    }

    /// The apiserver's count of writes (POST, PUT, PATCH, DELETE) per resource in [`WRITTEN`].
    async fn writes(&self) -> Result<[u64; 4], AnyError> {
        let text = apiserver_metrics(&self.client).await?;
        let mut counts = [0; 4];
        for (labels, value) in samples(&text, "apiserver_request_total") {
            let write = matches!(
                label(labels, "verb"),
                Some("POST" | "PUT" | "PATCH" | "APPLY" | "DELETE")
            );
            let index = WRITTEN
                .iter()
                .position(|r| Some(*r) == label(labels, "resource"));
            if let (true, Some(index)) = (write, index) {
                counts[index] += value.parse::<f64>()? as u64;
            }
        }
        Ok(counts)
    }
}

/// Secret creates so far, and of them those answered 409 (AlreadyExists).
#[derive(Clone, Copy, Default)]
struct SecretCreates {
    posts: u64,
    conflicts: u64,
}

impl std::ops::Sub for SecretCreates {
    type Output = Self;
    fn sub(self, before: Self) -> Self {
        Self {
            posts: self.posts - before.posts,
            conflicts: self.conflicts - before.conflicts,
        }
    }
}

impl ControlPlane {
    /// The apiserver's count of POSTs on Secrets, and of those answered 409.
    async fn secret_creates(&self) -> Result<SecretCreates, AnyError> {
        let text = apiserver_metrics(&self.client).await?;
        let mut creates = SecretCreates::default();
        for (labels, value) in samples(&text, "apiserver_request_total") {
            if label(labels, "verb") == Some("POST") && label(labels, "resource") == Some("secrets")
            {
                let n = value.parse::<f64>()? as u64;
                creates.posts += n;
                if label(labels, "code") == Some("409") {
                    creates.conflicts += n;
                }
            }
        }
        Ok(creates)
    }
}

/// Key pairs the reconciler generated, from its own metrics; `None` for a reconciler without
/// the metric (it made one per Secret create).
fn keys_generated(metrics: &str) -> Option<u64> {
    metrics
        .contains("mpi_webhook_ssh_keys_generated_total")
        .then(|| prometheus::sum(metrics, "mpi_webhook_ssh_keys_generated_total"))
}

/// The apiserver's own `/metrics` text.
async fn apiserver_metrics(client: &Client) -> Result<String, AnyError> {
    Ok(client
        .request_text(Request::get("/metrics").body(Vec::new())?)
        .await?)
}

/// Each sample of the metric family `name` in `text`: its labels (read with [`label`]) and
/// its value.
fn samples<'t>(text: &'t str, name: &str) -> impl Iterator<Item = (&'t str, &'t str)> {
    let prefix = format!("{name}{{");
    text.lines().filter_map(move |line| {
        let labels = line.strip_prefix(prefix.as_str())?;
        Some((labels, line.rsplit(' ').next()?))
    })
}

/// The value of the label `key` in a sample's `labels`.
fn label<'l>(labels: &'l str, key: &str) -> Option<&'l str> {
    labels
        .split(&format!("{key}=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
}

/// Watches open on the apiserver, by resource: its own gauge
/// `apiserver_longrunning_requests{verb="WATCH"}`, which counts every watch request it is
/// serving (its own loopback informers' too: compare two readings).
async fn open_watches(client: &Client) -> Result<BTreeMap<String, i64>, AnyError> {
    let text = apiserver_metrics(client).await?;
    let mut watches = BTreeMap::new();
    for (labels, value) in samples(&text, "apiserver_longrunning_requests") {
        if label(labels, "verb") != Some("WATCH") {
            continue;
        }
        let resource = label(labels, "resource").unwrap_or_default().to_string();
        *watches.entry(resource).or_insert(0) += value.parse::<f64>()? as i64;
    }
    Ok(watches)
}

/// The watches opened between two readings of [`open_watches`], by resource.
fn opened(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> Watches {
    Watches(
        after
            .iter()
            .map(|(resource, n)| (resource.clone(), n - before.get(resource).unwrap_or(&0)))
            .filter(|(_, n)| *n != 0)
            .collect(),
    )
}

/// Watches one process opened, by resource.
#[derive(Default)]
struct Watches(BTreeMap<String, i64>);

impl Watches {
    fn total(&self) -> i64 {
        self.0.values().sum()
    }
}

impl std::fmt::Display for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let each: Vec<String> = self.0.iter().map(|(r, n)| format!("{r} {n}")).collect();
        write!(f, "{} ({})", self.total(), each.join(", "))
    }
}

/// The pid of the kube-apiserver serving on `port` (the harness runs it under a watchdog shell).
fn apiserver_pid(port: u16) -> Result<u32, AnyError> {
    let flag = format!("--secure-port={port}");
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
        if args.next().is_some_and(|a| a.ends_with("kube-apiserver")) && args.any(|a| a == flag) {
            return Ok(pid);
        }
    }
    Err(format!("no kube-apiserver with {flag}").into())
}

/// `GET /metrics` of one of our processes (plain HTTP).
async fn scrape(port: u16) -> Result<String, AnyError> {
    let path = "/metrics";
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let exchange = async {
        let tcp = TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(connection);
        let request = Request::get(path)
            .header(HOST, addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        if response.status() != StatusCode::OK {
            return Err(format!("{path}: HTTP {}", response.status()).into());
        }
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, AnyError>(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| format!("{path} timed out"))?
}

// ---------------------------------------------------------------------------------------------
// Seeding

fn yaml_documents(path: &str) -> Result<Vec<Value>, AnyError> {
    let path = Path::new(ROOT).join(path);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(parse_documents(&text, false).map_err(|e| format!("{}: {e}", path.display()))?)
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn create_namespaces(client: &Client, prefix: &str) -> Result<Vec<String>, AnyError> {
    let api = Api::<Namespace>::all(client.clone());
    let mut names = Vec::new();
    for i in 0..NAMESPACES {
        let name = format!("{prefix}-{i:02}");
        let namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &namespace).await?;
        names.push(name);
    }
    Ok(names)
}

/// The runtime, then `jobs` owners made from the first sample of `kind`, numNodes (or the
/// node job's parallelism) 2 to 8, spread over the namespaces. Returns their `namespace/name`s.
async fn seed(
    client: &Client,
    kind: Kind,
    jobs: usize,
    namespaces: &[String],
) -> Result<HashSet<String>, AnyError> {
    let runtime = yaml_documents("manifests/runtimes/deepspeed_distributed.yaml")?
        .into_iter()
        .next()
        .ok_or("no runtime")?;
    let runtimes = resource(
        "trainer.kubeflow.org",
        "v1alpha1",
        "ClusterTrainingRuntime",
        "clustertrainingruntimes",
    );
    Api::<DynamicObject>::all_with(client.clone(), &runtimes)
        .create(&PostParams::default(), &serde_json::from_value(runtime)?)
        .await?;
    let (sample, api_resource) = match kind {
        Kind::TrainJobs => (
            "manifests/samples/trainjob-pi-deepspeed.yaml",
            resource("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs"),
        ),
        Kind::JobSets => (
            "manifests/samples/jobset-pi-openmpi.yaml",
            resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
        ),
    };
    let mut template = yaml_documents(sample)?
        .into_iter()
        .next()
        .ok_or("no sample")?;
    if let Some(metadata) = template["metadata"].as_object_mut() {
        metadata.remove("uid");
    }
    let owners = (0..jobs).map(|i| {
        let mut owner = template.clone();
        let namespace = &namespaces[i % namespaces.len()];
        owner["metadata"]["name"] = json!(format!("job-{i:05}"));
        owner["metadata"]["namespace"] = json!(namespace);
        let nodes = 2 + (i % 7);
        match kind {
            Kind::TrainJobs => owner["spec"]["trainer"]["numNodes"] = json!(nodes),
            Kind::JobSets => {
                let node = &mut owner["spec"]["replicatedJobs"][0]["template"]["spec"];
                node["parallelism"] = json!(nodes);
                node["completions"] = json!(nodes);
            }
        }
        (namespace.clone(), owner)
    });
    let created = futures::stream::iter(owners)
        .map(|(namespace, owner)| {
            let api =
                Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &api_resource);
            async move {
                let object: DynamicObject = serde_json::from_value(owner)?;
                let created = api.create(&PostParams::default(), &object).await?;
                Ok::<_, AnyError>(format!(
                    "{namespace}/{}",
                    created.metadata.name.unwrap_or_default()
                ))
            }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(created)
}

/// How the floor writes each job's ConfigMap.
#[derive(Clone, Copy)]
enum FloorWrite {
    /// A plain create: the API server's write throughput (issue 37's floor).
    Create,
    /// A server-side apply, as the reconciler must (interface.md "Reconciler"): what the
    /// contract costs before the reconciler does anything of its own.
    Apply,
}

impl FloorWrite {
    /// Its name in namespaces and messages.
    fn name(self) -> &'static str {
        match self {
            FloorWrite::Create => "floor",
            FloorWrite::Apply => "floor-apply",
        }
    }
}

/// One floor's figures.
#[derive(Clone, Copy)]
struct Floor {
    time: Duration,
    /// kube-apiserver's CPU time meanwhile.
    apiserver_cpu: Duration,
}

/// Runs [`write_floor`] within the step timeout and reads kube-apiserver's (`apiserver_pid`)
/// CPU time around it.
async fn measure_floor(
    client: &Client,
    apiserver_pid: u32,
    kind: Kind,
    jobs: usize,
    write: FloorWrite,
    settings: &Settings,
) -> Result<Floor, AnyError> {
    let cpu_before = procfs::cpu_time(apiserver_pid)?;
    let time = tokio::time::timeout(settings.timeout, write_floor(client, kind, jobs, write))
        .await
        .map_err(|_| format!("the {} timed out", write.name()))??;
    let apiserver_cpu = procfs::cpu_time(apiserver_pid)? - cpu_before;
    Ok(Floor {
        time,
        apiserver_cpu,
    })
}

/// The floor: per job, the reconciler's own Secret and then its ConfigMap (built by the same
/// library functions, with one key pair made beforehand: the same label, owner reference, field
/// manager and sizes), owned by a `kind` owner that does not exist, [`FLOOR_CONCURRENCY`] jobs
/// at a time, no reads; the ConfigMap written as `write` says, in namespaces of its own.
async fn write_floor(
    client: &Client,
    kind: Kind,
    jobs: usize,
    write: FloorWrite,
) -> Result<Duration, AnyError> {
    let namespaces = create_namespaces(client, write.name()).await?;
    let keys = generate_key_pair()?;
    let (api_version, owner_kind) = match kind {
        Kind::TrainJobs => (TRAINER_API_VERSION, "TrainJob"),
        Kind::JobSets => (JOBSET_API_VERSION, "JobSet"),
    };
    let started = Instant::now();
    futures::stream::iter(0..jobs)
        .map(|i| {
            let namespace = &namespaces[i % namespaces.len()];
            let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
            let configmaps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            let owner = Owner {
                api_version,
                kind: owner_kind,
                name: format!("job-{i:05}"),
                namespace: namespace.clone(),
                uid: format!("00000000-0000-0000-0000-{i:012}"),
            };
            let hosts: String = (0..2 + i % 7)
                .map(|n| format!("job-{i:05}-node-0-{n}.job-{i:05} slots=1\n"))
                .collect();
            let secret = ssh_secret(owner.clone(), &keys);
            let configmap = ConfigMap {
                metadata: owned_metadata(&owner, hostfile_configmap_name(&owner.name)),
                data: Some(BTreeMap::from([(HOSTFILE_NAME.to_string(), hosts)])),
                ..ConfigMap::default()
            };
            async move {
                let params = PostParams {
                    field_manager: Some(MANAGER.to_string()),
                    ..PostParams::default()
                };
                secrets.create(&params, &secret).await?;
                match write {
                    FloorWrite::Create => drop(configmaps.create(&params, &configmap).await?),
                    FloorWrite::Apply => {
                        let name = configmap.metadata.name.clone().unwrap_or_default();
                        let apply = PatchParams::apply(MANAGER);
                        configmaps
                            .patch(&name, &apply, &Patch::Apply(&configmap))
                            .await?;
                    }
                }
                Ok::<_, AnyError>(())
            }
        })
        .buffer_unordered(FLOOR_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

// ---------------------------------------------------------------------------------------------
// One case

struct CaseResult {
    kind: Kind,
    jobs: usize,
    seed: Duration,
    all_objects: Duration,
    floor: Floor,
    /// The floor with the ConfigMaps server-side applied ([`FloorWrite::Apply`]).
    apply_floor: Floor,
    writes: [u64; 4],
    reconcile_mib: f64,
    /// The reconciler's CPU time (user and system) until it was quiet.
    reconcile_cpu: Duration,
    /// kube-apiserver's CPU time over the same span.
    apiserver_cpu: Duration,
    serve_ready_mib: f64,
    serve_mib: f64,
    /// Watches `serve` opened (once its caches synced).
    serve_watches: Watches,
    /// Watches `reconcile` opened (once it was quiet).
    reconcile_watches: Watches,
    /// The first run's Secret creates.
    secret_creates: SecretCreates,
    /// The first run's key pairs (`None`: one per create).
    keys: Option<u64>,
    /// The second run, over owners that have all their objects.
    restart: Restart,
    load: String,
}

/// What a new term over owners that have all their objects costs.
struct Restart {
    /// From its spawn until its last reconcile before it was quiet.
    time: Duration,
    secret_creates: SecretCreates,
    keys: Option<u64>,
    reconcile_cpu: Duration,
    apiserver_cpu: Duration,
}

fn keys_text(keys: Option<u64>, creates: SecretCreates) -> String {
    match keys {
        Some(keys) => keys.to_string(),
        None => format!("{} (one per create)", creates.posts),
    }
}

impl CaseResult {
    fn writes_per_job(&self) -> f64 {
        self.writes.iter().sum::<u64>() as f64 / self.jobs as f64
    }

    fn print(&self) {
        let per_job: Vec<String> = WRITTEN
            .iter()
            .zip(self.writes)
            .map(|(r, w)| format!("{r} {:.2}", w as f64 / self.jobs as f64))
            .collect();
        println!(
            "  seeded in {:.1} s; all objects {:.1} s after reconcile started; floor {:.1} s \
             ({:.2}x), applying the ConfigMaps {:.1} s ({:.2}x); writes per job {:.2} ({}); peak RSS reconcile {:.1} MiB, serve {:.1} MiB \
             ({:.1} MiB when its caches were synced); CPU reconcile {:.1} s, kube-apiserver {:.1} s \
             ({:.1} s in the floor, {:.1} s in the apply floor); watches open: serve {}, reconcile {}; \
             Secret creates {} ({} answered 409), key pairs {}; restarted: quiet after {:.1} s, \
             Secret creates {} ({} answered 409), key pairs {}, CPU reconcile {:.1} s, \
             kube-apiserver {:.1} s; load average after: {}",
            self.seed.as_secs_f64(),
            self.all_objects.as_secs_f64(),
            self.floor.time.as_secs_f64(),
            self.all_objects.as_secs_f64() / self.floor.time.as_secs_f64(),
            self.apply_floor.time.as_secs_f64(),
            self.all_objects.as_secs_f64() / self.apply_floor.time.as_secs_f64(),
            self.writes_per_job(),
            per_job.join(", "),
            self.reconcile_mib,
            self.serve_mib,
            self.serve_ready_mib,
            self.reconcile_cpu.as_secs_f64(),
            self.apiserver_cpu.as_secs_f64(),
            self.floor.apiserver_cpu.as_secs_f64(),
            self.apply_floor.apiserver_cpu.as_secs_f64(),
            self.serve_watches,
            self.reconcile_watches,
            self.secret_creates.posts,
            self.secret_creates.conflicts,
            keys_text(self.keys, self.secret_creates),
            self.restart.time.as_secs_f64(),
            self.restart.secret_creates.posts,
            self.restart.secret_creates.conflicts,
            keys_text(self.restart.keys, self.restart.secret_creates),
            self.restart.reconcile_cpu.as_secs_f64(),
            self.restart.apiserver_cpu.as_secs_f64(),
            self.load,
        );
    }
}

fn table(results: &[CaseResult]) -> String {
    let mut out = String::from(
        "| owners | all objects | floor | ratio | apply floor | ratio | writes per job | reconcile peak RSS | serve peak RSS | watches serve / reconcile |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        out.push_str(&format!(
            "| {} {} | {:.1} s | {:.1} s | {:.2} | {:.1} s | {:.2} | {:.2} | {:.1} MiB | {:.1} MiB | {} / {} |\n",
            r.jobs,
            r.kind.label(),
            r.all_objects.as_secs_f64(),
            r.floor.time.as_secs_f64(),
            r.all_objects.as_secs_f64() / r.floor.time.as_secs_f64(),
            r.apply_floor.time.as_secs_f64(),
            r.all_objects.as_secs_f64() / r.apply_floor.time.as_secs_f64(),
            r.writes_per_job(),
            r.reconcile_mib,
            r.serve_mib,
            r.serve_watches.total(),
            r.reconcile_watches.total(),
        ));
    }
    out.push_str(
        "\n| owners | run | Secret creates | of them 409 | key pairs | CPU reconcile / apiserver |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for r in results {
        out.push_str(&format!(
            "| {} {} | first | {} | {} | {} | {:.1} s / {:.1} s |\n",
            r.jobs,
            r.kind.label(),
            r.secret_creates.posts,
            r.secret_creates.conflicts,
            keys_text(r.keys, r.secret_creates),
            r.reconcile_cpu.as_secs_f64(),
            r.apiserver_cpu.as_secs_f64(),
        ));
        out.push_str(&format!(
            "| {} {} | restarted ({:.1} s) | {} | {} | {} | {:.1} s / {:.1} s |\n",
            r.jobs,
            r.kind.label(),
            r.restart.time.as_secs_f64(),
            r.restart.secret_creates.posts,
            r.restart.secret_creates.conflicts,
            keys_text(r.restart.keys, r.restart.secret_creates),
            r.restart.reconcile_cpu.as_secs_f64(),
            r.restart.apiserver_cpu.as_secs_f64(),
        ));
    }
    out
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Names (`namespace/name` of the owner) whose Secret and ConfigMap both exist, fed by watches.
#[derive(Default)]
struct Seen {
    secrets: HashSet<String>,
    configmaps: HashSet<String>,
}

fn watch_owned<K>(api: Api<K>, suffix: &'static str, seen: Arc<Mutex<Seen>>, secrets: bool)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let stream = watcher(api, watcher::Config::default().labels(MANAGED))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(object)) = stream.next().await {
            let meta = object.meta();
            let owner = meta
                .name
                .as_deref()
                .and_then(|n| n.strip_suffix(suffix))
                .unwrap_or_default();
            let key = format!("{}/{owner}", meta.namespace.as_deref().unwrap_or_default());
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            if secrets {
                seen.secrets.insert(key);
            } else {
                seen.configmaps.insert(key);
            }
        }
    });
}

async fn run_case(settings: &Settings, kind: Kind, jobs: usize) -> Result<CaseResult, AnyError> {
    let temp = tempfile::tempdir()?;
    let dir = match &settings.logs {
        Some(logs) => {
            let dir = logs.join(format!(
                "{}-{jobs}",
                if kind == Kind::TrainJobs {
                    "trainjobs"
                } else {
                    "jobsets"
                }
            ));
            std::fs::create_dir_all(&dir)?;
            dir
        }
        None => temp.path().to_path_buf(),
    };
    let plane = ControlPlane::start(&dir).await?;
    let client = plane.client.clone();
    let status = Command::new(BIN)
        .args(["certs", "--ip", "127.0.0.1", "--out"])
        .arg(dir.join("certs"))
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("mpi-webhook certs: {status}").into());
    }
    let namespaces = create_namespaces(&client, "team").await?;
    let started = Instant::now();
    let owners = tokio::time::timeout(settings.timeout, seed(&client, kind, jobs, &namespaces))
        .await
        .map_err(|_| "seeding timed out")??;
    let seed_time = started.elapsed();

    let no_process = open_watches(&client).await?;
    let serve_metrics = free_port()?;
    let certs = dir.join("certs");
    let mut serve = Process::spawn(
        "serve",
        Command::new(BIN)
            .arg("serve")
            .arg(format!("--listen=127.0.0.1:{}", free_port()?))
            .arg(format!(
                "--tls-cert-file={}",
                certs.join("tls.crt").display()
            ))
            .arg(format!(
                "--tls-key-file={}",
                certs.join("tls.key").display()
            ))
            .arg(format!("--metrics-listen=127.0.0.1:{serve_metrics}"))
            .args(["--shutdown-delay", "0s"])
            .env("KUBECONFIG", &plane.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST"),
        &dir,
    )?;
    let deadline = Instant::now() + settings.timeout;
    loop {
        serve.ensure_running()?;
        // `/readyz` is on the HTTPS listener; its log says the same in plain text.
        if std::fs::read_to_string(&serve.log).is_ok_and(|log| log.contains("object caches synced"))
        {
            break;
        }
        if Instant::now() > deadline {
            return Err(serve.failure("serve's caches never synced"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let serve_ready_mib = serve.peak_mib()?;
    // Each watch opens right after its list: give the last one a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let serve_watches = opened(&no_process, &open_watches(&client).await?);

    let before_bench = open_watches(&client).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    watch_owned(
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        "-mpi-ssh-auth",
        Arc::clone(&seen),
        true,
    );
    watch_owned(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        "-mpi-hostfile",
        Arc::clone(&seen),
        false,
    );
    let writes_before = plane.writes().await?;
    let creates_before = plane.secret_creates().await?;
    // The bench's own two watches are open before the reconciler's are counted.
    let bound = Instant::now() + settings.timeout;
    let before_reconcile = loop {
        let now = open_watches(&client).await?;
        if opened(&before_bench, &now).total() >= 2 {
            break now;
        }
        if Instant::now() > bound {
            return Err("the bench's own watches never opened".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let apiserver_cpu_before = procfs::cpu_time(plane.apiserver_pid)?;
    let reconcile_metrics = free_port()?;
    let started = Instant::now();
    let mut command = match settings.reconcile_wrapper.split_first() {
        Some((wrapper, args)) => {
            let mut command = Command::new(wrapper);
            command.args(args).arg(BIN);
            command
        }
        None => Command::new(BIN),
    };
    let mut reconcile = Process::spawn(
        "reconcile",
        command
            .args(["reconcile", "--leader-elect"])
            .arg(format!("--metrics-listen=127.0.0.1:{reconcile_metrics}"))
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("MPI_WEBHOOK_LEASE_NAMESPACE", "default")
            .env("MPI_WEBHOOK_LEASE_HOLDER", "bench")
            .env_remove("KUBERNETES_SERVICE_HOST"),
        &dir,
    )?;
    let deadline = started + settings.timeout;
    let all_objects = loop {
        reconcile.ensure_running()?;
        let done = {
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            owners
                .iter()
                .all(|o| seen.secrets.contains(o) && seen.configmaps.contains(o))
        };
        if done {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            return Err(reconcile.failure("not every owner got its Secret and ConfigMap in time"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Quiet: the reconciles its own objects' watch events trigger have finished too.
    let finished = |m: &str| prometheus::sum(m, "mpi_webhook_reconcile_duration_seconds_count");
    let mut last = (finished(&scrape(reconcile_metrics).await?), Instant::now());
    while last.1.elapsed() < QUIET {
        if Instant::now() > deadline + settings.timeout {
            return Err(reconcile.failure("the reconciler never became quiet"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = finished(&scrape(reconcile_metrics).await?);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let writes_after = plane.writes().await?;
    let secret_creates = plane.secret_creates().await? - creates_before;
    let keys = keys_generated(&scrape(reconcile_metrics).await?);
    let reconcile_watches = opened(&before_reconcile, &open_watches(&client).await?);
    let reconcile_cpu = procfs::cpu_time(reconcile.pid())?;
    let apiserver_cpu = procfs::cpu_time(plane.apiserver_pid)? - apiserver_cpu_before;
    let reconcile_mib = reconcile.peak_mib()?;
    drop(reconcile);
    let writes = std::array::from_fn(|i| writes_after[i] - writes_before[i]);
    let restart = restart(&plane, jobs, settings, &dir).await?;
    // The floors, once the reconciler stopped, with the bench's own watches still open: they
    // see the floors' objects (which carry the reconciler's label), so what they cost the API
    // server is in both the floors and the reconciler's time.
    let floor = measure_floor(
        &client,
        plane.apiserver_pid,
        kind,
        jobs,
        FloorWrite::Create,
        settings,
    )
    .await?;
    let apply_floor = measure_floor(
        &client,
        plane.apiserver_pid,
        kind,
        jobs,
        FloorWrite::Apply,
        settings,
    )
    .await?;

    let result = CaseResult {
        kind,
        jobs,
        seed: seed_time,
        all_objects,
        floor,
        apply_floor,
        writes,
        reconcile_mib,
        reconcile_cpu,
        apiserver_cpu,
        serve_ready_mib,
        serve_mib: serve.peak_mib()?,
        serve_watches,
        reconcile_watches,
        secret_creates,
        keys,
        restart,
        load: load_average(),
    };
    drop(serve);
    drop(plane);
    Ok(result)
}

/// Starts `reconcile` again over owners that all have their objects (a new leadership term, as
/// after a failover), waits until it reconciled every owner (`jobs` reconciles) and was quiet
/// for [`QUIET`], and reads what that cost.
async fn restart(
    plane: &ControlPlane,
    jobs: usize,
    settings: &Settings,
    dir: &Path,
) -> Result<Restart, AnyError> {
    let creates_before = plane.secret_creates().await?;
    let apiserver_cpu_before = procfs::cpu_time(plane.apiserver_pid)?;
    let port = free_port()?;
    let started = Instant::now();
    let mut reconcile = Process::spawn(
        "reconcile-restarted",
        Command::new(BIN)
            .args(["reconcile", "--leader-elect"])
            .arg(format!("--metrics-listen=127.0.0.1:{port}"))
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("MPI_WEBHOOK_LEASE_NAMESPACE", "default")
            .env("MPI_WEBHOOK_LEASE_HOLDER", "bench")
            .env_remove("KUBERNETES_SERVICE_HOST"),
        dir,
    )?;
    let deadline = started + settings.timeout;
    let finished = |m: &str| prometheus::sum(m, "mpi_webhook_reconcile_duration_seconds_count");
    let mut last: Option<(u64, Instant)> = None;
    let (metrics, quiet_since) = loop {
        reconcile.ensure_running()?;
        if Instant::now() > deadline {
            return Err(reconcile.failure("the restarted reconciler never became quiet"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Refused until its probe server listens.
        let Ok(metrics) = scrape(port).await else {
            continue;
        };
        let now = finished(&metrics);
        match last {
            Some((count, since)) if count == now => {
                if now as usize >= jobs && since.elapsed() >= QUIET {
                    break (metrics, since);
                }
            }
            _ => last = Some((now, Instant::now())),
        }
    };
    let time = quiet_since.duration_since(started);
    let secret_creates = plane.secret_creates().await? - creates_before;
    let reconcile_cpu = procfs::cpu_time(reconcile.pid())?;
    let apiserver_cpu = procfs::cpu_time(plane.apiserver_pid)? - apiserver_cpu_before;
    drop(reconcile);
    Ok(Restart {
        time,
        secret_creates,
        keys: keys_generated(&metrics),
        reconcile_cpu,
        apiserver_cpu,
    })
}
