//! Builders for runtimes, TrainJobs and JobSets shaped like the upstream fixtures.

use json_patch::PatchOperation;
use mpi_webhook::api::{TrainJob, TrainingRuntime};
use mpi_webhook::mpi::enforce::{MutationError, enforce_mpi_policy};
use mpi_webhook::mpi::plan::MpiPlan;
use serde_json::{Value, json};

pub const TRAINER_LABEL: &str = "trainer.kubeflow.org/trainjob-ancestor-step";

/// A replicatedJob: optional trainer label, containers by name.
pub fn rjob(name: &str, trainer_label: bool, containers: &[&str]) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| json!({"name": c, "image": "test:runtime"}))
        .collect();
    let mut rjob = json!({
        "name": name,
        "template": {"spec": {"template": {"spec": {"containers": containers}}}}
    });
    if trainer_label {
        rjob["template"]["metadata"] = json!({"labels": {TRAINER_LABEL: "trainer"}});
    }
    rjob
}

/// A TrainingRuntime with the given MPI policy and replicated jobs.
pub fn runtime(mpi: Value, rjobs: Vec<Value>) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": "test-runtime", "namespace": "default"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": mpi},
            "template": {"spec": {"replicatedJobs": rjobs}}
        }
    })
}

/// A TrainJob `trainjob` in `default` on `test-runtime`.
pub fn train_job(trainer: Value) -> Value {
    let mut tj = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "trainjob", "namespace": "default", "uid": "trainjob-uid"},
        "spec": {"runtimeRef": {"name": "test-runtime", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}}
    });
    if !trainer.is_null() {
        tj["spec"]["trainer"] = trainer;
    }
    tj
}

pub fn typed_runtime(v: &Value) -> TrainingRuntime {
    serde_json::from_value(v.clone()).expect("runtime parses")
}

pub fn typed_train_job(v: &Value) -> TrainJob {
    serde_json::from_value(v.clone()).expect("trainjob parses")
}

pub fn plan(runtime: &Value, train_job: &Value) -> MpiPlan {
    MpiPlan::new(&typed_train_job(train_job), &typed_runtime(runtime))
        .expect("supported")
        .expect("mpi runtime")
}

/// The JobSet Kubeflow Trainer creates for `train_job` from `runtime`, before MPI: the
/// runtime's template, owned by the TrainJob.
pub fn jobset(runtime: &Value, train_job: &Value) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": train_job["metadata"]["name"],
            "namespace": "default",
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "name": train_job["metadata"]["name"], "uid": train_job["metadata"]["uid"],
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": runtime["spec"]["template"]["spec"]
    })
}

/// The JobSet mutation as `serve` writes it, checked against the golden corpus (the JobSet it makes)
/// and the reference (`oracle.rs`: the patch applied makes the JobSet the reference makes, and
/// is empty exactly when the JobSet already is that), or the same error. Returns the operations.
pub fn enforce(plan: &MpiPlan, jobset: &Value) -> Result<Vec<PatchOperation>, MutationError> {
    let written = written_patch(plan, jobset);
    let answer = match &written {
        Ok(patch) => json!({"ok": patch}),
        Err(e) => json!({"err": e.to_string()}),
    };
    super::golden::check(
        "enforce",
        &super::golden::enforce_key(plan, jobset),
        super::golden::Input::JobSet(jobset),
        &answer,
    );
    let ops = written.as_ref().map(|p| p.0.as_slice());
    assert_wires_as_the_reference(plan, jobset, ops.map_err(ToString::to_string));
    written.map(|patch| patch.0)
}

/// Checks `written`, the writer's operations for `jobset` or its error's message, against the
/// reference.
pub fn assert_wires_as_the_reference(
    plan: &MpiPlan,
    jobset: &Value,
    written: Result<&[PatchOperation], String>,
) {
    match (super::oracle::wired(plan, jobset), written) {
        (Ok(expected), Ok(ops)) => {
            let mut patched = jobset.clone();
            json_patch::patch(&mut patched, ops).expect("the writer's patch applies");
            assert_eq!(
                patched, expected,
                "the writer's patch wires the JobSet as the reference does"
            );
            assert_eq!(
                ops.is_empty(),
                &expected == jobset,
                "a patch exactly when something changes: {ops:?}"
            );
        }
        (Err(expected), Err(written)) => assert_eq!(written, expected.to_string()),
        (expected, written) => {
            panic!("the writer and the reference disagree: {written:?}, not {expected:?}")
        }
    }
}

/// The patch `serve` writes for `jobset`.
pub fn written_patch(plan: &MpiPlan, jobset: &Value) -> Result<json_patch::Patch, MutationError> {
    enforce_mpi_policy(plan, jobset)
}

/// Applies the MPI mutation and returns the patched JobSet, checking idempotence on the way.
pub fn mutate(plan: &MpiPlan, jobset: &Value) -> Value {
    let ops = enforce(plan, jobset).expect("patchable");
    let mut patched = jobset.clone();
    json_patch::patch(&mut patched, &ops).expect("patch applies");
    let again = enforce(plan, &patched).expect("patchable");
    assert!(
        again.is_empty(),
        "second pass must be a no-op, got {again:?}"
    );
    patched
}

/// The exact SSH volume of section C.3 for TrainJob `tj`.
pub fn ssh_volume(tj: &str) -> Value {
    json!({
        "name": "mpi-ssh-auth",
        "secret": {
            "secretName": format!("{tj}-mpi-ssh-auth"),
            "defaultMode": 256,
            "items": [
                // Upstream's 0o640 in TrainJob mode (Decision 16): Trainer re-applies this JobSet.
                {"key": "ssh-privatekey", "path": "id_rsa", "mode": 416},
                {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 420},
                {"key": "ssh-publickey", "path": "authorized_keys", "mode": 420}
            ]
        }
    })
}

/// The exact hostfile volume of section C.3 for TrainJob `tj`.
pub fn hostfile_volume(tj: &str) -> Value {
    json!({
        "name": "mpi-hostfile",
        "configMap": {"name": format!("{tj}-mpi-hostfile"), "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]}
    })
}

/// The four upstream OpenMPI env vars then the four PRTE ones (Decision 5).
pub fn open_mpi_env(slots: i64) -> Value {
    let s = slots.to_string();
    json!([
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": s},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        {"name": "PRTE_MCA_prte_default_hostfile", "value": "/etc/mpi/hostfile"},
        {"name": "PRTE_MCA_prte_keep_fqdn_hostnames", "value": "false"},
        {"name": "PRTE_MCA_prte_set_default_slots", "value": s},
        {"name": "PRTE_MCA_plm_ssh_args", "value": "-o ConnectionAttempts=10"}
    ])
}

/// The pod spec of replicatedJob `name`.
pub fn pod_spec<'a>(jobset: &'a Value, name: &str) -> &'a Value {
    let rjobs = jobset["spec"]["replicatedJobs"]
        .as_array()
        .expect("replicatedJobs");
    let rjob = rjobs
        .iter()
        .find(|r| r["name"] == name)
        .expect("replicatedJob");
    &rjob["template"]["spec"]["template"]["spec"]
}

/// The Job spec of replicatedJob `name`.
pub fn job_spec<'a>(jobset: &'a Value, name: &str) -> &'a Value {
    let rjobs = jobset["spec"]["replicatedJobs"]
        .as_array()
        .expect("replicatedJobs");
    &rjobs
        .iter()
        .find(|r| r["name"] == name)
        .expect("replicatedJob")["template"]["spec"]
}

/// Loads one of Kubeflow Trainer's runtimes, which the repository ships verbatim under
/// `manifests/runtimes/` (checked against upstream's digests by `tests/manifests.rs`).
pub fn upstream_runtime(file: &str) -> Value {
    let full = format!("{}/manifests/runtimes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"));
    serde_saphyr::from_str(&text).expect("upstream YAML parses")
}
