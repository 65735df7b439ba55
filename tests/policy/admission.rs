//! The admission core: AdmissionReview in, response out, through `admission::review` with an
//! in-memory object source. Exact messages, uid echo, warnings, patches and bad input.

use base64::Engine;
use json_patch::PatchOperation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mpi_webhook::admission::{BadReview, Options, Route, review, review_with};
use mpi_webhook::api::{JobSet, RuntimeKind};
use mpi_webhook::mpi::jobset_mode::{self, Mode};
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::objects::{ObjectSource, Snapshot};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::*;

pub(super) fn admission_review(kind: (&str, &str, &str), operation: &str, object: Value) -> Value {
    let (group, version, kind) = kind;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "namespace": "default",
            "name": object["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object
        }
    })
}

const TRAINJOB: (&str, &str, &str) = ("trainer.kubeflow.org", "v1alpha1", "TrainJob");
pub(super) const JOBSET: (&str, &str, &str) = ("jobset.x-k8s.io", "v1alpha2", "JobSet");

fn snapshot(runtimes: &[(RuntimeKind, Value)], train_jobs: &[Value]) -> Snapshot {
    let mut s = Snapshot::default();
    for (kind, rt) in runtimes {
        s.insert_runtime(*kind, typed_runtime(rt));
    }
    for tj in train_jobs {
        s.insert_train_job(typed_train_job(tj));
    }
    s
}

/// The answer `serve` gives to `body` ([`one_read`]).
pub(super) async fn respond(route: Route, body: &Value, objects: &Snapshot) -> Value {
    respond_with(route, body, objects, &Options::default()).await
}

/// The answer `serve` configured with `options` gives to `body` ([`one_read`]).
pub(super) async fn respond_with(
    route: Route,
    body: &Value,
    objects: &Snapshot,
    options: &Options,
) -> Value {
    one_read_with(route, body, objects, options)
        .await
        .expect("an AdmissionReview")
}

async fn one_read(route: Route, body: &Value, objects: &Snapshot) -> Result<Value, BadReview> {
    one_read_with(route, body, objects, &Options::default()).await
}

/// The answer to `body` (its JSON bytes, read once), or the 400's message. A patch, or a denial
/// because the JobSet cannot be patched, must agree with the reference mutation (`oracle.rs`) for
/// the same plan: the patch applied makes the JobSet it makes, the denial names its error.
async fn one_read_with(
    route: Route,
    body: &Value,
    objects: &Snapshot,
    options: &Options,
) -> Result<Value, BadReview> {
    let bytes = serde_json::to_vec(body).expect("serializes");
    let key = super::golden::review_key(route, options, &bytes);
    let response = match review_with(route, &bytes, objects, options).await {
        Ok(reviewed) => reviewed.json(),
        Err(bad) => {
            super::golden::check(
                "reviews",
                &key,
                super::golden::Input::Review(&bytes),
                &json!({"badReview": bad.to_string()}),
            );
            return Err(bad);
        }
    };
    super::golden::check(
        "reviews",
        &key,
        super::golden::Input::Review(&bytes),
        &super::golden::readable(&response),
    );
    assert_patch_applies(body, &response);
    if route == Route::MutateJobSet {
        assert_the_reference_agrees_with(body, &response, objects, options).await;
    }
    Ok(response)
}

/// Prefix of a denial by the mutation's writer.
const CANNOT_BE_PATCHED: &str = "JobSet cannot be patched: ";

/// Checks a mutating answer that reached the JobSet writer (a patch, or a denial because the
/// JobSet cannot be patched) against the reference mutation, for the plan made here from the
/// review as the route makes it: from the owning TrainJob, or from the JobSet in JobSet mode.
async fn assert_the_reference_agrees(body: &Value, response: &Value, objects: &Snapshot) {
    assert_the_reference_agrees_with(body, response, objects, &Options::default()).await;
}

async fn assert_the_reference_agrees_with(
    body: &Value,
    response: &Value,
    objects: &Snapshot,
    options: &Options,
) {
    let r = &response["response"];
    let written: Result<Vec<PatchOperation>, String> =
        match (r["patch"].as_str(), r["status"]["message"].as_str()) {
            (Some(patch), _) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(patch)
                    .expect("base64");
                Ok(serde_json::from_slice(&bytes).expect("an RFC 6902 patch"))
            }
            (None, Some(message)) if message.starts_with(CANNOT_BE_PATCHED) => {
                Err(message[CANNOT_BE_PATCHED.len()..].to_string())
            }
            _ => return,
        };
    let object = &body["request"]["object"];
    let metadata: ObjectMeta =
        serde_json::from_value(object["metadata"].clone()).expect("metadata the route read");
    let plan = match jobset_mode::mode(&metadata) {
        Mode::TrainJob(owner) => {
            let namespace = body["request"]["namespace"]
                .as_str()
                .or(metadata.namespace.as_deref())
                .unwrap_or_default();
            let train_job = objects
                .train_job(namespace, &owner.name)
                .await
                .expect("looked up")
                .expect("the TrainJob the route found");
            let kind = train_job
                .spec
                .runtime_ref
                .runtime_kind()
                .expect("a runtime kind");
            let runtime = objects
                .runtime(kind, namespace, &train_job.spec.runtime_ref.name)
                .await
                .expect("looked up")
                .expect("the runtime the route found");
            MpiPlan::new(&train_job, &runtime)
                .expect("a plan")
                .expect("an MPI runtime")
        }
        Mode::JobSet => {
            let jobset: JobSet = serde_json::from_value(object.clone()).expect("a JobSet");
            MpiPlan::for_jobset(&jobset, options).expect("JobSet-mode settings")
        }
        Mode::Plain => panic!("a plain JobSet is never patched: {response}"),
    };
    let written = written.as_ref().map(Vec::as_slice).map_err(Clone::clone);
    assert_wires_as_the_reference(&plan, object, written);
}

/// The JobSet Trainer creates for an MPI TrainJob with `trainer`, and the object source holding
/// that TrainJob and its runtime.
fn mpi_jobset(trainer: Value) -> (Value, Snapshot) {
    let rt = mpi_runtime();
    let tj = train_job(trainer);
    let objects = snapshot(
        &[(RuntimeKind::TrainingRuntime, rt.clone())],
        std::slice::from_ref(&tj),
    );
    (jobset(&rt, &tj), objects)
}

fn mpi_runtime() -> Value {
    runtime(
        json!({"runLauncherAsNode": true}),
        vec![
            rjob("node", false, &["node"]),
            rjob("launcher", true, &["node"]),
        ],
    )
}

#[tokio::test]
async fn allowed_trainjob_echoes_uid_with_no_patch() {
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, mpi_runtime())], &[]);
    let body = admission_review(TRAINJOB, "CREATE", train_job(json!({"numNodes": 2})));
    let response = respond(Route::ValidateTrainJob, &body, &objects).await;
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(
        response["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(response["response"].get("patch"), None);
}

#[tokio::test]
async fn denial_is_403_forbidden_with_the_upstream_message() {
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, mpi_runtime())], &[]);
    let tj = train_job(json!({"env": [{"name": "OMPI_MCA_orte_default_hostfile", "value": "/x"}]}));
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "UPDATE", tj),
        &objects,
    )
    .await;
    let r = &response["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(r["status"]["reason"], "Forbidden");
    assert_eq!(r["status"]["status"], "Failure");
    assert_eq!(
        r["status"]["message"],
        r#"spec.trainer.env: Invalid value: [{"name":"OMPI_MCA_orte_default_hostfile","value":"/x"}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile]"#
    );
}

#[tokio::test]
async fn missing_runtimes_keep_upstream_texts() {
    let objects = Snapshot::default();
    let tj = train_job(json!({}));
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj.clone()),
        &objects,
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"spec.runtimeRef: Invalid value: {"name":"test-runtime","apiGroup":"trainer.kubeflow.org","kind":"TrainingRuntime"}: trainingruntimes.trainer.kubeflow.org "test-runtime" not found: specified trainingRuntime must be created before the TrainJob is created"#
    );
    let mut cluster = tj;
    cluster["spec"]["runtimeRef"] = json!({"name": "gone", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"});
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", cluster),
        &objects,
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"spec.RuntimeRef: Invalid value: {"name":"gone","apiGroup":"trainer.kubeflow.org","kind":"ClusterTrainingRuntime"}: clustertrainingruntimes.trainer.kubeflow.org "gone" not found: specified clusterTrainingRuntime must be created before the TrainJob is created"#
    );
}

#[tokio::test]
async fn unsupported_runtime_kind_is_denied() {
    let mut tj = train_job(json!({}));
    tj["spec"]["runtimeRef"] = json!({"name": "x", "apiGroup": "example.com", "kind": "MyRuntime"});
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj),
        &Snapshot::default(),
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        "unsupported runtime: MyRuntime.example.com"
    );
}

#[tokio::test]
async fn deprecated_cluster_runtime_warns() {
    let mut rt = mpi_runtime();
    rt["kind"] = json!("ClusterTrainingRuntime");
    rt["metadata"] =
        json!({"name": "old", "labels": {"trainer.kubeflow.org/support": "deprecated"}});
    let objects = snapshot(&[(RuntimeKind::ClusterTrainingRuntime, rt)], &[]);
    let mut tj = train_job(json!({}));
    tj["spec"]["runtimeRef"] = json!({"name": "old"});
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj),
        &objects,
    )
    .await;
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(
        response["response"]["warnings"],
        json!([
            "Referenced ClusterTrainingRuntime \"old\" is deprecated and will be removed in a future release of Kubeflow Trainer. See runtime deprecation policy: https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
        ])
    );
}

#[tokio::test]
async fn non_mpi_trainjob_is_allowed() {
    let rt = json!({"metadata": {"name": "test-runtime", "namespace": "default"}, "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}}});
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, rt)], &[]);
    let tj = train_job(json!({"env": [{"name": "OMPI_MCA_orte_default_hostfile", "value": "/x"}]}));
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj),
        &objects,
    )
    .await;
    assert_eq!(response["response"]["allowed"], true);
}

#[tokio::test]
async fn unreadable_object_is_denied_naming_the_field() {
    let mut tj = train_job(json!({}));
    tj["spec"]["trainer"] = json!({"numNodes": "three"});
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj),
        &Snapshot::default(),
    )
    .await;
    assert_eq!(response["response"]["allowed"], false);
    assert_eq!(
        response["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(
        response["response"]["status"]["message"],
        r#"TrainJob cannot be read: spec.trainer.numNodes: invalid type: string "three", expected i32"#
    );
}

/// Found by the `validation` fuzz target: an object that is not a JSON object at all is denied
/// naming `request.object`, not with serde's bare message (and an array is not read as a struct).
#[tokio::test]
async fn an_object_unreadable_as_a_whole_is_denied_naming_request_object() {
    for (object, expected) in [
        (
            json!(2147483647),
            "TrainJob cannot be read: request.object: invalid type: number, expected a JSON object",
        ),
        (
            json!(["spec"]),
            "TrainJob cannot be read: request.object: invalid type: array, expected a JSON object",
        ),
    ] {
        let mut review = admission_review(TRAINJOB, "CREATE", train_job(json!({})));
        review["request"]["object"] = object;
        let response = respond(Route::ValidateTrainJob, &review, &Snapshot::default()).await;
        assert_eq!(response["response"]["allowed"], false);
        assert_eq!(response["response"]["status"]["message"], expected);
    }
}

#[tokio::test]
async fn jobset_owned_by_an_mpi_trainjob_is_patched_once() {
    let (js, objects) = mpi_jobset(json!({"numNodes": 3}));
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", js.clone()),
        &objects,
    )
    .await;
    let r = &response["response"];
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(r["patch"].as_str().expect("patch"))
        .expect("base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("RFC 6902");
    let mut patched = js;
    json_patch::patch(&mut patched, &patch).expect("applies");
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(2));
    let again = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", patched),
        &objects,
    )
    .await;
    assert_eq!(again["response"]["allowed"], true);
    assert_eq!(
        again["response"].get("patch"),
        None,
        "second pass: no patch"
    );
}

/// Decision 19 in TrainJob mode: a warning, never a denial (Trainer's values stay Trainer's), on
/// the TrainJob before anything is made and on the JobSet Trainer makes, in the words of JobSet
/// mode's denial. `<name>-launcher-0-0` is the longest host name: the name and 13 more.
#[tokio::test]
async fn a_trainjob_whose_host_names_open_mpi_cannot_take_is_warned_of_twice() {
    for (length, warned) in [(43, false), (44, true)] {
        let name = "t".repeat(length);
        let rt = mpi_runtime();
        let mut tj = train_job(json!({"numNodes": 3}));
        tj["metadata"]["name"] = json!(name);
        let objects = snapshot(
            &[(RuntimeKind::TrainingRuntime, rt.clone())],
            std::slice::from_ref(&tj),
        );
        let warnings = if warned {
            json!([format!(
                r#"metadata.name: the longest pod host name, "{name}-launcher-0-0", would be 57 characters, over the 56 that Open MPI 4.1 accepts: its mpirun aborts with "*** stack smashing detected ***" (open-mpi/ompi#13358); use a shorter name"#
            )])
        } else {
            Value::Null
        };
        let body = admission_review(TRAINJOB, "CREATE", tj.clone());
        let validated = respond(Route::ValidateTrainJob, &body, &objects).await;
        assert_eq!(validated["response"]["allowed"], true, "{length}");
        assert_eq!(validated["response"]["warnings"], warnings, "{length}");
        let body = admission_review(JOBSET, "CREATE", jobset(&rt, &tj));
        let mutated = respond(Route::MutateJobSet, &body, &objects).await;
        assert_eq!(mutated["response"]["allowed"], true, "{length}");
        assert_eq!(mutated["response"]["patchType"], "JSONPatch", "{length}");
        assert_eq!(mutated["response"]["warnings"], warnings, "{length}");
    }
}

/// The mutate route reads a borrowed view of the JobSet (`mpi::enforce`). Wherever the policy
/// reads or writes, a value of the wrong type, a value already in place, an unknown field or a
/// duplicate key must give the answer the reference mutation gives on the whole document.
#[tokio::test]
async fn edited_jobsets_are_answered_as_the_reference_answers_them() {
    let (js, objects) = mpi_jobset(json!({"numNodes": 3}));
    let edits: &[(&str, Value)] = &[
        ("/spec", json!({})),
        ("/spec", json!("spec")),
        ("/spec/replicatedJobs", json!(5)),
        ("/spec/replicatedJobs/0", json!("job")),
        ("/spec/replicatedJobs/1/name", json!(["launcher"])),
        ("/spec/replicatedJobs/1/template", json!([])),
        ("/spec/replicatedJobs/1/template/spec", json!(null)),
        ("/spec/replicatedJobs/0/template/spec/parallelism", json!(2)),
        (
            "/spec/replicatedJobs/0/template/spec/completions",
            json!("2"),
        ),
        ("/spec/replicatedJobs/1/template/spec/template", json!(1.5)),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec",
            json!(true),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/volumes",
            json!("v"),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/containers",
            json!({}),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/containers/0",
            json!("c"),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/containers/0/volumeMounts",
            json!({"mountPath": "/root/.ssh"}),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/containers/0/env",
            json!([{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true", "x": {"y": [1]}}]),
        ),
        (
            "/spec/replicatedJobs/1/template/spec/template/spec/x-unknown",
            json!({"a": [1, {"b": null}]}),
        ),
        ("/metadata/ownerReferences", json!("owner")),
    ];
    for (at, value) in edits {
        let mut edited = js.clone();
        let (parent, last) = at.rsplit_once('/').expect("a pointer");
        match edited.pointer_mut(parent) {
            Some(Value::Object(map)) => {
                map.insert(last.to_string(), value.clone());
            }
            Some(Value::Array(items)) => {
                items[last.parse::<usize>().expect("index")] = value.clone()
            }
            _ => panic!("{parent} is not a container in the sample JobSet"),
        }
        // `respond` asserts that the writer and the reference agree.
        respond(
            Route::MutateJobSet,
            &admission_review(JOBSET, "CREATE", edited),
            &objects,
        )
        .await;
    }
    // A duplicate key: the last one wins, as in a JSON object (and Go's decoder).
    let body = serde_json::to_string(&admission_review(JOBSET, "CREATE", js)).expect("JSON");
    let duplicated = body.replacen(
        "\"replicatedJobs\":",
        "\"replicatedJobs\":\"first\",\"replicatedJobs\":",
        1,
    );
    assert_ne!(body, duplicated, "the sample has replicatedJobs");
    let response = review(Route::MutateJobSet, duplicated.as_bytes(), &objects)
        .await
        .expect("an AdmissionReview")
        .json();
    let whole: Value = serde_json::from_str(&duplicated).expect("JSON");
    assert_the_reference_agrees(&whole, &response, &objects).await;
    assert!(response["response"]["patch"].is_string(), "{response}");
}

#[tokio::test]
async fn jobset_not_owned_by_a_trainjob_is_allowed_unchanged() {
    let mut js = jobset(&mpi_runtime(), &train_job(json!({})));
    js["metadata"]["ownerReferences"][0]["kind"] = json!("Workflow");
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", js),
        &Snapshot::default(),
    )
    .await;
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(response["response"].get("patch"), None);
}

#[tokio::test]
async fn jobset_of_a_missing_or_different_trainjob_is_denied() {
    let rt = mpi_runtime();
    let tj = train_job(json!({}));
    let js = jobset(&rt, &tj);
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", js.clone()),
        &Snapshot::default(),
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"TrainJob "default/trainjob", the controller owner of this JobSet, was not found; retry once it exists"#
    );
    let mut other = tj.clone();
    other["metadata"]["uid"] = json!("recreated-uid");
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, rt.clone())], &[other]);
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", js.clone()),
        &objects,
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"TrainJob "default/trainjob" has uid "recreated-uid", but this JobSet's controller ownerReference names uid "trainjob-uid""#
    );
    let objects = snapshot(&[], std::slice::from_ref(&tj));
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", js),
        &objects,
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"TrainJob "default/trainjob" refers to TrainingRuntime "test-runtime", which was not found"#
    );
}

/// The denial of the JobSet of a TrainJob whose runtime has the MPI policy `mpi`.
async fn denial_for_runtime_mpi(mpi: Value) -> Value {
    let rt = runtime(mpi, vec![rjob("launcher", false, &["node"])]);
    let tj = train_job(json!({}));
    let objects = snapshot(
        &[(RuntimeKind::TrainingRuntime, rt.clone())],
        std::slice::from_ref(&tj),
    );
    let response = respond(
        Route::MutateJobSet,
        &admission_review(JOBSET, "CREATE", jobset(&rt, &tj)),
        &objects,
    )
    .await;
    response["response"]["status"]["message"].clone()
}

#[tokio::test]
async fn jobset_of_an_unsupported_implementation_is_denied() {
    assert_eq!(
        denial_for_runtime_mpi(json!({"mpiImplementation": ""})).await,
        r#"TrainJob "default/trainjob": TrainingRuntime "test-runtime" has an unsupported spec.mlPolicy.mpi.mpiImplementation "": supported values: "OpenMPI", "Intel", "MPICH""#
    );
}

/// A runtime admitted before the rule (or by another webhook) that mounts the SSH Secret where the
/// hostfile is: its JobSets are denied, naming the runtime, instead of patched with one mount
/// replacing the other.
#[tokio::test]
async fn jobset_of_a_runtime_mounting_ssh_on_the_hostfile_is_denied() {
    assert_eq!(
        denial_for_runtime_mpi(json!({"sshAuthMountPath": "/etc/mpi/"})).await,
        r#"TrainJob "default/trainjob": TrainingRuntime "test-runtime" has spec.mlPolicy.mpi.sshAuthMountPath "/etc/mpi/": must not be /etc/mpi, where the hostfile is mounted"#
    );
}

#[tokio::test]
async fn delete_and_jobset_update_are_allowed_untouched() {
    let body = admission_review(TRAINJOB, "DELETE", json!({"metadata": {"name": "x"}}));
    let response = respond(Route::ValidateTrainJob, &body, &Snapshot::default()).await;
    assert_eq!(response["response"]["allowed"], true);
    let body = admission_review(
        JOBSET,
        "UPDATE",
        jobset(&mpi_runtime(), &train_job(json!({}))),
    );
    let response = respond(Route::MutateJobSet, &body, &Snapshot::default()).await;
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(response["response"].get("patch"), None);
}

#[tokio::test]
async fn a_kind_on_the_wrong_route_is_denied() {
    let body = admission_review(JOBSET, "CREATE", json!({"metadata": {"name": "x"}}));
    let response = respond(Route::ValidateTrainJob, &body, &Snapshot::default()).await;
    assert_eq!(
        response["response"]["status"]["message"],
        "/validate-trainer-kubeflow-org-v1alpha1-trainjob admits TrainJob.trainer.kubeflow.org, not JobSet.jobset.x-k8s.io: check the webhook configuration's rules"
    );
}

#[tokio::test]
async fn runtime_routes_validate_runtimes() {
    let rt = runtime(
        json!({"numProcPerNode": 0}),
        vec![rjob("node", false, &["node"])],
    );
    let body = admission_review(
        ("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime"),
        "CREATE",
        rt,
    );
    let response = respond(Route::ValidateTrainingRuntime, &body, &Snapshot::default()).await;
    assert_eq!(
        response["response"]["status"]["message"],
        "spec.mlPolicy.mpi.numProcPerNode: Invalid value: 0: NumProcPerNode in mpiPolicy must be >= 1"
    );
    let ok = upstream_runtime("deepspeed_distributed.yaml");
    let body = admission_review(
        ("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime"),
        "CREATE",
        ok,
    );
    let response = respond(
        Route::ValidateClusterTrainingRuntime,
        &body,
        &Snapshot::default(),
    )
    .await;
    assert_eq!(response["response"]["allowed"], true);
}

/// The warning for an implementation stock Trainer builds no JobSet for (Decision 16), written
/// out in full: the same text on the runtime routes and the TrainJob route.
fn trainer_support_warning(implementation: &str) -> String {
    format!(
        "spec.mlPolicy.mpi.mpiImplementation \"{implementation}\": Kubeflow Trainer's controller (through 8c0f5059) builds no JobSet for it, so a TrainJob on this runtime never starts; for {implementation}, use mpi-webhook's JobSet mode instead: a plain JobSet labelled mpi-webhook.io/implementation: {implementation} (README \"JobSet mode\")"
    )
}

const TRAINING_RUNTIME: (&str, &str, &str) =
    ("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime");
const CLUSTER_TRAINING_RUNTIME: (&str, &str, &str) =
    ("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime");

#[tokio::test]
async fn intel_and_mpich_runtimes_are_admitted_with_a_warning_open_mpi_without() {
    for (implementation, warnings) in [
        ("Intel", json!([trainer_support_warning("Intel")])),
        ("MPICH", json!([trainer_support_warning("MPICH")])),
        ("OpenMPI", Value::Null),
    ] {
        let mut rt = mpi_runtime();
        rt["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = json!(implementation);
        let mut cluster_rt = rt.clone();
        cluster_rt["kind"] = json!("ClusterTrainingRuntime");
        cluster_rt["metadata"] = json!({"name": "cluster-runtime"});
        for (route, kind, object) in [
            (Route::ValidateTrainingRuntime, TRAINING_RUNTIME, rt),
            (
                Route::ValidateClusterTrainingRuntime,
                CLUSTER_TRAINING_RUNTIME,
                cluster_rt,
            ),
        ] {
            for operation in ["CREATE", "UPDATE"] {
                let body = admission_review(kind, operation, object.clone());
                let response = respond(route, &body, &Snapshot::default()).await;
                assert_eq!(
                    response["response"]["allowed"], true,
                    "{implementation} {route:?}"
                );
                assert_eq!(
                    response["response"]["warnings"], warnings,
                    "{implementation} {route:?} {operation}"
                );
            }
        }
    }
}

#[tokio::test]
async fn trainjobs_on_intel_and_mpich_runtimes_are_admitted_with_the_same_warning() {
    for implementation in ["Intel", "MPICH"] {
        let mut rt = mpi_runtime();
        rt["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = json!(implementation);
        let objects = snapshot(&[(RuntimeKind::TrainingRuntime, rt)], &[]);
        let body = admission_review(TRAINJOB, "CREATE", train_job(json!({"numNodes": 2})));
        let response = respond(Route::ValidateTrainJob, &body, &objects).await;
        assert_eq!(response["response"]["allowed"], true);
        assert_eq!(
            response["response"]["warnings"],
            json!([trainer_support_warning(implementation)])
        );
    }
    // A denied TrainJob still carries the warning: both are true.
    let mut rt = mpi_runtime();
    rt["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = json!("MPICH");
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, rt)], &[]);
    let tj = train_job(json!({"env": [{"name": "HYDRA_IFACE", "value": "eth1"}]}));
    let response = respond(
        Route::ValidateTrainJob,
        &admission_review(TRAINJOB, "CREATE", tj),
        &objects,
    )
    .await;
    assert_eq!(
        response["response"]["status"]["message"],
        r#"spec.trainer.env: Invalid value: [{"name":"HYDRA_IFACE","value":"eth1"}]: must not have reserved envs, invalid envs configured: [HYDRA_IFACE]"#
    );
    assert_eq!(
        response["response"]["warnings"],
        json!([trainer_support_warning("MPICH")])
    );
    // Open MPI (what stock Trainer builds): no warning.
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, mpi_runtime())], &[]);
    let body = admission_review(TRAINJOB, "CREATE", train_job(json!({"numNodes": 2})));
    let response = respond(Route::ValidateTrainJob, &body, &objects).await;
    assert_eq!(response["response"].get("warnings"), None);
}

#[tokio::test]
async fn bodies_that_are_not_admission_reviews_are_bad_reviews() {
    let cases: [(&[u8], &str); 5] = [
        (b"\xff\xfe garbage", "request body is not JSON: "),
        (b"[1,2]", "request body is not a JSON object"),
        (br#"{"apiVersion":"v1","kind":"Pod"}"#, r#"expected apiVersion "admission.k8s.io/v1" and kind "AdmissionReview", got "v1" and "Pod""#),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#, "AdmissionReview has no request"),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}"#, "not an AdmissionReview: request: missing field `kind`"),
    ];
    for (body, expected) in cases {
        let message = review(Route::ValidateTrainJob, body, &Snapshot::default())
            .await
            .expect_err("bad")
            .to_string();
        assert!(message.starts_with(expected), "{message}");
    }
}

/// Every JSON pointer into `value`, parents before children.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let path = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(path.clone());
                pointers(child, path, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let path = format!("{at}/{i}");
                out.push(path.clone());
                pointers(child, path, out);
            }
        }
        _ => {}
    }
}

/// `value` with the location `at` removed (`None`) or replaced.
fn edited(value: &Value, at: &str, with: Option<&Value>) -> Value {
    let mut edited = value.clone();
    let (parent, last) = at.rsplit_once('/').unwrap_or_default();
    let last = last.replace("~1", "/").replace("~0", "~");
    match (edited.pointer_mut(parent), with) {
        (Some(Value::Object(map)), Some(with)) => {
            map.insert(last, with.clone());
        }
        (Some(Value::Object(map)), None) => {
            map.shift_remove(&last);
        }
        (Some(Value::Array(items)), with) => {
            let i: usize = last.parse().unwrap_or_default();
            match with {
                Some(with) => items[i] = with.clone(),
                None => {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
    edited
}

/// A patch the webhook returns applies to the object it was computed for: the kube-apiserver
/// fails the user's request with an internal error otherwise.
fn assert_patch_applies(review: &Value, response: &Value) {
    let Some(patch) = response["response"]["patch"].as_str() else {
        return;
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch is a JSON Patch");
    let mut object = review["request"]["object"].clone();
    if let Err(e) = json_patch::patch(&mut object, &patch) {
        panic!("the returned patch does not apply: {e}\npatch: {patch:?}");
    }
}

/// A pod template `spec` that is an array, at any depth, is denied naming the field;
/// it never gets a patch that cannot apply.
#[tokio::test]
async fn an_array_where_the_pod_spec_belongs_is_denied_at_any_depth() {
    let sample = format!(
        "{}/manifests/samples/reviews/jobset-create-owned-by-trainjob.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let review: Value =
        serde_json::from_str(&std::fs::read_to_string(&sample).expect("sample")).expect("JSON");
    let objects = Snapshot::load_dir(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests"
    )))
    .expect("manifests load");
    let rjobs = review["request"]["object"]["spec"]["replicatedJobs"]
        .as_array()
        .expect("replicatedJobs");
    let node = rjobs
        .iter()
        .position(|r| r["name"] == "node")
        .expect("a node replicatedJob");
    for depth in [1, 100] {
        let nested = (0..depth).fold(json!([]), |inner, _| json!([inner]));
        let mut body = review.clone();
        body["request"]["object"]["spec"]["replicatedJobs"][node]["template"]["spec"]["template"]
            ["spec"] = nested;
        let response = one_read(Route::MutateJobSet, &body, &objects)
            .await
            .expect("an AdmissionReview");
        assert_eq!(response["response"]["allowed"], false, "depth {depth}");
        assert_eq!(
            response["response"]["status"]["message"],
            format!(
                r#"JobSet cannot be patched: spec.replicatedJobs[{node}].template.spec.template.spec: Invalid value: "array": must be an object"#
            ),
            "depth {depth}"
        );
    }
}

/// Every location of `body`, removed or replaced by a value of each JSON type, is answered (or
/// refused with a 400) without a panic, with a patch that applies, and, on the mutating route,
/// as the reference mutation answers. Returns how many edits were answered.
pub(super) async fn every_edit_is_answered(
    route: Route,
    body: &Value,
    objects: &Snapshot,
) -> usize {
    every_edit_is_answered_with(route, body, objects, &Options::default()).await
}

/// [`every_edit_is_answered`] by `serve` configured with `options`.
pub(super) async fn every_edit_is_answered_with(
    route: Route,
    body: &Value,
    objects: &Snapshot,
    options: &Options,
) -> usize {
    let replacements = [
        json!(null),
        json!("s"),
        json!(7),
        json!(2.5),
        json!(true),
        json!({}),
        json!([]),
        json!(["node"]),
    ];
    let mut locations = Vec::new();
    pointers(body, String::new(), &mut locations);
    let mut answered = 0;
    for at in &locations {
        for with in replacements.iter().map(Some).chain([None]) {
            if one_read_with(route, &edited(body, at, with), objects, options)
                .await
                .is_ok()
            {
                answered += 1;
            }
        }
    }
    answered
}

/// Differential check of the read and the mutation against the reference, over every location
/// of a JobSet review (envelope included). It found that serde's derived structs read a JSON
/// array as a struct, which the JobSet view must refuse.
#[tokio::test]
async fn every_edit_of_a_jobset_review_is_answered_as_the_reference_answers() {
    let (js, objects) = mpi_jobset(json!({"numNodes": 3}));
    let body = admission_review(JOBSET, "CREATE", js);
    assert!(every_edit_is_answered(Route::MutateJobSet, &body, &objects).await > 0);
}

/// The same over every location of a TrainJob review.
#[tokio::test]
async fn every_edit_of_a_trainjob_review_is_answered() {
    let objects = snapshot(&[(RuntimeKind::TrainingRuntime, mpi_runtime())], &[]);
    let tj = train_job(json!({"numNodes": 2, "env": [{"name": "A", "value": "1"}]}));
    let body = admission_review(TRAINJOB, "CREATE", tj);
    assert!(every_edit_is_answered(Route::ValidateTrainJob, &body, &objects).await > 0);
}
