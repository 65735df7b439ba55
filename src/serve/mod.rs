//! `mpi-webhook serve`, the process: choosing the object source and the certificate, binding the
//! HTTPS and metrics listeners, the background reload tasks, and graceful shutdown.
//!
//! What it is made of: [`router`] (the HTTPS routes and their handlers, with the body and deadline
//! bounds), [`accept`] (the TLS accept loop and the drain at shutdown), [`reload`] (the
//! certificate and `--objects-dir`, reloaded on change), [`supervise`] (restarting a background
//! task that dies), [`metrics`]. The probes, the `/metrics` route and the reloader are the
//! [shell](crate::shell)'s, shared with `reconcile`.

mod accept;
pub mod metrics;
pub mod reload;
pub mod router;
pub mod supervise;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::certs::{self, CertsError};
use crate::cli::ServeArgs;
use crate::objects::cluster::ClusterObjects;
use crate::objects::{LoadError, ObjectSource, Snapshot};
use crate::shell::probes::{self, Gate};
use crate::shell::{Reload, Reloader};
use crate::tls::{self, TlsError, TlsFiles};
use accept::Phase;
use metrics::Metrics;
use reload::{CertFiles, LiveSnapshot, ObjectsDir};
use supervise::supervise;

pub use crate::shell::Readiness;
pub use router::{AppState, MAX_BODY_BYTES, TIMEOUT_MESSAGE, router};

/// What `serve` waits for first: the object source loaded (or its caches synced).
pub const OBJECTS_LOADED: Gate = Gate("objects not loaded yet");
/// What `serve` waits for next: the TLS listener bound and accepting.
pub const LISTENING: Gate = Gate("TLS listener not bound yet");

/// Readiness of `serve`: ready once the objects are loaded and the TLS listener is bound,
/// until shutdown starts.
pub fn readiness() -> Readiness {
    Readiness::waiting_for(&[OBJECTS_LOADED, LISTENING])
}

/// `serve` failed to start or to shut down cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A given certificate or key file does not exist (never silently replaced by dev certs).
    #[error("{flag} {path}: no such file")]
    MissingFile {
        /// The flag that named it.
        flag: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// The certificate could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The dev certificate could not be created.
    #[error(transparent)]
    Certs(#[from] CertsError),
    /// `--objects-dir` is not a readable directory.
    #[error("--objects-dir {path}: {source}")]
    ObjectsDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The embedded runtimes do not load (a build of a broken tree).
    #[error("loading the shipped runtimes: {0}")]
    Shipped(#[source] LoadError),
    /// A Kubernetes configuration was found but no client could be built from it.
    #[error("Kubernetes client for {url}: {source}")]
    KubeClient {
        /// The API server URL.
        url: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A listener could not be bound.
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for the SIGTERM / SIGINT handlers failed.
    #[error("installing the signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// Everything `serve` needs besides the object source; built from [`ServeArgs`] by [`run`],
/// or directly by tests.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// HTTPS listener address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Plain-HTTP metrics listener address.
    pub metrics_listen: SocketAddr,
    /// The serving certificate files.
    pub tls: TlsFiles,
    /// How often the certificate files are checked for changes.
    pub tls_poll_interval: Duration,
    /// How often `--objects-dir` is checked for changes.
    pub objects_poll_interval: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// How long [`run`] keeps accepting after SIGTERM (`--shutdown-delay`).
    pub shutdown_delay: Duration,
    /// The policy's configuration (`--preflight-image`).
    pub policy: crate::admission::Options,
}

impl ServeOptions {
    /// Default poll interval of the certificate files and `--objects-dir`.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);
    /// Default bound on draining at shutdown: the apiserver's default webhook timeout, after
    /// which it has given up on the request anyway.
    pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

    /// Options with the default intervals.
    pub fn new(listen: SocketAddr, metrics_listen: SocketAddr, tls: TlsFiles) -> Self {
        Self {
            listen,
            metrics_listen,
            tls,
            tls_poll_interval: Self::DEFAULT_POLL_INTERVAL,
            objects_poll_interval: Self::DEFAULT_POLL_INTERVAL,
            shutdown_grace: Self::DEFAULT_SHUTDOWN_GRACE,
            shutdown_delay: Duration::ZERO,
            policy: crate::admission::Options::default(),
        }
    }
}

/// Where `serve` reads TrainJobs and runtimes from (`--objects-dir`, the cluster, or the shipped runtimes).
#[derive(Debug)]
pub enum ServeObjects {
    /// `--objects-dir DIR`, reloaded on change.
    Dir(PathBuf),
    /// The cluster's API server (kubeconfig or in-cluster configuration).
    Cluster(Box<kube::Config>),
    /// Neither: the runtimes shipped in `manifests/runtimes/`, embedded in the binary.
    Shipped,
}

/// **The one place where `serve` picks its object source**: `--objects-dir` if given, else the
/// cluster if a configuration can be inferred, else the shipped runtimes.
pub async fn objects_for_serve(args: &ServeArgs) -> ServeObjects {
    if let Some(dir) = &args.objects_dir {
        return ServeObjects::Dir(dir.clone());
    }
    match kube::Config::infer().await {
        Ok(config) => ServeObjects::Cluster(Box::new(config)),
        Err(e) => {
            tracing::debug!(error = %e, "no Kubernetes configuration");
            ServeObjects::Shipped
        }
    }
}

/// The certificate files from the flags, or the dev certificate under `certs/`.
///
/// # Errors
/// [`ServeError::MissingFile`] for a given path that does not exist; [`ServeError::Certs`] if the
/// dev certificate cannot be written.
pub fn tls_files(args: &ServeArgs) -> Result<TlsFiles, ServeError> {
    match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            for (flag, path) in [("--tls-cert-file", cert), ("--tls-key-file", key)] {
                if !path.exists() {
                    return Err(ServeError::MissingFile {
                        flag,
                        path: path.clone(),
                    });
                }
            }
            Ok(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            })
        }
        // clap makes the two flags require each other; only "neither" is left.
        _ => Ok(certs::dev_certs(Path::new(certs::DEV_CERTS_DIR))?),
    }
}

/// Runs `serve` until SIGTERM or SIGINT, then shuts down gracefully: `/readyz` fails at once,
/// connections are still accepted and answered (each told to close) for the shutdown delay, a
/// second signal skips the rest of it, then the listener closes and in-flight requests drain.
///
/// # Errors
/// [`ServeError`] when startup fails.
pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let mut signals = crate::shutdown::Signals::install().map_err(ServeError::Signal)?;
    let mut options = ServeOptions::new(args.listen, args.metrics_listen, tls_files(&args)?);
    options.shutdown_delay = args.shutdown_delay;
    let delay = options.shutdown_delay;
    options.policy = (&args.policy).into();
    let objects = objects_for_serve(&args).await;
    let running = start(options, objects).await?;
    let signal = signals.recv().await;
    running.begin_shutdown();
    if !delay.is_zero() {
        tracing::info!(
            signal,
            delay_seconds = delay.as_secs_f64(),
            "shutdown signal received: /readyz fails; still accepting for the shutdown delay, \
             every response closes its connection (HTTP/2: GOAWAY)"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => tracing::info!("shutdown delay over"),
            again = signals.recv() => {
                tracing::info!(signal = again, "second signal: skipping the rest of the shutdown delay");
            }
        }
    } else {
        tracing::info!(signal, "shutdown signal received");
    }
    tracing::info!("closing the listener; draining in-flight requests");
    running.shutdown().await;
    Ok(())
}

/// Starts serving with the objects from `objects` (see [`objects_for_serve`]).
///
/// # Errors
/// [`ServeError`] when the objects, the certificate or a listener cannot be set up.
pub async fn start(options: ServeOptions, objects: ServeObjects) -> Result<Running, ServeError> {
    let readiness = readiness();
    let metrics = Arc::new(Metrics::new());
    let live = Arc::new(LiveSnapshot::default());
    let mut tasks = Vec::new();
    match objects {
        ServeObjects::Dir(dir) => {
            if let Err(source) = std::fs::read_dir(&dir) {
                return Err(ServeError::ObjectsDir { path: dir, source });
            }
            tracing::info!(dir = %dir.display(), "reading objects from --objects-dir");
            let source = ObjectsDir {
                dir,
                metrics: metrics.clone(),
                readiness: readiness.clone(),
                gate: OBJECTS_LOADED,
            };
            let mut reloader = Reloader::new(source, Arc::clone(&live));
            // First load before serving, so a good directory is ready at once; a broken one
            // leaves /readyz at 503 until a fixed version is seen.
            reloader.check().await;
            let interval = options.objects_poll_interval;
            tasks.push(poll("objects-dir-reload", reloader, interval, &metrics));
        }
        ServeObjects::Shipped => {
            let snapshot = Snapshot::shipped_runtimes().map_err(ServeError::Shipped)?;
            tracing::info!(
                runtimes = snapshot.len(),
                "no --objects-dir and no Kubernetes configuration: serving with the shipped runtimes (manifests/runtimes/) only"
            );
            live.store(snapshot);
            readiness.pass(OBJECTS_LOADED);
        }
        ServeObjects::Cluster(config) => {
            return start_cluster(options, *config, readiness, metrics).await;
        }
    }
    let mut running = start_with(options, live, readiness, metrics).await?;
    running.tasks.extend(tasks);
    Ok(running)
}

/// Serves from watch-backed caches of the cluster; `/readyz` waits for their initial lists.
async fn start_cluster(
    options: ServeOptions,
    config: kube::Config,
    readiness: Readiness,
    metrics: Arc<Metrics>,
) -> Result<Running, ServeError> {
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|source| ServeError::KubeClient {
        url: url.clone(),
        source,
    })?;
    tracing::info!(%url, "reading objects from the cluster (watch-backed caches)");
    let (objects, driver) = ClusterObjects::watch(client, metrics.cache().clone());
    // The driver never ends: a failed watch reconnects with backoff inside it.
    let mut tasks = vec![tokio::spawn(driver)];
    let (synced, ready) = (objects.clone(), readiness.clone());
    tasks.push(tokio::spawn(async move {
        if synced.synced().await.is_ok() {
            tracing::info!("object caches synced");
            ready.pass(OBJECTS_LOADED);
        }
    }));
    let mut running = start_with(options, Arc::new(objects), readiness, metrics).await?;
    running.tasks.extend(tasks);
    Ok(running)
}

/// Starts serving with any object source. The caller sets `readiness` once `objects` is
/// loaded; this function marks the listener bound.
///
/// # Errors
/// [`ServeError`] when the certificate or a listener cannot be set up.
pub async fn start_with<S: ObjectSource + 'static>(
    options: ServeOptions,
    objects: Arc<S>,
    readiness: Readiness,
    metrics: Arc<Metrics>,
) -> Result<Running, ServeError> {
    let certs = Reloader::load(CertFiles {
        files: options.tls.clone(),
        metrics: metrics.clone(),
    })?;
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(certs.live())?));
    let bind = |what, addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { what, addr, source })
    };
    let https = bind("the HTTPS listener", options.listen).await?;
    let metrics_listener = bind("the metrics listener", options.metrics_listen).await?;
    let local = |l: &TcpListener, what, addr| {
        l.local_addr()
            .map_err(|source| ServeError::Bind { what, addr, source })
    };
    let https_addr = local(&https, "the HTTPS listener", options.listen)?;
    let metrics_addr = local(
        &metrics_listener,
        "the metrics listener",
        options.metrics_listen,
    )?;

    let mut tasks = vec![poll(
        "tls-reload",
        certs,
        options.tls_poll_interval,
        &metrics,
    )];
    let (shutdown_tx, shutdown_rx) = watch::channel(Phase::Serving);
    let mut metrics_shutdown = shutdown_rx.clone();
    tasks.push(probes::serve(
        "metrics listener",
        metrics_listener,
        probes::metrics_route(metrics.registry()),
        async move { accept::stop_requested(&mut metrics_shutdown).await },
    ));
    let state = Arc::new(
        AppState::new(objects, readiness.clone(), metrics).with_policy(options.policy.clone()),
    );
    let router = router::router(state);
    let grace = options.shutdown_grace;
    let accept = tokio::spawn(accept::accept_loop(
        https,
        acceptor,
        router,
        shutdown_rx,
        grace,
    ));
    readiness.pass(LISTENING);
    tracing::info!(%https_addr, %metrics_addr, "listening (HTTPS admission, plain-HTTP /metrics)");
    Ok(Running {
        https_addr,
        metrics_addr,
        readiness,
        shutdown_tx,
        accept,
        tasks,
    })
}

/// Polls `reloader` every `interval` under [`supervise`], keeping what it saw across restarts.
fn poll<R: Reload>(
    name: &'static str,
    reloader: Reloader<R>,
    interval: Duration,
    metrics: &Arc<Metrics>,
) -> JoinHandle<()> {
    let reloader = Arc::new(tokio::sync::Mutex::new(reloader));
    supervise(name, metrics.clone(), move || {
        Reloader::poll(Arc::clone(&reloader), interval)
    })
}

/// A started server.
#[derive(Debug)]
pub struct Running {
    https_addr: SocketAddr,
    metrics_addr: SocketAddr,
    readiness: Readiness,
    shutdown_tx: watch::Sender<Phase>,
    accept: JoinHandle<()>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// The bound HTTPS address.
    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
    }

    /// The bound metrics address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// First step of shutdown: `/readyz` answers 503 from now on, and every connection is told
    /// to close after its current response (HTTP/1 `Connection: close`, HTTP/2 GOAWAY), while
    /// new connections are still accepted and answered.
    pub fn begin_shutdown(&self) {
        self.readiness.set_draining();
        self.shutdown_tx.send_if_modified(|phase| {
            let moved = *phase < Phase::Closing;
            if moved {
                *phase = Phase::Closing;
            }
            moved
        });
    }

    /// Graceful shutdown: report not ready, stop accepting, let in-flight requests finish
    /// (bounded by the shutdown grace), stop the background tasks.
    pub async fn shutdown(self) {
        self.begin_shutdown();
        self.shutdown_tx.send_replace(Phase::Stopped);
        if let Err(e) = self.accept.await {
            tracing::error!(error = %e, "the accept loop failed");
        }
        for task in self.tasks {
            task.abort();
        }
        tracing::info!("shut down");
    }
}
