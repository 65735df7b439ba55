//! Child processes with a deadline. Every process this test starts goes through here: it runs in
//! its own process group, and on timeout the whole group is killed, so nothing outlives its budget.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What a finished (or killed) child printed.
#[derive(Debug)]
pub struct Output {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Output {
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.is_some_and(|s| s.success())
    }

    /// A short description for failure messages.
    pub fn describe(&self) -> String {
        let how = if self.timed_out {
            "timed out (killed)".to_string()
        } else {
            match self.status {
                Some(s) => format!("{s}"),
                None => "no exit status".to_string(),
            }
        };
        format!(
            "{how}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            tail(&self.stdout, 6000),
            tail(&self.stderr, 6000)
        )
    }
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Kill a process group we created (the child's pid is its pgid, see `process_group(0)`).
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn reader<R: Read + Send + 'static>(mut r: R, sink: Arc<Mutex<String>>) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut s) = sink.lock() {
                        s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            }
        }
        let _ = tx.send(());
    });
    rx
}

/// Run `cmd` to completion, killing its process group after `timeout`.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    run_with_stdin(cmd, None, timeout)
}

pub fn run_with_stdin(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output> {
    let what = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = cmd.spawn().with_context(|| format!("spawning {what}"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(data)
            .with_context(|| format!("writing stdin of {what}"))?;
    }
    let out = Arc::new(Mutex::new(String::new()));
    let err = Arc::new(Mutex::new(String::new()));
    let out_done = reader(child.stdout.take().context("stdout pipe")?, out.clone());
    let err_done = reader(child.stderr.take().context("stderr pipe")?, err.clone());
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .with_context(|| format!("waiting for {what}"))?
        {
            break Some(s);
        }
        if Instant::now() >= deadline {
            timed_out = true;
            kill_group(child.id());
            let _ = child.kill();
            break child.wait().ok();
        }
        thread::sleep(Duration::from_millis(20));
    };
    // Descendants that left the group may still hold the pipes; do not wait for them forever
    // (the cluster teardown kills everything inside its namespaces).
    let grace = Duration::from_secs(if timed_out { 1 } else { 5 });
    let _ = out_done.recv_timeout(grace);
    let _ = err_done.recv_timeout(grace);
    let stdout = out.lock().map(|s| s.clone()).unwrap_or_default();
    let stderr = err.lock().map(|s| s.clone()).unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stderr,
        timed_out,
    })
}

/// Run and insist on success, returning stdout.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = run(cmd, timeout)?;
    if !out.success() {
        bail!("{what} failed: {}", out.describe());
    }
    Ok(out.stdout)
}

/// A long-running child (sshd in a worker pod). Its stderr is collected for diagnostics.
pub struct Daemon {
    pub name: String,
    child: Child,
    pub log: Arc<Mutex<String>>,
}

impl Daemon {
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Daemon> {
        let what = format!("{cmd:?}");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().with_context(|| format!("spawning {what}"))?;
        let log = Arc::new(Mutex::new(String::new()));
        let _ = reader(child.stdout.take().context("stdout pipe")?, log.clone());
        let _ = reader(child.stderr.take().context("stderr pipe")?, log.clone());
        Ok(Daemon {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Wait until the daemon's output contains `needle` (its readiness signal).
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return Ok(());
            }
            if let Some(s) = self.child.try_wait()? {
                bail!(
                    "{} exited ({s}) before it was ready:\n{}",
                    self.name,
                    self.log()
                );
            }
            if Instant::now() >= deadline {
                bail!("{} not ready after {timeout:?}:\n{}", self.name, self.log());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
