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
