//! The proof that no admission fails across a rolling restart and a certificate rotation.
//!
//! Two real `mpi-webhook serve` processes over real TLS on 127.0.0.1, behind a TCP forwarder that
//! behaves like kube-proxy during an endpoints update (it keeps sending new connections to a
//! replica for [`ROUTING_LAG`] after that replica was told to stop). Clients stream reviews the
//! way the apiserver does: kept-alive HTTP/1.1 and HTTP/2 connections, plus one client that dials
//! for every review. No review is retried; the only request sent twice is one a closing
//! connection never wrote (Go's transport does the same). Both replicas are restarted one after
//! the other with `--shutdown-delay`, then the serving certificate is rotated by a Secret-volume
//! symlink swap, and every review must have been answered, correctly: each answer is the one
//! the offline `mpi-webhook review` gives for the same review (allowed, denied with its message,
//! or allowed with its patch), with the review's own uid.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tls_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mpi_webhook::admission::Route;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use tls_support::*;
use tokio::net::{TcpListener, TcpStream};

/// The replicas' `--shutdown-delay`.
const SHUTDOWN_DELAY: &str = "3s";
/// How long the forwarder keeps routing new connections to a replica told to stop.
const ROUTING_LAG: Duration = Duration::from_secs(2);
/// Bound on every wait (a replica starting or exiting, the new certificate being served).
const WAIT: Duration = Duration::from_secs(20);
/// Pause between one client's reviews: a steady stream, not a benchmark.
const PACE: Duration = Duration::from_millis(10);
/// Bound on the reviews one client sends.
const MAX_REVIEWS_PER_CLIENT: usize = 5_000;

/// A `serve` process: HTTPS on a free port, the given certificate files, `--shutdown-delay`.
struct Replica {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Replica {
    async fn start(volume: &SecretVolume, logs: &Path, name: &str) -> Self {
        let log = logs.join(format!("{name}.log"));
        let files = volume.files();
        let mut command = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"));
        for (key, _) in std::env::vars() {
            if key.starts_with("MPI_WEBHOOK_") {
                command.env_remove(key);
            }
        }
        let child = command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .arg("--tls-cert-file")
            .arg(&files.cert)
            .arg("--tls-key-file")
            .arg(&files.key)
            .args(["--shutdown-delay", SHUTDOWN_DELAY])
            .arg("--objects-dir")
            .arg(repo().join("manifests"))
            .current_dir(logs)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            // No cluster: the shipped runtimes, whatever this machine's kubeconfig says.
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut replica = Self {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
        };
        let line = replica.wait_for_log("https_addr=").await;
        replica.addr = https_addr(&line);
        replica
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for a log line containing `needle` and returns it.
    async fn wait_for_log(&self, needle: &str) -> String {
        eventually(&format!("a log line with {needle:?}"), WAIT, || {
            let line = self
                .log_text()
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_string);
            async move { line }
        })
        .await
    }

    /// Waits (bounded) until `/readyz` answers 200 on a direct connection.
    async fn wait_ready(&self, client: &Arc<rustls::ClientConfig>) {
        eventually("/readyz 200", WAIT, || async {
            let reply = request(self.addr, client.clone(), "GET", "/readyz", Vec::new()).await;
            reply.ok().filter(|r| r.status == 200).map(|_| ())
        })
        .await;
    }

    /// The certificate a new direct connection is served.
    async fn leaf(&self, client: &Arc<rustls::ClientConfig>) -> CertificateDer<'static> {
        request(self.addr, client.clone(), "GET", "/healthz", Vec::new())
            .await
            .unwrap()
            .leaf
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    async fn exited(&mut self) -> ExitStatus {
        let child = &mut self.child;
        eventually("the replica to exit", WAIT, || {
            let status = child.try_wait().unwrap();
            async move { status }
        })
        .await
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP forwarder standing in for the Service and kube-proxy: each new connection goes to the
/// next routed replica, round robin.
struct Forwarder {
    addr: SocketAddr,
    routes: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
    /// Connections whose replica refused them (the client then sees a failed handshake).
    refused: AtomicUsize,
}

impl Forwarder {
    async fn start() -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let forwarder = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            routes: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        });
        let this = Arc::clone(&forwarder);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let backend = this.pick();
                let this = Arc::clone(&this);
                tokio::spawn(async move {
                    let Some(backend) = backend else {
                        this.refused.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    match TcpStream::connect(backend).await {
                        Ok(mut server) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                        Err(_) => {
                            this.refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        forwarder
    }

    fn pick(&self) -> Option<SocketAddr> {
        let routes = self.routes.lock().unwrap();
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        (!routes.is_empty()).then(|| routes[n % routes.len()])
    }

    /// An endpoint became ready.
    fn add(&self, backend: SocketAddr) {
        self.routes.lock().unwrap().push(backend);
    }

    /// The endpoints update reached this node: no new connections to `backend`.
    fn remove(&self, backend: SocketAddr) {
        self.routes.lock().unwrap().retain(|b| *b != backend);
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    failures: Mutex<Vec<String>>,
    /// Requests a closing connection never wrote, sent again on a new connection.
    resent: AtomicUsize,
    /// Kept-alive connections the server ended (`Connection: close`, GOAWAY, closed).
    sent_away: AtomicUsize,
    connections: AtomicUsize,
    /// Bumped once the new certificate is served by every replica.
    epoch: AtomicUsize,
    /// For each connection: the epoch when its handshake started, and the certificate it got.
    leaves: Mutex<Vec<(usize, CertificateDer<'static>)>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failures.lock().unwrap().push(what);
    }
}

/// One kind of review the clients send, and the answer it must get.
struct Case {
    route: Route,
    review: Value,
    /// The `response` the offline `mpi-webhook review` gives, without its uid.
    expected: Value,
}

/// The reviews of the stream: a TrainJob allowed and one denied, a JobSet patched for its
/// TrainJob and a JobSet-mode JobSet patched. Each expected answer comes from the offline CLI.
fn cases() -> Vec<Case> {
    [
        (
            Route::ValidateTrainJob,
            "validate",
            "trainjob-create-allowed.json",
        ),
        (
            Route::ValidateTrainJob,
            "validate",
            "trainjob-create-denied-reserved-env.json",
        ),
        (
            Route::MutateJobSet,
            "mutate",
            "jobset-create-owned-by-trainjob.json",
        ),
        (
            Route::MutateJobSet,
            "mutate",
            "jobset-mode-create-mpich.json",
        ),
    ]
    .into_iter()
    .map(|(route, verb, file)| {
        let output = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
            .args(["review", "--objects-dir"])
            .arg(repo().join("manifests"))
            .arg(verb)
            .arg(repo().join("manifests/samples/reviews").join(file))
            .env_remove("MPI_WEBHOOK_OBJECTS_DIR")
            .output()
            .unwrap();
        assert!(output.status.success(), "review {file}: {output:?}");
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
        let mut expected = answer["response"].clone();
        expected.as_object_mut().unwrap().remove("uid");
        Case {
            route,
            review: sample_json(file),
            expected,
        }
    })
    .collect()
}

/// How a client uses its connections.
#[derive(Debug, Clone, Copy)]
enum Dialing {
    /// One kept-alive connection, replaced when the server closes it (the apiserver's way).
    KeepAlive,
    /// A new connection for every review (new handshakes all the time).
    EveryReview,
}

/// One client: the [`cases`] in turn with its own uids, paced, until `stop` or its bound.
async fn client(
    id: usize,
    dialing: Dialing,
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    cases: Arc<Vec<Case>>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut connection: Option<KeptConnection> = None;
    for n in 0..MAX_REVIEWS_PER_CLIENT {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let case = &cases[n % cases.len()];
        let uid = format!("client-{id}-review-{n}");
        let mut review = case.review.clone();
        review["request"]["uid"] = Value::from(uid.clone());
        let body = serde_json::to_vec(&review).unwrap();
        let mut resent = false;
        let reply = loop {
            let kept = match connection.take() {
                Some(kept) if kept.is_usable() => kept,
                previous => {
                    if previous.is_some() {
                        tally.sent_away.fetch_add(1, Ordering::SeqCst);
                    }
                    match open(addr, &config, &tally).await {
                        Ok(kept) => kept,
                        Err(e) => break Err(format!("connecting: {e}")),
                    }
                }
            };
            let mut kept = kept;
            match kept.send("POST", case.route.path(), body.clone()).await {
                Ok(reply) => {
                    if matches!(dialing, Dialing::KeepAlive) {
                        if reply.close {
                            tally.sent_away.fetch_add(1, Ordering::SeqCst);
                        } else {
                            connection = Some(kept);
                        }
                    }
                    break Ok(reply);
                }
                Err(KeptError::Unsent(e)) if !resent => {
                    tracing::debug!(%uid, error = %e, "not sent on a closing connection; resending");
                    tally.resent.fetch_add(1, Ordering::SeqCst);
                    resent = true;
                }
                Err(KeptError::Unsent(e) | KeptError::Failed(e)) => break Err(e),
            }
        };
        match reply {
            Ok(reply) => match check(&reply, &uid, &case.expected) {
                Ok(()) => {
                    tally.answered.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => tally.fail(format!("{uid}: {e}")),
            },
            Err(e) => tally.fail(format!("{uid}: {e}")),
        }
        tokio::time::sleep(PACE).await;
    }
}

async fn open(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    tally: &Tally,
) -> Result<KeptConnection, String> {
    let epoch = tally.epoch.load(Ordering::SeqCst);
    let kept = KeptConnection::open(addr, config.clone()).await?;
    tally.connections.fetch_add(1, Ordering::SeqCst);
    tally
        .leaves
        .lock()
        .unwrap()
        .push((epoch, kept.leaf.clone()));
    Ok(kept)
}

/// The answer is `expected` for the review `uid`.
fn check(reply: &KeptReply, uid: &str, expected: &Value) -> Result<(), String> {
    let body = String::from_utf8_lossy(&reply.body);
    if reply.status != 200 {
        return Err(format!("HTTP {}: {body}", reply.status));
    }
    let json: Value = serde_json::from_slice(&reply.body).map_err(|e| format!("{e}: {body}"))?;
    let mut response = json["response"].clone();
    let echoed = response
        .as_object_mut()
        .and_then(|r| r.remove("uid"))
        .is_some_and(|u| u == uid);
    if json["kind"] != "AdmissionReview" || !echoed || response != *expected {
        return Err(format!("wrong answer: {body}"));
    }
    Ok(())
}

/// Waits (bounded) until the clients have had `more` answers beyond what they had.
async fn answered_more(tally: &Tally, more: usize) {
    let from = tally.answered.load(Ordering::SeqCst);
    eventually(&format!("{more} more answers"), WAIT, || async {
        (tally.answered.load(Ordering::SeqCst) >= from + more).then_some(())
    })
    .await;
}

/// Replaces `old` with a new replica the way a Deployment with `maxSurge: 1, maxUnavailable: 0`
/// does: the new one is started and routed once ready, then the old one gets SIGTERM and keeps
/// receiving new connections for [`ROUTING_LAG`].
async fn roll(
    old: &mut Replica,
    name: &str,
    volume: &SecretVolume,
    logs: &Path,
    forwarder: &Arc<Forwarder>,
    config: &Arc<rustls::ClientConfig>,
) -> Replica {
    let new = Replica::start(volume, logs, name).await;
    new.wait_ready(config).await;
    forwarder.add(new.addr);
    old.terminate();
    let (lagging, stopped) = (Arc::clone(forwarder), old.addr);
    let endpoints_update = tokio::spawn(async move {
        tokio::time::sleep(ROUTING_LAG).await;
        lagging.remove(stopped);
    });
    let status = old.exited().await;
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        old.log_text()
    );
    endpoints_update.await.unwrap();
    let log = old.log_text();
    let steps = [
        "shutdown signal received",
        "shutdown delay over",
        "closing the listener",
        "stopped accepting",
        "shut down",
    ];
    let at: Vec<Option<usize>> = steps.iter().map(|step| log.find(step)).collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "each shutdown step logged, in order: {steps:?}\n{log}"
    );
    new
}

#[tokio::test]
async fn rolling_restart_and_certificate_rotation_fail_no_review() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let volume_dir = dir.path().join("tls");
    std::fs::create_dir(&volume_dir).unwrap();
    let (mut volume, first) = SecretVolume::new(&volume_dir);
    // The next CA is made up front: during a rotation the apiserver's caBundle holds both.
    let next_dir = tempfile::tempdir().unwrap();
    let next = TestCa::write(next_dir.path());
    let cas = [
        first.certs.ca_cert_pem.as_str(),
        next.certs.ca_cert_pem.as_str(),
    ];
    let http1 = client_config(&cas);
    let http2 = client_config_with(&cas, rustls::DEFAULT_VERSIONS, &[b"h2".as_slice()]);

    let forwarder = Forwarder::start().await;
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let replica = Replica::start(&volume, &logs, name).await;
        replica.wait_ready(&http1).await;
        forwarder.add(replica.addr);
        replicas.push(replica);
    }

    let cases = Arc::new(cases());
    let verdicts: Vec<(bool, bool)> = cases
        .iter()
        .map(|c| {
            (
                c.expected["allowed"] == true,
                c.expected.get("patch").is_some(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [(true, false), (false, false), (true, true), (true, true)],
        "the offline answers: allowed, denied, patched, patched"
    );
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients = [
        (Dialing::KeepAlive, &http1),
        (Dialing::KeepAlive, &http1),
        (Dialing::KeepAlive, &http2),
        (Dialing::EveryReview, &http1),
    ];
    let mut streams = tokio::task::JoinSet::new();
    for (id, (dialing, config)) in clients.into_iter().enumerate() {
        streams.spawn(client(
            id,
            dialing,
            forwarder.addr,
            Arc::clone(config),
            Arc::clone(&cases),
            Arc::clone(&tally),
            Arc::clone(&stop),
        ));
    }
    answered_more(&tally, 50).await;

    // The rolling restart: a -> c, then b -> d, under the stream.
    for (slot, name) in [(0, "c"), (1, "d")] {
        let new = roll(
            &mut replicas[slot],
            name,
            &volume,
            &logs,
            &forwarder,
            &http1,
        )
        .await;
        replicas[slot] = new;
        answered_more(&tally, 50).await;
    }

    // The rotation: a new version of the Secret, swapped in by `..data`.
    volume.publish_files(next_dir.path());
    for replica in &replicas {
        eventually("the new certificate to be served", WAIT, || async {
            (replica.leaf(&http1).await == next.leaf_der()).then_some(())
        })
        .await;
    }
    tally.epoch.store(1, Ordering::SeqCst);
    let connections = tally.connections.load(Ordering::SeqCst);
    answered_more(&tally, 100).await;

    stop.store(true, Ordering::SeqCst);
    while let Some(done) = streams.join_next().await {
        done.unwrap();
    }
    let failures = tally.failures.lock().unwrap().clone();
    let answered = tally.answered.load(Ordering::SeqCst);
    let sent_away = tally.sent_away.load(Ordering::SeqCst);
    println!(
        "{answered} reviews answered, {} failed, {} resent unsent, {sent_away} kept-alive connections sent away, {} connections ({} after the rotation), {} refused by the forwarder",
        failures.len(),
        tally.resent.load(Ordering::SeqCst),
        tally.connections.load(Ordering::SeqCst),
        tally.connections.load(Ordering::SeqCst) - connections,
        forwarder.refused.load(Ordering::SeqCst),
    );
    assert!(
        failures.is_empty(),
        "{} of {} reviews failed: {failures:#?}",
        failures.len(),
        answered + failures.len()
    );
    assert_eq!(forwarder.refused.load(Ordering::SeqCst), 0);
    // Every kept-alive connection of the start was to a replica that was restarted.
    assert!(
        sent_away >= 3,
        "{sent_away} kept-alive connections were sent away"
    );
    let leaves = tally.leaves.lock().unwrap().clone();
    let after: Vec<_> = leaves.iter().filter(|(epoch, _)| *epoch == 1).collect();
    assert!(
        !after.is_empty(),
        "connections were opened after the rotation"
    );
    assert!(
        after.iter().all(|(_, leaf)| *leaf == next.leaf_der()),
        "every connection opened after the rotation got the new certificate"
    );
    for replica in &replicas {
        replica.terminate();
    }
    for replica in &mut replicas {
        assert!(replica.exited().await.success());
    }
}
