//! The reference JobSet mutation, the oracle of the differential tests: the MPI policy's
//! operations (spec section C) computed on a `serde_json::Value` with a working copy, the most
//! direct reading of the spec, kept as the readable statement of the rules next to the shipped
//! writer (`mpi_webhook::mpi::enforce`, the same approach); `support::enforce` checks the two
//! agree on every JobSet the tests mutate, and `admission::every_edit_*` on every edit of a
//! review, and both against the golden corpus (`golden.rs`).
//!
//! Lists are upserted (volumes and env by `name`, mounts by `mountPath`): an equal entry yields
//! no operation, a different one is replaced in place, a missing one is appended.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use mpi_webhook::mpi::enforce::MutationError;
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::mpi::{
    HOSTFILE_DIR, HOSTFILE_MODE, HOSTFILE_NAME, HOSTFILE_PATH, HOSTFILE_VOLUME, LAUNCHER, NODE,
    SSH_AUTH_DEFAULT_MODE, SSH_AUTH_VOLUME, SSH_AUTHORIZED_KEYS_FILE, SSH_PRIVATE_KEY,
    SSH_PRIVATE_KEY_FILE, SSH_PUBLIC_KEY, SSH_PUBLIC_KEY_FILE, SSH_PUBLIC_KEY_FILE_MODE,
    hostfile_configmap_name, ssh_secret_name,
};
use serde_json::{Value, json};

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

/// JobSet mode's pre-flight init container (interface.md "JobSet mode that just works").
fn preflight_container(image: &str, port: u16) -> Value {
    json!({
        "name": "mpi-preflight",
        "image": image,
        "command": ["/usr/local/bin/mpi-webhook", "preflight", "--hostfile", HOSTFILE_PATH,
                    "--port", port.to_string()],
        "volumeMounts": [{"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR, "readOnly": true}],
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

/// Whether `value` is absent or `null`: where JobSet mode may fill in a default.
fn unset(value: Option<&Value>) -> bool {
    value.is_none_or(Value::is_null)
}

fn mount(name: &str, mount_path: &str) -> Value {
    json!({"name": name, "mountPath": mount_path})
}

/// One step of a path into the JobSet. Every member name the policy uses is a constant, so a
/// path is a vector of small `Copy` values: building and extending one allocates once, not once
/// per token (a mutation builds dozens of paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// An object member.
    Key(&'static str),
    /// An array element.
    Index(usize),
    /// The end of an array (`-` in a JSON pointer): where `add` appends.
    End,
}

/// A path into the JobSet.
type Path = Vec<Token>;

fn child(base: &[Token], tokens: &[Token]) -> Path {
    let mut path = Vec::with_capacity(base.len() + tokens.len());
    path.extend_from_slice(base);
    path.extend_from_slice(tokens);
    path
}

/// `tokens` as member names.
fn keys<const N: usize>(names: [&'static str; N]) -> [Token; N] {
    names.map(Token::Key)
}

fn dotted(path: &[Token]) -> String {
    let mut out = String::new();
    for token in path {
        match token {
            Token::Index(i) => out.push_str(&format!("[{i}]")),
            Token::End => out.push_str("[-]"),
            Token::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
        }
    }
    out
}

/// The child of `value` at `token`, if there is one.
fn step<'v>(value: &'v Value, token: &Token) -> Option<&'v Value> {
    match (value, token) {
        (Value::Object(map), Token::Key(key)) => map.get(*key),
        (Value::Array(items), Token::Index(i)) => items.get(*i),
        _ => None,
    }
}

fn step_mut<'v>(value: &'v mut Value, token: &Token) -> Option<&'v mut Value> {
    match (value, token) {
        (Value::Object(map), Token::Key(key)) => map.get_mut(*key),
        (Value::Array(items), Token::Index(i)) => items.get_mut(*i),
        _ => None,
    }
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

/// Builds the operations of one replicatedJob while keeping a working copy of that replicatedJob
/// they have been applied to, so later operations see the effect of earlier ones (indices after
/// an append, parents created). Paths are full JobSet paths; `base` (the replicatedJob's own
/// path, whose every level exists) is the root of the working copy. Copying one replicatedJob
/// instead of the whole JobSet keeps the copy to what the operations can touch.
struct Patcher {
    base: Path,
    doc: Value,
    ops: Vec<PatchOperation>,
}

impl Patcher {
    /// `path` below `base`, or `None` for a path outside the working copy (never asked for).
    fn local<'p>(&self, path: &'p [Token]) -> Option<&'p [Token]> {
        path.strip_prefix(self.base.as_slice())
    }

    fn get(&self, path: &[Token]) -> Option<&Value> {
        self.local(path)?.iter().try_fold(&self.doc, step)
    }

    /// Records `add` (`replace: false`) or `replace` of `value` at `path` and applies it to the
    /// working copy.
    fn emit(&mut self, replace: bool, path: &[Token], value: Value) {
        self.apply(path, &value, !replace);
        let path = pointer(path);
        self.ops.push(if replace {
            PatchOperation::Replace(ReplaceOperation { path, value })
        } else {
            PatchOperation::Add(AddOperation { path, value })
        });
    }

    /// Applies an operation to the working copy, walking the tokens directly (`json_patch::patch`
    /// would re-parse and unescape the pointer and keep an undo log: most of the cost of a
    /// mutation). Every operation targets a location checked just before (an absent or null
    /// object member, the end of an array, an existing value), where `add` and `replace` both
    /// set the value; were one not to apply, the working copy would only be stale for later
    /// operations of this same pass.
    fn apply(&mut self, path: &[Token], value: &Value, insert: bool) {
        let Some(path) = self.local(path) else {
            return;
        };
        let Some((last, parents)) = path.split_last() else {
            self.doc = value.clone();
            return;
        };
        let parent = parents.iter().try_fold(&mut self.doc, step_mut);
        match (parent, last) {
            (Some(Value::Object(map)), Token::Key(key)) => {
                map.insert((*key).to_string(), value.clone());
            }
            (Some(Value::Array(items)), Token::End) => items.push(value.clone()),
            (Some(Value::Array(items)), Token::Index(i)) if insert && *i <= items.len() => {
                items.insert(*i, value.clone());
            }
            (Some(Value::Array(items)), Token::Index(i)) => {
                if let Some(slot) = items.get_mut(*i) {
                    *slot = value.clone();
                }
            }
            _ => {}
        }
    }

    /// Sets `path` to `value`, creating missing parent objects; no operation when equal.
    fn set(&mut self, path: &[Token], value: Value) -> Result<(), MutationError> {
        // The levels down to `base` exist (objects and the replicatedJobs array).
        for depth in self.base.len()..path.len() {
            let parent = &path[..depth];
            let node = self.get(parent);
            match node {
                Some(Value::Object(map)) => {
                    // Only member names follow objects in the paths the policy writes.
                    let Token::Key(key) = path[depth] else {
                        return Err(wrong_type(parent, node, "an array"));
                    };
                    if map.get(key).is_none_or(Value::is_null) {
                        let nested =
                            path[depth + 1..].iter().rev().fold(
                                value,
                                |inner, token| match token {
                                    Token::Key(key) => json!({ *key: inner }),
                                    Token::Index(_) | Token::End => json!([inner]),
                                },
                            );
                        self.emit(false, &path[..=depth], nested);
                        return Ok(());
                    }
                }
                // An array only where the path indexes into one (the replicatedJobs and the
                // lists the policy upserts into); an array where a member name follows is the
                // wrong type, not a place to write (a patch that would not apply).
                Some(Value::Array(_)) if matches!(path[depth], Token::Index(_) | Token::End) => {}
                other => return Err(wrong_type(parent, other, "an object")),
            }
        }
        if self.get(path) != Some(&value) {
            self.emit(true, path, value);
        }
        Ok(())
    }

    /// Upserts `item` into the list at `path`, matching entries on `key`.
    fn upsert(&mut self, path: &[Token], key: &str, item: Value) -> Result<(), MutationError> {
        let list = match self.get(path) {
            None | Some(Value::Null) => return self.set(path, Value::Array(vec![item])),
            Some(Value::Array(list)) => list,
            other => return Err(wrong_type(path, other, "an array")),
        };
        match list
            .iter()
            .position(|entry| entry.get(key) == item.get(key))
        {
            Some(i) if list[i] == item => {}
            Some(i) => {
                let at = child(path, &[Token::Index(i)]);
                self.emit(true, &at, item);
            }
            None => {
                let at = child(path, &[Token::End]);
                self.emit(false, &at, item);
            }
        }
        Ok(())
    }
}

/// `path` as a JSON pointer.
fn pointer(path: &[Token]) -> PointerBuf {
    let mut pointer = PointerBuf::new();
    for token in path {
        match token {
            Token::Key(key) => pointer.push_back(*key),
            Token::Index(i) => pointer.push_back(*i),
            Token::End => pointer.push_back("-"),
        }
    }
    pointer
}

fn wrong_type(path: &[Token], found: Option<&Value>, expected: &'static str) -> MutationError {
    MutationError {
        field: dotted(path),
        found: found.map_or("\"null\"", json_type),
        expected,
    }
}

/// The RFC 6902 operations that give `jobset` (raw JSON) the MPI wiring of `plan`. Empty when
/// the JobSet already has it.
///
/// # Errors
/// [`MutationError`] when a location the policy writes holds a value of the wrong JSON type.
pub fn enforce_mpi_policy(
    plan: &MpiPlan,
    jobset: &Value,
) -> Result<Vec<PatchOperation>, MutationError> {
    let mut ops = Vec::new();
    let rjobs = match jobset.pointer("/spec/replicatedJobs") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(rjobs)) => rjobs,
        other => {
            return Err(wrong_type(
                &keys(["spec", "replicatedJobs"]),
                other,
                "an array",
            ));
        }
    };
    // JobSet refuses dependsOn next to `startupPolicyOrder: InOrder`.
    let in_order =
        jobset.pointer("/spec/startupPolicy/startupPolicyOrder") == Some(&json!("InOrder"));
    let mut node_before = false;
    for (i, rjob) in rjobs.iter().enumerate() {
        let name = rjob.get("name").and_then(Value::as_str).unwrap_or_default();
        if !rjob.is_object() || (name != LAUNCHER && name != NODE) {
            continue;
        }
        let rjob_path = child(&keys(["spec", "replicatedJobs"]), &[Token::Index(i)]);
        let mut patcher = Patcher {
            base: rjob_path.clone(),
            doc: rjob.clone(),
            ops: Vec::new(),
        };
        let launcher = (name == LAUNCHER).then_some(node_before && !in_order);
        enforce_replicated_job(&mut patcher, plan, &rjob_path, launcher)?;
        ops.append(&mut patcher.ops);
        node_before |= name == NODE;
    }
    Ok(ops)
}

/// `launcher`: for the launcher `Some(whether it may depend on node)` (node listed before it, no
/// `startupPolicyOrder: InOrder`), `None` for `node`.
fn enforce_replicated_job(
    patcher: &mut Patcher,
    plan: &MpiPlan,
    rjob_path: &[Token],
    launcher: Option<bool>,
) -> Result<(), MutationError> {
    let is_launcher = launcher.is_some();
    let defaults = plan.jobset_defaults.is_some();
    let port = plan.ssh_port();
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (false, Some(count)) = (is_launcher, plan.node_count) {
        patcher.set(
            &child(rjob_path, &keys(["template", "spec", "parallelism"])),
            json!(count),
        )?;
        patcher.set(
            &child(rjob_path, &keys(["template", "spec", "completions"])),
            json!(count),
        )?;
    }
    // JobSet mode: the launcher waits for Ready workers when `node` is listed before it.
    let depends_on = child(rjob_path, &keys(["dependsOn"]));
    if defaults && launcher == Some(true) && unset(patcher.get(&depends_on)) {
        patcher.emit(
            false,
            &depends_on,
            json!([{"name": "node", "status": "Ready"}]),
        );
    }
    // C.3: volumes, by name.
    let pod_spec = child(rjob_path, &keys(["template", "spec", "template", "spec"]));
    let volumes = child(&pod_spec, &keys(["volumes"]));
    patcher.upsert(&volumes, "name", ssh_auth_volume(plan))?;
    if is_launcher {
        patcher.upsert(&volumes, "name", hostfile_volume(plan))?;
    }
    // JobSet mode: the pre-flight first among the launcher's init containers, unless one of
    // that name is there, among them or among the containers.
    let named_preflight = |list: Option<&Value>| {
        list.and_then(Value::as_array).is_some_and(|l| {
            l.iter()
                .any(|c| c.get("name") == Some(&json!("mpi-preflight")))
        })
    };
    let taken = named_preflight(patcher.get(&child(&pod_spec, &keys(["containers"]))));
    if let (true, Some(image), false) = (is_launcher, plan.preflight_image(), taken) {
        let init = child(&pod_spec, &keys(["initContainers"]));
        match patcher.get(&init) {
            None | Some(Value::Null) => {
                patcher.emit(false, &init, json!([preflight_container(image, port)]));
            }
            Some(Value::Array(list)) => {
                if !list
                    .iter()
                    .any(|c| c.get("name") == Some(&json!("mpi-preflight")))
                {
                    let first = child(&init, &[Token::Index(0)]);
                    patcher.emit(false, &first, preflight_container(image, port));
                }
            }
            other => return Err(wrong_type(&init, other, "an array")),
        }
    }
    // C.4 and C.5: mounts by mountPath and env by name, on the wired containers only (in
    // TrainJob mode those named `node`).
    let containers = child(&pod_spec, &keys(["containers"]));
    let count = match patcher.get(&containers) {
        None | Some(Value::Null) => 0,
        Some(Value::Array(list)) => list.len(),
        other => return Err(wrong_type(&containers, other, "an array")),
    };
    for c in 0..count {
        let container = child(&containers, &[Token::Index(c)]);
        let name = patcher
            .get(&child(&container, &keys(["name"])))
            .and_then(Value::as_str);
        if !plan.wired_container.wires(c, name) {
            continue;
        }
        let mounts = child(&container, &keys(["volumeMounts"]));
        patcher.upsert(
            &mounts,
            "mountPath",
            mount(SSH_AUTH_VOLUME, &plan.ssh_auth_mount_path),
        )?;
        if is_launcher {
            patcher.upsert(&mounts, "mountPath", mount(HOSTFILE_VOLUME, HOSTFILE_DIR))?;
            let env = child(&container, &keys(["env"]));
            for (name, value) in plan.launcher_env() {
                patcher.upsert(&env, "name", json!({"name": name, "value": value}))?;
            }
        }
        // JobSet mode: sshd on the workers, unless they run something of their own, and a
        // readiness probe on its port.
        if defaults && !is_launcher {
            let command = child(&container, &keys(["command"]));
            let args = child(&container, &keys(["args"]));
            if unset(patcher.get(&command)) && unset(patcher.get(&args)) {
                patcher.emit(
                    false,
                    &command,
                    json!(["/usr/sbin/sshd", "-De", "-p", port.to_string()]),
                );
            }
            let probe = child(&container, &keys(["readinessProbe"]));
            if unset(patcher.get(&probe)) {
                patcher.emit(false, &probe, json!({"tcpSocket": {"port": port}}));
            }
        }
    }
    Ok(())
}
