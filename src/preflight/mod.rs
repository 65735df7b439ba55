//! `mpi-webhook preflight`: the launcher pod's init container. Before `mpirun` starts, every host
//! of the hostfile must resolve (the launcher's own name included: kubeflow/trainer PR #3783) and
//! every host that runs sshd must accept TCP on the port and greet with an `SSH-` banner. It
//! retries with backoff until all are ready or the timeout passes, and then names the host and
//! the cause in one line instead of the launcher's cryptic failure.
//!
//! The pure parts are here and in [`hostfile`] and [`schedule`]; [`run`] is the I/O shell.

pub mod hostfile;
pub mod schedule;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::io::AsyncReadExt as _;

use crate::cli::PreflightArgs;

/// At most this many hosts are checked at once: one connection each, so the pre-flight's sockets
/// and memory stay bounded on a JobSet of any size.
pub const MAX_CONCURRENT_HOSTS: usize = 32;
/// The most of a server's greeting read while looking for the banner (RFC 4253 allows lines
/// before it; OpenSSH sends the banner first).
const MAX_GREETING_BYTES: usize = 1024;

/// What must be true of one host before the launcher may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The name as the launcher will use it.
    pub name: String,
    /// Must it accept TCP on the port and greet with `SSH-`? Every host but the launcher itself,
    /// whose sshd (in its main container) has not started while an init container runs.
    pub runs_sshd: bool,
}

/// The targets for a hostfile's `hosts`, seen from the pod whose hostname is `own_hostname`.
/// The launcher is the host whose first DNS label is its hostname; when the hostfile does not
/// list it, its name is still checked, as `<hostname>.<the domain of the hostfile's hosts>`
/// (that is the name the workers' daemons call back to).
pub fn targets(hosts: &[String], own_hostname: &str) -> Vec<Target> {
    let own = own_hostname.split('.').next().unwrap_or("");
    let is_own = |h: &str| !own.is_empty() && h.split('.').next() == Some(own);
    let mut out: Vec<Target> = hosts
        .iter()
        .map(|h| Target {
            name: h.clone(),
            runs_sshd: !is_own(h),
        })
        .collect();
    if !own.is_empty() && !hosts.iter().any(|h| is_own(h)) {
        let domain = hosts
            .iter()
            .filter(|h| h.parse::<std::net::IpAddr>().is_err())
            .find_map(|h| h.split_once('.').map(|(_, d)| d));
        out.push(Target {
            name: match domain {
                Some(d) => format!("{own}.{d}"),
                None => own.to_string(),
            },
            runs_sshd: false,
        });
    }
    out
}

/// Why a host is not ready (the last thing seen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The name does not resolve (no record, or the lookup failed or timed out).
    NoDnsAnswer,
    /// Nothing listens on the port.
    ConnectionRefused,
    /// The connect got no answer within the step budget.
    ConnectTimeout,
    /// Another connect error.
    Connect(String),
    /// Connected, but nothing arrived within the step budget.
    NoBanner,
    /// Connected, but the server closed the connection without a banner.
    ClosedBeforeBanner,
    /// Connected, but the server greeted with something else.
    NotSsh(String),
}

impl Cause {
    /// Is it about the port (said as `host:port`) rather than the name?
    fn on_port(&self) -> bool {
        !matches!(self, Cause::NoDnsAnswer)
    }

    fn describe(&self) -> String {
        match self {
            Cause::NoDnsAnswer => "no DNS answer".to_string(),
            Cause::ConnectionRefused => "connection refused".to_string(),
            Cause::ConnectTimeout => "no answer to TCP connect".to_string(),
            Cause::Connect(e) => format!("cannot connect ({e})"),
            Cause::NoBanner => "no SSH banner".to_string(),
            Cause::ClosedBeforeBanner => "connection closed before the SSH banner".to_string(),
            Cause::NotSsh(greeting) => format!("not an SSH server (it sent {greeting:?})"),
        }
    }
}

/// The failure line: the host (with the port when the cause is about the port) and the last
/// cause seen, e.g. `pi-node-0-1.pi: no DNS answer after 300 s`.
pub fn failure_line(host: &str, port: u16, cause: &Cause, timeout: Duration) -> String {
    let who = if cause.on_port() {
        format!("{host}:{port}")
    } else {
        host.to_string()
    };
    format!(
        "{who}: {} after {}",
        cause.describe(),
        schedule::seconds(timeout)
    )
}

/// The success line of one host.
pub fn ready_line(target: &Target, port: u16, took: Duration) -> String {
    if target.runs_sshd {
        format!(
            "{}:{port}: resolves, SSH answers (after {})",
            target.name,
            schedule::seconds(took)
        )
    } else {
        format!(
            "{}: resolves (this pod; its sshd starts with the main container) (after {})",
            target.name,
            schedule::seconds(took)
        )
    }
}

/// The outcome of one host: ready after some time, or the last cause seen.
type HostOutcome = Result<Duration, Cause>;

/// One attempt at one host; `started`/`timeout` bound every step.
async fn attempt(
    target: &Target,
    port: u16,
    started: Instant,
    timeout: Duration,
) -> Result<(), Cause> {
    let budget = || schedule::step_budget(started.elapsed(), timeout);
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(
        budget(),
        tokio::net::lookup_host((target.name.as_str(), port)),
    )
    .await
    {
        Ok(Ok(addrs)) => addrs.collect(),
        _ => return Err(Cause::NoDnsAnswer),
    };
    if addrs.is_empty() {
        return Err(Cause::NoDnsAnswer);
    }
    if !target.runs_sshd {
        return Ok(());
    }
    let mut last = Cause::ConnectTimeout;
    for addr in addrs {
        let stream =
            match tokio::time::timeout(budget(), tokio::net::TcpStream::connect(addr)).await {
                Err(_) => {
                    last = Cause::ConnectTimeout;
                    continue;
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    last = Cause::ConnectionRefused;
                    continue;
                }
                Ok(Err(e)) => {
                    last = Cause::Connect(e.to_string());
                    continue;
                }
                Ok(Ok(s)) => s,
            };
        return match tokio::time::timeout(budget(), read_banner(stream)).await {
            Err(_) => Err(Cause::NoBanner),
            Ok(r) => r,
        };
    }
    Err(last)
}

/// Read the greeting up to its first line that starts with `SSH-` (at most
/// [`MAX_GREETING_BYTES`]).
async fn read_banner(mut stream: tokio::net::TcpStream) -> Result<(), Cause> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        if banner_seen(&buf) {
            return Ok(());
        }
        if buf.len() >= MAX_GREETING_BYTES {
            return Err(Cause::NotSsh(greeting_excerpt(&buf)));
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) if buf.is_empty() => return Err(Cause::ClosedBeforeBanner),
            Ok(0) | Err(_) => return Err(Cause::NotSsh(greeting_excerpt(&buf))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Does the greeting so far contain a line starting with `SSH-`?
fn banner_seen(buf: &[u8]) -> bool {
    buf.starts_with(b"SSH-") || buf.windows(5).any(|w| w == b"\nSSH-")
}

fn greeting_excerpt(buf: &[u8]) -> String {
    String::from_utf8_lossy(buf)
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(60)
        .collect()
}

/// Retry one host until it is ready or the timeout passes.
async fn check(target: &Target, port: u16, started: Instant, timeout: Duration) -> HostOutcome {
    let mut tries = 0u32;
    loop {
        let result = attempt(target, port, started, timeout).await;
        let cause = match result {
            Ok(()) => return Ok(started.elapsed()),
            Err(cause) => cause,
        };
        match schedule::next_wait(tries, started.elapsed(), timeout) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => return Err(cause),
        }
        tries = tries.saturating_add(1);
    }
}

/// What a run ends with.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// Every host is ready.
    Ready,
    /// A host is not ready; the line names it.
    NotReady(String),
    /// The hostfile cannot be used (usage error, exit 2).
    BadHostfile(String),
}

impl Exit {
    /// The process exit code: 0 ready, 1 a host not ready, 2 a hostfile error.
    pub fn code(&self) -> u8 {
        match self {
            Exit::Ready => 0,
            Exit::NotReady(_) => 1,
            Exit::BadHostfile(_) => 2,
        }
    }
}

/// Read at most one byte more than the limit, so that a larger file is told apart without
/// reading it all.
fn read_hostfile(path: &Path) -> Result<Vec<String>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    let limit = u64::try_from(hostfile::MAX_HOSTFILE_BYTES + 1).unwrap_or(u64::MAX);
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    hostfile::hosts(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The pod's hostname: `HOSTNAME`, which kubelet sets to it in every container, else the kernel's.
fn own_hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Run the pre-flight: one line per host on stdout when ready; on failure the line naming the
/// first host that is not ready (hostfile order) on stderr and as the first line of the
/// termination log (when it can be written).
pub async fn run(args: &PreflightArgs) -> Exit {
    let exit = check_all(args).await;
    if let Exit::NotReady(line) | Exit::BadHostfile(line) = &exit {
        eprintln!("preflight: {line}");
        // Kubernetes shows this file's content as the container's termination message
        // (`kubectl describe pod`). Opened without create: where it does not exist, nothing is
        // written.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&args.termination_log)
        {
            use std::io::Write as _;
            let _ = writeln!(f, "{line}");
        }
    }
    exit
}

async fn check_all(args: &PreflightArgs) -> Exit {
    let hosts = match read_hostfile(&args.hostfile) {
        Ok(h) => h,
        Err(e) => return Exit::BadHostfile(e),
    };
    let targets = targets(&hosts, &own_hostname());
    let started = Instant::now();
    let (port, timeout) = (args.port, args.timeout);
    let outcomes: Vec<HostOutcome> = futures::stream::iter(targets.iter())
        .map(|t| check(t, port, started, timeout))
        .buffered(MAX_CONCURRENT_HOSTS)
        .collect()
        .await;
    let mut first_failure = None;
    for (t, outcome) in targets.iter().zip(&outcomes) {
        match outcome {
            Ok(took) => println!("preflight: {}", ready_line(t, port, *took)),
            Err(cause) => {
                first_failure.get_or_insert_with(|| failure_line(&t.name, port, cause, timeout));
            }
        }
    }
    match first_failure {
        None => Exit::Ready,
        Some(line) => Exit::NotReady(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn t(name: &str, runs_sshd: bool) -> Target {
        Target {
            name: name.to_string(),
            runs_sshd,
        }
    }

    #[test]
    fn the_launcher_listed_in_the_hostfile_is_resolved_only() {
        let hosts = names(&["pi-node-0-0.pi", "pi-node-0-1.pi", "pi-launcher-0-0.pi"]);
        assert_eq!(
            targets(&hosts, "pi-launcher-0-0"),
            vec![
                t("pi-node-0-0.pi", true),
                t("pi-node-0-1.pi", true),
                t("pi-launcher-0-0.pi", false)
            ]
        );
        // Hydra's launcher line is the bare pod name (Decision 17).
        let hosts = names(&["pi-node-0-0.pi", "pi-launcher-0-0"]);
        assert_eq!(
            targets(&hosts, "pi-launcher-0-0"),
            vec![t("pi-node-0-0.pi", true), t("pi-launcher-0-0", false)]
        );
    }

    #[test]
    fn the_launcher_not_in_the_hostfile_is_resolved_in_the_hosts_domain() {
        let hosts = names(&["pi-node-0-0.pi", "pi-node-0-1.pi"]);
        assert_eq!(
            targets(&hosts, "pi-launcher-0-0"),
            vec![
                t("pi-node-0-0.pi", true),
                t("pi-node-0-1.pi", true),
                t("pi-launcher-0-0.pi", false)
            ]
        );
        assert_eq!(
            targets(&names(&["a", "b"]), "l"),
            vec![t("a", true), t("b", true), t("l", false)]
        );
        // An address has no domain.
        assert_eq!(
            targets(&names(&["127.0.0.1", "n.pi"]), "l"),
            vec![t("127.0.0.1", true), t("n.pi", true), t("l.pi", false)]
        );
        // No hostname known: only the hostfile's hosts.
        assert_eq!(targets(&names(&["a"]), ""), vec![t("a", true)]);
    }

    #[test]
    fn a_longer_name_with_the_same_first_label_is_the_launcher() {
        assert_eq!(
            targets(
                &names(&["pi-node-0-0.pi.ns.svc.cluster.local"]),
                "pi-node-0-0"
            ),
            vec![t("pi-node-0-0.pi.ns.svc.cluster.local", false)]
        );
        // A prefix of the hostname is another host.
        assert_eq!(
            targets(&names(&["pi-node-0-1.pi"]), "pi-node-0-10"),
            vec![t("pi-node-0-1.pi", true), t("pi-node-0-10.pi", false)]
        );
    }

    #[test]
    fn failure_lines_name_the_host_and_the_cause() {
        let five_min = Duration::from_secs(300);
        let line = |host, cause| failure_line(host, 2222, &cause, five_min);
        assert_eq!(
            line("pi-node-0-1.pi", Cause::NoDnsAnswer),
            "pi-node-0-1.pi: no DNS answer after 300 s"
        );
        assert_eq!(
            line("pi-node-0-0.pi", Cause::ConnectionRefused),
            "pi-node-0-0.pi:2222: connection refused after 300 s"
        );
        assert_eq!(
            line("h", Cause::ConnectTimeout),
            "h:2222: no answer to TCP connect after 300 s"
        );
        assert_eq!(
            line(
                "h",
                Cause::Connect("Network is unreachable (os error 101)".into())
            ),
            "h:2222: cannot connect (Network is unreachable (os error 101)) after 300 s"
        );
        assert_eq!(
            line("h", Cause::NoBanner),
            "h:2222: no SSH banner after 300 s"
        );
        assert_eq!(
            line("h", Cause::ClosedBeforeBanner),
            "h:2222: connection closed before the SSH banner after 300 s"
        );
        assert_eq!(
            line("h", Cause::NotSsh("HTTP/1.1 400 Bad Request".into())),
            "h:2222: not an SSH server (it sent \"HTTP/1.1 400 Bad Request\") after 300 s"
        );
    }

    #[test]
    fn ready_lines() {
        assert_eq!(
            ready_line(&t("pi-node-0-0.pi", true), 22, Duration::from_millis(1300)),
            "pi-node-0-0.pi:22: resolves, SSH answers (after 1.3 s)"
        );
        assert_eq!(
            ready_line(&t("pi-launcher-0-0.pi", false), 22, Duration::ZERO),
            "pi-launcher-0-0.pi: resolves (this pod; its sshd starts with the main container) (after 0 s)"
        );
    }

    #[test]
    fn banners() {
        assert!(banner_seen(b"SSH-2.0-OpenSSH_9.2p1\r\n"));
        assert!(banner_seen(b"hello\r\nSSH-2.0-x"));
        assert!(!banner_seen(b"SSH"));
        assert!(!banner_seen(b"HTTP/1.1 400\r\n"));
        assert_eq!(
            greeting_excerpt(b"HTTP/1.1 400 Bad\r\nx"),
            "HTTP/1.1 400 Bad"
        );
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Exit::Ready.code(), 0);
        assert_eq!(Exit::NotReady(String::new()).code(), 1);
        assert_eq!(Exit::BadHostfile(String::new()).code(), 2);
    }
}
