//! A real Kubernetes control plane for tests and benchmarks, as controller-runtime's envtest
//! runs one: etcd and kube-apiserver (and, on demand, kube-controller-manager with only the
//! garbage collector) from `KUBEBUILDER_ASSETS`, on free ports of 127.0.0.1.
//!
//! The apiserver authenticates static tokens ([`ADMIN`] in `system:masters`, and one token per
//! [`User`]), authorizes with `Node,RBAC`, runs its default admission plugins plus
//! OwnerReferencesPermissionEnforcement and PodSecurity, and serves a certificate signed by a CA of
//! its own ([`ControlPlane::ca_pem`]).
//!
//! Every process runs under a `sh` watchdog that reads a pipe from this process: when this process
//! exits for any reason (a panic, an abort, SIGKILL), the kernel closes the pipe and the watchdog
//! stops its child, so nothing outlives the test binary. The crate forbids `unsafe`, which rules
//! out `prctl(PR_SET_PDEATHSIG)`.
//!
//! One file, free of test-only modules, so a bench can include it with
//! `#[path = "../tests/envtest/control_plane.rs"] mod control_plane;`.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::OnceCell;

/// How long the control plane may take to become ready (5 to 15 s is usual on 2 cores).
/// The CRDs of every kind the product reads, from the upstream copies in the repository.
pub const CRDS: [&str; 4] = [
    "tests/fixtures/upstream/jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
    "tests/fixtures/upstream/kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    "manifests/overlays/crds-intel-mpich/upstream/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "manifests/overlays/crds-intel-mpich/upstream/trainer.kubeflow.org_trainingruntimes.yaml",
];

pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a CRD may take to be established.
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
/// Log lines printed when a start fails.
const LOG_TAIL: usize = 40;
/// How to get the assets, in the skip message.
pub const ASSETS_HINT: &str = "get them with `setup-envtest use 1.36.x -p path` and set \
     KUBEBUILDER_ASSETS to the directory it prints (or run scripts/install-test-deps.sh)";

/// A user the apiserver knows by a static token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    /// The bearer token.
    pub token: &'static str,
    /// The user name RBAC matches.
    pub name: &'static str,
    /// Its groups (besides `system:authenticated`, which the apiserver adds).
    pub groups: &'static [&'static str],
}

/// The cluster administrator.
pub const ADMIN: User = User {
    token: "envtest-admin-token",
    name: "envtest-admin",
    groups: &["system:masters"],
};

/// The shipped reconciler's ServiceAccount (`manifests/base/rbac.yaml`), as RBAC sees it: a
/// static token for the user name the ServiceAccount's tokens carry.
pub const RECONCILER: User = User {
    token: "envtest-reconciler-token",
    name: "system:serviceaccount:mpi-webhook:mpi-webhook",
    groups: &[
        "system:serviceaccounts",
        "system:serviceaccounts:mpi-webhook",
    ],
};

/// A user with no permissions at all, for denial tests.
pub const NOBODY: User = User {
    token: "envtest-nobody-token",
    name: "envtest-nobody",
    groups: &[],
};

/// Kubeflow Trainer's controller, for tests that bind it a role.
pub const TRAINER: User = User {
    token: "envtest-trainer-token",
    name: "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager",
    groups: &[
        "system:serviceaccounts",
        "system:serviceaccounts:kubeflow-system",
    ],
};

/// Kueue's controller manager (`tests/cluster/kueue.rs`), bound the release's roles.
pub const KUEUE: User = User {
    token: "envtest-kueue-token",
    name: "system:serviceaccount:kueue-system:kueue-controller-manager",
    groups: &[
        "system:serviceaccounts",
        "system:serviceaccounts:kueue-system",
    ],
};

/// A user for tests that bind it a role of their own (e.g. the shipped one minus a rule).
pub const RESTRICTED: User = User {
    token: "envtest-restricted-token",
    name: "envtest-restricted",
    groups: &[],
};

/// Every user of the token file.
pub const USERS: [User; 6] = [ADMIN, RECONCILER, NOBODY, TRAINER, KUEUE, RESTRICTED];

/// Where the assets are, or why there are none.
#[derive(Debug)]
pub enum Assets {
    /// A directory holding `etcd`, `kube-apiserver` (and maybe `kube-controller-manager`).
    Found(PathBuf),
    /// No assets configured: tests skip.
    Absent,
}

/// The assets directory: `KUBEBUILDER_ASSETS`, else the repository's `target/envtest` if it
/// holds the binaries (where `scripts/install-test-deps.sh` puts them).
///
/// # Errors
/// `KUBEBUILDER_ASSETS` names a directory without `etcd` or `kube-apiserver`: a misconfiguration
/// is a failure, never a skip.
pub fn assets() -> Result<Assets, String> {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        for binary in ["etcd", "kube-apiserver"] {
            if !dir.join(binary).is_file() {
                return Err(format!(
                    "KUBEBUILDER_ASSETS={} has no {binary}; {ASSETS_HINT}",
                    dir.display()
                ));
            }
        }
        return Ok(Assets::Found(dir));
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/envtest");
    if local.join("etcd").is_file() && local.join("kube-apiserver").is_file() {
        return Ok(Assets::Found(local));
    }
    Ok(Assets::Absent)
}

/// The version a Kubernetes binary built without a version stamp reports (the default of
/// `k8s.io/component-base/version`): the team's kube-apiserver says it. Clients that parse the
/// server's version refuse it (Kueue stops at start: "could not parse pre-release/metadata").
const UNSTAMPED_VERSION: &[u8] = b"v0.0.0-master+$Format:%H$";

/// `assets`' kube-apiserver; when it reports [`UNSTAMPED_VERSION`], a copy in
/// `target/envtest-stamped/` with the version stamped in as a release build's `-ldflags -X` does:
/// the version the kubelet beside it reports (the same tree, stamped), plus build metadata that
/// pads it to the same length. Made once per source binary.
///
/// # Errors
/// When the copy cannot be written.
fn stamped_apiserver(assets: &Path) -> Result<PathBuf, String> {
    let binary = assets.join("kube-apiserver");
    let version_of = |program: &Path| {
        Command::new(program)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let unstamped = String::from_utf8_lossy(UNSTAMPED_VERSION);
    if !version_of(&binary).is_some_and(|v| v.ends_with(&*unstamped)) {
        return Ok(binary);
    }
    // "Kubernetes v1.36.2" from the kubelet; without one the binary is used as it is.
    let Some(version) = version_of(&assets.join("kubelet"))
        .and_then(|v| v.strip_prefix("Kubernetes ").map(str::to_owned))
        .filter(|v| {
            v.starts_with('v') && !v.contains('+') && v.len() + 2 <= UNSTAMPED_VERSION.len()
        })
    else {
        return Ok(binary);
    };
    let stamp = format!(
        "{version}+{:0<1$}",
        "",
        UNSTAMPED_VERSION.len() - version.len() - 1
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/envtest-stamped");
    let stamped = dir.join("kube-apiserver");
    let io = |e: std::io::Error| format!("{}: {e}", stamped.display());
    let source = std::fs::metadata(&binary).map_err(io)?;
    let current = std::fs::metadata(&stamped)
        .and_then(|m| Ok(m.modified()? >= source.modified()? && m.len() == source.len()))
        .unwrap_or(false);
    if !current {
        let mut bytes = std::fs::read(&binary).map_err(io)?;
        let Some(at) = bytes
            .windows(UNSTAMPED_VERSION.len())
            .position(|w| w == UNSTAMPED_VERSION)
        else {
            return Ok(binary);
        };
        bytes[at..at + stamp.len()].copy_from_slice(stamp.as_bytes());
        std::fs::create_dir_all(&dir).map_err(io)?;
        let partial = dir.join(format!("kube-apiserver.{}", std::process::id()));
        std::fs::write(&partial, bytes).map_err(io)?;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
        std::fs::rename(&partial, &stamped).map_err(io)?;
    }
    Ok(stamped)
}

/// A child process under its watchdog; stopping it (or this process exiting) stops the child.
pub struct Process {
    name: String,
    watchdog: Child,
    /// The pipe the watchdog reads; closing it stops the child.
    lifeline: Option<ChildStdin>,
    log: PathBuf,
}

/// The watchdog: runs the command in the background, stops it (TERM, then KILL after 5 s) when
/// stdin reaches end-of-file, and exits with the child's status when the child exits first; then
/// removes `ENVTEST_CLEANUP_DIR` if set (etcd's watchdog removes the control plane's directory,
/// which a shared, never dropped, instance could not).
const WATCHDOG: &str = r#"exec 3<&0
"$@" </dev/null &
child=$!
( read -r _ <&3; kill -TERM "$child" 2>/dev/null; sleep 5; kill -KILL "$child" 2>/dev/null ) &
reader=$!
wait "$child"
status=$?
kill "$reader" 2>/dev/null
if [ -n "${ENVTEST_CLEANUP_DIR:-}" ]; then rm -rf "$ENVTEST_CLEANUP_DIR"; fi
exit "$status"
"#;

impl Process {
    /// Starts `program args` under a watchdog, stdout and stderr into `log`.
    ///
    /// # Errors
    /// The log cannot be created or `sh` cannot be started.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Result<Self, String> {
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(WATCHDOG)
            .arg(name)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err);
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut watchdog = command
            .spawn()
            .map_err(|e| format!("start {name} ({}): {e}", program.display()))?;
        let lifeline = watchdog.stdin.take();
        Ok(Self {
            name: name.to_owned(),
            watchdog,
            lifeline,
            log: log.to_owned(),
        })
    }

    /// The process's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log, LOG_TAIL)
    }

    /// `Some(status)` once the child has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.watchdog.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// Sends the child SIGTERM and waits for it: its exit status (the watchdog exits with it).
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus, String> {
        drop(self.lifeline.take());
        self.watchdog
            .wait()
            .map_err(|e| format!("wait for {}: {e}", self.name))
    }

    /// Stops the child and waits until it (and its watchdog) exited.
    pub fn stop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.watchdog.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of the file at `path`.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free TCP port on 127.0.0.1 (the kernel's pick; the listener is closed before use).
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port: {e}"))
}

/// What the control plane runs with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Start kube-controller-manager (garbage collector only) right away.
    pub garbage_collector: bool,
    /// More kube-apiserver flags (tests/cluster: the kubelet client certificate).
    pub extra_apiserver_args: Vec<String>,
}

/// etcd, kube-apiserver and optionally kube-controller-manager.
pub struct ControlPlane {
    assets: PathBuf,
    /// `assets`' kube-apiserver, or its version-stamped copy ([`stamped_apiserver`]).
    apiserver_binary: PathBuf,
    /// Holds data, certificates, kubeconfigs and logs; removed on drop (a shared instance is never
    /// dropped: its directory is removed by the etcd watchdog's shell when this process exits).
    dir: PathBuf,
    tempdir: Option<tempfile::TempDir>,
    url: String,
    port: u16,
    ca_pem: String,
    apiserver_args: Vec<String>,
    etcd: Mutex<Option<Process>>,
    apiserver: Mutex<Option<Process>>,
    controller_manager: Mutex<Option<Process>>,
    /// Serialises starting the controller manager.
    gc_started: OnceCell<()>,
}

static SHARED: OnceCell<Result<Option<ControlPlane>, String>> = OnceCell::const_new();
static SKIP_NOTICE: std::sync::Once = std::sync::Once::new();
static GC_SKIP_NOTICE: std::sync::Once = std::sync::Once::new();
/// What is missing when there are no assets.
const NO_ASSETS: &str =
    "no kube-apiserver and etcd (KUBEBUILDER_ASSETS is unset and target/envtest has none)";
static NAMESPACES: AtomicU32 = AtomicU32::new(0);

/// The control plane shared by every test of this binary, started on first use; `None` (after one
/// line on stderr) when there are no assets and `SKIP_TEST_SUITES` names `envtest`.
///
/// # Panics
/// When the assets are misconfigured, missing (unless `SKIP_TEST_SUITES` names `envtest`), or
/// the control plane does not start (with its log).
pub async fn shared() -> Option<&'static ControlPlane> {
    let result = SHARED
        .get_or_init(|| async {
            match assets()? {
                Assets::Absent => Ok(None),
                Assets::Found(dir) => {
                    let mut plane = ControlPlane::start_in(dir, Options::default()).await?;
                    // A shared instance is never dropped; leave its directory to the watchdog.
                    if let Some(tempdir) = plane.tempdir.take() {
                        let _ = tempdir.keep();
                    }
                    Ok(Some(plane))
                }
            }
        })
        .await;
    match result {
        Ok(Some(plane)) => Some(plane),
        Ok(None) => {
            crate::prerequisites::skip_or_fail("envtest", NO_ASSETS, ASSETS_HINT, &SKIP_NOTICE);
            None
        }
        Err(e) => panic!("envtest control plane: {e}"),
    }
}

impl ControlPlane {
    /// A control plane of its own (for a test that restarts it), from the configured assets;
    /// `None` when there are none and `SKIP_TEST_SUITES` names `envtest`.
    ///
    /// # Errors
    /// It does not start.
    ///
    /// # Panics
    /// No assets, unless `SKIP_TEST_SUITES` names `envtest`.
    pub async fn start(options: Options) -> Result<Option<Self>, String> {
        match assets()? {
            Assets::Absent => {
                crate::prerequisites::skip_or_fail("envtest", NO_ASSETS, ASSETS_HINT, &SKIP_NOTICE);
                Ok(None)
            }
            Assets::Found(dir) => Ok(Some(Self::start_in(dir, options).await?)),
        }
    }

    async fn start_in(assets: PathBuf, options: Options) -> Result<Self, String> {
        let tempdir = tempfile::Builder::new()
            .prefix("envtest-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let dir = tempdir.path().to_owned();
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");

        let certs = mpi_webhook::certs::generate(
            &["localhost".to_owned()],
            &[std::net::IpAddr::V4(Ipv4Addr::LOCALHOST)],
        )
        .map_err(|e| format!("serving certificate: {e}"))?;
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(|e| io("pki", e))?;
        std::fs::write(pki.join("ca.crt"), &certs.ca_cert_pem).map_err(|e| io("ca.crt", e))?;
        std::fs::write(pki.join("serving.crt"), &certs.cert_pem).map_err(|e| io("crt", e))?;
        std::fs::write(pki.join("serving.key"), &certs.key_pem).map_err(|e| io("key", e))?;
        let sa_key = rcgen::KeyPair::generate().map_err(|e| format!("sa key: {e}"))?;
        std::fs::write(pki.join("sa.key"), sa_key.serialize_pem()).map_err(|e| io("sa", e))?;
        std::fs::write(pki.join("sa.pub"), sa_key.public_key_pem()).map_err(|e| io("sa", e))?;
        let tokens: String = USERS
            .iter()
            .map(|u| {
                format!(
                    "{},{},{},\"{}\"\n",
                    u.token,
                    u.name,
                    u.name,
                    u.groups.join(",")
                )
            })
            .collect();
        std::fs::write(pki.join("tokens.csv"), tokens).map_err(|e| io("tokens", e))?;

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let etcd_args: Vec<String> = [
            "--name=envtest".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=envtest=http://127.0.0.1:{etcd_peer}"),
            "--log-level=warn".to_owned(),
        ]
        .into();
        let etcd = Process::spawn(
            "etcd",
            &assets.join("etcd"),
            &etcd_args,
            &[("ENVTEST_CLEANUP_DIR", &dir.display().to_string())],
            &dir.join("etcd.log"),
        )?;

        let port = free_port()?;
        let p = |name: &str| pki.join(name).display().to_string();
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", dir.join("cert-dir").display()),
            format!("--tls-cert-file={}", p("serving.crt")),
            format!("--tls-private-key-file={}", p("serving.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement,PodSecurity"
                .to_owned(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://127.0.0.1".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--v=1".to_owned(),
        ];
        apiserver_args.extend(options.extra_apiserver_args.iter().cloned());

        let plane = Self {
            apiserver_binary: stamped_apiserver(&assets)?,
            assets,
            dir: dir.clone(),
            tempdir: Some(tempdir),
            url: format!("https://127.0.0.1:{port}"),
            port,
            ca_pem: certs.ca_cert_pem,
            apiserver_args,
            etcd: Mutex::new(Some(etcd)),
            apiserver: Mutex::new(None),
            controller_manager: Mutex::new(None),
            gc_started: OnceCell::new(),
        };
        plane.write_kubeconfig(&dir.join("admin.kubeconfig"), ADMIN)?;
        plane.start_apiserver().await?;
        if options.garbage_collector {
            plane.start_garbage_collector().await?;
        }
        Ok(plane)
    }

    /// Starts kube-apiserver (again, after [`stop_apiserver`](Self::stop_apiserver)) and waits
    /// for `/readyz`.
    ///
    /// # Errors
    /// It exits or is not ready within [`START_TIMEOUT`]; the message holds its last log lines.
    pub async fn start_apiserver(&self) -> Result<(), String> {
        let log = self.dir.join("kube-apiserver.log");
        // A restart appends to the log of the first start.
        if log.exists() {
            let old = std::fs::read(&log).unwrap_or_default();
            let _ = std::fs::write(self.dir.join("kube-apiserver.1.log"), old);
        }
        let process = Process::spawn(
            "kube-apiserver",
            &self.apiserver_binary,
            &self.apiserver_args,
            &[],
            &log,
        )?;
        *lock(&self.apiserver) = Some(process);
        let deadline = Instant::now() + START_TIMEOUT;
        let client = self.client(ADMIN).map_err(|e| self.failed(&e))?;
        loop {
            if let Some(status) = lock(&self.apiserver).as_mut().and_then(Process::exited) {
                return Err(self.failed(&format!("kube-apiserver exited ({status})")));
            }
            if let Some(status) = lock(&self.etcd).as_mut().and_then(Process::exited) {
                return Err(self.failed(&format!("etcd exited ({status})")));
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            if let Ok(body) = client.request_text(request).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failed(&format!(
                    "kube-apiserver not ready within {START_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stops kube-apiserver (etcd keeps the data) and waits until it exited.
    pub fn stop_apiserver(&self) {
        if let Some(mut process) = lock(&self.apiserver).take() {
            process.stop();
        }
    }

    /// A start-up failure with the processes' last log lines.
    fn failed(&self, what: &str) -> String {
        format!(
            "{what}\n--- last lines of kube-apiserver.log ---\n{}\n--- last lines of etcd.log ---\n{}",
            log_tail(&self.dir.join("kube-apiserver.log"), LOG_TAIL),
            log_tail(&self.dir.join("etcd.log"), LOG_TAIL / 2),
        )
    }

    /// Starts kube-controller-manager with only the garbage collector, once; later calls wait for
    /// the first.
    ///
    /// # Errors
    /// No `kube-controller-manager` in the assets, or it exits at once.
    pub async fn start_garbage_collector(&self) -> Result<(), String> {
        self.gc_started
            .get_or_try_init(|| async {
                let binary = self.assets.join("kube-controller-manager");
                if !binary.is_file() {
                    return Err(format!(
                        "{} has no kube-controller-manager (the garbage collector)",
                        self.assets.display()
                    ));
                }
                let kubeconfig = self.dir.join("admin.kubeconfig").display().to_string();
                let args = vec![
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    "--controllers=garbagecollector".to_owned(),
                    "--secure-port=0".to_owned(),
                    "--leader-elect=false".to_owned(),
                    "--v=1".to_owned(),
                ];
                let log = self.dir.join("kube-controller-manager.log");
                let mut process =
                    Process::spawn("kube-controller-manager", &binary, &args, &[], &log)?;
                // It has nothing to report ready on (no secure port); a quick exit is a failure.
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Some(status) = process.exited() {
                    return Err(format!(
                        "kube-controller-manager exited ({status})\n{}",
                        process.log_tail()
                    ));
                }
                *lock(&self.controller_manager) = Some(process);
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Starts the garbage collector; `false` when the assets have no `kube-controller-manager`
    /// (`setup-envtest` does not ship it) and `SKIP_TEST_SUITES` names `garbage-collector`.
    ///
    /// # Panics
    /// When it does not start, or is missing and not opted out of.
    pub async fn garbage_collector_or_skip(&self) -> bool {
        if !self.assets.join("kube-controller-manager").is_file() {
            crate::prerequisites::skip_or_fail(
                "garbage-collector",
                &format!("no kube-controller-manager in {}", self.assets.display()),
                "setup-envtest does not ship it: scripts/install-test-deps.sh downloads it beside \
                 the others",
                &GC_SKIP_NOTICE,
            );
            return false;
        }
        if let Err(e) = self.start_garbage_collector().await {
            panic!("envtest garbage collector: {e}");
        }
        true
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The apiserver's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA (PEM) the apiserver's serving certificate is signed by.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The control plane's directory (logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kubeconfig for `user`, as YAML.
    pub fn kubeconfig_yaml(&self, user: User) -> String {
        let ca = base64_encode(self.ca_pem.as_bytes());
        json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "envtest",
            "clusters": [{"name": "envtest",
                          "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user.name, "user": {"token": user.token}}],
            "contexts": [{"name": "envtest",
                          "context": {"cluster": "envtest", "user": user.name}}],
        })
        .to_string()
    }

    /// Writes a kubeconfig for `user` to `path` (for spawned binaries' `KUBECONFIG`).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_kubeconfig(&self, path: &Path, user: User) -> Result<PathBuf, String> {
        std::fs::write(path, self.kubeconfig_yaml(user))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path.to_owned())
    }

    /// A client authenticated as `user`. Make one per test: a client belongs to the Tokio runtime
    /// it was first used on.
    ///
    /// # Errors
    /// The kubeconfig is refused by kube.
    pub fn client(&self, user: User) -> Result<Client, String> {
        let kubeconfig =
            Kubeconfig::from_yaml(&self.kubeconfig_yaml(user)).map_err(|e| e.to_string())?;
        let config = futures::executor::block_on(Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions::default(),
        ))
        .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    }

    /// A client as the cluster administrator.
    ///
    /// # Panics
    /// When kube refuses the generated kubeconfig.
    pub fn admin(&self) -> Client {
        self.client(ADMIN).expect("an admin client")
    }

    /// A client as the administrator impersonating `user` in `groups` (e.g.
    /// `system:serviceaccount:NS:NAME`).
    ///
    /// # Errors
    /// The kubeconfig is refused by kube.
    pub fn impersonating(&self, user: &str, groups: &[&str]) -> Result<Client, String> {
        let mut kubeconfig =
            Kubeconfig::from_yaml(&self.kubeconfig_yaml(ADMIN)).map_err(|e| e.to_string())?;
        for auth in &mut kubeconfig.auth_infos {
            if let Some(info) = auth.auth_info.as_mut() {
                info.impersonate = Some(user.to_owned());
                info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
            }
        }
        let config = futures::executor::block_on(Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions::default(),
        ))
        .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    }

    /// A new namespace `PREFIX-N` with a `default` ServiceAccount (there is no controller to make
    /// it, and the ServiceAccount admission plugin wants it for Pods).
    ///
    /// # Panics
    /// When the apiserver refuses.
    pub async fn namespace(&self, prefix: &str) -> String {
        let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        self.create_namespace(&name).await;
        name
    }

    /// Creates namespace `name` (and its `default` ServiceAccount) unless it exists.
    ///
    /// # Panics
    /// When the apiserver refuses.
    pub async fn create_namespace(&self, name: &str) {
        let client = self.admin();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Namespace");
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(client, name);
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("an SA");
        match accounts.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create ServiceAccount default in {name}: {e}"),
        }
    }

    /// Applies the CRDs in the YAML files at `paths` (relative to the repository root, e.g.
    /// `tests/fixtures/upstream/...`) and waits until each is established. Safe to call from
    /// many tests: applying the same CRD again is a no-op.
    ///
    /// # Panics
    /// When a file is unreadable, the apiserver refuses it, or it is not established in time.
    pub async fn apply_crds(&self, paths: &[&str]) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin());
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut names = Vec::new();
        for path in paths {
            let text = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("read {path}: {e}"));
            for crd in serde_saphyr::from_multiple::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("parse {path}: {e}"))
            {
                if crd.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
                    continue;
                }
                let name = crd["metadata"]["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{path}: a CRD without a name"))
                    .to_owned();
                crds.patch(
                    &name,
                    &PatchParams::apply("envtest").force(),
                    &Patch::Apply(&crd),
                )
                .await
                .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
                names.push(name);
            }
        }
        let deadline = Instant::now() + CRD_TIMEOUT;
        for name in names {
            loop {
                let crd = crds
                    .get(&name)
                    .await
                    .unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "CRD {name} not established within {CRD_TIMEOUT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The controller manager and the apiserver first, so neither logs etcd going away.
        if let Some(mut p) = lock(&self.controller_manager).take() {
            p.stop();
        }
        self.stop_apiserver();
        if let Some(mut p) = lock(&self.etcd).take() {
            p.stop();
        }
    }
}

/// The mutex's guard, poisoned or not (a panicking test must not wedge the others).
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The address `https://127.0.0.1:PORT` of a free port, for a webhook server to listen on.
pub fn free_loopback_addr() -> Result<SocketAddr, String> {
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)))
}
