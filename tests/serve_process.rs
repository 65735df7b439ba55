//! The real `mpi-webhook` binary: `serve` with no flags (dev certificates under `certs/`,
//! shipped runtimes), graceful shutdown on SIGTERM with requests in flight, dev-certificate
//! reuse, startup errors, and the `certs` subcommand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tls_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use mpi_webhook::admission::Route;
use tls_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(20);

fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"));
    command
        // Logs must be plain text when stderr is not a terminal, whatever NO_COLOR says.
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info,mpi_webhook::serve=debug")
        // No cluster: the shipped runtimes are used whatever this machine's kubeconfig says.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    for (key, _) in std::env::vars() {
        if key.starts_with("MPI_WEBHOOK_") {
            command.env_remove(key);
        }
    }
    command
}

/// A running `serve` and the HTTPS address it logged.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: mpsc::Receiver<String>,
}

impl Server {
    /// `mpi-webhook serve` in `cwd` on free ports, waiting for its "listening" log line.
    fn start(cwd: &Path) -> Self {
        Self::start_with(cwd, &[])
    }

    /// [`Server::start`] with more flags.
    fn start_with(cwd: &Path, flags: &[&str]) -> Self {
        let mut child = binary()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(flags)
            .current_dir(cwd)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, log) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Self {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
        };
        let line = server.wait_for_log("https_addr");
        assert!(
            !line.contains('\u{1b}'),
            "escape codes in a log piped to a file: {line:?}"
        );
        server.addr = https_addr(&line);
        server
    }

    fn wait_for_log(&mut self, needle: &str) -> String {
        loop {
            match self.log.recv_timeout(WAIT) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => {
                    let _ = self.child.kill();
                    panic!("no log line with {needle:?}: {e}");
                }
            }
        }
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit and returns its status.
    fn wait(mut self) -> std::process::ExitStatus {
        let give_up = std::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > give_up {
                let _ = self.child.kill();
                panic!("serve did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[tokio::test]
async fn serve_without_flags_drains_in_flight_requests_on_sigterm_and_reuses_its_dev_certs() {
    init();
    let cwd = tempfile::tempdir().unwrap();
    let server = Server::start(cwd.path());
    let ca_pem = std::fs::read_to_string(cwd.path().join("certs/ca.crt")).unwrap();
    let client = client_config(&[&ca_pem]);
    let reply = request(server.addr, client.clone(), "GET", "/readyz", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);

    // Three requests in flight: headers and half of each body sent.
    let body = sample("trainjob-create-allowed.json");
    let (first_half, second_half) = body.split_at(body.len() / 2);
    let mut in_flight = Vec::new();
    for _ in 0..3 {
        let mut tls = connect(server.addr, client.clone()).await.unwrap();
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            Route::ValidateTrainJob.path(),
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(first_half).await.unwrap();
        tls.flush().await.unwrap();
        in_flight.push(tls);
    }
    // Each handler has started (hyper saw the headers), so the requests are in flight, not idle
    // connections that shutdown may close.
    let mut server = server;
    for _ in 0..3 {
        server.wait_for_log("request received");
    }
    // An idle keep-alive connection must not hold shutdown up.
    let _idle = connect(server.addr, client.clone()).await.unwrap();

    server.terminate();
    server.wait_for_log("stopped accepting");
    // New connections are refused once draining started.
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err());

    for tls in &mut in_flight {
        tls.write_all(second_half).await.unwrap();
        tls.flush().await.unwrap();
    }
    for tls in &mut in_flight {
        let mut response = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout(WAIT, tls.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => response.extend_from_slice(&chunk[..n]),
                _ => break,
            }
            if String::from_utf8_lossy(&response).contains("\"allowed\"") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            text.contains(r#""uid":"0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e01","allowed":true"#),
            "{text}"
        );
    }
    let status = server.wait();
    assert!(status.success(), "exit status {status:?}");

    // Started again in the same directory: the dev CA is reused.
    let mut again = Server::start(cwd.path());
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("certs/ca.crt")).unwrap(),
        ca_pem
    );
    let reply = request(again.addr, client, "GET", "/healthz", Vec::new())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    again.terminate();
    again.wait_for_log("shut down");
    assert!(again.wait().success());
}

/// With `--shutdown-delay`, SIGTERM fails `/readyz` at once while new connections are
/// still answered; a second SIGTERM skips the rest of the delay (an hour here, so exiting at all
/// shows it was skipped), and the process exits 0 after the usual drain.
#[tokio::test]
async fn a_shutdown_delay_keeps_answering_after_sigterm_and_a_second_signal_skips_it() {
    init();
    let cwd = tempfile::tempdir().unwrap();
    let mut server = Server::start_with(cwd.path(), &["--shutdown-delay", "1h"]);
    let ca_pem = std::fs::read_to_string(cwd.path().join("certs/ca.crt")).unwrap();
    let client = client_config(&[&ca_pem]);
    let readyz = request(server.addr, client.clone(), "GET", "/readyz", Vec::new())
        .await
        .unwrap();
    assert_eq!(readyz.status, 200);

    server.terminate();
    let line = server.wait_for_log("shutdown signal received");
    assert!(line.contains("delay_seconds=3600"), "{line}");
    let readyz = request(server.addr, client.clone(), "GET", "/readyz", Vec::new())
        .await
        .unwrap();
    assert_eq!(readyz.status, 503);
    assert_eq!(readyz.body, "shutting down");
    let reply = post(
        server.addr,
        client,
        Route::ValidateTrainJob.path(),
        sample("trainjob-create-allowed.json"),
    )
    .await;
    assert_eq!(
        response_for(&reply, "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e01")["allowed"],
        true
    );

    server.terminate();
    server.wait_for_log("second signal: skipping the rest of the shutdown delay");
    server.wait_for_log("closing the listener");
    server.wait_for_log("stopped accepting");
    server.wait_for_log("shut down");
    let status = server.wait();
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn a_given_certificate_path_that_does_not_exist_is_an_error() {
    let cwd = tempfile::tempdir().unwrap();
    let output = binary()
        .args([
            "serve",
            "--tls-cert-file",
            "missing.crt",
            "--tls-key-file",
            "missing.key",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tls-cert-file missing.crt: no such file"),
        "{stderr}"
    );
    assert!(
        !cwd.path().join("certs").exists(),
        "no silent fallback to dev certificates"
    );
}

#[test]
fn certs_writes_a_ca_and_serving_certificate_and_prints_the_ca_bundle() {
    init();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("tls");
    let output = binary()
        .args(["certs", "--out"])
        .arg(&dir)
        .args([
            "--dns",
            "mpi-webhook.mpi-webhook.svc",
            "--dns",
            "localhost",
            "--ip",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bundle = String::from_utf8(output.stdout).unwrap();
    let ca = base64::engine::general_purpose::STANDARD
        .decode(bundle.trim())
        .unwrap();
    assert_eq!(ca, std::fs::read(dir.join("ca.crt")).unwrap());
    use std::os::unix::fs::PermissionsExt;
    for key in ["ca.key", "tls.key"] {
        let mode = std::fs::metadata(dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    // The serving certificate and key load as a matching pair.
    let files = mpi_webhook::tls::TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(mpi_webhook::tls::load_pair(&files))
        .unwrap();
}

/// The costliest body `serve` accepts: just under 7 MiB, a review of a TrainJob whose runtime does
/// not exist, so that its denial quotes the client's JSON (`spec.runtimeRef`), which parses the
/// whole object into a `serde_json::Value`, and whose object is made of the smallest JSON values
/// there are (`{}`), each of which becomes a map in that `Value`.
fn costliest_review() -> Vec<u8> {
    let head = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"big","kind":{"group":"trainer.kubeflow.org","version":"v1alpha1","kind":"TrainJob"},"resource":{"group":"trainer.kubeflow.org","version":"v1alpha1","resource":"trainjobs"},"operation":"CREATE","userInfo":{},"object":{"metadata":{"name":"big","namespace":"default"},"spec":{"runtimeRef":{"name":"no-such-runtime"},"filler":[{}"#;
    let tail = b"]}}}}";
    let mut body = head.to_vec();
    let room = mpi_webhook::serve::MAX_BODY_BYTES - head.len() - tail.len();
    body.extend(std::iter::repeat_n(*b",{}", room / 3).flatten());
    body.extend_from_slice(tail);
    body
}

/// Peak resident set of process `pid` in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// The bound on serve's memory under any burst of bodies (docs/operations.md "Bounded work"):
/// what `serve` holds idle, plus, for each of the reviews over 64 KiB it works on at once, its
/// body and the `Value` the costliest one parses into, plus a margin for the buffers of
/// everything still arriving.
const PEAK_RSS_BOUND: u64 = 384 * 1024 * 1024;

/// 64 bodies of 7 MiB at once. The async workers keep answering `/healthz` and small
/// reviews within a second meanwhile, every large body gets one of the documented answers before
/// its deadline (its review, a fail-closed denial, 408 or 503 busy), and serve's peak memory
/// stays under the stated bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_huge_bodies_stalls_nothing_and_stays_within_its_memory_bound() {
    init();
    let cwd = tempfile::tempdir().unwrap();
    let server = Server::start(cwd.path());
    let ca_pem = std::fs::read_to_string(cwd.path().join("certs/ca.crt")).unwrap();
    let client = client_config(&[&ca_pem]);
    let huge = costliest_review();
    assert!(huge.len() <= mpi_webhook::serve::MAX_BODY_BYTES);

    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (client, body) = (client.clone(), huge.clone());
        let addr = server.addr;
        burst.spawn(async move {
            request(addr, client, "POST", Route::ValidateTrainJob.path(), body).await
        });
    }
    // While the burst is being read and parsed: liveness and a small review, each within 1 s.
    let small = sample("trainjob-create-allowed.json");
    for _ in 0..5 {
        let healthz = tokio::time::timeout(
            Duration::from_secs(1),
            request(server.addr, client.clone(), "GET", "/healthz", Vec::new()),
        )
        .await
        .expect("/healthz answered within 1 s during the burst")
        .unwrap();
        assert_eq!(healthz.status, 200);
        let reply = tokio::time::timeout(
            Duration::from_secs(1),
            post(
                server.addr,
                client.clone(),
                Route::ValidateTrainJob.path(),
                small.clone(),
            ),
        )
        .await
        .expect("a small review answered within 1 s during the burst");
        assert_eq!(
            response_for(&reply, "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e01")["allowed"],
            true
        );
    }
    let mut answered = 0;
    while let Some(reply) = burst.join_next().await {
        let reply = reply.unwrap().unwrap();
        match reply.status {
            // Denied for its missing runtime, or (fail closed) because its deadline passed
            // before its turn ended.
            200 => {
                let response = response_for(&reply, "big");
                assert_eq!(response["allowed"], false);
                let message = response["status"]["message"].as_str().unwrap_or_default();
                assert!(
                    message == mpi_webhook::serve::TIMEOUT_MESSAGE
                        || message.contains(r#""no-such-runtime" not found"#),
                    "{message}"
                );
            }
            // Its turn came too late to read the whole body before the deadline.
            408 => assert_eq!(
                reply.json()["message"],
                "the request body did not arrive before the deadline"
            ),
            // Its turn did not come before the deadline.
            503 => assert_eq!(
                reply.json()["message"],
                "too many large reviews in progress; retry"
            ),
            other => panic!(
                "unexpected HTTP {other}: {}",
                String::from_utf8_lossy(&reply.body)
            ),
        }
        answered += 1;
    }
    assert_eq!(answered, 64);
    let peak = peak_rss(server.child.id());
    assert!(
        peak < PEAK_RSS_BOUND,
        "serve peaked at {} MiB, over the stated {} MiB",
        peak >> 20,
        PEAK_RSS_BOUND >> 20
    );
    println!("peak RSS during the burst: {} MiB", peak >> 20);
}
