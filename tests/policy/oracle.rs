//! The reference JobSet mutation, the oracle of the differential tests: the JobSet as the MPI
//! policy wants it (spec section C, and JobSet mode's defaults), made by editing a copy of it in
//! place, rule after rule, the most direct reading of the spec. It knows nothing of operations:
//! `support::enforce` (every JobSet the tests mutate) and `admission::every_edit_*` (every edit of
//! a review) apply the shipped writer's patch (`mpi_webhook::mpi::enforce`) and compare what it
//! makes with what this makes, or the writer's error with this one's. The operations themselves
//! are held by the golden corpus (`golden.rs`), so the writer answers to two references that
//! share no code with it: where to write, and what the JobSet must end up as.
//!
//! Lists are upserted (volumes and env by `name`, mounts by `mountPath`): an equal entry stays,
//! a different one is replaced where it is, a missing one is appended. A missing or `null` object
//! member on the way to a write becomes an object; any other value of the wrong JSON type there,
//! or a list that is not an array, is the writer's error.

use mpi_webhook::mpi::enforce::MutationError;
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::mpi::{
    HOSTFILE_DIR, HOSTFILE_MODE, HOSTFILE_NAME, HOSTFILE_VOLUME, LAUNCHER, NODE,
    SSH_AUTH_DEFAULT_MODE, SSH_AUTH_VOLUME, SSH_AUTHORIZED_KEYS_FILE, SSH_PRIVATE_KEY,
    SSH_PRIVATE_KEY_FILE, SSH_PUBLIC_KEY, SSH_PUBLIC_KEY_FILE, SSH_PUBLIC_KEY_FILE_MODE,
    hostfile_configmap_name, ssh_secret_name,
};
use serde_json::{Map, Value, json};

use mpi_webhook::mpi::jobset_mode::ssh_setup::script;

use super::preflight::preflight_container;

const PREFLIGHT: &str = "mpi-preflight";

/// The SSH Secret's volume (C.3).
fn ssh_auth_volume(plan: &MpiPlan) -> Value {
    json!({
        "name": SSH_AUTH_VOLUME,
        "secret": {
            "secretName": ssh_secret_name(&plan.jobset_name),
            "defaultMode": SSH_AUTH_DEFAULT_MODE,
            "items": [
                {"key": SSH_PRIVATE_KEY, "path": SSH_PRIVATE_KEY_FILE, "mode": plan.ssh_private_key_mode},
                {"key": SSH_PUBLIC_KEY, "path": SSH_PUBLIC_KEY_FILE, "mode": SSH_PUBLIC_KEY_FILE_MODE},
                {"key": SSH_PUBLIC_KEY, "path": SSH_AUTHORIZED_KEYS_FILE, "mode": SSH_PUBLIC_KEY_FILE_MODE},
            ]
        }
    })
}

/// `generated`'s Secret volume: 0444 for every file, no item modes.
fn generated_ssh_auth_volume(plan: &MpiPlan) -> Value {
    json!({
        "name": SSH_AUTH_VOLUME,
        "secret": {
            "secretName": ssh_secret_name(&plan.jobset_name),
            "defaultMode": 0o444,
            "items": [
                {"key": SSH_PRIVATE_KEY, "path": SSH_PRIVATE_KEY_FILE},
                {"key": SSH_PUBLIC_KEY, "path": SSH_PUBLIC_KEY_FILE},
            ]
        }
    })
}

/// `generated`'s init container, in the image and as the user of `wired`.
fn ssh_setup_container(wired: &Value, port: u16) -> Value {
    let mut security = Map::new();
    for key in ["runAsUser", "runAsGroup", "runAsNonRoot"] {
        if let Some(v) = wired
            .get("securityContext")
            .and_then(|c| c.get(key))
            .filter(|v| !v.is_null())
        {
            security.insert(key.into(), v.clone());
        }
    }
    security.insert("allowPrivilegeEscalation".into(), json!(false));
    security.insert("capabilities".into(), json!({"drop": ["ALL"]}));
    security.insert("seccompProfile".into(), json!({"type": "RuntimeDefault"}));
    let mut c = Map::new();
    c.insert("name".into(), json!(SSH_SETUP));
    if let Some(image) = wired.get("image").filter(|v| !v.is_null()) {
        c.insert("image".into(), image.clone());
    }
    c.insert("command".into(), json!(["sh", "-c", script(port)]));
    c.insert(
        "volumeMounts".into(),
        json!([
            {"name": "mpi-ssh-auth", "mountPath": "/run/mpi-ssh-secret", "readOnly": true},
            {"name": "mpi-ssh-runtime", "mountPath": "/run/mpi-ssh"}
        ]),
    );
    c.insert(
        "terminationMessagePolicy".into(),
        json!("FallbackToLogsOnError"),
    );
    c.insert(
        "resources".into(),
        json!({"requests": {"cpu": "10m", "memory": "16Mi"},
               "limits": {"cpu": "100m", "memory": "32Mi"}}),
    );
    c.insert("securityContext".into(), Value::Object(security));
    Value::Object(c)
}

const SSH_SETUP: &str = "mpi-ssh-setup";

/// The launcher's hostfile volume (C.3).
fn hostfile_volume(plan: &MpiPlan) -> Value {
    json!({
        "name": HOSTFILE_VOLUME,
        "configMap": {
            "name": hostfile_configmap_name(&plan.jobset_name),
            "items": [{"key": HOSTFILE_NAME, "path": HOSTFILE_NAME, "mode": HOSTFILE_MODE}]
        }
    })
}

fn mount(name: &str, mount_path: &str) -> Value {
    json!({"name": name, "mountPath": mount_path})
}

/// Whether `value` is absent or `null`: where JobSet mode may fill in a default.
fn unset(value: Option<&Value>) -> bool {
    value.is_none_or(Value::is_null)
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "\"null\"",
        Value::Bool(_) => "\"boolean\"",
        Value::Number(_) => "\"number\"",
        Value::String(_) => "\"string\"",
        Value::Array(_) => "\"array\"",
        Value::Object(_) => "\"object\"",
    }
}

fn wrong_type(field: &str, found: &Value, expected: &'static str) -> MutationError {
    MutationError {
        field: field.to_owned(),
        found: json_type(found),
        expected,
    }
}

/// `value`, at `field`, as an object.
fn object<'v>(
    value: &'v mut Value,
    field: &str,
) -> Result<&'v mut Map<String, Value>, MutationError> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(wrong_type(field, other, "an object")),
    }
}

/// The object at member `key` of `parent` (at `field`), made an empty one when unset.
fn member_object<'v>(
    parent: &'v mut Map<String, Value>,
    field: &str,
    key: &str,
) -> Result<&'v mut Map<String, Value>, MutationError> {
    let slot = parent.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = json!({});
    }
    object(slot, &format!("{field}.{key}"))
}

/// The list at member `key` of `parent` (at `field`), made an empty one when unset.
fn member_list<'v>(
    parent: &'v mut Map<String, Value>,
    field: &str,
    key: &str,
) -> Result<&'v mut Vec<Value>, MutationError> {
    let slot = parent.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = json!([]);
    }
    match slot {
        Value::Array(list) => Ok(list),
        other => Err(wrong_type(&format!("{field}.{key}"), other, "an array")),
    }
}

/// `item` in `list`: in place of the entry with the same `key`, else at the end.
fn upsert(list: &mut Vec<Value>, key: &str, item: Value) {
    match list
        .iter_mut()
        .find(|entry| entry.get(key) == item.get(key))
    {
        Some(entry) => *entry = item,
        None => list.push(item),
    }
}

/// Whether `list` holds an entry named `name`.
fn named(list: &[Value], name: &str) -> bool {
    list.iter().any(|c| c.get("name") == Some(&json!(name)))
}

/// `jobset` with the MPI wiring of `plan`: unchanged when it already has it.
///
/// # Errors
/// The [`MutationError`] the writer reports: the first place, in the order of the rules below,
/// where a value of the wrong JSON type stands in the way of a write.
pub fn wired(plan: &MpiPlan, jobset: &Value) -> Result<Value, MutationError> {
    let mut out = jobset.clone();
    // JobSet refuses dependsOn next to `startupPolicyOrder: InOrder`.
    let in_order =
        jobset.pointer("/spec/startupPolicy/startupPolicyOrder") == Some(&json!("InOrder"));
    let rjobs = match out.pointer_mut("/spec/replicatedJobs") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Array(rjobs)) => rjobs,
        Some(other) => return Err(wrong_type("spec.replicatedJobs", other, "an array")),
    };
    let mut node_before = false;
    for (i, rjob) in rjobs.iter_mut().enumerate() {
        let name = rjob.get("name").and_then(Value::as_str).unwrap_or_default();
        let is_node = name == NODE;
        let launcher = match name {
            LAUNCHER => Some(node_before && !in_order),
            NODE => None,
            _ => continue,
        };
        if let Value::Object(rjob) = rjob {
            wire(plan, rjob, &format!("spec.replicatedJobs[{i}]"), launcher)?;
        }
        node_before |= is_node;
    }
    Ok(out)
}

/// Wires one replicatedJob, `rjob` at `field`. `launcher`: for the launcher `Some(whether it may
/// depend on node)` (node listed before it, no `startupPolicyOrder: InOrder`), `None` for `node`.
fn wire(
    plan: &MpiPlan,
    rjob: &mut Map<String, Value>,
    field: &str,
    launcher: Option<bool>,
) -> Result<(), MutationError> {
    let is_launcher = launcher.is_some();
    let defaults = plan.jobset_defaults.is_some();
    let port = plan.ssh_port();
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (false, Some(count)) = (is_launcher, plan.node_count) {
        let template = member_object(rjob, field, "template")?;
        let spec = member_object(template, &format!("{field}.template"), "spec")?;
        spec.insert("parallelism".into(), json!(count));
        spec.insert("completions".into(), json!(count));
    }
    // JobSet mode: the launcher waits for Ready workers when `node` is listed before it.
    if defaults && launcher == Some(true) && unset(rjob.get("dependsOn")) {
        rjob.insert(
            "dependsOn".into(),
            json!([{"name": "node", "status": "Ready"}]),
        );
    }
    // C.3: volumes, by name.
    let mut at = field.to_owned();
    let mut pod_spec = rjob;
    for key in ["template", "spec", "template", "spec"] {
        pod_spec = member_object(pod_spec, &at, key)?;
        at = format!("{at}.{key}");
    }
    let generated = plan.generated_ssh();
    let volumes = member_list(pod_spec, &at, "volumes")?;
    if generated {
        upsert(volumes, "name", generated_ssh_auth_volume(plan));
    } else {
        upsert(volumes, "name", ssh_auth_volume(plan));
    }
    if is_launcher {
        upsert(volumes, "name", hostfile_volume(plan));
    }
    if generated {
        upsert(
            volumes,
            "name",
            json!({"name": "mpi-ssh-runtime", "emptyDir": {}}),
        );
    }
    // `generated`: the ssh setup first among the init containers of both pods, unless one of
    // that name is there, among them or among the containers.
    let wired = pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter().enumerate().find(|(c, entry)| {
                plan.wired_container
                    .wires(*c, entry.get("name").and_then(Value::as_str))
            })
        })
        .map(|(_, entry)| entry.clone());
    let setup_taken = pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .is_some_and(|containers| named(containers, SSH_SETUP));
    if let (true, Some(wired), false) = (generated, &wired, setup_taken) {
        let init = member_list(pod_spec, &at, "initContainers")?;
        if !named(init, SSH_SETUP) {
            init.insert(0, ssh_setup_container(wired, port));
        }
    }
    // JobSet mode: the pre-flight first among the launcher's init containers, unless one of
    // that name is there, among them or among the containers.
    let taken = pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .is_some_and(|containers| named(containers, PREFLIGHT));
    if let (true, Some(image), false) = (is_launcher, plan.preflight_image(), taken) {
        let init = member_list(pod_spec, &at, "initContainers")?;
        if !named(init, PREFLIGHT) {
            // After the ssh setup, when there is one.
            let at = match generated {
                true => init
                    .iter()
                    .position(|c| c.get("name") == Some(&json!(SSH_SETUP)))
                    .map_or(0, |p| p + 1),
                false => 0,
            };
            init.insert(at, preflight_container(image, &port.to_string()));
        }
    }
    // C.4 and C.5: mounts by mountPath and env by name, on the wired containers only (in
    // TrainJob mode those named `node`).
    let containers = match pod_spec.get_mut("containers") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(containers)) => containers,
        Some(other) => return Err(wrong_type(&format!("{at}.containers"), other, "an array")),
    };
    for (c, container) in containers.iter_mut().enumerate() {
        let name = container.get("name").and_then(Value::as_str);
        if !plan.wired_container.wires(c, name) {
            continue;
        }
        let at = format!("{at}.containers[{c}]");
        let container = object(container, &at)?;
        let mounts = member_list(container, &at, "volumeMounts")?;
        if generated {
            upsert(
                mounts,
                "mountPath",
                mount("mpi-ssh-runtime", "/run/mpi-ssh"),
            );
            upsert(
                mounts,
                "mountPath",
                json!({"name": "mpi-ssh-runtime", "mountPath": "/etc/passwd", "subPath": "passwd"}),
            );
        } else {
            upsert(
                mounts,
                "mountPath",
                mount(SSH_AUTH_VOLUME, &plan.ssh_auth_mount_path),
            );
        }
        if is_launcher {
            upsert(mounts, "mountPath", mount(HOSTFILE_VOLUME, HOSTFILE_DIR));
            let env = member_list(container, &at, "env")?;
            for (name, value) in plan.launcher_env() {
                upsert(env, "name", json!({"name": name, "value": value}));
            }
        }
        // JobSet mode: sshd on the workers, unless they run something of their own, and a
        // readiness probe on its port.
        if defaults && !is_launcher {
            if unset(container.get("command")) && unset(container.get("args")) {
                let command = if generated {
                    json!(["/usr/sbin/sshd", "-De", "-f", "/run/mpi-ssh/sshd_config"])
                } else {
                    json!(["/usr/sbin/sshd", "-De", "-p", port.to_string()])
                };
                container.insert("command".into(), command);
            }
            if unset(container.get("readinessProbe")) {
                container.insert(
                    "readinessProbe".into(),
                    json!({"tcpSocket": {"port": port}}),
                );
            }
        }
    }
    Ok(())
}
