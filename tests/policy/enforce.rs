//! The JobSet mutation (section C) and the hostfile (D.2/D.3): upstream TestMPI (E.1) and the
//! other upstream MPI tests (E.3), re-expressed against the raw-JSON patch.

use json_patch::PatchOperation;
use mpi_webhook::api::TrainingRuntime;
use mpi_webhook::mpi::hostfile::hostfile;
use mpi_webhook::mpi::plan::MpiPlan;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::*;

fn open_mpi(run_launcher_as_node: Option<bool>) -> Value {
    let mut mpi = json!({"numProcPerNode": 1, "mpiImplementation": "OpenMPI", "sshAuthMountPath": "/root/.ssh"});
    if let Some(v) = run_launcher_as_node {
        mpi["runLauncherAsNode"] = json!(v);
    }
    mpi
}

#[test]
fn e1_1_to_3_no_action_without_mpi_policy() {
    let tj = typed_train_job(&train_job(json!({"numNodes": 2})));
    for spec in [
        json!({}),
        json!({"mlPolicy": {}}),
        json!({"mlPolicy": {"mpi": null}}),
    ] {
        let rt: TrainingRuntime = serde_json::from_value(json!({"spec": spec})).expect("parses");
        assert_eq!(MpiPlan::new(&tj, &rt), Ok(None));
    }
}

#[test]
fn e1_4_trainjob_num_nodes_is_respected_rather_than_ml_policy() {
    let rt = runtime(
        open_mpi(None),
        vec![rjob("launcher", false, &[]), rjob("node", true, &[])],
    );
    let tj = train_job(json!({"numNodes": 2}));
    let plan = plan(&rt, &tj);
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(2));
    assert_eq!(job_spec(&patched, "node")["completions"], json!(2));
    assert_eq!(job_spec(&patched, "launcher").get("parallelism"), None);
    assert_eq!(
        pod_spec(&patched, "launcher")["volumes"],
        json!([ssh_volume("trainjob"), hostfile_volume("trainjob")])
    );
    assert_eq!(
        pod_spec(&patched, "node")["volumes"],
        json!([ssh_volume("trainjob")])
    );
    assert_eq!(plan.slots, 1);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "trainjob-node-0-0.trainjob slots=1\ntrainjob-node-0-1.trainjob slots=1\n"
    );
}

#[test]
fn e1_5_trainjob_num_proc_per_node_is_respected() {
    let rt = runtime(
        open_mpi(None),
        vec![rjob("launcher", false, &[]), rjob("node", true, &[])],
    );
    let tj = train_job(json!({"numNodes": 1, "numProcPerNode": 2}));
    let plan = plan(&rt, &tj);
    assert_eq!(plan.slots, 2);
    assert_eq!(plan.node_count, Some(1));
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "trainjob-node-0-0.trainjob slots=2\n"
    );
}

#[test]
fn e1_6_num_proc_per_node_is_the_trainjob_gpu_count() {
    let rt = runtime(
        open_mpi(None),
        vec![rjob("launcher", false, &[]), rjob("node", true, &[])],
    );
    let tj = train_job(json!({
        "numNodes": 1, "image": "test:trainjob", "command": ["trainjob"], "args": ["trainjob"],
        "resourcesPerNode": {"requests": {"custom.com/gpu": 5}}
    }));
    let plan = plan(&rt, &tj);
    assert_eq!(plan.slots, 5);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "trainjob-node-0-0.trainjob slots=5\n"
    );
}

#[test]
fn e1_7_run_launcher_as_node_wires_launcher_and_node_containers() {
    let rt = runtime(
        open_mpi(Some(true)),
        vec![
            rjob("launcher", false, &["node"]),
            rjob("node", true, &["node"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 10}));
    let plan = plan(&rt, &tj);
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(9));
    let launcher = &pod_spec(&patched, "launcher")["containers"][0];
    assert_eq!(
        launcher["volumeMounts"],
        json!([{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}, {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}])
    );
    assert_eq!(launcher["env"], open_mpi_env(1));
    let node = &pod_spec(&patched, "node")["containers"][0];
    assert_eq!(
        node["volumeMounts"],
        json!([{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}])
    );
    assert_eq!(node.get("env"), None);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "trainjob-launcher-0-0.trainjob slots=1\n\
         trainjob-node-0-0.trainjob slots=1\ntrainjob-node-0-1.trainjob slots=1\n\
         trainjob-node-0-2.trainjob slots=1\ntrainjob-node-0-3.trainjob slots=1\n\
         trainjob-node-0-4.trainjob slots=1\ntrainjob-node-0-5.trainjob slots=1\n\
         trainjob-node-0-6.trainjob slots=1\ntrainjob-node-0-7.trainjob slots=1\n\
         trainjob-node-0-8.trainjob slots=1\n"
    );
}

#[test]
fn e1_8_launcher_only_runtime_without_trainer() {
    let rt = runtime(open_mpi(Some(true)), vec![rjob("launcher", false, &[])]);
    let tj = train_job(Value::Null);
    let plan = plan(&rt, &tj);
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(
        pod_spec(&patched, "launcher")["volumes"],
        json!([ssh_volume("trainjob"), hostfile_volume("trainjob")])
    );
    assert_eq!(plan.node_count, None);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "trainjob-launcher-0-0.trainjob slots=1\n"
    );
}

#[test]
fn exact_operations_for_a_fresh_jobset() {
    let rt = runtime(
        open_mpi(Some(false)),
        vec![
            rjob("launcher", false, &["node"]),
            rjob("node", false, &["node"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 2}));
    let ops = enforce(&plan(&rt, &tj), &jobset(&rt, &tj)).expect("patchable");
    let ops = serde_json::to_value(&ops).expect("serializes");
    let l = "/spec/replicatedJobs/0/template/spec/template/spec";
    let n = "/spec/replicatedJobs/1/template/spec/template/spec";
    // The diff of the JobSet and its wired copy: each new member whole, in the copy's order
    // (existing members first, then those the policy adds).
    let expected = vec![
        json!({"op": "add", "path": format!("{l}/containers/0/volumeMounts"), "value": [
            {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"},
            {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}
        ]}),
        json!({"op": "add", "path": format!("{l}/containers/0/env"), "value": open_mpi_env(1)}),
        json!({"op": "add", "path": format!("{l}/volumes"),
               "value": [ssh_volume("trainjob"), hostfile_volume("trainjob")]}),
        json!({"op": "add", "path": format!("{n}/containers/0/volumeMounts"),
               "value": [{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}]}),
        json!({"op": "add", "path": format!("{n}/volumes"), "value": [ssh_volume("trainjob")]}),
        json!({"op": "add", "path": "/spec/replicatedJobs/1/template/spec/parallelism", "value": 2}),
        json!({"op": "add", "path": "/spec/replicatedJobs/1/template/spec/completions", "value": 2}),
    ];
    assert_eq!(ops, Value::Array(expected));
}

#[test]
fn unknown_fields_annotations_sidecars_and_user_volumes_survive() {
    let rt = runtime(
        open_mpi(Some(true)),
        vec![
            rjob("node", false, &["node"]),
            rjob("launcher", true, &["node"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 3}));
    let mut js = jobset(&rt, &tj);
    js["metadata"]["annotations"] = json!({"team.example.com/owner": "ml-infra"});
    js["spec"]["futureField"] = json!({"x": [1, 2, 3]});
    js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"] = json!({
        "containers": [
            {"name": "node", "image": "trainer:1", "unknownContainerField": true,
             "env": [{"name": "TRAIN_JOB", "value": "v"}, {"name": "OMPI_MCA_orte_set_default_slots", "value": "99"}],
             "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "old-ssh", "mountPath": "/root/.ssh", "readOnly": true}]},
            {"name": "sidecar", "image": "proxy:1"}
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "futurePodField": "kept"
    });
    let patched = mutate(&plan(&rt, &tj), &js);
    assert_eq!(
        patched["metadata"]["annotations"],
        js["metadata"]["annotations"]
    );
    assert_eq!(patched["spec"]["futureField"], json!({"x": [1, 2, 3]}));
    let launcher = pod_spec(&patched, "launcher");
    assert_eq!(launcher["futurePodField"], "kept");
    assert_eq!(
        launcher["containers"][1],
        json!({"name": "sidecar", "image": "proxy:1"})
    );
    assert_eq!(
        launcher["volumes"],
        json!([{"name": "data", "emptyDir": {}}, ssh_volume("trainjob"), hostfile_volume("trainjob")])
    );
    let node = &launcher["containers"][0];
    assert_eq!(node["unknownContainerField"], true);
    // Mounts upsert by mountPath: the runtime's /root/.ssh mount is replaced in place (kept quirk).
    assert_eq!(
        node["volumeMounts"],
        json!([
            {"name": "data", "mountPath": "/data"},
            {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"},
            {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}
        ])
    );
    // Env upserts by name after what is there (Decision 12): replaced in place, others appended.
    // OMPI_MCA_orte_set_default_slots stays at index 1; the other OMPI/PRTE vars follow in order.
    let names: Vec<&str> = node["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| e["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "TRAIN_JOB",
            "OMPI_MCA_orte_set_default_slots",
            "OMPI_MCA_orte_default_hostfile",
            "OMPI_MCA_orte_keep_fqdn_hostnames",
            "OMPI_MCA_plm_rsh_args",
            "PRTE_MCA_prte_default_hostfile",
            "PRTE_MCA_prte_keep_fqdn_hostnames",
            "PRTE_MCA_prte_set_default_slots",
            "PRTE_MCA_plm_ssh_args"
        ]
    );
    assert_eq!(
        node["env"][1],
        json!({"name": "OMPI_MCA_orte_set_default_slots", "value": "1"})
    );
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(2));
}

#[test]
fn only_containers_named_node_and_only_launcher_and_node_jobs_are_touched() {
    let rt = runtime(
        open_mpi(Some(false)),
        vec![
            rjob("dataset-initializer", false, &["dataset-initializer"]),
            rjob("launcher", false, &["launcher", "node"]),
            rjob("node", true, &["node"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 0}));
    let js = jobset(&rt, &tj);
    let patched = mutate(&plan(&rt, &tj), &js);
    assert_eq!(
        patched["spec"]["replicatedJobs"][0],
        js["spec"]["replicatedJobs"][0]
    );
    let launcher = pod_spec(&patched, "launcher");
    assert_eq!(
        launcher["containers"][0],
        json!({"name": "launcher", "image": "test:runtime"})
    );
    assert_eq!(launcher["containers"][1]["env"], open_mpi_env(1));
    // numNodes 0 without runLauncherAsNode: zero workers.
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(0));
}

#[test]
fn wrong_json_types_are_errors_not_panics() {
    let rt = runtime(open_mpi(None), vec![rjob("launcher", false, &["node"])]);
    let tj = train_job(json!({}));
    let plan = plan(&rt, &tj);
    let mut js = jobset(&rt, &tj);
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"] =
        json!("nope");
    let err = enforce(&plan, &js).expect_err("not a list");
    assert_eq!(
        err.to_string(),
        r#"spec.replicatedJobs[0].template.spec.template.spec.volumes: Invalid value: "string": must be an array"#
    );
    let mut js = jobset(&rt, &tj);
    js["spec"]["replicatedJobs"][0]["template"] = json!(7);
    let err = enforce(&plan, &js).expect_err("not an object");
    assert_eq!(
        err.to_string(),
        r#"spec.replicatedJobs[0].template: Invalid value: "number": must be an object"#
    );
}

#[test]
fn missing_pod_template_parents_are_created() {
    let rt = runtime(open_mpi(None), vec![json!({"name": "launcher"})]);
    let tj = train_job(json!({}));
    let patched = mutate(&plan(&rt, &tj), &jobset(&rt, &tj));
    assert_eq!(
        patched["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"],
        json!([ssh_volume("trainjob"), hostfile_volume("trainjob")])
    );
}

#[test]
fn intel_and_mpich_env_and_hostfile() {
    for (implementation, env) in [
        (
            "Intel",
            json!([
                {"name": "I_MPI_HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
                {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
                {"name": "I_MPI_PERHOST", "value": "4"},
                {"name": "I_MPI_HYDRA_IFACE", "value": "eth0"}
            ]),
        ),
        (
            "MPICH",
            json!([
                {"name": "HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
                {"name": "HYDRA_LAUNCHER_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
                {"name": "HYDRA_IFACE", "value": "eth0"}
            ]),
        ),
    ] {
        let rt = runtime(
            json!({"numProcPerNode": 4, "mpiImplementation": implementation, "runLauncherAsNode": true}),
            vec![
                rjob("node", false, &["node"]),
                rjob("launcher", true, &["node"]),
            ],
        );
        let tj = train_job(json!({"numNodes": 3}));
        let plan = plan(&rt, &tj);
        let patched = mutate(&plan, &jobset(&rt, &tj));
        assert_eq!(
            pod_spec(&patched, "launcher")["containers"][0]["env"],
            env,
            "{implementation}"
        );
        // Hydra recognises the launcher only by its bare pod host name (tests/mpi_launchers).
        assert_eq!(
            hostfile(&plan).expect("fits"),
            "trainjob-node-0-0.trainjob:4\ntrainjob-node-0-1.trainjob:4\ntrainjob-launcher-0-0:4\n",
            "{implementation}"
        );
    }
}

#[test]
fn e3_trainingruntime_new_objects_with_open_mpi_values() {
    // pkg/runtime/core/trainingruntime_test.go: launcher before node, node labelled trainer.
    let mut node = rjob("node", true, &["node"]);
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1"}});
    let rt = runtime(
        open_mpi(Some(false)),
        vec![
            rjob("dataset-initializer", false, &["dataset-initializer"]),
            rjob("model-initializer", false, &["model-initializer"]),
            rjob("launcher", false, &["node"]),
            node,
        ],
    );
    let mut tj = train_job(json!({"numNodes": 2, "numProcPerNode": 8}));
    tj["metadata"]["name"] = json!("test-job");
    let plan = plan(&rt, &tj);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "test-job-node-0-0.test-job slots=8\ntest-job-node-0-1.test-job slots=8\n"
    );
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(2));
    let launcher = &pod_spec(&patched, "launcher")["containers"][0];
    assert_eq!(launcher["env"], open_mpi_env(8));
    assert_eq!(
        pod_spec(&patched, "launcher")["volumes"],
        json!([ssh_volume("test-job"), hostfile_volume("test-job")])
    );
}

#[test]
fn e3_framework_run_launcher_as_node_with_hundred_nodes() {
    // framework_test.go: launcher labelled trainer, node labelled "invalid", numNodes 100.
    let mut node = rjob("node", false, &["node"]);
    node["template"]["metadata"] = json!({"labels": {TRAINER_LABEL: "invalid"}});
    let rt = runtime(
        open_mpi(Some(true)),
        vec![rjob("launcher", true, &["node"]), node],
    );
    let tj = train_job(json!({"numNodes": 100}));
    let plan = plan(&rt, &tj);
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(job_spec(&patched, "node")["parallelism"], json!(99));
    assert_eq!(job_spec(&patched, "node")["completions"], json!(99));
    let text = hostfile(&plan).expect("fits");
    assert_eq!(text.lines().count(), 100);
    assert!(text.starts_with(
        "trainjob-launcher-0-0.trainjob slots=1\ntrainjob-node-0-0.trainjob slots=1\n"
    ));
    assert!(text.ends_with("trainjob-node-0-98.trainjob slots=1\n"));
}

#[test]
fn subdomain_and_replicas_shape_endpoint_names() {
    let mut rt = runtime(
        open_mpi(Some(false)),
        vec![
            rjob("launcher", false, &["node"]),
            rjob("node", false, &["node"]),
        ],
    );
    rt["spec"]["template"]["spec"]["network"] = json!({"subdomain": "mpi"});
    rt["spec"]["template"]["spec"]["replicatedJobs"][1]["replicas"] = json!(2);
    let tj = train_job(json!({"numNodes": 2}));
    assert_eq!(
        hostfile(&plan(&rt, &tj)).expect("fits"),
        "trainjob-node-0-0.mpi slots=1\ntrainjob-node-0-1.mpi slots=1\n\
         trainjob-node-1-0.mpi slots=1\ntrainjob-node-1-1.mpi slots=1\n"
    );
}

/// One writer mutates a JobSet as Trainer creates it, one already wired (a reinvocation, a second
/// webhook pass), one missing a level and one with a value of the wrong type; [`enforce`] checks
/// each answer against the golden corpus, operation for operation, and the reference
/// (`oracle.rs`): the JobSet it makes, or its error.
#[test]
fn fresh_wired_incomplete_and_wrong_jobsets_are_written_as_the_reference_writes_them() {
    let rt = runtime(
        open_mpi(Some(true)),
        vec![
            rjob("node", false, &["node"]),
            rjob("launcher", true, &["node", "sidecar"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 3}));
    let plan = plan(&rt, &tj);
    let fresh = jobset(&rt, &tj);
    let patch = written_patch(&plan, &fresh).expect("patchable");
    let ops = enforce(&plan, &fresh).expect("patchable");
    assert_eq!(patch.0, ops);

    // Counts compare as the reference compares JSON values: 2 is 2; 2.0 and "2" are not.
    assert_eq!(plan.node_count, Some(2), "numNodes 3, the launcher a node");
    let node_spec = "/spec/replicatedJobs/0/template/spec";
    for (count, ops) in [
        (json!(2), 0),
        (json!(2.0), 2),
        (json!("2"), 2),
        (Value::Null, 2),
    ] {
        let mut js = fresh.clone();
        let job_spec = js
            .pointer_mut(node_spec)
            .and_then(Value::as_object_mut)
            .expect("a job spec");
        for field in ["parallelism", "completions"] {
            job_spec.insert(field.into(), count.clone());
        }
        let counted = enforce(&plan, &js)
            .expect("patchable")
            .iter()
            .filter(|op| op.path().to_string().starts_with(&format!("{node_spec}/")))
            .filter(|op| !op.path().to_string().contains("/template/spec/template"))
            .count();
        assert_eq!(counted, ops, "count {count}");
    }

    let wired = mutate(&plan, &fresh);
    assert!(
        enforce(&plan, &wired).expect("patchable").is_empty(),
        "entries already there, equal: nothing to write"
    );

    let mut no_pod_spec = fresh.clone();
    no_pod_spec["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"] = Value::Null;
    let ops = enforce(&plan, &no_pod_spec).expect("patchable");
    assert!(
        ops.iter().any(
            |op| op.path() == "/spec/replicatedJobs/0/template/spec/template/spec"
                && matches!(op, PatchOperation::Replace(r) if r.value["volumes"].is_array())
        ),
        "a null level is replaced with the entry inside: {ops:?}"
    );
    let mut wrong_type = fresh;
    wrong_type["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["volumes"] =
        json!("volumes");
    assert_eq!(
        enforce(&plan, &wrong_type)
            .expect_err("not a list")
            .to_string(),
        r#"spec.replicatedJobs[1].template.spec.template.spec.volumes: Invalid value: "string": must be an array"#
    );
}
