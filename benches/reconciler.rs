//! Scale benchmark of `mpi-webhook reconcile` against an in-process fake API server.
//!
//! `cargo bench --bench reconciler` builds the release binary, then, all on 127.0.0.1:
//! 1. starts the fake Kubernetes API server of `tests/fake_apiserver/` (plain HTTP/1.1, objects
//!    in memory; what it models is in its module doc), with no RBAC and no admission: LIST, WATCH,
//!    GET, POST, merge PATCH and server-side apply with field ownership (a no-op apply keeps the
//!    resourceVersion and sends no watch event, as the real apiserver does). It counts every
//!    request by verb and resource. A request it does not implement is answered 404, 405 or 501
//!    and fails the run, naming the request;
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
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use mpi_webhook::objects::dir::{object_files, parse_documents};
use serde_json::{Value, json};
use tokio::net::TcpStream;

#[path = "../tests/fake_apiserver/mod.rs"]
mod fake_apiserver;
#[path = "support/procfs.rs"]
mod procfs;
#[path = "../tests/support/prometheus.rs"]
mod prometheus;

use fake_apiserver::{
    CLUSTER_RUNTIMES, CONFIGMAPS, EVENTS, FakeApi, Kind, SECRETS, Stats, TRAINJOBS, str_at,
    write_kubeconfig,
};

type AnyError = Box<dyn std::error::Error + Send + Sync>;

const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
/// Longest the reconciler may take to create every object, or to reconcile every TrainJob.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// The reconciler counts as done once it made no request, and started no reconcile, this long.
const QUIET: Duration = Duration::from_secs(1);
/// Longest the reconciler may take to become quiet after converging.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
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

/// Finished reconciles (`reconciles_total` counts started ones; the duration histogram's count
/// only those that returned).
const FINISHED: &str = "mpi_webhook_reconcile_duration_seconds_count";

/// Finished reconciles so far, or 0 while the probe server is not up yet.
async fn reconciles(reconciler: &Reconciler) -> u64 {
    scrape(reconciler.metrics)
        .await
        .map_or(0, |m| prometheus::sum(&m, FINISHED))
}

// ---------------------------------------------------------------------------------------------
// The run

/// Waits until every TrainJob has its Secret and ConfigMap; returns (first, all) since spawn:
/// when the first TrainJob, and the last, had both (from the fake's change log).
async fn converge(
    api: &FakeApi,
    reconciler: &mut Reconciler,
    jobs: &[Value],
) -> Result<(Duration, Duration), AnyError> {
    loop {
        if api.count(SECRETS) >= jobs.len() && api.count(CONFIGMAPS) >= jobs.len() {
            break;
        }
        reconciler.ensure_running()?;
        if reconciler.started.elapsed() > CONVERGE_TIMEOUT {
            return Err(reconciler.failure(&format!(
                "only {} Secrets and {} ConfigMaps of {} after {CONVERGE_TIMEOUT:?}",
                api.count(SECRETS),
                api.count(CONFIGMAPS),
                jobs.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (secrets, configmaps) = (api.added(SECRETS), api.added(CONFIGMAPS));
    let mut pairs = Vec::with_capacity(jobs.len());
    for job in jobs {
        let namespace = str_at(job, "/metadata/namespace").unwrap_or_default();
        let name = str_at(job, "/metadata/name").unwrap_or_default();
        let added = |added: &HashMap<(String, String), Instant>, suffix: &str| {
            added
                .get(&(namespace.to_string(), format!("{name}-{suffix}")))
                .copied()
        };
        match (
            added(&secrets, "mpi-ssh-auth"),
            added(&configmaps, "mpi-hostfile"),
        ) {
            (Some(secret), Some(configmap)) => pairs.push(secret.max(configmap)),
            _ => return Err(format!("{namespace}/{name} lacks its Secret or ConfigMap").into()),
        }
    }
    let since = |at: Option<&Instant>| {
        at.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(reconciler.started)
        })
    };
    Ok((since(pairs.iter().min()), since(pairs.iter().max())))
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
        reconciles: prometheus::sum(&metrics, FINISHED) - base.0,
        errors: prometheus::sum(&metrics, "mpi_webhook_reconcile_errors_total") - base.1,
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
        api.create(CLUSTER_RUNTIMES, None, runtime.clone(), "bench")?;
    }
    let jobs = train_jobs(config, &runtimes)?;
    for job in &jobs {
        api.create(TRAINJOBS, None, job.clone(), "bench")?;
    }
    let addr = api.start().await?;
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
    let (first, all) = converge(&api, &mut process, &jobs).await?;
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
