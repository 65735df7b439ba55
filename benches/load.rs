//! HTTPS load benchmark of `mpi-webhook serve` against a baseline.
//!
//! `cargo bench --bench load` builds the release binary, then, all on 127.0.0.1:
//! 1. writes a dev CA and serving certificate with `mpi-webhook certs`;
//! 2. starts `mpi-webhook serve --objects-dir DIR` (DIR: copies of `manifests/runtimes` and
//!    `manifests/samples`) with that certificate, and the *baseline*: this same bench binary
//!    re-executed as an HTTPS server with serve's own rustls configuration
//!    (`mpi_webhook::tls::server_config`, aws-lc-rs, TLS 1.3/1.2) and the same hyper connection
//!    builder, which reads the body and answers with a fixed AdmissionReview (the very bytes
//!    serve returns for the sample, so response sizes are equal);
//! 3. drives the validate and mutate routes of each, one server at a time, with the README's
//!    sample reviews over HTTPS/1.1 keep-alive connections: at maximum throughput (closed loop:
//!    every connection sends its next request as soon as the last one is answered; three rounds
//!    alternating between the two servers, the median kept) and at fixed rates (open loop:
//!    request `i` is due at `start + i / rate`; a request sent late because its connection was
//!    still busy is timed from when it was due, so a stall is charged to every request it
//!    delays, not hidden: no coordinated omission);
//! 4. prints throughput, p50/p99/p99.9/max latency, errors, the CPU time per request of the
//!    server and of the client (this process) from `/proc/<pid>/stat`, the server's idle and
//!    peak RSS (`VmRSS` after start-up, `VmHWM` at the end, from `/proc/<pid>/status`) and
//!    serve's maximum throughput as a fraction of the baseline's, then stops both servers;
//! 5. calibrates that fraction: the baseline is started again with a fixed amount of CPU work
//!    added to every request (`LOAD_CALIBRATE_US`, a busy loop sized at start-up to take that
//!    many microseconds when run hot on one core, as criterion measures `benches/policy.rs`) and
//!    its maximum throughput is measured as a fraction of the plain baseline's. This turns the
//!    throughput target into a CPU budget per review: with client and servers sharing the two
//!    cores, a fraction of 0.7 allows only as much work as the row that reads 0.7.
//!
//! Every phase is bounded in requests (by its duration and rate) and in time (a deadline, and a
//! timeout per request); the whole run takes about a minute. Knobs (environment):
//! `LOAD_SECONDS` per phase (default 3), `LOAD_CONNECTIONS` (default 16), `LOAD_RATES`
//! (comma-separated requests/s, default `1000,2000`), `LOAD_CALIBRATE_US` (comma-separated
//! microseconds of added work, default `2,3,4`; empty for none), `LOAD_SERVE_WRAPPER` (a command
//! prefix for serve, e.g. `valgrind --tool=callgrind`, to profile it under load); `RUST_LOG`
//! reaches serve.
//!
//! Without `--bench` (as `cargo test --benches` runs it) it does nothing: benchmarks are never
//! timed tests.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use mpi_webhook::admission::{Route, review};
use mpi_webhook::objects::Snapshot;
use mpi_webhook::tls::{self, ReloadingCert, TlsFiles};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

#[path = "support/procfs.rs"]
mod procfs;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

const BIN: &str = env!("CARGO_BIN_EXE_mpi-webhook");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
const BASELINE_FLAG: &str = "--baseline-server";
/// Server names in the output.
const SERVE: &str = "mpi-webhook serve";
const BASELINE: &str = "baseline";
/// Longest any single request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Alternating rounds of the maximum-throughput measurement (the median is reported).
const MAX_ROUNDS: usize = 3;
/// Longest a server may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One route under load: its path and the sample review it is sent.
#[derive(Clone)]
struct Workload {
    name: &'static str,
    route: Route,
    body: Bytes,
}

fn workloads() -> Result<Vec<Workload>, AnyError> {
    let sample = |file: &str| -> Result<Bytes, AnyError> {
        let path = Path::new(MANIFESTS).join("samples/reviews").join(file);
        Ok(Bytes::from(
            std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        ))
    };
    Ok(vec![
        Workload {
            name: "validate",
            route: Route::ValidateTrainJob,
            body: sample("trainjob-create-allowed.json")?,
        },
        Workload {
            name: "mutate",
            route: Route::MutateJobSet,
            body: sample("jobset-create-owned-by-trainjob.json")?,
        },
    ])
}

struct Config {
    seconds: f64,
    connections: usize,
    rates: Vec<u32>,
    /// Microseconds of work added to the baseline's requests, one calibration run each.
    calibrate_us: Vec<f64>,
}

impl Config {
    fn from_env() -> Result<Self, AnyError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let seconds: f64 = var("LOAD_SECONDS").map_or(Ok(3.0), |v| v.parse())?;
        let connections: usize = var("LOAD_CONNECTIONS").map_or(Ok(16), |v| v.parse())?;
        let rates = var("LOAD_RATES")
            .unwrap_or_else(|| "1000,2000".into())
            .split(',')
            .map(|r| r.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()?;
        if !(0.5..=60.0).contains(&seconds) || !(1..=256).contains(&connections) {
            return Err("LOAD_SECONDS must be 0.5..=60 and LOAD_CONNECTIONS 1..=256".into());
        }
        if rates.iter().any(|r| !(1..=100_000).contains(r)) {
            return Err("every LOAD_RATES entry must be 1..=100000".into());
        }
        // Set but empty means no calibration; unset means the default.
        let calibrate_us = std::env::var("LOAD_CALIBRATE_US")
            .unwrap_or_else(|_| "2,3,4".into())
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(str::parse::<f64>)
            .collect::<Result<Vec<_>, _>>()?;
        if calibrate_us.iter().any(|w| !(*w > 0.0 && *w <= 1000.0)) {
            return Err(
                "every LOAD_CALIBRATE_US entry must be more than 0 and at most 1000".into(),
            );
        }
        Ok(Self {
            seconds,
            connections,
            rates,
            calibrate_us,
        })
    }
}

fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == BASELINE_FLAG) {
        return baseline_main(&args);
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("load: skipped (a benchmark, not a test: run `cargo bench --bench load`)");
        return Ok(());
    }
    tls::install_crypto_provider();
    let config = Config::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(&config))
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process that is killed (and reaped) when dropped, so no server outlives the run.
struct Server {
    name: String,
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    /// SIGTERM (serve drains and exits; a profiler wrapping it writes its output), then SIGKILL
    /// if it is still running 10 s later.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// CPU time (user and system) the server has used so far.
    fn cpu_time(&self) -> Result<Duration, AnyError> {
        procfs::cpu_time(self.child.id())
    }

    /// `(VmRSS, VmHWM)` in KiB.
    fn memory_kib(&self) -> Result<(u64, u64), AnyError> {
        let pid = self.child.id();
        Ok((
            procfs::status_kib(pid, "VmRSS")?,
            procfs::status_kib(pid, "VmHWM")?,
        ))
    }
}

fn free_port() -> Result<SocketAddr, AnyError> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn spawn(name: String, command: &mut Command, addr: SocketAddr) -> Result<Server, AnyError> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {name}: {e}"))?;
    Ok(Server { name, child, addr })
}

/// The objects serve needs, copied into `dir`: the shipped runtimes and the sample TrainJobs the
/// sample reviews refer to (`--objects-dir manifests` would also parse the two 668 KiB CRDs of
/// the overlays, which hold no object serve uses, and count them in its RSS).
fn objects_dir(dir: &Path) -> Result<(), AnyError> {
    std::fs::create_dir_all(dir)?;
    for sub in ["runtimes", "samples"] {
        for entry in std::fs::read_dir(Path::new(MANIFESTS).join(sub))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "yaml")
                && let Some(name) = path.file_name()
            {
                std::fs::copy(&path, dir.join(format!("{sub}-{}", name.to_string_lossy())))?;
            }
        }
    }
    Ok(())
}

fn start_serve(certs: &Path, objects: &Path) -> Result<Server, AnyError> {
    let addr = free_port()?;
    let metrics = free_port()?;
    // LOAD_SERVE_WRAPPER, e.g. `valgrind --tool=callgrind`, runs serve under a profiler.
    let wrapper = std::env::var("LOAD_SERVE_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    command
        .arg("serve")
        .arg("--objects-dir")
        .arg(objects)
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .arg("--tls-cert-file")
        .arg(certs.join("tls.crt"))
        .arg("--tls-key-file")
        .arg(certs.join("tls.key"));
    // RUST_LOG passes through; unset, serve logs at its default level (info: one event per
    // mutation or denial), as in production.
    spawn(SERVE.into(), &mut command, addr)
}

/// The baseline, adding `work_us` microseconds of work (a busy loop that takes that long when run
/// hot) to every request; named [`calibration_name`] of `work_us` unless that is 0.
fn start_baseline(certs: &Path, responses: &Path, work_us: f64) -> Result<Server, AnyError> {
    let work = Duration::from_secs_f64(work_us / 1e6);
    let addr = free_port()?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg(BASELINE_FLAG)
        .arg(addr.to_string())
        .arg(certs)
        .arg(responses)
        .arg(work.as_nanos().to_string());
    let name = if work.is_zero() {
        BASELINE.to_string()
    } else {
        calibration_name(work_us)
    };
    spawn(name, &mut command, addr)
}

fn calibration_name(us: f64) -> String {
    format!("{BASELINE} + {us:.1} us")
}

/// The responses serve gives to the samples, written for the baseline to return verbatim.
async fn write_baseline_responses(
    dir: &Path,
    objects: &Path,
    workloads: &[Workload],
) -> Result<(), AnyError> {
    let snapshot = Snapshot::load_dir(objects)?;
    for w in workloads {
        let reviewed = review(w.route, &w.body, &snapshot).await?;
        if !reviewed.outcome.allowed() {
            return Err(format!(
                "the {} sample is not allowed: {:?}",
                w.name, reviewed.outcome
            )
            .into());
        }
        std::fs::write(
            dir.join(w.route.path().trim_start_matches('/')),
            &reviewed.body,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The baseline server (a child process of the bench)

fn baseline_main(args: &[String]) -> Result<(), AnyError> {
    let [_, _, addr, certs, responses, work_ns] = args else {
        return Err(format!("usage: {BASELINE_FLAG} ADDR CERT_DIR RESPONSE_DIR WORK_NS").into());
    };
    let (addr, certs, responses): (SocketAddr, PathBuf, PathBuf) =
        (addr.parse()?, certs.into(), responses.into());
    let work = BusyWork::sized(Duration::from_nanos(work_ns.parse()?));
    tls::install_crypto_provider();
    // The same runtime as serve's `#[tokio::main]`: multi-threaded, one worker per core.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(baseline_serve(addr, &certs, &responses, work))
}

/// A fixed amount of CPU work standing in for a review in the calibration runs: a loop whose
/// iterations depend on each other, sized so that it takes the given time when run hot.
#[derive(Clone, Copy)]
struct BusyWork {
    iterations: u64,
}

impl BusyWork {
    fn sized(target: Duration) -> Self {
        if target.is_zero() {
            return Self { iterations: 0 };
        }
        // The fastest of a few timed runs: the loop's cost on an otherwise idle core.
        const PROBE: u64 = 1_000_000;
        let probe = Self { iterations: PROBE };
        let fastest = (0..5)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(probe.run());
                start.elapsed()
            })
            .min()
            .unwrap_or(Duration::from_millis(1));
        let per_iteration = fastest.as_secs_f64() / PROBE as f64;
        Self {
            iterations: (target.as_secs_f64() / per_iteration).round() as u64,
        }
    }

    /// xorshift64: cheap, serial, and not something the compiler can fold away.
    fn run(self) -> u64 {
        let mut x = std::hint::black_box(0x9E37_79B9_7F4A_7C15_u64);
        for _ in 0..self.iterations {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        x
    }
}

async fn baseline_serve(
    addr: SocketAddr,
    certs: &Path,
    responses: &Path,
    work: BusyWork,
) -> Result<(), AnyError> {
    let files = TlsFiles {
        cert: certs.join("tls.crt"),
        key: certs.join("tls.key"),
    };
    let resolver = Arc::new(ReloadingCert::new(tls::load_pair(&files).await?));
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(resolver)?));
    let mut bodies = Vec::new();
    for route in Route::ALL {
        let file = responses.join(route.path().trim_start_matches('/'));
        if let Ok(body) = std::fs::read(&file) {
            bodies.push((route.path(), Bytes::from(body)));
        }
    }
    let bodies: Arc<[(&'static str, Bytes)]> = bodies.into();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    let builder = Arc::new(builder);
    let listener = TcpListener::bind(addr).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let (acceptor, builder, bodies) = (acceptor.clone(), builder.clone(), bodies.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let bodies = bodies.clone();
                async move { Ok::<_, hyper::Error>(baseline_answer(request, &bodies, work).await) }
            });
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

/// Reads the whole body (as serve must), does `work`, then answers with the fixed review of the
/// path.
async fn baseline_answer(
    request: Request<Incoming>,
    bodies: &[(&'static str, Bytes)],
    work: BusyWork,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let fixed = bodies.iter().find(|(p, _)| *p == path).map(|(_, b)| b);
    let read = request.into_body().collect().await;
    std::hint::black_box(work.run());
    let (status, body) = match (read, fixed) {
        (Ok(_), Some(body)) => (StatusCode::OK, body.clone()),
        (Ok(_), None) => (StatusCode::NOT_FOUND, Bytes::new()),
        (Err(_), _) => (StatusCode::BAD_REQUEST, Bytes::new()),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

// ---------------------------------------------------------------------------------------------
// The client

fn client_tls(ca: &Path) -> Result<TlsConnector, AnyError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(tls::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // HTTP/1.1 keep-alive, one request at a time per connection, as the apiserver's pool does.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr, tls: &TlsConnector) -> Result<Sender, AnyError> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let stream = tls.connect(ServerName::try_from("localhost")?, tcp).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one review and reads the whole answer; `Err` unless it is a 200 that allows.
async fn send(sender: &mut Sender, w: &Workload) -> Result<(), AnyError> {
    let request = Request::post(w.route.path())
        .header(HOST, "localhost")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(w.body.clone()))?;
    let exchange = async {
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            return Err(format!("HTTP {status}").into());
        }
        // Cheap check that the server answered the review, not an error.
        if !body.windows(15).any(|win| win == b"\"allowed\":true,") {
            return Err("response is not an allowed review".into());
        }
        Ok::<(), AnyError>(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| "request timed out")?
}

/// How a phase schedules its requests.
#[derive(Clone, Copy)]
enum Mode {
    /// Closed loop: back to back on every connection.
    Max,
    /// Open loop at this many requests per second in all.
    Rate(u32),
}

impl Mode {
    fn label(self) -> String {
        match self {
            Mode::Max => "max".into(),
            Mode::Rate(r) => format!("{r}/s"),
        }
    }
}

struct PhaseResult {
    requests: u64,
    errors: u64,
    elapsed: Duration,
    latency_us: Histogram<u64>,
    first_error: Option<String>,
    /// CPU time of the server and of the client (this process) during the phase.
    server_cpu: Duration,
    client_cpu: Duration,
}

impl PhaseResult {
    fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// Microseconds of `cpu` per request, to one decimal; `-` where the phase had too few
    /// requests for `/proc`'s clock ticks (10 ms) to resolve a tenth of a microsecond.
    fn cpu_per_request(&self, cpu: Duration) -> String {
        let resolution_us = 1e6 / procfs::clock_ticks_per_second() / self.requests.max(1) as f64;
        if resolution_us > 0.1 {
            return "-".into();
        }
        format!("{:.1}", cpu.as_secs_f64() * 1e6 / self.requests as f64)
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 60 s, 3 significant digits; these bounds are valid, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

struct ConnResult {
    requests: u64,
    errors: u64,
    latency_us: Histogram<u64>,
    first_error: Option<String>,
}

/// One connection's share of a phase.
async fn drive(
    sender: &mut Sender,
    w: Workload,
    mode: Mode,
    start: Instant,
    duration: Duration,
    index: usize,
    connections: usize,
) -> ConnResult {
    let mut out = ConnResult {
        requests: 0,
        errors: 0,
        latency_us: histogram(),
        first_error: None,
    };
    let end = start + duration;
    // Open loop: this connection sends requests index, index + n, index + 2n, ... of the
    // phase's schedule, request k being due at start + k / rate.
    let interval = match mode {
        Mode::Max => Duration::ZERO,
        Mode::Rate(rate) => Duration::from_secs_f64(connections as f64 / f64::from(rate)),
    };
    let offset = match mode {
        Mode::Max => Duration::ZERO,
        Mode::Rate(rate) => Duration::from_secs_f64(index as f64 / f64::from(rate)),
    };
    let mut k: u32 = 0;
    loop {
        let due = start + offset + interval * k;
        k += 1;
        let stop = match mode {
            Mode::Max => Instant::now() >= end,
            // Late requests still go out (they are the backlog a stall leaves), up to a bound.
            Mode::Rate(_) => due >= end || Instant::now() >= end + REQUEST_TIMEOUT,
        };
        if stop {
            break;
        }
        // A request whose connection was free before it was due is timed from when it was sent
        // (tokio's timer may wake it up to a millisecond late: the client's lag, not the
        // server's); one whose connection was still busy is timed from when it was due.
        let timed_from = match mode {
            Mode::Max => Instant::now(),
            Mode::Rate(_) if Instant::now() < due => {
                tokio::time::sleep_until(due.into()).await;
                Instant::now()
            }
            Mode::Rate(_) => due,
        };
        let result = send(sender, &w).await;
        let micros = timed_from.elapsed().as_micros();
        let _ = out
            .latency_us
            .record(u64::try_from(micros).unwrap_or(u64::MAX).max(1));
        out.requests += 1;
        if let Err(e) = result {
            out.errors += 1;
            out.first_error.get_or_insert_with(|| e.to_string());
            // The connection may be unusable; reconnecting is not measured, so stop here.
            break;
        }
    }
    out
}

async fn phase(
    senders: &mut Vec<Sender>,
    addr: SocketAddr,
    tls: &TlsConnector,
    w: &Workload,
    mode: Mode,
    duration: Duration,
) -> Result<PhaseResult, AnyError> {
    // Reconnect any connection a previous phase gave up on.
    for sender in senders.iter_mut() {
        if sender.is_closed() {
            *sender = connect(addr, tls).await?;
        }
    }
    let connections = senders.len();
    let start = Instant::now() + Duration::from_millis(20);
    let tasks: Vec<_> = senders
        .drain(..)
        .enumerate()
        .map(|(i, sender)| {
            let w = w.clone();
            tokio::spawn(async move {
                let mut sender = sender;
                let r = drive(&mut sender, w, mode, start, duration, i, connections).await;
                (sender, r)
            })
        })
        .collect();
    let mut result = PhaseResult {
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latency_us: histogram(),
        first_error: None,
        server_cpu: Duration::ZERO,
        client_cpu: Duration::ZERO,
    };
    for task in tasks {
        let (sender, r) = task.await?;
        senders.push(sender);
        result.requests += r.requests;
        result.errors += r.errors;
        result.latency_us.add(&r.latency_us)?;
        if result.first_error.is_none() {
            result.first_error = r.first_error;
        }
    }
    result.elapsed = start.elapsed();
    Ok(result)
}

// ---------------------------------------------------------------------------------------------
// The run

struct Row {
    server: String,
    workload: &'static str,
    mode: Mode,
    result: PhaseResult,
}

impl Row {
    fn new(server: &Server, w: &Workload, mode: Mode, result: PhaseResult) -> Self {
        Self {
            server: server.name.clone(),
            workload: w.name,
            mode,
            result,
        }
    }
}

async fn wait_ready(server: &mut Server, tls: &TlsConnector, w: &Workload) -> Result<(), AnyError> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = server.child.try_wait()? {
            return Err(format!("{} exited during start-up: {status}", server.name).into());
        }
        if let Ok(mut sender) = connect(server.addr, tls).await
            && send(&mut sender, w).await.is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not answer within {START_TIMEOUT:?}", server.name).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    format!("{:.3}", h.value_at_quantile(q) as f64 / 1000.0)
}

/// A started server with its open keep-alive connections.
struct Target<'a> {
    server: &'a Server,
    senders: Vec<Sender>,
}

async fn measure(
    target: &mut Target<'_>,
    tls: &TlsConnector,
    w: &Workload,
    mode: Mode,
    duration: Duration,
) -> Result<PhaseResult, AnyError> {
    let (server_before, client_before) = (
        target.server.cpu_time()?,
        procfs::cpu_time(std::process::id())?,
    );
    let mut result = phase(
        &mut target.senders,
        target.server.addr,
        tls,
        w,
        mode,
        duration,
    )
    .await?;
    result.server_cpu = target.server.cpu_time()?.saturating_sub(server_before);
    result.client_cpu = procfs::cpu_time(std::process::id())?.saturating_sub(client_before);
    eprintln!(
        "  {:<24} {:<8} {:>7}: {:>8.0} req/s, p99 {} ms, {} errors, CPU per request: server {} us, client {} us",
        target.server.name,
        w.name,
        mode.label(),
        result.throughput(),
        ms(&result.latency_us, 0.99),
        result.errors,
        result.cpu_per_request(result.server_cpu),
        result.cpu_per_request(result.client_cpu),
    );
    Ok(result)
}

/// One second at maximum throughput (connections, allocator, caches); not reported.
async fn warm_up(
    target: &mut Target<'_>,
    tls: &TlsConnector,
    w: &Workload,
) -> Result<(), AnyError> {
    let warm_up = Duration::from_secs(1);
    phase(
        &mut target.senders,
        target.server.addr,
        tls,
        w,
        Mode::Max,
        warm_up,
    )
    .await?;
    Ok(())
}

/// Loads serve and the baseline in turn, never both at once. Maximum throughput is measured in
/// `MAX_ROUNDS` alternating rounds and the median round is kept, so that a slow spell of the
/// machine (other processes) is not charged to one server only.
async fn load_both(
    targets: &mut [Target<'_>; 2],
    tls: &TlsConnector,
    workloads: &[Workload],
    config: &Config,
    rows: &mut Vec<Row>,
) -> Result<(), AnyError> {
    let duration = Duration::from_secs_f64(config.seconds);
    for w in workloads {
        for target in targets.iter_mut() {
            warm_up(target, tls, w).await?;
        }
        let mut rounds: [Vec<PhaseResult>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..MAX_ROUNDS {
            for (t, target) in targets.iter_mut().enumerate() {
                rounds[t].push(measure(target, tls, w, Mode::Max, duration).await?);
            }
        }
        for (t, mut results) in rounds.into_iter().enumerate() {
            results.sort_by(|a, b| a.throughput().total_cmp(&b.throughput()));
            let median = results.swap_remove(results.len() / 2);
            rows.push(Row::new(targets[t].server, w, Mode::Max, median));
        }
        for &rate in &config.rates {
            for target in targets.iter_mut() {
                let result = measure(target, tls, w, Mode::Rate(rate), duration).await?;
                rows.push(Row::new(target.server, w, Mode::Rate(rate), result));
            }
        }
    }
    Ok(())
}

/// The calibration runs: for each `LOAD_CALIBRATE_US` entry, the baseline with that much work
/// added to every request, at maximum throughput on every workload (one round each).
async fn calibrate(
    certs: &Path,
    responses: &Path,
    tls: &TlsConnector,
    workloads: &[Workload],
    config: &Config,
    rows: &mut Vec<Row>,
) -> Result<(), AnyError> {
    let duration = Duration::from_secs_f64(config.seconds);
    for &us in &config.calibrate_us {
        let mut server = start_baseline(certs, responses, us)?;
        wait_ready(&mut server, tls, &workloads[0]).await?;
        let mut target = Target {
            senders: connections(&server, tls, config.connections).await?,
            server: &server,
        };
        for w in workloads {
            warm_up(&mut target, tls, w).await?;
            let result = measure(&mut target, tls, w, Mode::Max, duration).await?;
            rows.push(Row::new(&server, w, Mode::Max, result));
        }
    }
    Ok(())
}

async fn connections(
    server: &Server,
    tls: &TlsConnector,
    n: usize,
) -> Result<Vec<Sender>, AnyError> {
    let mut senders = Vec::with_capacity(n);
    for _ in 0..n {
        senders.push(connect(server.addr, tls).await?);
    }
    Ok(senders)
}

async fn run(config: &Config) -> Result<(), AnyError> {
    let started = Instant::now();
    let workloads = workloads()?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let certs = dir.join("certs");
    let status = Command::new(BIN)
        .arg("certs")
        .arg("--out")
        .arg(&certs)
        .args(["--dns", "localhost", "--ip", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("mpi-webhook certs failed: {status}").into());
    }
    let responses = dir.join("responses");
    std::fs::create_dir_all(&responses)?;
    let objects = dir.join("objects");
    objects_dir(&objects)?;
    write_baseline_responses(&responses, &objects, &workloads).await?;
    let tls = client_tls(&certs.join("ca.crt"))?;

    eprintln!(
        "load: {} s per phase, {} HTTPS/1.1 keep-alive connections, rates {:?} req/s",
        config.seconds, config.connections, config.rates
    );
    let mut rows = Vec::new();
    let mut serve = start_serve(&certs, &objects)?;
    wait_ready(&mut serve, &tls, &workloads[0]).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_rss, _) = serve.memory_kib()?;
    let mut baseline = start_baseline(&certs, &responses, 0.0)?;
    wait_ready(&mut baseline, &tls, &workloads[0]).await?;
    let (baseline_idle, _) = baseline.memory_kib()?;
    let mut targets = [
        Target {
            server: &serve,
            senders: connections(&serve, &tls, config.connections).await?,
        },
        Target {
            server: &baseline,
            senders: connections(&baseline, &tls, config.connections).await?,
        },
    ];
    load_both(&mut targets, &tls, &workloads, config, &mut rows).await?;
    drop(targets);
    let (after_rss, serve_peak) = serve.memory_kib()?;
    let (_, baseline_peak) = baseline.memory_kib()?;
    drop(serve);
    drop(baseline);
    calibrate(&certs, &responses, &tls, &workloads, config, &mut rows).await?;
    drop(tmp);

    println!();
    println!(
        "| server | route | load | req/s | p50 ms | p99 ms | p99.9 ms | max ms | errors | server CPU us/req | client CPU us/req |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let (h, r) = (&row.result.latency_us, &row.result);
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.3} | {} | {} | {} |",
            row.server,
            row.workload,
            row.mode.label(),
            r.throughput(),
            ms(h, 0.5),
            ms(h, 0.99),
            ms(h, 0.999),
            h.max() as f64 / 1000.0,
            r.errors,
            r.cpu_per_request(r.server_cpu),
            r.cpu_per_request(r.client_cpu),
        );
    }
    println!();
    for row in rows.iter().filter(|r| r.result.first_error.is_some()) {
        println!(
            "first error, {} {} {}: {}",
            row.server,
            row.workload,
            row.mode.label(),
            row.result.first_error.as_deref().unwrap_or_default()
        );
    }
    let max_of = |server: &str, workload: &str| {
        rows.iter()
            .find(|r| r.server == server && r.workload == workload && matches!(r.mode, Mode::Max))
            .map_or(0.0, |r| r.result.throughput())
    };
    for w in &workloads {
        let ours = max_of(SERVE, w.name);
        let base = max_of(BASELINE, w.name);
        println!(
            "{} max throughput: {:.0} / {:.0} req/s = {:.2} of the baseline (target >= 0.70)",
            w.name,
            ours,
            base,
            ours / base
        );
    }
    for &us in &config.calibrate_us {
        let name = calibration_name(us);
        let fractions: Vec<String> = workloads
            .iter()
            .map(|w| {
                let fraction = max_of(&name, w.name) / max_of(BASELINE, w.name);
                format!("{} {fraction:.2}", w.name)
            })
            .collect();
        println!(
            "calibration: {name} of work per request reaches {} of the baseline",
            fractions.join(", ")
        );
    }
    println!(
        "serve RSS: idle {} (target < 15 MiB), peak under load {} (target < 30 MiB), after load {}",
        mib(idle_rss),
        mib(serve_peak),
        mib(after_rss)
    );
    println!(
        "baseline RSS: idle {}, peak {}",
        mib(baseline_idle),
        mib(baseline_peak)
    );
    println!("total run time {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
