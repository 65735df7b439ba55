//! The entries the policy writes into a JobSet (C.3 to C.5), defined once as serializable types.
//!
//! The mutation builds each once per JobSet, as the JSON every operation that carries it holds.
//! Members are declared in the order they are written, the order of docs/behaviour.md.

use serde::Serialize;
use serde_json::{Value, json};

use super::super::jobset_mode::ssh_setup;
use super::super::plan::MpiPlan;
use super::super::{
    HOSTFILE_DIR, HOSTFILE_MODE, HOSTFILE_NAME, HOSTFILE_PATH, HOSTFILE_VOLUME, LAUNCHER,
    PREFLIGHT_BINARY, PREFLIGHT_CONTAINER, PREFLIGHT_USER, SSH_AUTH_DEFAULT_MODE, SSH_AUTH_VOLUME,
    SSH_AUTHORIZED_KEYS_FILE, SSH_PRIVATE_KEY, SSH_PRIVATE_KEY_FILE, SSH_PUBLIC_KEY,
    SSH_PUBLIC_KEY_FILE, SSH_PUBLIC_KEY_FILE_MODE, SSHD, hostfile_configmap_name, ssh_secret_name,
};

/// A `KeyToPath` of a Secret or ConfigMap volume.
#[derive(Debug, Serialize)]
pub struct KeyToPath {
    key: &'static str,
    path: &'static str,
    mode: i32,
}

/// The `mpi-ssh-auth` Secret volume (C.3).
#[derive(Debug, Serialize)]
pub struct SshAuthVolume {
    name: &'static str,
    secret: SecretSource,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretSource {
    secret_name: String,
    default_mode: i32,
    items: [KeyToPath; 3],
}

/// The launcher's `mpi-hostfile` ConfigMap volume (C.3).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostfileVolume {
    name: &'static str,
    config_map: ConfigMapSource,
}

#[derive(Debug, Serialize)]
struct ConfigMapSource {
    name: String,
    items: [KeyToPath; 1],
}

/// A volume mount of a `node` container (C.4).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount<'a> {
    /// The volume.
    pub name: &'static str,
    /// Where it is mounted: the key mounts are upserted by.
    pub mount_path: &'a str,
}

/// An env var of the implementation on the launcher's `node` container (C.5).
#[derive(Debug, Serialize)]
pub struct EnvVar {
    /// The key env vars are upserted by.
    pub name: &'static str,
    /// Its value.
    pub value: String,
}

impl SshAuthVolume {
    /// The volume of the SSH Secret of `plan` (named after its TrainJob), with the plan's mode
    /// for the private key.
    pub fn new(plan: &MpiPlan) -> Self {
        Self {
            name: SSH_AUTH_VOLUME,
            secret: SecretSource {
                secret_name: ssh_secret_name(&plan.jobset_name),
                default_mode: SSH_AUTH_DEFAULT_MODE,
                items: [
                    KeyToPath {
                        key: SSH_PRIVATE_KEY,
                        path: SSH_PRIVATE_KEY_FILE,
                        mode: plan.ssh_private_key_mode,
                    },
                    KeyToPath {
                        key: SSH_PUBLIC_KEY,
                        path: SSH_PUBLIC_KEY_FILE,
                        mode: SSH_PUBLIC_KEY_FILE_MODE,
                    },
                    KeyToPath {
                        key: SSH_PUBLIC_KEY,
                        path: SSH_AUTHORIZED_KEYS_FILE,
                        mode: SSH_PUBLIC_KEY_FILE_MODE,
                    },
                ],
            },
        }
    }
}

impl HostfileVolume {
    /// The volume of TrainJob `train_job`'s hostfile ConfigMap.
    pub fn new(train_job: &str) -> Self {
        Self {
            name: HOSTFILE_VOLUME,
            config_map: ConfigMapSource {
                name: hostfile_configmap_name(train_job),
                items: [KeyToPath {
                    key: HOSTFILE_NAME,
                    path: HOSTFILE_NAME,
                    mode: HOSTFILE_MODE,
                }],
            },
        }
    }
}

impl<'a> Mount<'a> {
    /// The SSH Secret's mount, where the plan puts it.
    pub fn ssh_auth(plan: &'a MpiPlan) -> Self {
        Self {
            name: SSH_AUTH_VOLUME,
            mount_path: &plan.ssh_auth_mount_path,
        }
    }

    /// The hostfile's mount on the launcher.
    pub fn hostfile() -> Self {
        Self {
            name: HOSTFILE_VOLUME,
            mount_path: HOSTFILE_DIR,
        }
    }
}

/// JobSet mode: the `node` container's command when it has neither command nor args.
pub fn sshd_command(port: u16) -> Value {
    ssh_setup::worker_command(&[SSHD, "-De", "-p", &port.to_string()])
}

/// JobSet mode: the Job `backoffLimit` of the launcher and of every worker group when they have
/// none (Decision 21): the first failed Pod or container restart fails the Job, so the JobSet's
/// `failurePolicy` restarts the whole job through its pre-flight at once (or, without one, the
/// JobSet fails at once) instead of the launcher retrying in place against a missing host.
pub fn backoff_limit() -> Value {
    json!(0)
}

/// JobSet mode: the `node` container's readiness probe when it has none.
pub fn sshd_readiness_probe(port: u16) -> Value {
    json!({"tcpSocket": {"port": port}})
}

/// JobSet mode: the launcher's `dependsOn` when it has none and every worker group (`node`, or
/// those of Decision 20) is listed before it: each group Ready, in the groups' order.
pub fn depends_on_ready_groups<'g>(groups: impl Iterator<Item = &'g str>) -> Value {
    groups
        .map(|name| json!({"name": name, "status": "Ready"}))
        .collect()
}

/// JobSet mode: the JobSet completes when its launcher does, since workers that run sshd never
/// complete; written as the whole `successPolicy` when the JobSet has none.
pub fn success_policy_launcher() -> Value {
    json!({"operator": SUCCESS_ALL, "targetReplicatedJobs": [LAUNCHER]})
}

/// JobSet mode: the wired launcher container's `terminationMessagePolicy` when it has none, so
/// kubelet keeps the tail of its output in the Pod's status when it fails (the reconciler's
/// `LauncherFailed` Event carries it, after the Pod and its log are gone).
pub fn launcher_termination_message_policy() -> Value {
    json!("FallbackToLogsOnError")
}

/// JobSet mode, a launcher that is not a node: the env vars that hide the node's GPUs from it
/// under the NVIDIA container runtime, as mpi-operator sets them, each added only when the user
/// has no entry of that name.
pub fn hide_gpus_env() -> [Value; 2] {
    ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"]
        .map(|name| json!({"name": name, "value": ""}))
}

/// JobSet's `successPolicy` operator that waits for every targeted replicatedJob.
pub const SUCCESS_ALL: &str = "All";

/// JobSet mode: the launcher pre-flight init container, `mpi-webhook preflight` in `image`
/// on the hostfile (with `--timeout` when the JobSet sets one), admitted under the `restricted`
/// Pod Security Standard.
pub fn preflight_container(image: &str, port: u16, timeout: Option<&str>) -> Value {
    let mut command = vec![
        PREFLIGHT_BINARY.to_string(),
        "preflight".into(),
        "--hostfile".into(),
        HOSTFILE_PATH.into(),
        "--port".into(),
        port.to_string(),
    ];
    if let Some(timeout) = timeout {
        command.extend(["--timeout".into(), timeout.to_string()]);
    }
    json!({
        "name": PREFLIGHT_CONTAINER,
        "image": image,
        "command": command,
        "volumeMounts": [{"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR, "readOnly": true}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "32Mi"}
        },
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": PREFLIGHT_USER,
            "runAsGroup": PREFLIGHT_USER,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}
