//! The reference JobSet mutation, the oracle of the differential tests: the JobSet as the MPI
//! policy wants it (docs/behaviour.md section C, and JobSet mode's defaults), made by editing a copy of it in
//! place, rule after rule, the most direct reading of the docs. It knows nothing of operations:
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
//!
//! The values it writes (names, modes, env names and values, the defaults) are literals from
//! docs/behaviour.md and docs/jobset-mode.md, not `src`'s constants or functions, so that the
//! reference can disagree with the writer; of the plan it reads only the inputs (the
//! implementation's name, slots, counts, names, the settings).

use mpi_webhook::mpi::enforce::MutationError;
use mpi_webhook::mpi::plan::{MpiPlan, WiredContainer};
use serde_json::{Map, Value, json};

/// The script JobSet mode's workers run sshd under (docs/jobset-mode.md "Defaults"), as the
/// contract writes it.
const WORKER_SCRIPT: &str = "trap 'kill -TERM \"$sshd\" 2>/dev/null; exit 143' TERM INT; \"$@\" & sshd=$!; wait \"$sshd\"; code=$?; [ \"$code\" -ne 0 ] || code=1; exit \"$code\"";

use mpi_webhook::mpi::jobset_mode::SshSetup;
use mpi_webhook::mpi::jobset_mode::ssh_setup::script;

use super::preflight::preflight_container_with_timeout;

const PREFLIGHT: &str = "mpi-preflight";
const HOSTFILE: &str = "/etc/mpi/hostfile";
const CONNECTION_ATTEMPTS: &str = "-o ConnectionAttempts=10";

/// The launcher env of `implementation` for `slots` per node and the workers' sshd `port`, in
/// order (docs/behaviour.md C.5 and Decision 5; docs/jobset-mode.md for the port).
/// Under `generated` (interface.md "JobSet mode on hardened clusters") the client reads the
/// setup's ssh_config instead of being given the port.
fn launcher_env(
    implementation: &str,
    slots: i64,
    port: u16,
    generated: bool,
) -> Vec<(&'static str, String)> {
    let slots = slots.to_string();
    let ssh_args = match (generated, port) {
        (true, _) => format!("{CONNECTION_ATTEMPTS} -F /run/mpi-ssh/ssh_config"),
        (false, 22) => CONNECTION_ATTEMPTS.to_owned(),
        (false, port) => format!("{CONNECTION_ATTEMPTS} -p {port}"),
    };
    match implementation {
        "OpenMPI" => vec![
            ("OMPI_MCA_orte_default_hostfile", HOSTFILE.to_owned()),
            ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".to_owned()),
            ("OMPI_MCA_orte_set_default_slots", slots.clone()),
            ("OMPI_MCA_plm_rsh_args", ssh_args.clone()),
            ("PRTE_MCA_prte_default_hostfile", HOSTFILE.to_owned()),
            ("PRTE_MCA_prte_keep_fqdn_hostnames", "false".to_owned()),
            ("PRTE_MCA_prte_set_default_slots", slots),
            ("PRTE_MCA_plm_ssh_args", ssh_args),
        ],
        "Intel" => vec![
            ("I_MPI_HYDRA_HOST_FILE", HOSTFILE.to_owned()),
            ("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", ssh_args),
            ("I_MPI_PERHOST", slots),
            ("I_MPI_HYDRA_IFACE", "eth0".to_owned()),
        ],
        "MPICH" => vec![
            ("HYDRA_HOST_FILE", HOSTFILE.to_owned()),
            ("HYDRA_LAUNCHER_EXTRA_ARGS", ssh_args),
            ("HYDRA_IFACE", "eth0".to_owned()),
        ],
        other => panic!("no launcher env for {other:?} in docs/behaviour.md"),
    }
}

/// The workers' sshd port: 22 but in JobSet mode with `mpi-webhook.io/ssh-port`.
fn ssh_port(plan: &MpiPlan) -> u16 {
    plan.jobset_defaults
        .as_ref()
        .map_or(22, |d| d.settings.ssh_port)
}

/// Whether JobSet mode's `mpi-webhook.io/ssh-setup` is `generated`.
fn generated_ssh(plan: &MpiPlan) -> bool {
    plan.jobset_defaults
        .as_ref()
        .is_some_and(|d| d.settings.ssh_setup == SshSetup::Generated)
}

/// The pre-flight image: JobSet mode, `--preflight-image` set, the JobSet not opted out.
fn preflight_image(plan: &MpiPlan) -> Option<&str> {
    plan.jobset_defaults
        .as_ref()
        .filter(|d| d.settings.preflight && !d.options.preflight_image.is_empty())
        .map(|d| d.options.preflight_image.as_str())
}

/// Whether container `index` named `name` is wired: those named `node` (TrainJob mode), the
/// one `mpi-webhook.io/container` names, else each template's first (JobSet mode).
fn wires(wired: &WiredContainer, index: usize, name: Option<&str>) -> bool {
    match wired {
        WiredContainer::NamedNode => name == Some("node"),
        WiredContainer::Named(wired) => name == Some(wired.as_str()),
        WiredContainer::First => index == 0,
    }
}

/// The SSH Secret's volume (C.3).
/// `id_rsa` is 416 (0640) in TrainJob mode, 384 (0600) in JobSet mode (Decisions 16 and 18).
fn ssh_auth_volume(plan: &MpiPlan) -> Value {
    let private_mode = if plan.jobset_defaults.is_some() {
        384
    } else {
        416
    };
    json!({
        "name": "mpi-ssh-auth",
        "secret": {
            "secretName": format!("{}-mpi-ssh-auth", plan.jobset_name),
            "defaultMode": 256,
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa", "mode": private_mode},
                {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 420},
                {"key": "ssh-publickey", "path": "authorized_keys", "mode": 420},
            ]
        }
    })
}

/// `generated`'s Secret volume: 0444 for every file, no item modes.
fn generated_ssh_auth_volume(plan: &MpiPlan) -> Value {
    json!({
        "name": "mpi-ssh-auth",
        "secret": {
            "secretName": format!("{}-mpi-ssh-auth", plan.jobset_name),
            "defaultMode": 0o444,
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa"},
                {"key": "ssh-publickey", "path": "id_rsa.pub"},
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
        "name": "mpi-hostfile",
        "configMap": {
            "name": format!("{}-mpi-hostfile", plan.jobset_name),
            "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]
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
    // JobSet mode: a JobSet with a launcher finishes with it, unless the user chose a policy;
    // `operator: All` with no targets is what JobSet's defaulting writes, so it is no choice.
    let has_launcher = jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .is_some_and(|rjobs| named(rjobs, "launcher"));
    if plan.jobset_defaults.is_some() && has_launcher {
        let policy = jobset.pointer("/spec/successPolicy");
        let targets = policy.and_then(|p| p.get("targetReplicatedJobs"));
        if unset(policy) {
            out["spec"]["successPolicy"] =
                json!({"operator": "All", "targetReplicatedJobs": ["launcher"]});
        } else if policy.and_then(|p| p.get("operator")) == Some(&json!("All"))
            && (unset(targets) || targets == Some(&json!([])))
        {
            out["spec"]["successPolicy"]["targetReplicatedJobs"] = json!(["launcher"]);
        }
    }
    // JobSet refuses dependsOn next to `startupPolicyOrder: InOrder`.
    let in_order =
        jobset.pointer("/spec/startupPolicy/startupPolicyOrder") == Some(&json!("InOrder"));
    let rjobs = match out.pointer_mut("/spec/replicatedJobs") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Array(rjobs)) => rjobs,
        Some(other) => return Err(wrong_type("spec.replicatedJobs", other, "an array")),
    };
    // The worker groups (`node`, or Decision 20's) listed so far: the launcher depends on them
    // only when all are.
    let groups: Vec<&str> = plan.worker_groups.iter().map(|g| g.name.as_str()).collect();
    let mut seen: Vec<String> = Vec::new();
    for (i, rjob) in rjobs.iter_mut().enumerate() {
        let name = rjob.get("name").and_then(Value::as_str).unwrap_or_default();
        let is_group = groups.contains(&name);
        let launcher = if name == "launcher" {
            Some(groups.iter().all(|g| seen.iter().any(|s| s == g)) && !in_order)
        } else if is_group {
            None
        } else {
            continue;
        };
        if is_group {
            seen.push(name.to_owned());
        }
        if let Value::Object(rjob) = rjob {
            wire(plan, rjob, &format!("spec.replicatedJobs[{i}]"), launcher)?;
        }
    }
    Ok(out)
}

/// Wires one replicatedJob, `rjob` at `field`. `launcher`: for the launcher `Some(whether it may
/// depend on the worker groups)` (all listed before it, no `startupPolicyOrder: InOrder`), `None` for a group.
fn wire(
    plan: &MpiPlan,
    rjob: &mut Map<String, Value>,
    field: &str,
    launcher: Option<bool>,
) -> Result<(), MutationError> {
    let is_launcher = launcher.is_some();
    let defaults = plan.jobset_defaults.is_some();
    let port = ssh_port(plan);
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (false, Some(count)) = (is_launcher, plan.node_count) {
        let template = member_object(rjob, field, "template")?;
        let spec = member_object(template, &format!("{field}.template"), "spec")?;
        spec.insert("parallelism".into(), json!(count));
        spec.insert("completions".into(), json!(count));
    }
    // JobSet mode: the launcher's and every worker group's Job fail at their first failed Pod
    // or container restart, where the user set no backoffLimit (Decision 21).
    if defaults {
        let template = member_object(rjob, field, "template")?;
        let spec = member_object(template, &format!("{field}.template"), "spec")?;
        if unset(spec.get("backoffLimit")) {
            spec.insert("backoffLimit".into(), json!(0));
        }
    }
    // JobSet mode: the launcher waits for every worker group Ready when all are listed before it.
    if defaults && launcher == Some(true) && unset(rjob.get("dependsOn")) {
        let groups = plan.worker_groups.iter();
        rjob.insert(
            "dependsOn".into(),
            groups
                .map(|g| json!({"name": g.name, "status": "Ready"}))
                .collect(),
        );
    }
    // C.3: volumes, by name.
    let mut at = field.to_owned();
    let mut pod_spec = rjob;
    for key in ["template", "spec", "template", "spec"] {
        pod_spec = member_object(pod_spec, &at, key)?;
        at = format!("{at}.{key}");
    }
    let generated = generated_ssh(plan);
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
                wires(
                    &plan.wired_container,
                    *c,
                    entry.get("name").and_then(Value::as_str),
                )
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
    if let (true, Some(image), false) = (is_launcher, preflight_image(plan), taken) {
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
            let timeout = plan
                .jobset_defaults
                .as_ref()
                .and_then(|d| d.settings.preflight_timeout.as_deref());
            init.insert(
                at,
                preflight_container_with_timeout(image, &port.to_string(), timeout),
            );
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
        if !wires(&plan.wired_container, c, name) {
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
                mount("mpi-ssh-auth", &plan.ssh_auth_mount_path),
            );
        }
        if is_launcher {
            upsert(mounts, "mountPath", mount("mpi-hostfile", "/etc/mpi"));
            let env = member_list(container, &at, "env")?;
            for (name, value) in launcher_env(plan.implementation.name, plan.slots, port, generated)
            {
                upsert(env, "name", json!({"name": name, "value": value}));
            }
        }
        // JobSet mode, the launcher: its output kept as its termination message on failure,
        // and, unless it runs as a node or asks for GPUs itself, the NVIDIA runtime's GPU env
        // vars empty where the user set none (docs/jobset-mode.md "Defaults").
        if defaults && is_launcher {
            if unset(container.get("terminationMessagePolicy")) {
                container.insert(
                    "terminationMessagePolicy".into(),
                    json!("FallbackToLogsOnError"),
                );
            }
            let resources = container.get("resources");
            let gpu = ["requests", "limits"].iter().any(|list| {
                resources
                    .and_then(|r| r.get(*list))
                    .and_then(Value::as_object)
                    .is_some_and(|m| m.keys().any(|k| k.to_lowercase().contains("gpu")))
            });
            if !plan.run_launcher_as_node && !gpu {
                let env = member_list(container, &at, "env")?;
                for name in ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"] {
                    if !named(env, name) {
                        env.push(json!({"name": name, "value": ""}));
                    }
                }
            }
        }
        // JobSet mode: sshd on the workers under `sh`, which makes any end of it a failure
        // (143 when told to stop), unless they run something of their own, and a readiness
        // probe on its port (Decision 21).
        if defaults && !is_launcher {
            if unset(container.get("command")) && unset(container.get("args")) {
                let mut command = vec![
                    json!("/bin/sh"),
                    json!("-c"),
                    json!(WORKER_SCRIPT),
                    json!("mpi-worker"),
                ];
                if generated {
                    command.extend(
                        ["/usr/sbin/sshd", "-De", "-f", "/run/mpi-ssh/sshd_config"]
                            .map(|w| json!(w)),
                    );
                } else {
                    command.extend(["/usr/sbin/sshd", "-De", "-p"].map(|w| json!(w)));
                    command.push(json!(port.to_string()));
                }
                container.insert("command".into(), Value::Array(command));
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
