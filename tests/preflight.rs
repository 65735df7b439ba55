//! `mpi-webhook preflight` as the launcher's init container runs it: the real binary against
//! hosts on 127.0.0.1 (a tiny server that greets like sshd, a closed port, something that is not
//! sshd) and names that cannot resolve. Exit codes, stdout, stderr and the termination log are
//! asserted; the times in the lines are replaced by `T` (tests do not assert wall-clock times).

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use pretty_assertions::assert_eq;

/// A server on 127.0.0.1 that sends `greeting` to every connection and closes it.
fn greeter(greeting: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn): std::io::Result<TcpStream> = conn else {
                continue;
            };
            let _ = conn.write_all(greeting);
        }
    });
    port
}

fn fake_sshd() -> u16 {
    greeter(b"SSH-2.0-OpenSSH_9.2p1 fake\r\n")
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    termination_log: String,
}

/// Run `preflight` on a hostfile with `content`, as the pod named `hostname`, with `args`.
fn preflight(content: &[u8], hostname: &str, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("hostfile");
    std::fs::write(&hostfile, content).expect("hostfile");
    let log = dir.path().join("termination-log");
    // Kubernetes creates the file before the container starts; the pre-flight never creates it.
    std::fs::write(&log, "").expect("termination log");
    let out = command(&hostfile, &log, hostname)
        .args(args)
        .output()
        .expect("run");
    finish(out, &log)
}

fn command(hostfile: &Path, log: &Path, hostname: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MPI_WEBHOOK_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("preflight")
        .arg("--hostfile")
        .arg(hostfile)
        .arg("--termination-log")
        .arg(log)
        .env("HOSTNAME", hostname)
        .env("RUST_LOG", "off");
    cmd
}

fn finish(out: Output, log: &Path) -> Run {
    Run {
        code: out.status.code(),
        stdout: without_times(&String::from_utf8_lossy(&out.stdout)),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        termination_log: std::fs::read_to_string(log).unwrap_or_default(),
    }
}

/// `(after 0.3 s)` -> `(after T)`.
fn without_times(s: &str) -> String {
    s.lines()
        .map(|l| match l.rfind("(after ") {
            Some(i) if l.ends_with(" s)") => format!("{}(after T)\n", &l[..i]),
            _ => format!("{l}\n"),
        })
        .collect()
}

const LAUNCHER_LINE: &str = "preflight: localhost: resolves (this pod; its sshd starts with the main container) (after T)\n";

#[test]
fn every_host_ready_one_line_each_open_mpi_syntax() {
    let port = fake_sshd();
    // This pod is `localhost`: the hostfile's `localhost` is the launcher, resolved only.
    let run = preflight(
        b"# workers\n127.0.0.1 slots=2\n\nlocalhost slots=2\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "20s"],
    );
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (Some(0), ""),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stdout,
        format!("preflight: 127.0.0.1:{port}: resolves, SSH answers (after T)\n{LAUNCHER_LINE}")
    );
    assert_eq!(run.termination_log, "");
}

#[test]
fn hydra_syntax_and_the_flags_from_the_environment() {
    let port = fake_sshd();
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("hostfile");
    std::fs::write(&hostfile, "127.0.0.1:1\nlocalhost:1\n").expect("hostfile");
    let log = dir.path().join("termination-log");
    let mut cmd = command(&hostfile, &log, "localhost");
    cmd.env("MPI_WEBHOOK_PORT", port.to_string())
        .env("MPI_WEBHOOK_TIMEOUT", "20s");
    let run = finish(cmd.output().expect("run"), &log);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!("preflight: 127.0.0.1:{port}: resolves, SSH answers (after T)\n{LAUNCHER_LINE}")
    );
}

#[test]
fn the_launcher_not_in_the_hostfile_is_checked_too() {
    let port = fake_sshd();
    // Not listed: this pod `localhost` is checked as its bare name (the hostfile has no domain).
    let run = preflight(
        b"127.0.0.1 slots=1\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "20s"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!("preflight: 127.0.0.1:{port}: resolves, SSH answers (after T)\n{LAUNCHER_LINE}")
    );
}

#[test]
fn a_closed_port_names_the_host_and_port() {
    let port = closed_port();
    let run = preflight(
        b"127.0.0.1 slots=1\nlocalhost slots=1\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "1s"],
    );
    let line = format!("127.0.0.1:{port}: connection refused after 1 s");
    assert_eq!(run.code, Some(1));
    assert_eq!(run.stderr, format!("preflight: {line}\n"));
    assert_eq!(run.termination_log, format!("{line}\n"));
    // The host that is ready still gets its line.
    assert_eq!(run.stdout, LAUNCHER_LINE);
}

#[test]
fn a_name_that_does_not_resolve_is_named() {
    let port = fake_sshd();
    let run = preflight(
        b"127.0.0.1 slots=1\nnonexistent.invalid slots=1\nlocalhost slots=1\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "2s"],
    );
    let line = "nonexistent.invalid: no DNS answer after 2 s";
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert_eq!(run.stderr, format!("preflight: {line}\n"));
    assert_eq!(run.termination_log, format!("{line}\n"));
}

#[test]
fn the_first_host_not_ready_in_hostfile_order_is_named() {
    let closed = closed_port();
    let run = preflight(
        b"localhost slots=1\nnonexistent.invalid slots=1\n127.0.0.1 slots=1\n",
        "mpiw-launcher-0-0.localhost",
        &["--port", &closed.to_string(), "--timeout", "1s"],
    );
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        format!("preflight: localhost:{closed}: connection refused after 1 s\n")
    );
}

#[test]
fn a_server_that_is_not_sshd() {
    let port = greeter(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    let run = preflight(
        b"127.0.0.1\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "1s"],
    );
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        format!(
            "preflight: 127.0.0.1:{port}: not an SSH server (it sent \"HTTP/1.1 400 Bad Request\") after 1 s\n"
        )
    );
}

#[test]
fn a_worker_whose_sshd_starts_late_is_waited_for() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let server = std::thread::spawn(move || {
        // Refused at first; then sshd "starts" on the same port.
        std::thread::sleep(Duration::from_millis(700));
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("rebind");
        for mut conn in listener.incoming().flatten().take(1) {
            let _ = conn.write_all(b"SSH-2.0-late\r\n");
        }
    });
    let run = preflight(
        b"127.0.0.1 slots=1\n",
        "localhost",
        &["--port", &port.to_string(), "--timeout", "30s"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!("preflight: 127.0.0.1:{port}: resolves, SSH answers (after T)\n{LAUNCHER_LINE}")
    );
    server.join().expect("server");
}

#[test]
fn hostfile_problems_exit_2() {
    let bad = preflight(
        b"ok slots=1\nbad/host slots=1\n",
        "localhost",
        &["--timeout", "1s"],
    );
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr
            .ends_with("hostfile: hostfile line 2: \"bad/host\" is not a host name\n"),
        "{}",
        bad.stderr
    );
    assert_eq!(
        bad.termination_log,
        bad.stderr.trim_start_matches("preflight: ")
    );
    let empty = preflight(b"# none\n", "localhost", &[]);
    assert_eq!(empty.code, Some(2));
    assert!(
        empty
            .stderr
            .ends_with("hostfile: the hostfile names no host\n"),
        "{}",
        empty.stderr
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent");
    let log = dir.path().join("log");
    let out = command(&missing, &log, "localhost").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "preflight: {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    // The termination log is never created.
    assert!(!log.exists());
}

#[test]
fn usage_errors_exit_2_and_help_says_the_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(["preflight", "--timeout", "soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(["preflight", "--port", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let help = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(["preflight", "--help"])
        .output()
        .expect("run");
    let help = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "[env: MPI_WEBHOOK_HOSTFILE=]",
        "[default: /etc/mpi/hostfile]",
        "[env: MPI_WEBHOOK_PORT=]",
        "[default: 22]",
        "[env: MPI_WEBHOOK_TIMEOUT=]",
        "[default: 5m]",
        "Exit status: 0 every host is ready",
        "2 a usage or hostfile error",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}
