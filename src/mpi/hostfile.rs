//! Endpoints (spec D.3), the hostfile text (D.2 + Decision 5) and the hostfile ConfigMap.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::ConfigMap;

use super::plan::{MpiPlan, PodSet};
use super::{
    HOSTFILE_MAX_BYTES, HOSTFILE_NAME, LAUNCHER, Owner, hostfile_configmap_name, owned_metadata,
};

/// The hostfile would not fit a ConfigMap (Decision 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the MPI hostfile would be {size} bytes, over the {HOSTFILE_MAX_BYTES}-byte limit of a ConfigMap"
)]
pub struct HostfileTooLarge {
    /// Size the hostfile would have.
    pub size: u128,
}

/// The longest host name of a pod of the `launcher` and every worker group of `plan` (`node`
/// alone unless Decision 20's annotation names others), the pods that run MPI:
/// `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>` at the highest indices (the most digits).
/// `None` when no such pod set has a pod.
pub fn longest_host_name(plan: &MpiPlan) -> Option<String> {
    plan.pod_sets
        .iter()
        .filter(|p| {
            (p.name == LAUNCHER || plan.worker_group(&p.name).is_some())
                && p.replicas > 0
                && p.count > 0
        })
        .map(|p| {
            format!(
                "{}-{}-{}-{}",
                plan.jobset_name,
                p.name,
                p.replicas - 1,
                p.count - 1
            )
        })
        .fold(None, |longest: Option<String>, name| match longest {
            Some(l) if l.len() >= name.len() => Some(l),
            _ => Some(name),
        })
}

/// The reason a JobSet's pods would have a host name its implementation cannot live with: the
/// detail of the denial (JobSet mode) or warning (TrainJob mode) on `metadata.name`. `None` when
/// the implementation has no known limit, or every host name is within it.
pub fn host_name_too_long(plan: &MpiPlan) -> Option<String> {
    let limit = plan.implementation.host_name_limit.as_ref()?;
    let host = longest_host_name(plan)?;
    let length = host.chars().count();
    (length > limit.max).then(|| {
        format!(
            "the longest pod host name, {host:?}, would be {length} characters, over the {} that {} accepts: {}; use a shorter name",
            limit.max, limit.versions, limit.failure
        )
    })
}

/// TrainJob mode's warning, in the words of JobSet mode's denial ([`host_name_too_long`]).
pub fn host_name_warning(plan: &MpiPlan) -> Option<String> {
    host_name_too_long(plan).map(|detail| format!("metadata.name: {detail}"))
}

/// Size in bytes of the hostfile of `plan`, computed without building it, so that a huge
/// numNodes is rejected before anything is allocated.
pub fn hostfile_len(plan: &MpiPlan) -> u128 {
    plan.hostfile_pod_sets()
        .into_iter()
        .map(|(p, slots)| {
            let slots_len = plan.implementation.slots_separator.len() + slots.to_string().len();
            // "<tj>-<R>-<r>-<p>[.<subdomain>]<sep><N>\n"
            let suffix_len = host_suffix(plan, p).map_or(0, |s| 1 + s.len());
            let fixed =
                plan.jobset_name.len() + 1 + p.name.len() + 1 + 1 + suffix_len + slots_len + 1;
            let (replicas, count) = (as_u128(p.replicas), as_u128(p.count));
            replicas * count * fixed as u128
                + count * digit_sum(replicas)
                + replicas * digit_sum(count)
        })
        .sum()
}

/// The domain part of a pod set's host names in the hostfile: the subdomain, or none for an
/// implementation that lists the launcher by its pod host name.
fn host_suffix<'a>(plan: &'a MpiPlan, pod_set: &PodSet) -> Option<&'a str> {
    let bare = pod_set.name == LAUNCHER && plan.implementation.launcher_listed_by_pod_hostname;
    (!bare).then_some(plan.subdomain.as_str())
}

/// Checks that the hostfile of `plan` fits a ConfigMap.
///
/// # Errors
/// [`HostfileTooLarge`] with the size it would have.
pub fn check_hostfile_size(plan: &MpiPlan) -> Result<(), HostfileTooLarge> {
    let size = hostfile_len(plan);
    if size > u128::from(HOSTFILE_MAX_BYTES) {
        return Err(HostfileTooLarge { size });
    }
    Ok(())
}

fn as_u128(n: i64) -> u128 {
    u128::try_from(n.max(0)).unwrap_or(0)
}

/// Total number of decimal digits of 0, 1, ..., n-1.
fn digit_sum(n: u128) -> u128 {
    let mut total = 0;
    let (mut low, mut digits) = (0u128, 1u128);
    while low < n {
        let high = if low == 0 { 10 } else { low * 10 };
        total += (n.min(high) - low) * digits;
        low = high;
        digits += 1;
    }
    total
}

/// The hostfile text: one line per listed endpoint, in the order of
/// [`MpiPlan::hostfile_pod_sets`], each ending in `\n`.
///
/// # Errors
/// [`HostfileTooLarge`] when it would not fit a ConfigMap; nothing is allocated then.
pub fn hostfile(plan: &MpiPlan) -> Result<String, HostfileTooLarge> {
    check_hostfile_size(plan)?;
    let capacity = usize::try_from(hostfile_len(plan)).unwrap_or(0);
    let mut text = String::with_capacity(capacity);
    let separator = plan.implementation.slots_separator;
    for (pod_set, slots) in plan.hostfile_pod_sets() {
        let suffix = host_suffix(plan, pod_set);
        for (r, p) in (0..pod_set.replicas).flat_map(|r| (0..pod_set.count).map(move |p| (r, p))) {
            // Writing into a String cannot fail.
            let _ = write!(text, "{}-{}-{r}-{p}", plan.jobset_name, pod_set.name);
            if let Some(suffix) = suffix {
                let _ = write!(text, ".{suffix}");
            }
            let _ = writeln!(text, "{separator}{slots}");
        }
    }
    Ok(text)
}

/// The hostfile ConfigMap `<owner>-mpi-hostfile`, owned by the TrainJob or JobSet.
///
/// # Errors
/// [`HostfileTooLarge`] when the hostfile would not fit.
pub fn hostfile_configmap(
    owner: impl Into<Owner>,
    plan: &MpiPlan,
) -> Result<ConfigMap, HostfileTooLarge> {
    let owner = owner.into();
    Ok(ConfigMap {
        metadata: owned_metadata(&owner, hostfile_configmap_name(&owner.name)),
        data: Some(BTreeMap::from([(
            HOSTFILE_NAME.to_string(),
            hostfile(plan)?,
        )])),
        ..ConfigMap::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpi::implementation;

    fn plan(
        pod_sets: Vec<(&str, i64, i64)>,
        launcher_as_node: bool,
        slots: i64,
        implementation: &str,
    ) -> MpiPlan {
        MpiPlan {
            implementation: implementation::lookup(implementation).expect("known"),
            slots,
            worker_groups: vec![crate::mpi::plan::WorkerGroup {
                name: "node".into(),
                slots,
            }],
            ssh_auth_mount_path: "/root/.ssh".into(),
            ssh_private_key_mode: crate::mpi::SSH_PRIVATE_KEY_FILE_MODE_TRAINER,
            run_launcher_as_node: launcher_as_node,
            node_count: None,
            pod_sets: pod_sets
                .into_iter()
                .map(|(name, replicas, count)| PodSet {
                    name: name.into(),
                    replicas,
                    count,
                })
                .collect(),
            subdomain: "pi".into(),
            jobset_name: "pi".into(),
            wired_container: crate::mpi::plan::WiredContainer::NamedNode,
            jobset_defaults: None,
        }
    }

    /// [`plan`] of a JobSet named `name` with `pod_sets`.
    fn named(name: &str, pod_sets: Vec<(&str, i64, i64)>, implementation: &str) -> MpiPlan {
        let mut p = plan(pod_sets, false, 1, implementation);
        p.jobset_name = name.into();
        p
    }

    #[test]
    fn the_longest_host_name_is_the_mpi_pod_with_the_most_digits() {
        let p = named(
            "pi",
            vec![
                ("initializer", 1, 1),
                ("node", 2, 1_000_000),
                ("launcher", 1, 1),
            ],
            "OpenMPI",
        );
        assert_eq!(longest_host_name(&p).as_deref(), Some("pi-node-1-999999"));
        // The launcher's longer name wins over a short count; other pod sets never count.
        let p = named("pi", vec![("node", 1, 2), ("launcher", 1, 1)], "OpenMPI");
        assert_eq!(longest_host_name(&p).as_deref(), Some("pi-launcher-0-0"));
        let p = named("pi", vec![("a-very-long-initializer", 1, 1)], "OpenMPI");
        assert_eq!(longest_host_name(&p), None);
        // No pod (0 replicas or parallelism): no host name.
        let p = named("pi", vec![("node", 0, 2), ("launcher", 1, 0)], "OpenMPI");
        assert_eq!(longest_host_name(&p), None);
        // Every worker group's pods run MPI (Decision 20), whatever its name.
        let mut p = named(
            "pi",
            vec![
                ("node-cpu", 1, 2),
                ("node-a100-80gb", 1, 1),
                ("launcher", 1, 1),
            ],
            "OpenMPI",
        );
        p.worker_groups = ["node-cpu", "node-a100-80gb"]
            .map(|name| crate::mpi::plan::WorkerGroup {
                name: name.into(),
                slots: 1,
            })
            .into();
        assert_eq!(
            longest_host_name(&p).as_deref(),
            Some("pi-node-a100-80gb-0-0")
        );
    }

    #[test]
    fn open_mpi_takes_56_characters_and_refuses_57() {
        let pod_sets = || vec![("node", 1, 2), ("launcher", 1, 1)];
        // `<name>-launcher-0-0` is the name and 13 more.
        let at_limit = named(&"a".repeat(43), pod_sets(), "OpenMPI");
        assert_eq!(longest_host_name(&at_limit).map(|h| h.len()), Some(56));
        assert_eq!(host_name_too_long(&at_limit), None);
        let over = named(&"a".repeat(44), pod_sets(), "OpenMPI");
        let host = format!("{}-launcher-0-0", "a".repeat(44));
        assert_eq!(
            host_name_too_long(&over),
            Some(format!(
                "the longest pod host name, {host:?}, would be 57 characters, over the 56 that Open MPI 4.1 accepts: its mpirun aborts with \"*** stack smashing detected ***\" (open-mpi/ompi#13358); use a shorter name"
            ))
        );
        assert_eq!(
            host_name_warning(&over).as_deref(),
            host_name_too_long(&over)
                .map(|d| format!("metadata.name: {d}"))
                .as_deref()
        );
        // No limit known for Intel MPI or MPICH: nothing, however long.
        for implementation in ["Intel", "MPICH"] {
            let long = named(&"a".repeat(60), pod_sets(), implementation);
            assert_eq!(host_name_too_long(&long), None, "{implementation}");
        }
    }

    #[test]
    fn open_mpi_lists_workers_then_launcher_in_template_order() {
        let p = plan(vec![("node", 1, 2), ("launcher", 1, 1)], true, 1, "OpenMPI");
        assert_eq!(
            hostfile(&p).expect("fits"),
            "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n"
        );
    }

    #[test]
    fn hydra_format_and_launcher_left_out() {
        let p = plan(
            vec![("launcher", 1, 1), ("node", 2, 1), ("initializer", 1, 1)],
            false,
            4,
            "MPICH",
        );
        assert_eq!(
            hostfile(&p).expect("fits"),
            "pi-node-0-0.pi:4\npi-node-1-0.pi:4\n"
        );
    }

    #[test]
    fn hydra_lists_the_launcher_by_its_pod_host_name() {
        let p = plan(vec![("node", 1, 2), ("launcher", 1, 1)], true, 2, "Intel");
        assert_eq!(
            hostfile(&p).expect("fits"),
            "pi-node-0-0.pi:2\npi-node-0-1.pi:2\npi-launcher-0-0:2\n"
        );
        assert_eq!(hostfile_len(&p), hostfile(&p).expect("fits").len() as u128);
    }

    #[test]
    fn no_endpoints_is_empty_text() {
        let p = plan(vec![("node", 1, 0)], false, 1, "Intel");
        assert_eq!(hostfile(&p).expect("fits"), "");
    }

    #[test]
    fn length_formula_matches_rendering() {
        for (replicas, count) in [(1, 1), (1, 9), (1, 10), (3, 11), (12, 101), (2, 1000)] {
            let p = plan(
                vec![("node", replicas, count), ("launcher", 1, 1)],
                true,
                16,
                "OpenMPI",
            );
            assert_eq!(
                hostfile_len(&p),
                hostfile(&p).expect("fits").len() as u128,
                "{replicas}x{count}"
            );
        }
    }

    #[test]
    fn huge_counts_are_refused_without_allocating() {
        let p = plan(vec![("node", 1, i64::from(i32::MAX))], false, 1, "OpenMPI");
        let err = hostfile(&p).expect_err("too large");
        assert!(err.size > u128::from(HOSTFILE_MAX_BYTES));
        assert!(
            err.to_string()
                .ends_with("over the 1048576-byte limit of a ConfigMap")
        );
    }
}
