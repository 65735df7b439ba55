//! The launcher pre-flight init container exactly as the contract says the webhook adds it, for
//! the tests that assert it in a patch (`tests/cli.rs`, `tests/policy/jobset_mode.rs`). Written
//! out by hand from the contract, not from the code, so a change to the code shows up here.

use serde_json::{Value, json};

/// The `mpi-preflight` init container for `image` and the workers' sshd `port`.
pub fn preflight_container(image: &str, port: &str) -> Value {
    preflight_container_with_timeout(image, port, None)
}

/// The same, with `--timeout` when the JobSet sets `mpi-webhook.io/preflight-timeout`.
pub fn preflight_container_with_timeout(image: &str, port: &str, timeout: Option<&str>) -> Value {
    let mut command = json!([
        "/usr/local/bin/mpi-webhook",
        "preflight",
        "--hostfile",
        "/etc/mpi/hostfile",
        "--port",
        port
    ]);
    if let (Some(timeout), Some(words)) = (timeout, command.as_array_mut()) {
        words.extend([json!("--timeout"), json!(timeout)]);
    }
    json!({
        "name": "mpi-preflight",
        "image": image,
        "command": command,
        "volumeMounts": [{"name": "mpi-hostfile", "mountPath": "/etc/mpi", "readOnly": true}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "32Mi"}
        },
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}
