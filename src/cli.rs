//! Command-line configuration, parsed once (clap derive). Every flag also reads the environment
//! variable `MPI_WEBHOOK_<FLAG>`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::mpi::{objects_for, plan};

/// Kubeflow Trainer's MPI plugin as a Kubernetes admission webhook and reconciler.
#[derive(Debug, Parser)]
#[command(name = "mpi-webhook", version, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTPS admission webhook server.
    Serve(ServeArgs),
    /// Run the reconciler: SSH Secret and hostfile ConfigMap per MPI TrainJob.
    Reconcile(ReconcileArgs),
    /// Offline: answer one AdmissionReview as the server would.
    Review(ReviewArgs),
    /// Offline: print the Secret, ConfigMap (and NetworkPolicy, when on) the reconciler would
    /// create for each MPI TrainJob and JobSet-mode JobSet.
    Render(RenderArgs),
    /// Write a dev CA and a serving certificate and print the base64 caBundle.
    Certs(CertsArgs),
    /// The launcher's init container: wait until every hostfile host resolves and answers SSH.
    Preflight(PreflightArgs),
}

/// `serve` flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS listener.
    #[arg(long, env = "MPI_WEBHOOK_LISTEN", default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// PEM certificate (chain) file; reloaded when it changes. With neither this nor
    /// --tls-key-file, a dev CA and certificate are created under certs/.
    #[arg(long, env = "MPI_WEBHOOK_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key file; reloaded when it changes.
    #[arg(long, env = "MPI_WEBHOOK_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Address of the plain-HTTP Prometheus /metrics listener.
    #[arg(
        long,
        env = "MPI_WEBHOOK_METRICS_LISTEN",
        default_value = "127.0.0.1:9090"
    )]
    pub metrics_listen: SocketAddr,
    /// Read TrainJobs and runtimes from this directory instead of the cluster.
    #[arg(long, env = "MPI_WEBHOOK_OBJECTS_DIR")]
    pub objects_dir: Option<PathBuf>,
    /// After SIGTERM, keep accepting and answering for this long (e.g. `5s`) while /readyz
    /// fails and every response closes its connection, so endpoints and kube-proxy move traffic
    /// away before the listener closes. A second SIGTERM/SIGINT skips the rest.
    #[arg(
        long,
        env = "MPI_WEBHOOK_SHUTDOWN_DELAY",
        default_value = "0s",
        value_parser = humantime::parse_duration
    )]
    pub shutdown_delay: std::time::Duration,
    /// What the policy is configured with.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// The flags of the webhook's policy (`serve`, `review`), which become its [`plan::Options`]:
/// a new one is a field here and one line of the `From` below.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Image of the launcher pre-flight init container JobSet mode adds (`mpi-webhook
    /// preflight`); empty: no pre-flight. The shipped Deployment passes its own image.
    #[arg(long, env = "MPI_WEBHOOK_PREFLIGHT_IMAGE", default_value = "")]
    pub preflight_image: String,
}

impl From<&PolicyArgs> for plan::Options {
    fn from(args: &PolicyArgs) -> Self {
        plan::Options {
            preflight_image: args.preflight_image.clone(),
        }
    }
}

/// The flags of the reconciler's objects (`reconcile`, `render`), which become its
/// [`objects_for::Options`]: a new one is a field here and one line of the `From` below.
#[derive(Debug, Clone, Args)]
pub struct ObjectArgs {
    /// Create the NetworkPolicy `<name>-mpi` (ingress only from the job's own pods) for every MPI
    /// TrainJob, and for JobSet-mode JobSets without the `mpi-webhook.io/network-policy`
    /// annotation.
    #[arg(long, env = "MPI_WEBHOOK_NETWORK_POLICY_DEFAULT")]
    pub network_policy_default: bool,
}

impl From<&ObjectArgs> for objects_for::Options {
    fn from(args: &ObjectArgs) -> Self {
        objects_for::Options {
            network_policy_default: args.network_policy_default,
        }
    }
}

/// `reconcile` flags.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// Only reconcile while holding the coordination.k8s.io Lease.
    #[arg(long, env = "MPI_WEBHOOK_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Address of the plain-HTTP /metrics, /healthz and /readyz listener.
    #[arg(
        long,
        env = "MPI_WEBHOOK_METRICS_LISTEN",
        default_value = "127.0.0.1:9091"
    )]
    pub metrics_listen: SocketAddr,
    /// Name of the Lease used for leader election.
    #[arg(
        long,
        env = "MPI_WEBHOOK_LEASE_NAME",
        default_value = "mpi-webhook-reconciler"
    )]
    pub lease_name: String,
    /// Namespace of the Lease (default: the in-cluster namespace, else "default").
    #[arg(long, env = "MPI_WEBHOOK_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Identity of this replica in the Lease (default: the host name).
    #[arg(long, env = "MPI_WEBHOOK_LEASE_HOLDER")]
    pub lease_holder: Option<String>,
    /// What the objects are configured with.
    #[command(flatten)]
    pub objects: ObjectArgs,
}

/// `review` arguments.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("preflight_image", |arg| arg.help(
    "Image of the launcher pre-flight init container JobSet mode adds, as `serve` takes it; empty: no pre-flight",
)))]
pub struct ReviewArgs {
    /// Which webhook to act as.
    #[arg(value_enum)]
    pub verb: ReviewVerb,
    /// AdmissionReview request file (JSON or YAML); `-` reads standard input.
    pub file: PathBuf,
    /// Directory of TrainJob / TrainingRuntime / ClusterTrainingRuntime YAML or JSON files. A
    /// TrainJob-mode review needs it (the TrainJob and its runtime); a JobSet-mode review does not.
    #[arg(long, env = "MPI_WEBHOOK_OBJECTS_DIR")]
    pub objects_dir: Option<PathBuf>,
    /// What the policy is configured with, as `serve` takes it.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// `review validate` or `review mutate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReviewVerb {
    /// The validating webhook (TrainJob, TrainingRuntime, ClusterTrainingRuntime).
    Validate,
    /// The mutating webhook (JobSet).
    Mutate,
}

/// `render` flags.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("network_policy_default", |arg| arg.help(
    "Render the NetworkPolicy as `reconcile --network-policy-default` would create it",
)))]
pub struct RenderArgs {
    /// Directory of TrainJob / TrainingRuntime / ClusterTrainingRuntime and JobSet-mode JobSet
    /// YAML or JSON files.
    #[arg(long, env = "MPI_WEBHOOK_OBJECTS_DIR")]
    pub objects_dir: PathBuf,
    /// What the objects are configured with, as `reconcile` takes it.
    #[command(flatten)]
    pub objects: ObjectArgs,
}

/// `certs` flags.
#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key into.
    #[arg(long, env = "MPI_WEBHOOK_OUT", default_value = "certs")]
    pub out: PathBuf,
    /// DNS names of the serving certificate.
    #[arg(
        long = "dns",
        env = "MPI_WEBHOOK_DNS",
        value_delimiter = ',',
        default_value = "localhost"
    )]
    pub dns: Vec<String>,
    /// IP addresses of the serving certificate.
    #[arg(
        long = "ip",
        env = "MPI_WEBHOOK_IP",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    pub ip: Vec<IpAddr>,
}

/// `preflight` flags.
#[derive(Debug, Clone, Args)]
#[command(
    long_about = "Before mpirun starts: wait until every host of the hostfile resolves (this pod's own \
name included) and every host but this pod accepts TCP on the port and greets with an SSH banner, \
retrying with backoff until the timeout. No shell, no cluster access.",
    after_help = "Exit status: 0 every host is ready (one line per host on stdout); 1 a host is not \
ready at the timeout: stderr and the first line of the termination log name it and the last cause \
seen, e.g. `pi-node-0-1.pi: no DNS answer after 300 s`; 2 a usage or hostfile error."
)]
pub struct PreflightArgs {
    /// The hostfile the launcher reads (Open MPI `host slots=N` or Hydra `host:N` lines).
    #[arg(
        long,
        env = "MPI_WEBHOOK_HOSTFILE",
        default_value = "/etc/mpi/hostfile"
    )]
    pub hostfile: PathBuf,
    /// The workers' sshd port.
    #[arg(long, env = "MPI_WEBHOOK_PORT", default_value_t = 22, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// How long to keep trying, e.g. `300s`, `5m`.
    #[arg(long, env = "MPI_WEBHOOK_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// Where the failure line goes for Kubernetes to show as the termination message (written
    /// only when the file exists and is writable).
    #[arg(
        long,
        env = "MPI_WEBHOOK_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    pub termination_log: PathBuf,
}
