//! What the test needs from the machine, in words; a missing piece fails the test unless
//! `SKIP_TEST_SUITES` names the suite (`tests/support/prerequisites.rs`). `in_ci` refuses the
//! development knobs under CI.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::launchers::Launcher;
use crate::proc;
use crate::product::{ImageUser, Mode};

pub const INSTALL_HINT: &str =
    "install with: sudo scripts/install-mpi-launchers.sh (Debian packages + wheels, idempotent)";

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !v.is_empty() && v != "false" && v != "0"
    })
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

pub fn find_in_path(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(Into::into))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Everything the harness itself needs (not per launcher). Empty = fine.
pub fn missing_common(probe_ns: &str) -> Vec<String> {
    let mut missing = Vec::new();
    match effective_uid() {
        Some(0) => {}
        Some(u) => missing.push(format!(
            "root (network namespaces and mounts need it; euid is {u})"
        )),
        None => missing.push("root (could not read the effective uid)".to_string()),
    }
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
        ("mount", "mount"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
        ("sh", "dash"),
        ("kill", "procps"),
    ] {
        if find_in_path(tool).is_none() {
            missing.push(format!("`{tool}` (Debian package {pkg})"));
        }
    }
    if !is_executable(Path::new("/usr/sbin/sshd")) {
        missing.push("`/usr/sbin/sshd` (Debian package openssh-server)".to_string());
    }
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|f| f.lines().any(|l| l.trim_end().ends_with("overlay")));
    if !overlay {
        missing
            .push("overlayfs support in the kernel (/proc/filesystems has no overlay)".to_string());
    }
    if missing.is_empty() {
        // Root and ip are there: can we actually make a network namespace?
        let add = proc::run(
            Command::new("ip").args(["netns", "add", probe_ns]),
            Duration::from_secs(20),
        );
        match add {
            Ok(o) if o.success() => {
                let _ = proc::run(
                    Command::new("ip").args(["netns", "del", probe_ns]),
                    Duration::from_secs(20),
                );
            }
            Ok(o) => missing.push(format!(
                "permission to create network namespaces (`ip netns add` failed: {})",
                o.stderr.trim()
            )),
            Err(e) => missing.push(format!("`ip netns add` could not run: {e:#}")),
        }
    }
    missing
}

/// What one launcher needs. Empty = fine.
pub fn missing_for(l: &Launcher) -> Vec<String> {
    let mut missing = Vec::new();
    if !is_executable(&l.program) {
        missing.push(format!(
            "{} launcher {} ({})",
            l.label,
            l.program.display(),
            l.source
        ));
        return missing;
    }
    // TrainJob mode's pods run as a non-root user, and run the launcher and its daemons
    // (prted, hydra_pmi_proxy) from its folder. A folder on that path the user cannot search (a
    // clone under a 0700 `mktemp -d` folder) makes Open MPI 5's mpirun exit 255 in silence; ask
    // the kernel itself, as that user, before any case runs.
    if let Some(user) = Mode::TrainJob.image().user {
        for path in [&l.program, &l.bin_dir] {
            if let Err(why) = reachable_as(user, path) {
                missing.push(format!(
                    "{} launcher reachable by uid {}: {why} (TrainJob mode's pods run it and its \
                     daemons as Trainer's runtimes' user); install the launchers in a folder every \
                     user can search (MPI_LAUNCHERS_DIR, default /opt/mpi-launchers)",
                    l.label, user.uid,
                ));
                break;
            }
        }
    }
    missing
}

/// Can `user` (its uid, its gid and the pods' fsGroup, which equals it) reach `path` and
/// execute or search it? Asked of the kernel with `access(2)` as that user (`test -x`).
fn reachable_as(user: ImageUser, path: &Path) -> Result<(), String> {
    let out = proc::run(
        Command::new("setpriv")
            .arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .arg(format!("--groups={}", user.gid))
            .args(["--", "test", "-x"])
            .arg(path),
        Duration::from_secs(20),
    )
    .map_err(|e| format!("could not run setpriv: {e:#}"))?;
    if out.success() {
        return Ok(());
    }
    let blocked = path
        .ancestors()
        .skip(1)
        .filter_map(|d| {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let m = std::fs::metadata(d).ok()?;
            let mode = m.permissions().mode();
            let can = if m.uid() == user.uid {
                mode & 0o100 != 0
            } else if m.gid() == user.gid {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            };
            (!can).then(|| {
                format!(
                    "{} (mode {:o}, owner uid {})",
                    d.display(),
                    mode & 0o7777,
                    m.uid()
                )
            })
        })
        .last();
    Err(match blocked {
        Some(dir) => format!(
            "{} is not reachable: {dir} is not searchable",
            path.display()
        ),
        None => format!("{} is not executable", path.display()),
    })
}
