//! JobSet mode's settings: the opt-in label and the annotations, read and checked, with their
//! defaults, and which mode a JobSet is in. The lowest layer of the mode: it knows the
//! implementation table and nothing of plans, patches or rules.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::TRAINER_GROUP;
use crate::api::runtime::DEFAULT_SSH_AUTH_MOUNT_PATH;
use crate::field_error::{BadValue, FieldError, go_quote};
use crate::mpi::implementation::{self, DEFAULT_SSH_PORT, Implementation};
use crate::mpi::{LAUNCHER, NODE, SSH_MOUNT_ON_HOSTFILE_DETAIL, mounts_over_hostfile};

/// The opt-in label; its value names the implementation (`OpenMPI`, `Intel`, `MPICH`).
pub const IMPLEMENTATION_LABEL: &str = "mpi-webhook.io/implementation";
/// Annotation: processes per node, an integer >= 1.
pub const SLOTS_PER_NODE_ANNOTATION: &str = "mpi-webhook.io/slots-per-node";
/// Annotation: where the SSH Secret is mounted, an absolute path.
pub const SSH_AUTH_MOUNT_PATH_ANNOTATION: &str = "mpi-webhook.io/ssh-auth-mount-path";
/// Annotation: `true` lists the launcher in the hostfile too.
pub const RUN_LAUNCHER_AS_NODE_ANNOTATION: &str = "mpi-webhook.io/run-launcher-as-node";
/// Annotation: the name of the container to wire in both pod templates.
pub const CONTAINER_ANNOTATION: &str = "mpi-webhook.io/container";
/// Annotation: `true` or `false`, whether the reconciler creates the job's NetworkPolicy
///; absent means the reconciler's `--network-policy-default`.
pub const NETWORK_POLICY_ANNOTATION: &str = "mpi-webhook.io/network-policy";
/// Annotation: the workers' sshd port, an integer 1-65535.
pub const SSH_PORT_ANNOTATION: &str = "mpi-webhook.io/ssh-port";
/// Annotation: `false` opts out of the launcher pre-flight init container.
pub const PREFLIGHT_ANNOTATION: &str = "mpi-webhook.io/preflight";
/// Annotation: `generated` (the default) or `image`, who sets up ssh: the webhook's init
/// container, or the image (its sshd_config, host keys and client settings).
pub const SSH_SETUP_ANNOTATION: &str = "mpi-webhook.io/ssh-setup";
/// Annotation: the replicatedJobs whose pods are the MPI hosts, comma-separated, in hostfile
/// order (Decision 20); absent means `node`.
pub const WORKER_GROUPS_ANNOTATION: &str = "mpi-webhook.io/worker-groups";
/// Annotation: slots per host of some worker groups, `<group>=<N>` comma-separated (Decision 20).
pub const SLOTS_PER_GROUP_ANNOTATION: &str = "mpi-webhook.io/slots-per-group";
/// Every annotation JobSet mode reads; like the label, fixed once the JobSet exists.
pub const SETTING_ANNOTATIONS: [&str; 10] = [
    SLOTS_PER_NODE_ANNOTATION,
    SSH_AUTH_MOUNT_PATH_ANNOTATION,
    RUN_LAUNCHER_AS_NODE_ANNOTATION,
    CONTAINER_ANNOTATION,
    NETWORK_POLICY_ANNOTATION,
    SSH_PORT_ANNOTATION,
    PREFLIGHT_ANNOTATION,
    SSH_SETUP_ANNOTATION,
    WORKER_GROUPS_ANNOTATION,
    SLOTS_PER_GROUP_ANNOTATION,
];

/// Who sets up ssh in the pods (`mpi-webhook.io/ssh-setup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SshSetup {
    /// The `mpi-ssh-setup` init container ([`super::ssh_setup`]): any UID, host keys verified.
    Generated,
    /// The image's sshd_config, host keys and ssh client settings, the Secret mounted at
    /// `ssh-auth-mount-path` (JobSet mode before `generated`).
    Image,
}

impl SshSetup {
    /// The annotation's values, in the order error messages list them.
    pub const VALUES: [&'static str; 2] = ["generated", "image"];

    /// The workers' sshd port when `mpi-webhook.io/ssh-port` is unset.
    pub fn default_port(self) -> u16 {
        match self {
            SshSetup::Generated => super::ssh_setup::GENERATED_SSH_PORT,
            SshSetup::Image => DEFAULT_SSH_PORT,
        }
    }
}

/// Where a JobSet's MPI policy comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode<'m> {
    /// Its controller is a TrainJob (this reference): the TrainJob's runtime gives the policy.
    TrainJob(&'m OwnerReference),
    /// It carries [`IMPLEMENTATION_LABEL`] and no TrainJob controls it.
    JobSet,
    /// Neither: mpi-webhook leaves it alone.
    Plain,
}

/// The mode of a JobSet with `metadata`. TrainJob mode wins over the label.
pub fn mode(metadata: &ObjectMeta) -> Mode<'_> {
    let train_job = metadata.owner_references.iter().flatten().find(|r| {
        r.controller == Some(true)
            && r.kind == "TrainJob"
            && r.api_version.split('/').next() == Some(TRAINER_GROUP)
    });
    match (train_job, label(metadata)) {
        (Some(owner), _) => Mode::TrainJob(owner),
        (None, Some(_)) => Mode::JobSet,
        (None, None) => Mode::Plain,
    }
}

pub(super) fn label(metadata: &ObjectMeta) -> Option<&str> {
    metadata
        .labels
        .as_ref()?
        .get(IMPLEMENTATION_LABEL)
        .map(String::as_str)
}

pub(super) fn annotation<'m>(metadata: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

pub(super) fn label_field(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

pub(super) fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

pub(super) fn replicated_job_field(index: usize, rest: &str) -> String {
    format!("spec.replicatedJobs[{index}]{rest}")
}

pub(super) const CONTAINERS: &str = ".template.spec.template.spec.containers";

/// The MPI settings of a JobSet-mode JobSet, read from its label and annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// From the label.
    pub implementation: &'static Implementation,
    /// The annotation's slots, or `None` to count the `node` container's GPUs (Decision 3).
    pub slots_per_node: Option<i64>,
    /// The annotation's mount path, or `/root/.ssh`.
    pub ssh_auth_mount_path: String,
    /// The annotation's `true`/`false`, or `false`.
    pub run_launcher_as_node: bool,
    /// The annotation's container, or `None`: each template's first.
    pub container: Option<String>,
    /// The network-policy annotation's `true`/`false`, or `None`: the reconciler's default.
    pub network_policy: Option<bool>,
    /// The annotation's sshd port, or the default of `ssh_setup` (2222 `generated`, 22 `image`).
    pub ssh_port: u16,
    /// The annotation's `generated`/`image`, or `generated`.
    pub ssh_setup: SshSetup,
    /// The annotation's `true`/`false`, or `true`: whether the launcher gets the pre-flight
    /// (when an image for it is configured).
    pub preflight: bool,
    /// The worker groups' replicatedJob names, in hostfile order: the annotation's, or `node`.
    pub worker_groups: Vec<String>,
    /// The slots the `slots-per-group` annotation gives some groups, in its order.
    pub slots_per_group: Vec<(String, i64)>,
}

impl Settings {
    /// The slots of worker group `group` as far as the annotations say (Decision 20): its
    /// `slots-per-group` entry, else `slots-per-node`; `None` to count its GPUs (Decision 3).
    pub fn slots_of(&self, group: &str) -> Option<i64> {
        self.slots_per_group
            .iter()
            .find(|(name, _)| name == group)
            .map(|(_, slots)| *slots)
            .or(self.slots_per_node)
    }
}

/// The container the annotation names, if any (else each template's first is wired).
pub fn container(metadata: &ObjectMeta) -> Option<&str> {
    annotation(metadata, CONTAINER_ANNOTATION)
}

/// Reads the settings from `metadata`, with their defaults.
///
/// # Errors
/// One field error per label or annotation value that does not parse.
pub fn settings(metadata: &ObjectMeta) -> Result<Settings, Vec<FieldError>> {
    settings_with(metadata, SshSetup::Generated)
}

/// [`settings`], with `unset` standing for an absent `mpi-webhook.io/ssh-setup` (`image` for a
/// JobSet the webhook wired before `generated` existed).
///
/// # Errors
/// One field error per label or annotation value that does not parse.
pub fn settings_with(metadata: &ObjectMeta, unset: SshSetup) -> Result<Settings, Vec<FieldError>> {
    let mut errors = Vec::new();
    let name = label(metadata).unwrap_or_default();
    let implementation = implementation::lookup(name);
    if implementation.is_none() {
        errors.push(FieldError::unsupported(
            label_field(IMPLEMENTATION_LABEL),
            BadValue::Str(name.to_string()),
            &implementation::supported_names(),
        ));
    }
    let slots_per_node = annotation(metadata, SLOTS_PER_NODE_ANNOTATION).and_then(|text| {
        let slots = text.parse::<i64>().ok().filter(|n| *n >= 1);
        if slots.is_none() {
            errors.push(FieldError::invalid(
                annotation_field(SLOTS_PER_NODE_ANNOTATION),
                BadValue::Str(text.to_string()),
                "must be an integer >= 1",
            ));
        }
        slots
    });
    let ssh_auth_mount_path = match annotation(metadata, SSH_AUTH_MOUNT_PATH_ANNOTATION) {
        None => DEFAULT_SSH_AUTH_MOUNT_PATH,
        Some(path) if !path.starts_with('/') => {
            errors.push(FieldError::invalid(
                annotation_field(SSH_AUTH_MOUNT_PATH_ANNOTATION),
                BadValue::Str(path.to_string()),
                "must be an absolute path",
            ));
            path
        }
        Some(path) if mounts_over_hostfile(path) => {
            errors.push(FieldError::invalid(
                annotation_field(SSH_AUTH_MOUNT_PATH_ANNOTATION),
                BadValue::Str(path.to_string()),
                SSH_MOUNT_ON_HOSTFILE_DETAIL,
            ));
            path
        }
        Some(path) => path,
    };
    let run_launcher_as_node = match annotation(metadata, RUN_LAUNCHER_AS_NODE_ANNOTATION) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            errors.push(FieldError::unsupported(
                annotation_field(RUN_LAUNCHER_AS_NODE_ANNOTATION),
                BadValue::Str(other.to_string()),
                &["true", "false"],
            ));
            false
        }
    };
    let network_policy = network_policy(metadata)
        .map_err(|e| errors.push(*e))
        .ok()
        .flatten();
    let ssh_setup = match annotation(metadata, SSH_SETUP_ANNOTATION) {
        None => unset,
        Some("generated") => SshSetup::Generated,
        Some("image") => SshSetup::Image,
        Some(other) => {
            errors.push(FieldError::unsupported(
                annotation_field(SSH_SETUP_ANNOTATION),
                BadValue::Str(other.to_string()),
                &SshSetup::VALUES,
            ));
            unset
        }
    };
    let ssh_port = match annotation(metadata, SSH_PORT_ANNOTATION) {
        None => ssh_setup.default_port(),
        Some(text) => text
            .parse::<u16>()
            .ok()
            .filter(|p| *p >= 1)
            .unwrap_or_else(|| {
                errors.push(FieldError::invalid(
                    annotation_field(SSH_PORT_ANNOTATION),
                    BadValue::Str(text.to_string()),
                    "must be an integer between 1 and 65535, inclusive",
                ));
                ssh_setup.default_port()
            }),
    };
    let preflight = match annotation(metadata, PREFLIGHT_ANNOTATION) {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => {
            errors.push(FieldError::unsupported(
                annotation_field(PREFLIGHT_ANNOTATION),
                BadValue::Str(other.to_string()),
                &["true", "false"],
            ));
            true
        }
    };
    let groups = worker_groups(metadata).map_err(|e| errors.push(*e)).ok();
    let slots_per_group = slots_per_group(metadata, groups.as_deref())
        .map_err(|e| errors.push(*e))
        .unwrap_or_default();
    match implementation {
        Some(implementation) if errors.is_empty() => Ok(Settings {
            implementation,
            slots_per_node,
            ssh_auth_mount_path: ssh_auth_mount_path.to_string(),
            run_launcher_as_node,
            container: container(metadata).map(str::to_string),
            network_policy,
            ssh_port,
            ssh_setup,
            preflight,
            worker_groups: groups.unwrap_or_default(),
            slots_per_group,
        }),
        _ => Err(errors),
    }
}

/// The worker groups `mpi-webhook.io/worker-groups` names, in order (spaces around a name
/// ignored), or `node` when it is absent. Whether each names a replicatedJob of the JobSet is
/// the rules' to say: the metadata does not know.
///
/// # Errors
/// An Invalid-value field error for an empty list or name, a name given twice, or the launcher.
pub fn worker_groups(metadata: &ObjectMeta) -> Result<Vec<String>, Box<FieldError>> {
    let Some(text) = annotation(metadata, WORKER_GROUPS_ANNOTATION) else {
        return Ok(vec![NODE.to_string()]);
    };
    let invalid = |detail: String| {
        Box::new(FieldError::invalid(
            annotation_field(WORKER_GROUPS_ANNOTATION),
            BadValue::Str(text.to_string()),
            detail,
        ))
    };
    let names: Vec<String> = text.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        return Err(invalid(
            "must be replicatedJob names separated by commas".into(),
        ));
    }
    if let Some(twice) = first_repeated(names.iter().map(String::as_str)) {
        return Err(invalid(format!(
            "must name each replicatedJob once: {} is named twice",
            go_quote(twice)
        )));
    }
    // The launcher is a host only through run-launcher-as-node, which also gives it its line's
    // place and its env; as a group it would get the workers' sshd command instead of mpirun.
    if names.iter().any(|n| n == LAUNCHER) {
        return Err(invalid(format!(
            "must not name the launcher: set {RUN_LAUNCHER_AS_NODE_ANNOTATION} to make it a host too"
        )));
    }
    Ok(names)
}

/// The `<group>=<N>` entries of `mpi-webhook.io/slots-per-group`, in order; none when it is
/// absent. `groups`: the worker groups, when they parse (else an entry's group is not checked).
///
/// # Errors
/// An Invalid-value field error for an entry that does not parse, a group given twice, or one
/// that is not a worker group.
pub fn slots_per_group(
    metadata: &ObjectMeta,
    groups: Option<&[String]>,
) -> Result<Vec<(String, i64)>, Box<FieldError>> {
    let Some(text) = annotation(metadata, SLOTS_PER_GROUP_ANNOTATION) else {
        return Ok(Vec::new());
    };
    let invalid = |detail: String| {
        Box::new(FieldError::invalid(
            annotation_field(SLOTS_PER_GROUP_ANNOTATION),
            BadValue::Str(text.to_string()),
            detail,
        ))
    };
    let entry = |item: &str| {
        let (name, slots) = item.split_once('=')?;
        let slots = slots.trim().parse::<i64>().ok().filter(|n| *n >= 1)?;
        Some((name.trim().to_string(), slots)).filter(|(name, _)| !name.is_empty())
    };
    let entries: Option<Vec<(String, i64)>> = text.split(',').map(entry).collect();
    let Some(entries) = entries else {
        return Err(invalid(
            "must be <group>=<slots> entries separated by commas, slots an integer >= 1".into(),
        ));
    };
    if let Some(twice) = first_repeated(entries.iter().map(|(name, _)| name.as_str())) {
        return Err(invalid(format!(
            "must name each worker group once: {} is named twice",
            go_quote(twice)
        )));
    }
    let unknown = groups.and_then(|groups| {
        entries
            .iter()
            .find(|(name, _)| !groups.contains(name))
            .map(|(name, _)| name)
    });
    if let Some(unknown) = unknown {
        return Err(invalid(format!(
            "must name worker groups of {WORKER_GROUPS_ANNOTATION}: {} is not one",
            go_quote(unknown)
        )));
    }
    Ok(entries)
}

/// The first name of `names` that an earlier one repeats.
fn first_repeated<'n>(names: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    let mut seen = std::collections::BTreeSet::new();
    names.into_iter().find(|name| !seen.insert(*name))
}

/// The network-policy annotation: `Some(true)`, `Some(false)`, or `None` when absent.
///
/// # Errors
/// An Unsupported-value field error for any other text.
pub fn network_policy(metadata: &ObjectMeta) -> Result<Option<bool>, Box<FieldError>> {
    match annotation(metadata, NETWORK_POLICY_ANNOTATION) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(Box::new(FieldError::unsupported(
            annotation_field(NETWORK_POLICY_ANNOTATION),
            BadValue::Str(other.to_string()),
            &["true", "false"],
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn metadata(value: Value) -> ObjectMeta {
        serde_json::from_value(value).expect("metadata")
    }

    #[test]
    fn a_trainjob_controller_wins_over_the_label() {
        let owned = metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: "MPICH"},
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                 "name": "pi", "uid": "u", "controller": true}]
        }));
        assert!(matches!(mode(&owned), Mode::TrainJob(owner) if owner.name == "pi"));
        let labelled = metadata(json!({"labels": {IMPLEMENTATION_LABEL: "MPICH"}}));
        assert_eq!(mode(&labelled), Mode::JobSet);
        assert_eq!(
            mode(&metadata(json!({"labels": {"app": "x"}}))),
            Mode::Plain
        );
    }

    #[test]
    fn settings_default_as_the_contract_says() {
        let settings = settings(&metadata(
            json!({"labels": {IMPLEMENTATION_LABEL: "Intel"}}),
        ))
        .expect("parses");
        assert_eq!(
            settings,
            Settings {
                implementation: implementation::lookup("Intel").expect("Intel"),
                slots_per_node: None,
                ssh_auth_mount_path: "/root/.ssh".into(),
                run_launcher_as_node: false,
                container: None,
                network_policy: None,
                ssh_port: 2222,
                ssh_setup: SshSetup::Generated,
                preflight: true,
                worker_groups: vec!["node".into()],
                slots_per_group: Vec::new(),
            }
        );
        let image = super::settings(&metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: "Intel"},
            "annotations": {SSH_SETUP_ANNOTATION: "image"}
        })))
        .expect("parses");
        assert_eq!((image.ssh_setup, image.ssh_port), (SshSetup::Image, 22));
    }

    #[test]
    fn an_unknown_ssh_setup_is_an_unsupported_value() {
        let errors = settings(&metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: "MPICH"},
            "annotations": {SSH_SETUP_ANNOTATION: "Generated"}
        })))
        .expect_err("denied");
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "metadata.annotations[mpi-webhook.io/ssh-setup]: Unsupported value: \"Generated\": supported values: \"generated\", \"image\""
            ]
        );
    }

    #[test]
    fn every_bad_setting_is_reported_at_once() {
        let errors = settings(&metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: ""},
            "annotations": {SLOTS_PER_NODE_ANNOTATION: "-1", RUN_LAUNCHER_AS_NODE_ANNOTATION: "True"}
        })))
        .expect_err("three errors");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels[mpi-webhook.io/implementation]",
                "metadata.annotations[mpi-webhook.io/slots-per-node]",
                "metadata.annotations[mpi-webhook.io/run-launcher-as-node]"
            ]
        );
    }
}
