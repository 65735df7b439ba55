//! The supported MPI implementations as one table of data (spec Decision 5). Adding an
//! implementation means adding a row here; no other file matches on implementation names.

/// How an env var's value is produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvValue {
    /// A fixed string.
    Fixed(&'static str),
    /// The effective slots per node (numProcPerNode) as a decimal number.
    Slots,
    /// The arguments the launcher passes to `ssh`: this string, then the plan's suffix (JobSet
    /// mode's ` -p <port>` or ` -F <ssh_config>`, else nothing).
    SshArgs(&'static str),
}

/// One env var the implementation injects into the launcher's `node` container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LauncherEnv {
    /// Variable name; also a reserved name TrainJobs may not set.
    pub name: &'static str,
    /// Its value.
    pub value: EnvValue,
}

/// An MPI implementation: hostfile syntax and launcher env.
#[derive(Debug, PartialEq, Eq)]
pub struct Implementation {
    /// The `mpiImplementation` value selecting it.
    pub name: &'static str,
    /// What stands between host and slot count in a hostfile line
    /// (`host slots=N` for Open MPI, `host:N` for Hydra).
    pub slots_separator: &'static str,
    /// Launcher env vars in injection order.
    pub launcher_env: &'static [LauncherEnv],
    /// Whether the launcher's own hostfile line (runLauncherAsNode) is its bare pod host name
    /// `<pod>` instead of `<pod>.<subdomain>`: Hydra only recognises itself by its host name and
    /// would otherwise SSH to the launcher, which runs no sshd (found on MPICH 4 and Intel MPI).
    pub launcher_listed_by_pod_hostname: bool,
    /// What the user's launcher command needs for hosts of different slots (worker groups,
    /// Decision 20) when this implementation's env alone gives every host the same count.
    pub uneven_slots: Option<UnevenSlots>,
    /// Whether stock Kubeflow Trainer's controller (through 8c0f5059) builds a JobSet for a
    /// TrainJob with this implementation. It supports Open MPI only and errors before building
    /// for anything else, so such TrainJobs wait forever; admission warns (Decision 16).
    pub built_by_trainer: bool,
    /// The longest pod host name the implementation is known to live with, where a longer one
    /// breaks every job (only limits measured or reported upstream; `None`: none known).
    pub host_name_limit: Option<HostNameLimit>,
}

/// A host name length an implementation cannot go beyond, and what happens when it does.
#[derive(Debug, PartialEq, Eq)]
pub struct HostNameLimit {
    /// The most characters a host name may have.
    pub max: usize,
    /// Which versions (`Open MPI 4.1`), as the denial names them.
    pub versions: &'static str,
    /// What goes wrong beyond it, and where that is known from.
    pub failure: &'static str,
}

/// A launcher that places the same number of ranks on every host of its host file, whatever
/// each line's count, unless its command names the file with `flag` (admission warns).
#[derive(Debug, PartialEq, Eq)]
pub struct UnevenSlots {
    /// The launcher flag that reads the hostfile with each line's count.
    pub flag: &'static str,
    /// Why the env is not enough, for the warning.
    pub why: &'static str,
}

/// The port sshd listens on unless told otherwise, and that ssh uses without `-p`.
pub const DEFAULT_SSH_PORT: u16 = 22;

const CONNECTION_ATTEMPTS: &str = "-o ConnectionAttempts=10";
/// The network interface of a pod.
const POD_INTERFACE: &str = "eth0";

const fn fixed(name: &'static str, value: &'static str) -> LauncherEnv {
    LauncherEnv {
        name,
        value: EnvValue::Fixed(value),
    }
}

const fn ssh_args(name: &'static str, value: &'static str) -> LauncherEnv {
    LauncherEnv {
        name,
        value: EnvValue::SshArgs(value),
    }
}

const fn slots(name: &'static str) -> LauncherEnv {
    LauncherEnv {
        name,
        value: EnvValue::Slots,
    }
}

/// Every supported implementation, in the order error messages list them.
pub const IMPLEMENTATIONS: &[Implementation] = &[
    Implementation {
        name: "OpenMPI",
        slots_separator: " slots=",
        launcher_listed_by_pod_hostname: false,
        uneven_slots: None,
        built_by_trainer: true,
        // Open MPI 4.1's mpirun overflows a stack buffer with a longer host name
        // (open-mpi/ompi#13358, open: 4.1.6 and 4.1.8; measured on 4.1.4 in tests/mpi_launchers,
        // `host_name_limits`: 56 runs, 57 aborts). The label does not tell 4 from 5, so the row
        // takes 4.1's limit, although Open MPI 5.0.11 runs with 63.
        host_name_limit: Some(HostNameLimit {
            max: 56,
            versions: "Open MPI 4.1",
            failure: "its mpirun aborts with \"*** stack smashing detected ***\" (open-mpi/ompi#13358)",
        }),
        launcher_env: &[
            // Open MPI 4 (ORTE), exactly upstream's four.
            fixed("OMPI_MCA_orte_default_hostfile", super::HOSTFILE_PATH),
            fixed("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
            slots("OMPI_MCA_orte_set_default_slots"),
            ssh_args("OMPI_MCA_plm_rsh_args", CONNECTION_ATTEMPTS),
            // Open MPI 5 replaced ORTE by PRTE and ignores the names above (trainer #4028).
            fixed("PRTE_MCA_prte_default_hostfile", super::HOSTFILE_PATH),
            // false on purpose: with short host names PRTE would otherwise treat the launcher as
            // a remote host and SSH to itself (trainer PR #4029).
            fixed("PRTE_MCA_prte_keep_fqdn_hostnames", "false"),
            slots("PRTE_MCA_prte_set_default_slots"),
            ssh_args("PRTE_MCA_plm_ssh_args", CONNECTION_ATTEMPTS),
        ],
    },
    Implementation {
        name: "Intel",
        slots_separator: ":",
        launcher_listed_by_pod_hostname: true,
        // Proven on Intel MPI 2021 (tests/mpi_launchers, worker groups): with
        // I_MPI_HYDRA_HOST_FILE it starts I_MPI_PERHOST ranks on every host (all its cores
        // without it), ignoring `:N`; `-machinefile` keeps each host's `:N`.
        uneven_slots: Some(UnevenSlots {
            flag: "-machinefile",
            why: "Intel MPI starts I_MPI_PERHOST ranks on every host of I_MPI_HYDRA_HOST_FILE, whatever its slots",
        }),
        built_by_trainer: false,
        host_name_limit: None,
        launcher_env: &[
            fixed("I_MPI_HYDRA_HOST_FILE", super::HOSTFILE_PATH),
            ssh_args("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", CONNECTION_ATTEMPTS),
            slots("I_MPI_PERHOST"),
            // Workers' proxies call back to the launcher by the name it gives itself, its bare
            // pod host name, which the pods' DNS search list cannot resolve; given an interface,
            // Hydra advertises that interface's address instead. A pod's interface is eth0.
            fixed("I_MPI_HYDRA_IFACE", POD_INTERFACE),
        ],
    },
    Implementation {
        name: "MPICH",
        slots_separator: ":",
        launcher_listed_by_pod_hostname: true,
        uneven_slots: None,
        built_by_trainer: false,
        host_name_limit: None,
        launcher_env: &[
            fixed("HYDRA_HOST_FILE", super::HOSTFILE_PATH),
            ssh_args("HYDRA_LAUNCHER_EXTRA_ARGS", CONNECTION_ATTEMPTS),
            // See I_MPI_HYDRA_IFACE above.
            fixed("HYDRA_IFACE", POD_INTERFACE),
        ],
    },
];

/// The implementation named `name` (exact, case-sensitive match, as the CRD enum).
pub fn lookup(name: &str) -> Option<&'static Implementation> {
    IMPLEMENTATIONS.iter().find(|i| i.name == name)
}

/// The supported names, for error messages.
pub fn supported_names() -> Vec<&'static str> {
    IMPLEMENTATIONS.iter().map(|i| i.name).collect()
}

impl Implementation {
    /// Whether a TrainJob may not set env var `name` (Decision 6).
    pub fn reserves(&self, name: &str) -> bool {
        self.launcher_env.iter().any(|e| e.name == name)
    }

    /// The launcher env as `(name, value)` pairs for the given slots, with `ssh_args_suffix`
    /// appended to the ssh-args variables.
    pub fn env_pairs<'s>(
        &'s self,
        slots: i64,
        ssh_args_suffix: &'s str,
    ) -> impl Iterator<Item = (&'static str, String)> + 's {
        self.launcher_env.iter().map(move |e| {
            let value = match e.value {
                EnvValue::Fixed(v) => v.to_string(),
                EnvValue::Slots => slots.to_string(),
                EnvValue::SshArgs(v) => format!("{v}{ssh_args_suffix}"),
            };
            (e.name, value)
        })
    }
}

/// The ssh-args suffix that makes ssh dial `port`: none for 22, ssh's default.
pub fn port_suffix(port: u16) -> String {
    if port == DEFAULT_SSH_PORT {
        String::new()
    } else {
        format!(" -p {port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_looked_up_exactly() {
        assert_eq!(supported_names(), ["OpenMPI", "Intel", "MPICH"]);
        assert!(lookup("OpenMPI").is_some());
        assert!(lookup("openmpi").is_none());
        assert!(lookup("").is_none());
    }

    #[test]
    fn open_mpi_env_is_orte_then_prte() {
        let open_mpi = lookup("OpenMPI").expect("OpenMPI");
        let env: Vec<_> = open_mpi.env_pairs(4, "").collect();
        assert_eq!(
            env,
            [
                (
                    "OMPI_MCA_orte_default_hostfile",
                    "/etc/mpi/hostfile".to_string()
                ),
                ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".to_string()),
                ("OMPI_MCA_orte_set_default_slots", "4".to_string()),
                (
                    "OMPI_MCA_plm_rsh_args",
                    "-o ConnectionAttempts=10".to_string()
                ),
                (
                    "PRTE_MCA_prte_default_hostfile",
                    "/etc/mpi/hostfile".to_string()
                ),
                ("PRTE_MCA_prte_keep_fqdn_hostnames", "false".to_string()),
                ("PRTE_MCA_prte_set_default_slots", "4".to_string()),
                (
                    "PRTE_MCA_plm_ssh_args",
                    "-o ConnectionAttempts=10".to_string()
                ),
            ]
        );
    }

    #[test]
    fn another_ssh_port_is_appended_to_each_ssh_args_variable() {
        let with_port = |name: &str| -> Vec<(&str, String)> {
            let implementation = lookup(name).expect("known");
            implementation
                .env_pairs(1, &port_suffix(2222))
                .filter(|(_, value)| value.contains("ConnectionAttempts"))
                .collect()
        };
        let args = "-o ConnectionAttempts=10 -p 2222".to_string();
        assert_eq!(
            with_port("OpenMPI"),
            [
                ("OMPI_MCA_plm_rsh_args", args.clone()),
                ("PRTE_MCA_plm_ssh_args", args.clone())
            ]
        );
        assert_eq!(
            with_port("Intel"),
            [("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", args.clone())]
        );
        assert_eq!(with_port("MPICH"), [("HYDRA_LAUNCHER_EXTRA_ARGS", args)]);
    }

    #[test]
    fn reserved_names_follow_the_implementation() {
        let intel = lookup("Intel").expect("Intel");
        assert!(intel.reserves("I_MPI_PERHOST"));
        assert!(!intel.reserves("OMPI_MCA_orte_default_hostfile"));
        let mpich = lookup("MPICH").expect("MPICH");
        assert_eq!(
            mpich.env_pairs(2, &port_suffix(22)).collect::<Vec<_>>(),
            [
                ("HYDRA_HOST_FILE", "/etc/mpi/hostfile".to_string()),
                (
                    "HYDRA_LAUNCHER_EXTRA_ARGS",
                    "-o ConnectionAttempts=10".to_string()
                ),
                ("HYDRA_IFACE", "eth0".to_string()),
            ]
        );
    }
}
