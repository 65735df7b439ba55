//! JobSet mode's settings: the opt-in label and the annotations, read and checked in one pass
//! ([`Read`]) into one typed [`Settings`], with their defaults; which mode a JobSet is in; and
//! the rules on the label and annotations as written (fixed on UPDATE, none on a JobSet a
//! TrainJob controls). The only reader of the label and the annotations, and the lowest layer
//! of the mode: it knows the implementation table and nothing of plans, patches or rules.

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
/// Annotation: how long the launcher pre-flight waits for every host, a duration from 1s to 1h
/// (`30s`, `10m`); absent means `mpi-webhook preflight`'s own default (5 minutes).
pub const PREFLIGHT_TIMEOUT_ANNOTATION: &str = "mpi-webhook.io/preflight-timeout";
/// Annotation: `generated` (the default) or `image`, who sets up ssh: the webhook's init
/// container, or the image (its sshd_config, host keys and client settings).
pub const SSH_SETUP_ANNOTATION: &str = "mpi-webhook.io/ssh-setup";
/// Annotation: the replicatedJobs whose pods are the MPI hosts, comma-separated, in hostfile
/// order (Decision 20); absent means `node`.
pub const WORKER_GROUPS_ANNOTATION: &str = "mpi-webhook.io/worker-groups";
/// Annotation: slots per host of some worker groups, `<group>=<N>` comma-separated (Decision 20).
pub const SLOTS_PER_GROUP_ANNOTATION: &str = "mpi-webhook.io/slots-per-group";
/// Every annotation JobSet mode reads; like the label, fixed once the JobSet exists.
pub const SETTING_ANNOTATIONS: [&str; 11] = [
    SLOTS_PER_NODE_ANNOTATION,
    SSH_AUTH_MOUNT_PATH_ANNOTATION,
    RUN_LAUNCHER_AS_NODE_ANNOTATION,
    CONTAINER_ANNOTATION,
    NETWORK_POLICY_ANNOTATION,
    SSH_PORT_ANNOTATION,
    PREFLIGHT_ANNOTATION,
    PREFLIGHT_TIMEOUT_ANNOTATION,
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
    pub const CHOICES: [(&'static str, SshSetup); 2] = [
        ("generated", SshSetup::Generated),
        ("image", SshSetup::Image),
    ];

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

fn label(metadata: &ObjectMeta) -> Option<&str> {
    metadata
        .labels
        .as_ref()?
        .get(IMPLEMENTATION_LABEL)
        .map(String::as_str)
}

fn annotation<'m>(metadata: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn label_field(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

pub(in crate::mpi) fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

/// The MPI settings of a JobSet-mode JobSet, read from its label and annotations in one pass
/// ([`Read::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// From the label (Open MPI, the runtimes' default, in a [`Read`] whose label names none).
    pub implementation: &'static Implementation,
    /// The annotation's slots, or `None` to count the `node` container's GPUs (Decision 3).
    pub slots_per_node: Option<i64>,
    /// The annotation's mount path as written, or `None`: `/root/.ssh`
    /// ([`Settings::ssh_auth_mount_path`]).
    pub ssh_auth_mount_path_annotation: Option<String>,
    /// The annotation's `true`/`false`, or `false`.
    pub run_launcher_as_node: bool,
    /// The annotation's container, or `None`: each template's first.
    pub container: Option<String>,
    /// The network-policy annotation's `true`/`false`, or `None`: the reconciler's default.
    pub network_policy: Option<bool>,
    /// The annotation's sshd port, or the default of `ssh_setup` (2222 `generated`, 22 `image`).
    pub ssh_port: u16,
    /// The annotation's `generated`/`image`, or the JobSet's default (`generated`, or `image`
    /// for a JobSet the webhook wired before `generated` existed).
    pub ssh_setup: SshSetup,
    /// The annotation's `true`/`false`, or `true`: whether the launcher gets the pre-flight
    /// (when an image for it is configured).
    pub preflight: bool,
    /// The annotation's pre-flight timeout as written (a duration `mpi-webhook preflight
    /// --timeout` reads the same way), or `None`: the pre-flight's own default.
    pub preflight_timeout: Option<String>,
    /// The worker groups' replicatedJob names, in hostfile order: the annotation's, or `node`.
    pub worker_groups: Vec<String>,
    /// The worker-groups annotation as written (the rules' errors quote it), or `None`.
    pub worker_groups_annotation: Option<String>,
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

    /// Where the SSH Secret is mounted: the annotation's path, or `/root/.ssh`.
    pub fn ssh_auth_mount_path(&self) -> &str {
        self.ssh_auth_mount_path_annotation
            .as_deref()
            .unwrap_or(DEFAULT_SSH_AUTH_MOUNT_PATH)
    }
}

/// The label and annotations of a JobSet, read in one pass: every setting, each at its default
/// where its value is absent or does not parse, and one field error per value that does not
/// parse (the label's first, then the annotations' in the order they are read below). The rules check the JobSet
/// against these settings whether or not they all parse; a plan is made only of settings that
/// do ([`Read::into_result`]).
#[derive(Debug, Clone)]
pub struct Read {
    /// The settings, defaults standing in for the values that do not parse.
    pub settings: Settings,
    /// One error per value that does not parse.
    pub errors: Vec<FieldError>,
}

impl Read {
    /// Reads the label and annotations of `metadata`. `unset` gives the ssh setup of a JobSet
    /// without `mpi-webhook.io/ssh-setup` from the container the settings wire (the
    /// annotation's, or `None`: each template's first).
    pub fn new(metadata: &ObjectMeta, unset: impl FnOnce(Option<&str>) -> SshSetup) -> Self {
        let mut read = Reader {
            metadata,
            errors: Vec::new(),
        };
        let name = label(metadata).unwrap_or_default();
        let implementation = implementation::lookup(name).unwrap_or_else(|| {
            read.errors.push(FieldError::unsupported(
                label_field(IMPLEMENTATION_LABEL),
                BadValue::Str(name.to_string()),
                &implementation::supported_names(),
            ));
            // A stand-in that no plan sees: the error keeps these settings from making one.
            &implementation::IMPLEMENTATIONS[0]
        });
        let slots_per_node = read.parsed(
            SLOTS_PER_NODE_ANNOTATION,
            |text| text.parse::<i64>().ok().filter(|n| *n >= 1),
            "must be an integer >= 1",
        );
        let ssh_auth_mount_path_annotation =
            read.text(SSH_AUTH_MOUNT_PATH_ANNOTATION).inspect(|path| {
                if !path.starts_with('/') {
                    read.invalid(
                        SSH_AUTH_MOUNT_PATH_ANNOTATION,
                        path,
                        "must be an absolute path",
                    );
                } else if mounts_over_hostfile(path) {
                    read.invalid(
                        SSH_AUTH_MOUNT_PATH_ANNOTATION,
                        path,
                        SSH_MOUNT_ON_HOSTFILE_DETAIL,
                    );
                }
            });
        let run_launcher_as_node = read.flag(RUN_LAUNCHER_AS_NODE_ANNOTATION).unwrap_or(false);
        let network_policy = read.flag(NETWORK_POLICY_ANNOTATION);
        let container = read.text(CONTAINER_ANNOTATION);
        let ssh_setup = read
            .one_of(SSH_SETUP_ANNOTATION, &SshSetup::CHOICES)
            .unwrap_or_else(|| unset(container));
        let ssh_port = read
            .parsed(
                SSH_PORT_ANNOTATION,
                |text| text.parse::<u16>().ok().filter(|p| *p >= 1),
                "must be an integer between 1 and 65535, inclusive",
            )
            .unwrap_or_else(|| ssh_setup.default_port());
        let preflight = read.flag(PREFLIGHT_ANNOTATION).unwrap_or(true);
        let preflight_timeout = read.parsed(
            PREFLIGHT_TIMEOUT_ANNOTATION,
            |text| {
                humantime::parse_duration(text)
                    .ok()
                    .filter(|d| PREFLIGHT_TIMEOUTS.contains(d))
                    .map(|_| text.to_string())
            },
            "must be a duration from 1s to 1h, e.g. 30s or 10m",
        );
        let worker_groups = read.worker_groups();
        let slots_per_group = read.slots_per_group(worker_groups.as_deref());
        Read {
            settings: Settings {
                implementation,
                slots_per_node,
                ssh_auth_mount_path_annotation: ssh_auth_mount_path_annotation.map(str::to_string),
                run_launcher_as_node,
                container: container.map(str::to_string),
                network_policy,
                ssh_port,
                ssh_setup,
                preflight,
                preflight_timeout,
                worker_groups: worker_groups.unwrap_or_else(|| vec![NODE.to_string()]),
                worker_groups_annotation: read.text(WORKER_GROUPS_ANNOTATION).map(str::to_string),
                slots_per_group,
            },
            errors: read.errors,
        }
    }

    /// Whether the value of annotation `key` did not parse (its error is in `errors`).
    pub fn bad(&self, key: &str) -> bool {
        self.errors.iter().any(|e| {
            e.field
                .strip_prefix("metadata.annotations[")
                .and_then(|rest| rest.strip_suffix(']'))
                == Some(key)
        })
    }

    /// The settings when every value parses.
    ///
    /// # Errors
    /// One field error per label or annotation value that does not parse.
    pub fn into_result(self) -> Result<Settings, Vec<FieldError>> {
        if self.errors.is_empty() {
            Ok(self.settings)
        } else {
            Err(self.errors)
        }
    }
}

/// Reads the settings from `metadata`, with their defaults (`generated` ssh setup when unset).
///
/// # Errors
/// One field error per label or annotation value that does not parse.
pub fn settings(metadata: &ObjectMeta) -> Result<Settings, Vec<FieldError>> {
    Read::new(metadata, |_| SshSetup::Generated).into_result()
}

/// The pre-flight timeouts a JobSet may ask for: long enough to resolve a name, short enough
/// that a job that cannot start says so within the hour.
const PREFLIGHT_TIMEOUTS: std::ops::RangeInclusive<std::time::Duration> =
    std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(3600);

/// `true` and `false`, in the order error messages list them.
const BOOLEAN: [(&str, bool); 2] = [("true", true), ("false", false)];

/// The one pass: the metadata read, the errors found so far.
struct Reader<'m> {
    metadata: &'m ObjectMeta,
    errors: Vec<FieldError>,
}

#[cfg(test)]
thread_local! {
    /// Every annotation key a [`Reader`] of this thread asked for: a test holds
    /// [`SETTING_ANNOTATIONS`] (the immutable ones) to exactly these.
    static ASKED: std::cell::RefCell<std::collections::BTreeSet<String>> =
        const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

impl<'m> Reader<'m> {
    /// The annotation `key`, as written.
    fn text(&self, key: &str) -> Option<&'m str> {
        #[cfg(test)]
        ASKED.with(|asked| asked.borrow_mut().insert(key.to_string()));
        annotation(self.metadata, key)
    }

    /// An Invalid-value error for annotation `key` written `text`.
    fn invalid(&mut self, key: &str, text: &str, detail: impl Into<String>) {
        self.errors.push(FieldError::invalid(
            annotation_field(key),
            BadValue::Str(text.to_string()),
            detail,
        ));
    }

    /// The annotation `key` as `parse` reads it; `None` when absent, or when it does not parse
    /// (an Invalid-value error with `detail`).
    fn parsed<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&str) -> Option<T>,
        detail: &str,
    ) -> Option<T> {
        let text = self.text(key)?;
        let value = parse(text);
        if value.is_none() {
            self.invalid(key, text, detail);
        }
        value
    }

    /// The annotation `key`, one of `choices`' texts; `None` when absent, or when it is none of
    /// them (an Unsupported-value error listing them).
    fn one_of<T: Copy>(&mut self, key: &str, choices: &[(&'static str, T)]) -> Option<T> {
        let text = self.text(key)?;
        let value = choices
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, v)| *v);
        if value.is_none() {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            self.errors.push(FieldError::unsupported(
                annotation_field(key),
                BadValue::Str(text.to_string()),
                &names,
            ));
        }
        value
    }

    /// The annotation `key`, `true` or `false`: the one boolean parser of the settings.
    fn flag(&mut self, key: &str) -> Option<bool> {
        self.one_of(key, &BOOLEAN)
    }

    /// The worker groups `mpi-webhook.io/worker-groups` names, in order (spaces around a name
    /// ignored), or `node` when it is absent; `None` when it does not parse (an Invalid-value
    /// error for an empty list or name, a name given twice, or the launcher). Whether each names
    /// a replicatedJob of the JobSet is the rules' to say: the metadata does not know.
    fn worker_groups(&mut self) -> Option<Vec<String>> {
        let Some(text) = self.text(WORKER_GROUPS_ANNOTATION) else {
            return Some(vec![NODE.to_string()]);
        };
        let names: Vec<String> = text.split(',').map(|n| n.trim().to_string()).collect();
        let detail = if names.iter().any(String::is_empty) {
            "must be replicatedJob names separated by commas".to_string()
        } else if let Some(twice) = first_repeated(names.iter().map(String::as_str)) {
            format!(
                "must name each replicatedJob once: {} is named twice",
                go_quote(twice)
            )
        } else if names.iter().any(|n| n == LAUNCHER) {
            // The launcher is a host only through run-launcher-as-node, which also gives it its
            // line's place and its env; as a group it would get the workers' sshd command
            // instead of mpirun.
            format!(
                "must not name the launcher: set {RUN_LAUNCHER_AS_NODE_ANNOTATION} to make it a host too"
            )
        } else {
            return Some(names);
        };
        self.invalid(WORKER_GROUPS_ANNOTATION, text, detail);
        None
    }

    /// The `<group>=<N>` entries of `mpi-webhook.io/slots-per-group`, in order; none when it is
    /// absent or does not parse (an Invalid-value error for an entry that does not parse, a
    /// group given twice, or one that is not a worker group). `groups`: the worker groups, when
    /// they parse (else an entry's group is not checked).
    fn slots_per_group(&mut self, groups: Option<&[String]>) -> Vec<(String, i64)> {
        let Some(text) = self.text(SLOTS_PER_GROUP_ANNOTATION) else {
            return Vec::new();
        };
        let entry = |item: &str| {
            let (name, slots) = item.split_once('=')?;
            let slots = slots.trim().parse::<i64>().ok().filter(|n| *n >= 1)?;
            Some((name.trim().to_string(), slots)).filter(|(name, _)| !name.is_empty())
        };
        let entries: Option<Vec<(String, i64)>> = text.split(',').map(entry).collect();
        let detail = match entries {
            None => "must be <group>=<slots> entries separated by commas, slots an integer >= 1"
                .to_string(),
            Some(entries) => {
                let twice = first_repeated(entries.iter().map(|(name, _)| name.as_str()));
                let unknown = groups.and_then(|groups| {
                    entries
                        .iter()
                        .find(|(name, _)| !groups.contains(name))
                        .map(|(name, _)| name)
                });
                match (twice, unknown) {
                    (Some(twice), _) => format!(
                        "must name each worker group once: {} is named twice",
                        go_quote(twice)
                    ),
                    (None, Some(unknown)) => format!(
                        "must name worker groups of {WORKER_GROUPS_ANNOTATION}: {} is not one",
                        go_quote(unknown)
                    ),
                    (None, None) => return entries,
                }
            }
        };
        self.invalid(SLOTS_PER_GROUP_ANNOTATION, text, detail);
        Vec::new()
    }
}

/// The first name of `names` that an earlier one repeats.
fn first_repeated<'n>(names: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    let mut seen = std::collections::BTreeSet::new();
    names.into_iter().find(|name| !seen.insert(*name))
}

/// The label on a JobSet a TrainJob controls: denied, its policy comes from the runtime.
pub fn label_on_train_job_error(metadata: &ObjectMeta) -> Option<FieldError> {
    let value = label(metadata)?;
    Some(FieldError::invalid(
        label_field(IMPLEMENTATION_LABEL),
        BadValue::Str(value.to_string()),
        "must not be set on a JobSet owned by a TrainJob: its MPI policy comes from the TrainJob's runtime",
    ))
}

/// On UPDATE: any change of the label or of a setting annotation, added, changed or removed
/// (the wiring is fixed at creation). An absent value reads as `""`, as Go reads a map.
pub fn immutable_errors(old: &ObjectMeta, new: &ObjectMeta) -> Vec<FieldError> {
    let changed = |field: String, old: Option<&str>, new: Option<&str>| {
        (old != new).then(|| {
            FieldError::invalid(
                field,
                BadValue::Str(new.unwrap_or_default().to_string()),
                "field is immutable",
            )
        })
    };
    let label_error = changed(label_field(IMPLEMENTATION_LABEL), label(old), label(new));
    let annotation_errors = SETTING_ANNOTATIONS.iter().filter_map(|key| {
        changed(
            annotation_field(key),
            annotation(old, key),
            annotation(new, key),
        )
    });
    label_error.into_iter().chain(annotation_errors).collect()
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
                ssh_auth_mount_path_annotation: None,
                run_launcher_as_node: false,
                container: None,
                network_policy: None,
                ssh_port: 2222,
                ssh_setup: SshSetup::Generated,
                preflight: true,
                preflight_timeout: None,
                worker_groups: vec!["node".into()],
                worker_groups_annotation: None,
                slots_per_group: Vec::new(),
            }
        );
        assert_eq!(settings.ssh_auth_mount_path(), "/root/.ssh");
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
    fn a_preflight_timeout_is_a_duration_from_1s_to_1h_kept_as_written() {
        let timeout = |text: &str| {
            settings(&metadata(json!({
                "labels": {IMPLEMENTATION_LABEL: "OpenMPI"},
                "annotations": {PREFLIGHT_TIMEOUT_ANNOTATION: text}
            })))
            .map(|s| s.preflight_timeout)
            .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())
        };
        for ok in ["1s", "30s", "10m", "1m 30s", "1h"] {
            assert_eq!(timeout(ok), Ok(Some(ok.to_string())), "{ok}");
        }
        for bad in ["0s", "500ms", "61m", "30", "soon", ""] {
            assert_eq!(
                timeout(bad),
                Err(vec![format!(
                    "metadata.annotations[mpi-webhook.io/preflight-timeout]: Invalid value: \"{bad}\": \
                     must be a duration from 1s to 1h, e.g. 30s or 10m"
                )]),
                "{bad}"
            );
        }
        let unset = settings(&metadata(
            json!({"labels": {IMPLEMENTATION_LABEL: "OpenMPI"}}),
        ));
        assert_eq!(unset.map(|s| s.preflight_timeout), Ok(None));
    }

    /// A setting `Read::new` reads but `SETTING_ANNOTATIONS` lacks would be silently mutable on
    /// UPDATE; one listed but never read would be a rule on nothing.
    #[test]
    fn the_immutable_settings_are_exactly_the_annotations_read_new_reads() {
        ASKED.with(|asked| asked.borrow_mut().clear());
        let _ = Read::new(
            &metadata(json!({"labels": {IMPLEMENTATION_LABEL: "OpenMPI"}})),
            |_| SshSetup::Generated,
        );
        let asked = ASKED.with(|asked| asked.borrow().clone());
        let listed: std::collections::BTreeSet<String> = SETTING_ANNOTATIONS
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(asked, listed);
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

    #[test]
    fn one_pass_reports_each_bad_value_once_in_the_contracts_order_with_defaults_standing_in() {
        let read = Read::new(
            &metadata(json!({
                "labels": {IMPLEMENTATION_LABEL: "LAM"},
                "annotations": {
                    SLOTS_PER_NODE_ANNOTATION: "0", SSH_AUTH_MOUNT_PATH_ANNOTATION: "ssh",
                    RUN_LAUNCHER_AS_NODE_ANNOTATION: "yes", CONTAINER_ANNOTATION: "mpi",
                    NETWORK_POLICY_ANNOTATION: "on", SSH_SETUP_ANNOTATION: "sshd",
                    SSH_PORT_ANNOTATION: "0", PREFLIGHT_ANNOTATION: "no",
                    PREFLIGHT_TIMEOUT_ANNOTATION: "soon",
                    WORKER_GROUPS_ANNOTATION: ",", SLOTS_PER_GROUP_ANNOTATION: "a"
                }
            })),
            |_| SshSetup::Generated,
        );
        let fields: Vec<&str> = read.errors.iter().map(|e| e.field.as_str()).collect();
        let mut expected = vec![label_field(IMPLEMENTATION_LABEL)];
        expected.extend(
            [
                SLOTS_PER_NODE_ANNOTATION,
                SSH_AUTH_MOUNT_PATH_ANNOTATION,
                RUN_LAUNCHER_AS_NODE_ANNOTATION,
                NETWORK_POLICY_ANNOTATION,
                SSH_SETUP_ANNOTATION,
                SSH_PORT_ANNOTATION,
                PREFLIGHT_ANNOTATION,
                PREFLIGHT_TIMEOUT_ANNOTATION,
                WORKER_GROUPS_ANNOTATION,
                SLOTS_PER_GROUP_ANNOTATION,
            ]
            .map(annotation_field),
        );
        assert_eq!(fields, expected);
        assert!(read.bad(SSH_SETUP_ANNOTATION) && !read.bad(CONTAINER_ANNOTATION));
        let settings = &read.settings;
        assert_eq!(
            (
                settings.run_launcher_as_node,
                settings.preflight,
                settings.network_policy,
                settings.ssh_port,
                settings.worker_groups.as_slice(),
                settings.container.as_deref(),
            ),
            (
                false,
                true,
                None,
                2222,
                &["node".to_string()][..],
                Some("mpi")
            )
        );
        assert_eq!(
            read.errors[3].to_string(),
            "metadata.annotations[mpi-webhook.io/run-launcher-as-node]: Unsupported value: \"yes\": supported values: \"true\", \"false\""
        );
        assert!(read.into_result().is_err());
    }

    #[test]
    fn an_unset_ssh_setup_is_asked_of_the_caller_with_the_wired_container() {
        let read = Read::new(
            &metadata(json!({
                "labels": {IMPLEMENTATION_LABEL: "MPICH"},
                "annotations": {CONTAINER_ANNOTATION: "mpi"}
            })),
            |container| {
                assert_eq!(container, Some("mpi"));
                SshSetup::Image
            },
        );
        let settings = read.into_result().expect("parses");
        assert_eq!(
            (settings.ssh_setup, settings.ssh_port),
            (SshSetup::Image, 22)
        );
        let set = Read::new(
            &metadata(json!({
                "labels": {IMPLEMENTATION_LABEL: "MPICH"},
                "annotations": {SSH_SETUP_ANNOTATION: "generated"}
            })),
            |_| panic!("not asked when the annotation is set"),
        );
        assert_eq!(set.settings.ssh_setup, SshSetup::Generated);
    }
}
