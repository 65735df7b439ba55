//! Next to a running Kubeflow Trainer (Decision 16). Trainer's controller always runs its own MPI
//! plugin: it server-side applies the JobSet with its MPI wiring (field manager `trainer`, force)
//! at creation and again on every reconcile while the TrainJob or JobSet is suspended, and
//! JobSet's webhook rejects any change to `replicatedJobs` then. So mpi-webhook's patch must be a
//! strict superset of Trainer's wiring, and a re-apply of Trainer's JobSet must change nothing.
//!
//! The golden below is Trainer's JobSet for the shipped runtimes, written by hand from spec
//! section C ("How it lands in the JobSet"), never from the product's code: if a change to the
//! product ever makes a field Trainer sets differ, these tests fail.

use std::sync::OnceLock;

use json_patch::PatchOperation;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::ssa::{
    self, FieldPath, ListType, Schema, Step, Stored, WebhookFields, dotted, item_step,
};
use super::support::{enforce, mutate, plan, train_job, upstream_runtime};

const TRAINER_MANAGER: &str = "trainer";

/// The JobSet CRD's `openAPIV3Schema` (vendored verbatim from JobSet v0.12.0).
fn jobset_schema() -> Schema<'static> {
    static CRD: OnceLock<Value> = OnceLock::new();
    let crd = CRD.get_or_init(|| {
        let path = format!(
            "{}/tests/fixtures/upstream/jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_saphyr::from_str(&text).expect("the JobSet CRD parses")
    });
    Schema::new(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
}

/// A TrainJob on one of Trainer's shipped runtimes (both: OpenMPI, runLauncherAsNode true,
/// numProcPerNode 1, sshAuthMountPath /home/mpiuser/.ssh, replicatedJobs `node` then `launcher`,
/// the launcher labelled as the trainer step).
struct Case {
    runtime_file: &'static str,
    name: &'static str,
    /// The TrainJob's `spec.trainer`.
    trainer: Value,
    /// The slots section C step 2 gives it.
    slots: i64,
}

fn cases() -> Vec<Case> {
    let deepspeed = "deepspeed_distributed.yaml";
    vec![
        Case {
            runtime_file: deepspeed,
            name: "pi",
            trainer: json!({"numNodes": 1}),
            slots: 1,
        },
        Case {
            runtime_file: deepspeed,
            name: "pi",
            trainer: json!({"numNodes": 2}),
            slots: 1,
        },
        Case {
            runtime_file: deepspeed,
            name: "pi",
            trainer: json!({"numNodes": 3}),
            slots: 1,
        },
        Case {
            runtime_file: "mlx_distributed.yaml",
            name: "mlx-job",
            trainer: json!({"numNodes": 3, "command": ["mpirun", "python3", "train.py"]}),
            slots: 1,
        },
        Case {
            runtime_file: deepspeed,
            name: "gpu",
            trainer: json!({
                "numNodes": 3,
                "command": ["mpirun", "python3", "train.py"],
                "env": [{"name": "TRAIN_JOB", "value": "value"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}
            }),
            slots: 4,
        },
    ]
}

impl Case {
    fn runtime(&self) -> Value {
        upstream_runtime(self.runtime_file)
    }

    fn train_job(&self) -> Value {
        let mut tj = train_job(self.trainer.clone());
        tj["metadata"]["name"] = json!(self.name);
        tj["spec"]["runtimeRef"] = json!({"name": self.runtime()["metadata"]["name"]});
        tj
    }

    /// Worker count: runLauncherAsNode, so `max(numNodes - 1, 1)` (section C step 1).
    fn workers(&self) -> i64 {
        std::cmp::max(self.trainer["numNodes"].as_i64().unwrap_or(1) - 1, 1)
    }

    fn describe(&self) -> String {
        format!("{} {} {}", self.runtime_file, self.name, self.trainer)
    }
}

// Upstream's wiring, section C steps 3 to 5, value for value.

fn upstream_ssh_volume(tj: &str) -> Value {
    json!({
        "name": "mpi-ssh-auth",
        "secret": {
            "secretName": format!("{tj}-mpi-ssh-auth"),
            "defaultMode": 256,
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa", "mode": 416},
                {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 420},
                {"key": "ssh-publickey", "path": "authorized_keys", "mode": 420}
            ]
        }
    })
}

fn upstream_hostfile_volume(tj: &str) -> Value {
    json!({
        "name": "mpi-hostfile",
        "configMap": {
            "name": format!("{tj}-mpi-hostfile"),
            "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]
        }
    })
}

const SSH_MOUNT_PATH: &str = "/home/mpiuser/.ssh";

fn upstream_launcher_env(slots: i64) -> Vec<Value> {
    vec![
        json!({"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"}),
        json!({"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"}),
        json!({"name": "OMPI_MCA_orte_set_default_slots", "value": slots.to_string()}),
        json!({"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"}),
    ]
}

/// Only the MPI wiring of Trainer's JobSet (section C), as a sparse JobSet: what a JobSet without it
/// must have once mpi-webhook patched it.
fn upstream_mpi_wiring(case: &Case) -> Value {
    let tj = case.name;
    let w = case.workers();
    json!({"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {
            "parallelism": w, "completions": w,
            "template": {"spec": {
                "volumes": [upstream_ssh_volume(tj)],
                "containers": [{"name": "node", "volumeMounts": [
                    {"name": "mpi-ssh-auth", "mountPath": SSH_MOUNT_PATH}
                ]}]
            }}
        }}},
        {"name": "launcher", "template": {"spec": {"template": {"spec": {
            "volumes": [upstream_ssh_volume(tj), upstream_hostfile_volume(tj)],
            "containers": [{"name": "node",
                "volumeMounts": [
                    {"name": "mpi-ssh-auth", "mountPath": SSH_MOUNT_PATH},
                    {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}
                ],
                "env": upstream_launcher_env(case.slots)
            }]
        }}}}}
    ]}})
}

/// The JobSet Trainer's controller applies for `case` (section C.7):
/// the runtime's template; the trainer step (`launcher`) with `replicas` 1 and the TrainJob's
/// command on its `node` container; `spec.trainer.env` and `resourcesPerNode` on the `node`
/// containers of the trainer step and, with runLauncherAsNode, of `node`; owned by the TrainJob;
/// `suspend` as Kueue creates it. `wired`: with the MPI plugin's part (volumes and mounts, then
/// the launcher's MPI env before the trainer env) and each replicatedJob's count in
/// `parallelism`/`completions`; without it, the JobSet a Trainer without MPI would create.
fn trainer_jobset(case: &Case, wired: bool) -> Value {
    let tj = case.name;
    let mut spec = case.runtime()["spec"]["template"]["spec"].clone();
    for rjob in spec["replicatedJobs"]
        .as_array_mut()
        .expect("replicatedJobs")
    {
        let name = rjob["name"].as_str().expect("name").to_string();
        let trainer_step = rjob["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
            == "trainer";
        if trainer_step {
            rjob["replicas"] = json!(1);
        }
        let count = if name == "node" { case.workers() } else { 1 };
        let job = &mut rjob["template"]["spec"];
        if wired {
            job["parallelism"] = json!(count);
            job["completions"] = json!(count);
        }
        let pod = &mut job["template"]["spec"];
        if wired {
            let mut volumes = vec![upstream_ssh_volume(tj)];
            if name == "launcher" {
                volumes.push(upstream_hostfile_volume(tj));
            }
            pod["volumes"] = json!(volumes);
        }
        for c in pod["containers"].as_array_mut().expect("containers") {
            if c["name"] != "node" {
                continue;
            }
            let mut env: Vec<Value> = Vec::new();
            if wired {
                let mut mounts = vec![json!({"name": "mpi-ssh-auth", "mountPath": SSH_MOUNT_PATH})];
                if name == "launcher" {
                    mounts.push(json!({"name": "mpi-hostfile", "mountPath": "/etc/mpi"}));
                    env.extend(upstream_launcher_env(case.slots));
                }
                c["volumeMounts"] = json!(mounts);
            }
            if trainer_step {
                for field in ["image", "command", "args"] {
                    if let Some(v) = case.trainer.get(field) {
                        c[field] = v.clone();
                    }
                }
            }
            if trainer_step || name == "node" {
                env.extend(case.trainer["env"].as_array().cloned().unwrap_or_default());
                if let Some(resources) = case.trainer.get("resourcesPerNode") {
                    c["resources"] = resources.clone();
                }
            }
            if !env.is_empty() {
                c["env"] = json!(env);
            }
        }
    }
    spec["suspend"] = json!(true);
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": tj,
            "namespace": "default",
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "name": tj, "uid": "trainjob-uid", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": spec
    })
}

/// Every field `upstream` sets, with upstream's value in `ours`: objects member by member,
/// associative lists item by item by their list-map keys (in upstream's relative order), atomic
/// lists (`secret.items`, `command`, ...) and scalars whole. Returns the differences.
fn divergences(schema: Schema<'_>, upstream: &Value, ours: &Value) -> Vec<String> {
    let mut out = Vec::new();
    compare(schema, upstream, ours, &mut Vec::new(), &mut out);
    out
}

fn compare(
    schema: Schema<'_>,
    upstream: &Value,
    ours: &Value,
    path: &mut FieldPath,
    out: &mut Vec<String>,
) {
    match upstream {
        Value::Object(members) if !schema.atomic_object() => {
            for (k, u) in members {
                path.push(Step::Field(k.clone()));
                match ours.get(k) {
                    Some(o) => compare(schema.member(k), u, o, path, out),
                    None => out.push(format!("{}: missing, upstream has {u}", dotted(path))),
                }
                path.pop();
            }
        }
        Value::Array(items) if schema.list_type() != ListType::Atomic => {
            let list_type = schema.list_type();
            let ours_items = ours.as_array().map(Vec::as_slice).unwrap_or_default();
            let mut previous: Option<usize> = None;
            for u in items {
                let step = item_step(&list_type, u);
                path.push(step.clone().expect("associative"));
                match ours_items
                    .iter()
                    .position(|o| item_step(&list_type, o) == step)
                {
                    Some(at) => {
                        if previous.is_some_and(|p| at < p) {
                            out.push(format!("{}: not in upstream's order", dotted(path)));
                        }
                        previous = Some(at);
                        compare(schema.items(), u, &ours_items[at], path, out);
                    }
                    None => out.push(format!("{}: missing, upstream has {u}", dotted(path))),
                }
                path.pop();
            }
        }
        _ => {
            if upstream != ours {
                out.push(format!(
                    "{}: upstream {upstream}, ours {ours}",
                    dotted(path)
                ));
            }
        }
    }
}

/// The fields `ours` has and `upstream` lacks (members and associative-list items), as paths.
fn additions(schema: Schema<'_>, upstream: &Value, ours: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_additions(schema, upstream, ours, &mut Vec::new(), &mut out);
    out
}

fn collect_additions(
    schema: Schema<'_>,
    upstream: &Value,
    ours: &Value,
    path: &mut FieldPath,
    out: &mut Vec<String>,
) {
    match (upstream, ours) {
        (Value::Object(u), Value::Object(o)) if !schema.atomic_object() => {
            for (k, ov) in o {
                path.push(Step::Field(k.clone()));
                match u.get(k) {
                    Some(uv) => collect_additions(schema.member(k), uv, ov, path, out),
                    None => out.push(dotted(path)),
                }
                path.pop();
            }
        }
        (Value::Array(u), Value::Array(o)) if schema.list_type() != ListType::Atomic => {
            let list_type = schema.list_type();
            for ov in o {
                let step = item_step(&list_type, ov);
                path.push(step.clone().expect("associative"));
                match u.iter().find(|uv| item_step(&list_type, uv) == step) {
                    Some(uv) => collect_additions(schema.items(), uv, ov, path, out),
                    None => out.push(dotted(path)),
                }
                path.pop();
            }
        }
        _ => {}
    }
}

const LAUNCHER_ENV: &str =
    "spec.replicatedJobs[name=launcher].template.spec.template.spec.containers[name=node].env";
const PRTE_VARS: [&str; 4] = [
    "PRTE_MCA_prte_default_hostfile",
    "PRTE_MCA_prte_keep_fqdn_hostnames",
    "PRTE_MCA_prte_set_default_slots",
    "PRTE_MCA_plm_ssh_args",
];

#[test]
fn every_field_of_upstreams_wiring_has_upstreams_value_in_our_patched_jobset() {
    let schema = jobset_schema();
    for case in cases() {
        let plan = plan(&case.runtime(), &case.train_job());
        // A JobSet without the wiring (Trainer without its MPI plugin) and Trainer's own.
        for (input, golden) in [
            (trainer_jobset(&case, false), upstream_mpi_wiring(&case)),
            (trainer_jobset(&case, true), trainer_jobset(&case, true)),
        ] {
            let ours = mutate(&plan, &input);
            assert_eq!(
                divergences(schema, &golden, &ours),
                Vec::<String>::new(),
                "{}",
                case.describe()
            );
        }
    }
}

#[test]
fn on_trainers_jobset_our_patch_only_adds_the_open_mpi_5_vars() {
    let schema = jobset_schema();
    for case in cases() {
        let plan = plan(&case.runtime(), &case.train_job());
        let trainers = trainer_jobset(&case, true);
        let ours = mutate(&plan, &trainers);
        let expected: Vec<String> = PRTE_VARS
            .iter()
            .map(|v| format!("{LAUNCHER_ENV}[name={v}]"))
            .collect();
        assert_eq!(
            additions(schema, &trainers, &ours),
            expected,
            "{}",
            case.describe()
        );
        // The operations themselves: four appends to the launcher's env, nothing else.
        let ops = enforce(&plan, &trainers).expect("patchable");
        assert_eq!(ops.len(), 4, "{}: {ops:?}", case.describe());
        for op in &ops {
            let PatchOperation::Add(add) = op else {
                panic!("{}: not an add: {op:?}", case.describe());
            };
            assert!(
                add.path.to_string().starts_with(
                    "/spec/replicatedJobs/1/template/spec/template/spec/containers/0/env/"
                ),
                "{}",
                add.path
            );
        }
    }
}

/// The launcher's env after the patch: upstream's four, the trainer env, then the PRTE four.
fn launcher_env(object: &Value) -> &Value {
    &object["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
}

fn expected_launcher_env(case: &Case) -> Value {
    let slots = case.slots.to_string();
    let mut env = upstream_launcher_env(case.slots);
    env.extend(case.trainer["env"].as_array().cloned().unwrap_or_default());
    env.extend([
        json!({"name": "PRTE_MCA_prte_default_hostfile", "value": "/etc/mpi/hostfile"}),
        json!({"name": "PRTE_MCA_prte_keep_fqdn_hostnames", "value": "false"}),
        json!({"name": "PRTE_MCA_prte_set_default_slots", "value": slots}),
        json!({"name": "PRTE_MCA_plm_ssh_args", "value": "-o ConnectionAttempts=10"}),
    ]);
    json!(env)
}

/// Trainer creates the JobSet by a forced apply; mpi-webhook mutates it during that create; the
/// apiserver stores the result with Trainer's managed fields as [`WebhookFields`] says.
fn create_through_the_webhook(case: &Case, attribution: WebhookFields) -> Stored {
    let schema = jobset_schema();
    let plan = plan(&case.runtime(), &case.train_job());
    let applied = ssa::force_apply(schema, None, &trainer_jobset(case, true), TRAINER_MANAGER);
    let ops = enforce(&plan, &applied.object).expect("patchable");
    applied.admit(schema, &ops, TRAINER_MANAGER, attribution)
}

#[test]
fn trainers_reapplies_change_no_replicated_job_and_keep_our_env() {
    let schema = jobset_schema();
    for case in cases() {
        let stored = create_through_the_webhook(&case, WebhookFields::Unowned);
        assert_eq!(launcher_env(&stored.object), &expected_launcher_env(&case));
        // Every reconcile while suspended: the same JobSet again.
        let config = trainer_jobset(&case, true);
        let again = ssa::force_apply(schema, Some(&stored), &config, TRAINER_MANAGER);
        assert_eq!(again.object, stored.object, "{}", case.describe());
        // The resume: the same JobSet with suspend false. Only that field changes.
        let mut resume = config;
        resume["spec"]["suspend"] = json!(false);
        let resumed = ssa::force_apply(schema, Some(&again), &resume, TRAINER_MANAGER);
        assert_eq!(
            resumed.object["spec"]["replicatedJobs"],
            stored.object["spec"]["replicatedJobs"],
            "{}",
            case.describe()
        );
        assert_eq!(resumed.object["spec"]["suspend"], false);
        assert_eq!(launcher_env(&resumed.object), &expected_launcher_env(&case));
    }
}

/// The model has teeth: with mpi-webhook's old `id_rsa` mode 384 in the stored JobSet, Trainer's
/// re-apply puts its 416 back, a change to `replicatedJobs` (the JobSet that never resumed).
#[test]
fn with_a_key_mode_other_than_upstreams_trainers_reapply_changes_replicated_jobs() {
    let schema = jobset_schema();
    let case = &cases()[2];
    let mut stored = create_through_the_webhook(case, WebhookFields::Unowned);
    for rjob in 0..2 {
        let mode = format!(
            "/spec/replicatedJobs/{rjob}/template/spec/template/spec/volumes/0/secret/items/0/mode"
        );
        *stored.object.pointer_mut(&mode).expect("item mode") = json!(384);
    }
    let again = ssa::force_apply(
        schema,
        Some(&stored),
        &trainer_jobset(case, true),
        TRAINER_MANAGER,
    );
    assert_ne!(
        again.object["spec"]["replicatedJobs"],
        stored.object["spec"]["replicatedJobs"]
    );
    assert_eq!(
        again.object.pointer(
            "/spec/replicatedJobs/0/template/spec/template/spec/volumes/0/secret/items/0/mode"
        ),
        Some(&json!(416))
    );
}

/// Why the attribution matters: were the webhook's additions recorded as Trainer's, Trainer's
/// next apply (which does not name them) would prune the PRTE vars. The kube-apiserver does not
/// record them (see [`WebhookFields::Unowned`]), so they stay.
#[test]
fn were_webhook_fields_the_appliers_a_reapply_would_prune_the_prte_vars() {
    let schema = jobset_schema();
    let case = &cases()[2];
    let stored = create_through_the_webhook(case, WebhookFields::ToApplier);
    let again = ssa::force_apply(
        schema,
        Some(&stored),
        &trainer_jobset(case, true),
        TRAINER_MANAGER,
    );
    assert_eq!(
        launcher_env(&again.object),
        &json!(upstream_launcher_env(case.slots))
    );
}
