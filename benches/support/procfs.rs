//! What the benchmarks read of a process from `/proc` (proc(5)): its CPU time and its memory.
//! Shared by the bench binaries with `#[path = "support/procfs.rs"] mod procfs;`.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// CPU time (user and system) process `pid` has used so far, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration, AnyError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .ok_or("unexpected /proc/<pid>/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> Result<u64, AnyError> {
        Ok(fields.get(i).ok_or("short /proc/<pid>/stat")?.parse()?)
    };
    let ticks = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(
        ticks as f64 / clock_ticks_per_second(),
    ))
}

/// A field of `/proc/<pid>/status` given in kB, such as `VmRSS` or `VmHWM`, in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64, AnyError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("{field} missing from /proc/<pid>/status"))?;
    Ok(value.trim().trim_end_matches("kB").trim().parse()?)
}

/// `getconf CLK_TCK`: the unit of `/proc/<pid>/stat`'s times (100 on Linux unless told).
pub fn clock_ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
