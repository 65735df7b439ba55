//! The MPI policy: Kubeflow Trainer's MPI plugin (`pkg/runtime/framework/plugins/mpi/mpi.go`) as
//! pure functions over plain data, cut into the steps it performs, lowest layer first.
//!
//! - [`implementation`]: Open MPI, Intel MPI and MPICH as one table of data (Decision 5).
//! - [`jobset_mode`]: JobSet mode's label and annotations, read once into its settings.
//! - [`plan`]: resolve the effective policy of a TrainJob on its runtime, or of a JobSet-mode
//!   JobSet on its settings (node count, slots, pod sets, implementation), complete with its
//!   [`plan::Options`]. The webhook's patch and the reconciler's hostfile both start here, so
//!   they always agree.
//! - [`hostfile`]: endpoints and the hostfile ConfigMap (section D.2, D.3).
//! - [`validate`]: TrainJob and runtime admission rules (spec section B and the Decisions).
//! - [`jobset_rules`]: JobSet mode's admission rules.
//! - [`enforce`]: the JobSet mutation as RFC 6902 operations on the raw JobSet (section C).
//! - [`ssh_secret`]: the SSH key pair (the only randomness) and the Secret (section D.1).
//! - [`network_policy`]: the per-job NetworkPolicy that admits only the job's own pods.
//! - [`objects_for`]: the objects an owner needs ([`objects_for::desired`], shared by the
//!   reconciler and `render`), from a runtime already looked up.
//! - [`failed_run`]: a launcher Pod's failed pre-flight or launcher run, and the Event that
//!   says so on the job's owner.
//!
//! Nothing here performs I/O or reads a clock: the lookups of runtimes and TrainJobs are
//! [`crate::objects`]'s, above this layer.

pub mod enforce;
pub mod failed_run;
pub mod hostfile;
pub mod implementation;
pub mod jobset_mode;
pub mod jobset_rules;
pub mod lost_worker;
pub mod network_policy;
pub mod objects_for;
pub mod plan;
pub mod ssh_secret;
pub mod validate;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::{JOBSET_API_VERSION, JobSet, TRAINER_API_VERSION, TrainJob};

/// Name of the launcher replicatedJob / PodSet.
pub const LAUNCHER: &str = "launcher";
/// Name of the worker replicatedJob / PodSet, and of the container the policy touches in both.
pub const NODE: &str = "node";
/// Label on a replicatedJob template naming the TrainJob step it runs.
pub const ANCESTOR_LABEL: &str = "trainer.kubeflow.org/trainjob-ancestor-step";
/// Value of [`ANCESTOR_LABEL`] for the trainer step.
pub const ANCESTOR_TRAINER: &str = "trainer";
/// Label every object the reconciler creates carries, so it can watch only its own (Decision 13).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`]; also the server-side-apply field manager.
pub const MANAGER: &str = "mpi-webhook";

/// Volume name of the SSH auth Secret.
pub const SSH_AUTH_VOLUME: &str = "mpi-ssh-auth";
/// Suffix of the Secret name: `<trainjob>-mpi-ssh-auth`.
pub const SSH_AUTH_SECRET_SUFFIX: &str = "-mpi-ssh-auth";
/// Secret key of the private key (`corev1.SSHAuthPrivateKey`).
pub const SSH_PRIVATE_KEY: &str = "ssh-privatekey";
/// Secret key of the public key.
pub const SSH_PUBLIC_KEY: &str = "ssh-publickey";
/// File the private key is projected to; `id_rsa` although the key is ECDSA (kept quirk, Decision 15).
pub const SSH_PRIVATE_KEY_FILE: &str = "id_rsa";
/// File the public key is projected to.
pub const SSH_PUBLIC_KEY_FILE: &str = "id_rsa.pub";
/// Second projection of the public key, so every pod accepts every other pod.
pub const SSH_AUTHORIZED_KEYS_FILE: &str = "authorized_keys";
/// `defaultMode` of the Secret volume: 0o400.
pub const SSH_AUTH_DEFAULT_MODE: i32 = 0o400;
/// Mode of the private key file in TrainJob mode: upstream's 0o640, byte for byte (Decision 16).
/// Kubeflow Trainer re-applies its own JobSet while it is suspended; any other value there would
/// be a change to `replicatedJobs`, which JobSet's webhook rejects, and the job would never
/// resume. Trainer's runtimes run the launcher as a non-root user with `fsGroup`, which this
/// mode serves.
pub const SSH_PRIVATE_KEY_FILE_MODE_TRAINER: i32 = 0o640;
/// Mode of the private key file in JobSet mode: 0o600 (Decision 18). Proven on real launchers
/// (tests/mpi_launchers): a launcher running as the file's owner (root, as kubelet writes Secret
/// files) has ssh refuse a group-readable key ("UNPROTECTED PRIVATE KEY FILE"). With `fsGroup`,
/// kubelet still adds group read (0o640, group fsGroup), so non-root users keep working. No
/// Trainer re-applies a JobSet-mode JobSet, so nothing constrains this value to upstream's.
pub const SSH_PRIVATE_KEY_FILE_MODE_STRICT: i32 = 0o600;
/// Mode of the public key files: 0o644.
pub const SSH_PUBLIC_KEY_FILE_MODE: i32 = 0o644;
/// Secret type of the SSH auth Secret.
pub const SSH_AUTH_SECRET_TYPE: &str = "kubernetes.io/ssh-auth";

/// Volume name of the hostfile ConfigMap.
pub const HOSTFILE_VOLUME: &str = "mpi-hostfile";
/// Suffix of the ConfigMap name: `<trainjob>-mpi-hostfile`.
pub const HOSTFILE_CONFIGMAP_SUFFIX: &str = "-mpi-hostfile";
/// Directory the hostfile is mounted at.
pub const HOSTFILE_DIR: &str = "/etc/mpi";
/// ConfigMap key, item key and file name of the hostfile.
pub const HOSTFILE_NAME: &str = "hostfile";
/// Full path of the hostfile in the launcher.
pub const HOSTFILE_PATH: &str = "/etc/mpi/hostfile";
/// Mode of the hostfile item: 0o444.
pub const HOSTFILE_MODE: i32 = 0o444;
/// Why the SSH Secret cannot be mounted at a path: the hostfile's directory, where the two mounts,
/// upserted by mountPath, would replace each other (found by the `mutation` fuzz target).
pub const SSH_MOUNT_ON_HOSTFILE_DETAIL: &str =
    "must not be /etc/mpi, where the hostfile is mounted";

/// Whether mounting the SSH Secret at `path` would take the hostfile's mount path.
pub fn mounts_over_hostfile(path: &str) -> bool {
    path.trim_end_matches('/') == HOSTFILE_DIR
}

/// Name of the launcher pre-flight init container (JobSet mode, `--preflight-image`).
pub const PREFLIGHT_CONTAINER: &str = "mpi-preflight";
/// The binary in the pre-flight image: the shipped image's `mpi-webhook`.
pub const PREFLIGHT_BINARY: &str = "/usr/local/bin/mpi-webhook";
/// The uid and gid the pre-flight runs as: the shipped image's `nonroot` user.
pub const PREFLIGHT_USER: i64 = 65532;
/// The command of the workers' `node` container when the user set neither command nor args.
pub const SSHD: &str = "/usr/sbin/sshd";

/// Largest hostfile that fits a ConfigMap (1 MiB of data, `api.MaxSecretSize`).
pub const HOSTFILE_MAX_BYTES: u64 = 1024 * 1024;

/// Label JobSet puts on every Job and pod of a JobSet: the JobSet's name. The NetworkPolicy
/// selects the job's pods by it.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// Suffix of the NetworkPolicy name: `<trainjob>-mpi`.
pub const NETWORK_POLICY_SUFFIX: &str = "-mpi";

/// `<trainjob>-mpi`.
pub fn network_policy_name(train_job: &str) -> String {
    format!("{train_job}{NETWORK_POLICY_SUFFIX}")
}

/// `<trainjob>-mpi-ssh-auth`.
pub fn ssh_secret_name(train_job: &str) -> String {
    format!("{train_job}{SSH_AUTH_SECRET_SUFFIX}")
}

/// `<trainjob>-mpi-hostfile`.
pub fn hostfile_configmap_name(train_job: &str) -> String {
    format!("{train_job}{HOSTFILE_CONFIGMAP_SUFFIX}")
}

/// The object the reconciler's Secret and ConfigMap belong to: a TrainJob (TrainJob mode) or a
/// JobSet (JobSet mode). Both modes build their objects from this, so they differ only in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `apiVersion` of the owner.
    pub api_version: &'static str,
    /// `kind` of the owner.
    pub kind: &'static str,
    /// Its name: the prefix of the objects' names.
    pub name: String,
    /// Its namespace: the objects' namespace.
    pub namespace: String,
    /// Its uid, for the owner reference.
    pub uid: String,
}

impl From<&TrainJob> for Owner {
    fn from(train_job: &TrainJob) -> Self {
        Self {
            api_version: TRAINER_API_VERSION,
            kind: "TrainJob",
            name: train_job.name().to_string(),
            namespace: train_job.namespace().to_string(),
            uid: train_job.uid().to_string(),
        }
    }
}

impl From<&JobSet> for Owner {
    fn from(jobset: &JobSet) -> Self {
        Self {
            api_version: JOBSET_API_VERSION,
            kind: "JobSet",
            name: jobset.name().to_string(),
            namespace: jobset.namespace().to_string(),
            uid: jobset.uid().to_string(),
        }
    }
}

/// Metadata of an object the reconciler creates for `owner`: its namespace, the controller
/// owner reference and the managed-by label, nothing else (Decision 13).
pub fn owned_metadata(owner: &Owner, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(owner.namespace.clone()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGER.to_string(),
        )])),
        owner_references: Some(vec![owner_reference(owner)]),
        ..ObjectMeta::default()
    }
}

/// The controller owner reference every object derived from `owner` carries.
pub fn owner_reference(owner: &Owner) -> OwnerReference {
    OwnerReference {
        api_version: owner.api_version.to_string(),
        kind: owner.kind.to_string(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
