//! JobSet mode, read like the contract's table (docs/jobset-mode.md "Settings"): one test per
//! setting and per validation rule, with exact messages and exact patches. Every mutating review
//! goes through `respond`, which checks its patch against the reference mutation (`oracle.rs`).

use base64::Engine;
use mpi_webhook::admission::Route;
use mpi_webhook::api::JobSet;
use mpi_webhook::mpi::hostfile::hostfile;
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::objects::Snapshot;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use mpi_webhook::admission::Options;
use mpi_webhook::mpi::objects_for::{self, Owned, desired};

use super::admission::{
    JOBSET, admission_review, every_edit_is_answered, every_edit_is_answered_with, respond,
    respond_with,
};
use super::support::{hostfile_volume, mutate, open_mpi_env};

const LABEL: &str = "mpi-webhook.io/implementation";

/// A launcher's `env` in JobSet mode: `env` (the implementation's), then the NVIDIA runtime's
/// GPU env vars, empty (a launcher that is not a node sees no GPU).
fn hiding_gpus(env: Value) -> Value {
    let mut env = env;
    if let Value::Array(list) = &mut env {
        list.push(json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}));
        list.push(json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""}));
    }
    env
}

/// The script JobSet mode's workers run sshd under (docs/jobset-mode.md "Defaults").
const WORKER_SCRIPT: &str = "trap 'kill -TERM \"$sshd\" 2>/dev/null; exit 143' TERM INT; \"$@\" & sshd=$!; wait \"$sshd\"; code=$?; [ \"$code\" -ne 0 ] || code=1; exit \"$code\"";

/// A worker's default command: `sshd` (its words) under [`WORKER_SCRIPT`].
fn worker_command(sshd: &[&str]) -> Value {
    let mut command = vec!["/bin/sh", "-c", WORKER_SCRIPT, "mpi-worker"];
    command.extend_from_slice(sshd);
    json!(command)
}

/// A container with an image, and `extra` members.
fn container(name: &str, extra: Value) -> Value {
    let mut c = json!({"name": name, "image": "mpi:latest"});
    if let (Value::Object(c), Value::Object(extra)) = (&mut c, extra) {
        c.extend(extra);
    }
    c
}

fn rjob(name: &str, job_spec: Value, containers: Vec<Value>) -> Value {
    let mut spec = job_spec;
    spec["template"] = json!({"spec": {"containers": containers}});
    json!({"name": name, "template": {"spec": spec}})
}

/// `node` (2 workers, container `worker`) then `launcher` (container `launcher`, waiting for
/// the workers): the shape the samples and the README use.
fn rjobs() -> Vec<Value> {
    let mut launcher = rjob(
        "launcher",
        json!({}),
        vec![container("launcher", json!({}))],
    );
    launcher["dependsOn"] = json!([{"name": "node", "status": "Ready"}]);
    vec![
        rjob(
            "node",
            json!({"parallelism": 2, "completions": 2}),
            vec![container("worker", json!({}))],
        ),
        launcher,
    ]
}

const SSH_SETUP: &str = "mpi-webhook.io/ssh-setup";

/// A JobSet-mode JobSet `pi` with the given implementation and annotations, and `ssh-setup:
/// image` unless they say otherwise: the tests of the settings and rules from before `generated`
/// (whose own tests are at the end) keep their exact patches.
fn jobset(implementation: &str, annotations: Value, rjobs: Vec<Value>) -> Value {
    let mut annotations = annotations;
    if let Value::Object(map) = &mut annotations {
        map.entry(SSH_SETUP).or_insert(json!("image"));
    }
    generated_jobset(implementation, annotations, rjobs)
}

/// A JobSet-mode JobSet `pi` with exactly the given annotations.
fn generated_jobset(implementation: &str, annotations: Value, rjobs: Vec<Value>) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "pi", "namespace": "default", "uid": "pi-uid",
            "labels": {LABEL: implementation},
            "annotations": annotations
        },
        "spec": {"replicatedJobs": rjobs}
    })
}

fn plan(jobset: &Value) -> MpiPlan {
    let typed: JobSet = serde_json::from_value(jobset.clone()).expect("JobSet");
    MpiPlan::for_jobset(&typed, &Options::default()).expect("settings parse")
}

fn hostfile_of(jobset: &Value) -> String {
    hostfile(&plan(jobset)).expect("fits")
}

async fn review(route: Route, operation: &str, object: Value, old: Option<Value>) -> Value {
    let mut body = admission_review(JOBSET, operation, object);
    if let Some(old) = old {
        body["request"]["oldObject"] = old;
    }
    respond(route, &body, &Snapshot::default()).await["response"].clone()
}

async fn validate(object: Value) -> Value {
    review(Route::ValidateJobSet, "CREATE", object, None).await
}

/// The denial message of both routes, which must agree (the mutator denies what the validator
/// denies, so no pod starts half wired).
async fn denial(object: Value) -> String {
    let validated = validate(object.clone()).await;
    let mutated = review(Route::MutateJobSet, "CREATE", object, None).await;
    assert_eq!(validated["allowed"], false, "{validated}");
    assert_eq!(
        validated["status"], mutated["status"],
        "both routes deny alike"
    );
    validated["status"]["message"]
        .as_str()
        .expect("message")
        .to_string()
}

fn patch_of(response: &Value) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .expect("base64");
    serde_json::from_slice(&bytes).expect("JSON")
}

fn pod_spec(jobset: &Value, i: usize) -> &Value {
    &jobset["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"]
}

/// The SSH volume of JobSet `pi`: 0600 for `id_rsa` (Decision 18), the rest as TrainJob mode.
fn strict_ssh_volume() -> Value {
    json!({
        "name": "mpi-ssh-auth",
        "secret": {
            "secretName": "pi-mpi-ssh-auth",
            "defaultMode": 256,
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa", "mode": 384},
                {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 420},
                {"key": "ssh-publickey", "path": "authorized_keys", "mode": 420}
            ]
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Settings: one test per row of the table

#[tokio::test]
async fn defaults_give_this_exact_patch_on_each_templates_first_container() {
    let js = jobset("OpenMPI", json!({}), rjobs());
    let response = review(Route::MutateJobSet, "CREATE", js.clone(), None).await;
    assert_eq!(response["allowed"], true);
    let pod = |i: usize| format!("/spec/replicatedJobs/{i}/template/spec/template/spec");
    // The diff of the JobSet and its wired copy: each new member whole, existing members first.
    let expected = vec![
        json!({"op": "add", "path": format!("{}/containers/0/volumeMounts", pod(0)),
               "value": [{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}]}),
        json!({"op": "add", "path": format!("{}/containers/0/command", pod(0)),
               "value": worker_command(&["/usr/sbin/sshd", "-De", "-p", "22"])}),
        json!({"op": "add", "path": format!("{}/containers/0/readinessProbe", pod(0)),
               "value": {"tcpSocket": {"port": 22}}}),
        json!({"op": "add", "path": format!("{}/volumes", pod(0)), "value": [strict_ssh_volume()]}),
        json!({"op": "add", "path": "/spec/replicatedJobs/0/template/spec/backoffLimit", "value": 0}),
        json!({"op": "add", "path": format!("{}/containers/0/volumeMounts", pod(1)), "value": [
            {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"},
            {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}
        ]}),
        json!({"op": "add", "path": format!("{}/containers/0/env", pod(1)), "value": hiding_gpus(open_mpi_env(1))}),
        json!({"op": "add", "path": format!("{}/containers/0/terminationMessagePolicy", pod(1)),
               "value": "FallbackToLogsOnError"}),
        json!({"op": "add", "path": format!("{}/volumes", pod(1)),
               "value": [strict_ssh_volume(), hostfile_volume("pi")]}),
        json!({"op": "add", "path": "/spec/replicatedJobs/1/template/spec/backoffLimit", "value": 0}),
        json!({"op": "add", "path": "/spec/successPolicy",
               "value": {"operator": "All", "targetReplicatedJobs": ["launcher"]}}),
    ];
    assert_eq!(patch_of(&response), Value::Array(expected));
    assert_eq!(
        hostfile_of(&js),
        "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\n"
    );
}

#[tokio::test]
async fn a_second_pass_yields_no_patch() {
    for implementation in ["OpenMPI", "Intel", "MPICH"] {
        let js = jobset(
            implementation,
            json!({"mpi-webhook.io/run-launcher-as-node": "true", "mpi-webhook.io/slots-per-node": "3"}),
            rjobs(),
        );
        // `mutate` applies the patch and asserts the second pass is empty, on both enforce paths.
        let patched = mutate(&plan(&js), &js);
        let again = review(Route::MutateJobSet, "CREATE", patched, None).await;
        assert_eq!(again["allowed"], true);
        assert_eq!(again.get("patch"), None, "{implementation}");
    }
}

#[test]
fn label_chooses_the_implementation_row() {
    let intel = jobset("Intel", json!({}), rjobs());
    let patched = mutate(&plan(&intel), &intel);
    assert_eq!(
        pod_spec(&patched, 1)["containers"][0]["env"],
        hiding_gpus(json!([
            {"name": "I_MPI_HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
            {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
            {"name": "I_MPI_PERHOST", "value": "1"},
            {"name": "I_MPI_HYDRA_IFACE", "value": "eth0"}
        ]))
    );
    assert_eq!(hostfile_of(&intel), "pi-node-0-0.pi:1\npi-node-0-1.pi:1\n");
    let mpich = jobset("MPICH", json!({}), rjobs());
    let patched = mutate(&plan(&mpich), &mpich);
    assert_eq!(
        pod_spec(&patched, 1)["containers"][0]["env"],
        hiding_gpus(json!([
            {"name": "HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
            {"name": "HYDRA_LAUNCHER_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
            {"name": "HYDRA_IFACE", "value": "eth0"}
        ]))
    );
}

#[test]
fn slots_per_node_annotation_sets_slots() {
    let js = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/slots-per-node": "4"}),
        rjobs(),
    );
    let patched = mutate(&plan(&js), &js);
    assert_eq!(
        pod_spec(&patched, 1)["containers"][0]["env"],
        hiding_gpus(open_mpi_env(4))
    );
    assert_eq!(
        hostfile_of(&js),
        "pi-node-0-0.pi slots=4\npi-node-0-1.pi slots=4\n"
    );
}

#[test]
fn slots_default_to_the_gpus_of_the_wired_node_container_when_above_one() {
    let with_gpus = |gpus: Value, container_annotation: bool| {
        let mut rjobs = rjobs();
        let resources = json!({"resources": {"limits": {"nvidia.com/gpu": gpus}}});
        let containers = vec![
            container(
                "sidecar",
                json!({"resources": {"limits": {"nvidia.com/gpu": 8}}}),
            ),
            container("worker", resources),
        ];
        rjobs[0]["template"]["spec"]["template"]["spec"]["containers"] = json!(containers);
        rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] = json!([
            container("sidecar", json!({})),
            container("worker", json!({}))
        ]);
        let annotations = match container_annotation {
            true => json!({"mpi-webhook.io/container": "worker"}),
            false => json!({}),
        };
        plan(&jobset("OpenMPI", annotations, rjobs)).slots
    };
    assert_eq!(with_gpus(json!(4), true), 4, "the wired container's GPUs");
    assert_eq!(with_gpus(json!(1), true), 1, "one GPU: 1 slot");
    assert_eq!(
        with_gpus(json!(4), false),
        8,
        "by default the first container is wired"
    );
    assert_eq!(
        plan(&jobset("OpenMPI", json!({}), rjobs())).slots,
        1,
        "no GPU"
    );
}

#[test]
fn ssh_auth_mount_path_annotation_moves_the_ssh_mount() {
    let js = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/ssh-auth-mount-path": "/home/mpiuser/.ssh"}),
        rjobs(),
    );
    let patched = mutate(&plan(&js), &js);
    for i in [0, 1] {
        assert_eq!(
            pod_spec(&patched, i)["containers"][0]["volumeMounts"][0],
            json!({"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"})
        );
    }
}

#[test]
fn run_launcher_as_node_lists_the_launcher_and_hydra_by_its_pod_host_name() {
    let as_node = json!({"mpi-webhook.io/run-launcher-as-node": "true"});
    assert_eq!(
        hostfile_of(&jobset("OpenMPI", as_node.clone(), rjobs())),
        "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n"
    );
    assert_eq!(
        hostfile_of(&jobset("MPICH", as_node, rjobs())),
        "pi-node-0-0.pi:1\npi-node-0-1.pi:1\npi-launcher-0-0:1\n"
    );
    let not = json!({"mpi-webhook.io/run-launcher-as-node": "false"});
    assert_eq!(
        hostfile_of(&jobset("MPICH", not, rjobs())),
        "pi-node-0-0.pi:1\npi-node-0-1.pi:1\n"
    );
}

/// The launcher's env and `terminationMessagePolicy` after the mutation of a JobSet whose
/// launcher container has `extra` members, with `annotations`.
fn launcher_after(annotations: Value, extra: Value) -> (Value, Value) {
    let mut rjobs = rjobs();
    rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] =
        json!([container("launcher", extra)]);
    let js = jobset("MPICH", annotations, rjobs);
    let patched = mutate(&plan(&js), &js);
    let launcher = &pod_spec(&patched, 1)["containers"][0];
    (
        launcher["env"].clone(),
        launcher["terminationMessagePolicy"].clone(),
    )
}

const MPICH_ENV: [(&str, &str); 3] = [
    ("HYDRA_HOST_FILE", "/etc/mpi/hostfile"),
    ("HYDRA_LAUNCHER_EXTRA_ARGS", "-o ConnectionAttempts=10"),
    ("HYDRA_IFACE", "eth0"),
];

fn env(vars: &[(&str, &str)]) -> Value {
    vars.iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect()
}

#[test]
fn the_launcher_keeps_its_output_on_failure_unless_it_chose_a_policy() {
    let (_, policy) = launcher_after(json!({}), json!({}));
    assert_eq!(policy, "FallbackToLogsOnError");
    let (_, policy) = launcher_after(json!({}), json!({"terminationMessagePolicy": "File"}));
    assert_eq!(policy, "File", "the user's value");
    // A launcher that runs as a node too: its last words all the same.
    let as_node = json!({"mpi-webhook.io/run-launcher-as-node": "true"});
    assert_eq!(
        launcher_after(as_node, json!({})).1,
        "FallbackToLogsOnError"
    );
}

#[test]
fn a_launcher_that_is_not_a_worker_gets_the_gpu_env_empty_unless_set_or_a_node() {
    let mut hidden = MPICH_ENV.to_vec();
    hidden.extend([
        ("NVIDIA_VISIBLE_DEVICES", ""),
        ("NVIDIA_DRIVER_CAPABILITIES", ""),
    ]);
    assert_eq!(launcher_after(json!({}), json!({})).0, env(&hidden));
    // run-launcher-as-node: it runs ranks, and keeps its GPUs.
    let as_node = json!({"mpi-webhook.io/run-launcher-as-node": "true"});
    assert_eq!(launcher_after(as_node, json!({})).0, env(&MPICH_ENV));
    // The user's value wins, in place, and the other is still added.
    let mine = json!({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]});
    let mut expected = vec![("NVIDIA_VISIBLE_DEVICES", "all")];
    expected.extend(MPICH_ENV);
    expected.push(("NVIDIA_DRIVER_CAPABILITIES", ""));
    assert_eq!(launcher_after(json!({}), mine).0, env(&expected));
    // Set from a ConfigMap: still the user's.
    let from = json!({"env": [{"name": "NVIDIA_DRIVER_CAPABILITIES",
        "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": "caps"}}}]});
    let (got, _) = launcher_after(json!({}), from.clone());
    assert_eq!(got[0], from["env"][0]);
    assert_eq!(got.as_array().map(Vec::len), Some(5));
    assert_eq!(
        got[4],
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": ""})
    );
    // A launcher that asks for GPUs itself: its device plugin's value is not hidden.
    for list in ["requests", "limits"] {
        let gpus = json!({"resources": {list: {"nvidia.com/gpu": 1}}});
        assert_eq!(launcher_after(json!({}), gpus).0, env(&MPICH_ENV), "{list}");
    }
}

#[test]
fn container_annotation_wires_that_container_and_no_other() {
    let mut rjobs = rjobs();
    for (i, name) in [(0, "worker"), (1, "launcher")] {
        rjobs[i]["template"]["spec"]["template"]["spec"]["containers"] = json!([
            container("log", json!({})),
            container(name, json!({})),
            container("mpi", json!({}))
        ]);
    }
    let js = jobset("OpenMPI", json!({"mpi-webhook.io/container": "mpi"}), rjobs);
    let patched = mutate(&plan(&js), &js);
    for i in [0, 1] {
        let containers = &pod_spec(&patched, i)["containers"];
        assert_eq!(containers[0], container("log", json!({})), "untouched");
        assert!(containers[1].get("volumeMounts").is_none(), "untouched");
        assert!(containers[2]["volumeMounts"].is_array(), "wired");
    }
    assert_eq!(
        pod_spec(&patched, 1)["containers"][2]["env"],
        hiding_gpus(open_mpi_env(1))
    );
}

#[test]
fn counts_are_the_jobsets_own_and_never_patched() {
    let mut rjobs = rjobs();
    rjobs[0]["replicas"] = json!(2);
    rjobs[0]["template"]["spec"]["parallelism"] = json!(3);
    let mut js = jobset("MPICH", json!({}), rjobs);
    js["spec"]["network"] = json!({"subdomain": "workers"});
    assert_eq!(
        hostfile_of(&js),
        "pi-node-0-0.workers:1\npi-node-0-1.workers:1\npi-node-0-2.workers:1\npi-node-1-0.workers:1\npi-node-1-1.workers:1\npi-node-1-2.workers:1\n"
    );
    let patched = mutate(&plan(&js), &js);
    assert_eq!(
        patched["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"],
        3
    );
    assert_eq!(
        patched["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"], 2,
        "completions untouched"
    );
}

// ---------------------------------------------------------------------------------------------
// Validation: one test per rule

#[tokio::test]
async fn a_valid_jobset_is_admitted_without_warnings() {
    let response = validate(jobset("OpenMPI", json!({}), rjobs())).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response.get("warnings"), None);
}

#[tokio::test]
async fn unsupported_implementation_is_denied_with_the_supported_values() {
    assert_eq!(
        denial(jobset("openmpi", json!({}), rjobs())).await,
        r#"metadata.labels[mpi-webhook.io/implementation]: Unsupported value: "openmpi": supported values: "OpenMPI", "Intel", "MPICH""#
    );
}

#[tokio::test]
async fn annotations_that_do_not_parse_are_denied_each_naming_itself() {
    let cases = [
        (
            json!({"mpi-webhook.io/slots-per-node": "0"}),
            r#"metadata.annotations[mpi-webhook.io/slots-per-node]: Invalid value: "0": must be an integer >= 1"#,
        ),
        (
            json!({"mpi-webhook.io/slots-per-node": "two"}),
            r#"metadata.annotations[mpi-webhook.io/slots-per-node]: Invalid value: "two": must be an integer >= 1"#,
        ),
        (
            json!({"mpi-webhook.io/ssh-auth-mount-path": ".ssh"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-auth-mount-path]: Invalid value: ".ssh": must be an absolute path"#,
        ),
        // Found by the `mutation` fuzz target: both mounts are upserted by mountPath, so each
        // pass replaced the other and a second pass was never empty.
        (
            json!({"mpi-webhook.io/ssh-auth-mount-path": "/etc/mpi"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-auth-mount-path]: Invalid value: "/etc/mpi": must not be /etc/mpi, where the hostfile is mounted"#,
        ),
        (
            json!({"mpi-webhook.io/ssh-auth-mount-path": "/etc/mpi/"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-auth-mount-path]: Invalid value: "/etc/mpi/": must not be /etc/mpi, where the hostfile is mounted"#,
        ),
        (
            json!({"mpi-webhook.io/run-launcher-as-node": "yes"}),
            r#"metadata.annotations[mpi-webhook.io/run-launcher-as-node]: Unsupported value: "yes": supported values: "true", "false""#,
        ),
        (
            json!({"mpi-webhook.io/ssh-port": "0"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-port]: Invalid value: "0": must be an integer between 1 and 65535, inclusive"#,
        ),
        (
            json!({"mpi-webhook.io/ssh-port": "65536"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-port]: Invalid value: "65536": must be an integer between 1 and 65535, inclusive"#,
        ),
        (
            json!({"mpi-webhook.io/ssh-port": "ssh"}),
            r#"metadata.annotations[mpi-webhook.io/ssh-port]: Invalid value: "ssh": must be an integer between 1 and 65535, inclusive"#,
        ),
        (
            json!({"mpi-webhook.io/preflight": "no"}),
            r#"metadata.annotations[mpi-webhook.io/preflight]: Unsupported value: "no": supported values: "true", "false""#,
        ),
    ];
    for (annotations, expected) in cases {
        assert_eq!(
            denial(jobset("OpenMPI", annotations, rjobs())).await,
            expected
        );
    }
}

#[tokio::test]
async fn a_missing_or_multi_pod_launcher_is_denied() {
    let node_only = vec![rjobs().remove(0)];
    assert_eq!(
        denial(jobset("OpenMPI", json!({}), node_only)).await,
        r#"spec.replicatedJobs: Required value: JobSet mode needs a replicatedJob named "launcher""#
    );
    let mut rjobs = rjobs();
    rjobs[1]["replicas"] = json!(2);
    rjobs[1]["template"]["spec"]["parallelism"] = json!(3);
    rjobs[1]["template"]["spec"]["completions"] = json!(3);
    assert_eq!(
        denial(jobset("OpenMPI", json!({}), rjobs)).await,
        "[spec.replicatedJobs[1].replicas: Invalid value: 2: the launcher must run exactly 1 pod, spec.replicatedJobs[1].template.spec.parallelism: Invalid value: 3: the launcher must run exactly 1 pod, spec.replicatedJobs[1].template.spec.completions: Invalid value: 3: the launcher must run exactly 1 pod]"
    );
}

#[tokio::test]
async fn a_missing_node_is_denied_unless_the_launcher_runs_as_node() {
    let launcher_only = vec![rjobs().remove(1)];
    assert_eq!(
        denial(jobset("OpenMPI", json!({}), launcher_only.clone())).await,
        r#"spec.replicatedJobs: Required value: JobSet mode needs a replicatedJob named "node" unless mpi-webhook.io/run-launcher-as-node is "true""#
    );
    let as_node = json!({"mpi-webhook.io/run-launcher-as-node": "true"});
    let response = validate(jobset("MPICH", as_node, launcher_only)).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response.get("warnings"), None, "no node to wait for");
}

#[tokio::test]
async fn an_unknown_container_is_denied_in_each_template() {
    assert_eq!(
        denial(jobset(
            "OpenMPI",
            json!({"mpi-webhook.io/container": "mpi"}),
            rjobs()
        ))
        .await,
        r#"[spec.replicatedJobs[1].template.spec.template.spec.containers: Invalid value: "mpi": must contain the container named by annotation mpi-webhook.io/container, spec.replicatedJobs[0].template.spec.template.spec.containers: Invalid value: "mpi": must contain the container named by annotation mpi-webhook.io/container]"#
    );
}

#[tokio::test]
async fn a_jobset_without_a_name_is_denied() {
    let mut js = jobset("OpenMPI", json!({}), rjobs());
    js["metadata"]["name"] = json!("");
    js["metadata"]["generateName"] = json!("pi-");
    assert_eq!(
        denial(js).await,
        "metadata.name: Required value: JobSet mode names the Secret, the ConfigMap and the host names after the JobSet: set a name (generateName alone is not enough)"
    );
}

#[tokio::test]
async fn dns_hostnames_switched_off_is_denied() {
    let mut js = jobset("OpenMPI", json!({}), rjobs());
    js["spec"]["network"] = json!({"enableDNSHostnames": false});
    assert_eq!(
        denial(js).await,
        "spec.network.enableDNSHostnames: Invalid value: false: must not be false in JobSet mode: MPI reaches every host by its pod host name"
    );
}

#[tokio::test]
async fn a_reserved_env_on_the_wired_launcher_container_is_denied_in_section_b_form() {
    let mut rjobs = rjobs();
    // The entry the mutation writes is no conflict (the validator sees the mutated JobSet).
    let env = json!([
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "PRTE_MCA_plm_ssh_args", "value": "<x>"},
        {"name": "I_MPI_PERHOST", "value": "2"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/h"}
    ]);
    rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] = json!([
        container(
            "log",
            json!({"env": [{"name": "OMPI_MCA_plm_rsh_args", "value": "ok here"}]})
        ),
        container("mpi", json!({"env": env})),
    ]);
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"] =
        json!([container("mpi", json!({}))]);
    let js = jobset("OpenMPI", json!({"mpi-webhook.io/container": "mpi"}), rjobs);
    assert_eq!(
        denial(js).await,
        r#"spec.replicatedJobs[1].template.spec.template.spec.containers[1].env: Invalid value: [{"name":"OMPI_MCA_orte_keep_fqdn_hostnames","value":"true"},{"name":"PRTE_MCA_plm_ssh_args","value":"\u003cx\u003e"},{"name":"I_MPI_PERHOST","value":"2"},{"name":"OMPI_MCA_orte_default_hostfile","value":"/h"}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile PRTE_MCA_plm_ssh_args]"#
    );
}

#[tokio::test]
async fn a_hostfile_over_a_configmap_is_denied() {
    let mut rjobs = rjobs();
    rjobs[0]["template"]["spec"]["parallelism"] = json!(100_000);
    assert_eq!(
        denial(jobset("OpenMPI", json!({}), rjobs)).await,
        "spec.replicatedJobs[0].template.spec.parallelism: Invalid value: 100000: the MPI hostfile would be 2688890 bytes, over the 1048576-byte limit of a ConfigMap"
    );
}

/// `jobset` renamed `name`.
fn renamed(jobset: Value, name: &str) -> Value {
    let mut jobset = jobset;
    jobset["metadata"]["name"] = json!(name);
    jobset
}

/// Decision 19: Open MPI 4.1 takes host names of up to 56 characters. The longest here is the
/// launcher's, `<name>-launcher-0-0`: the name and 13 more.
#[tokio::test]
async fn open_mpi_denies_a_name_whose_host_names_are_over_56_characters_at_creation() {
    let at_limit = renamed(jobset("OpenMPI", json!({}), rjobs()), &"a".repeat(43));
    assert_eq!(validate(at_limit.clone()).await["allowed"], true);
    let mutated = review(Route::MutateJobSet, "CREATE", at_limit, None).await;
    assert_eq!(mutated["allowed"], true, "{mutated}");
    let name = "b".repeat(44);
    let over = renamed(jobset("OpenMPI", json!({}), rjobs()), &name);
    assert_eq!(
        denial(over.clone()).await,
        format!(
            r#"metadata.name: Invalid value: "{name}": the longest pod host name, "{name}-launcher-0-0", would be 57 characters, over the 56 that Open MPI 4.1 accepts: its mpirun aborts with "*** stack smashing detected ***" (open-mpi/ompi#13358); use a shorter name"#
        )
    );
    // An UPDATE of a JobSet made before the rule (Kueue's suspend, a label) is not refused.
    let updated = review(Route::ValidateJobSet, "UPDATE", over.clone(), Some(over)).await;
    assert_eq!(updated["allowed"], true, "{updated}");
    // No limit is known for Intel MPI or MPICH.
    for implementation in ["Intel", "MPICH"] {
        let long = renamed(jobset(implementation, json!({}), rjobs()), &name);
        assert_eq!(validate(long).await["allowed"], true, "{implementation}");
    }
}

#[tokio::test]
async fn on_update_the_label_and_annotations_are_immutable() {
    let old = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/slots-per-node": "2"}),
        rjobs(),
    );
    let same = review(
        Route::ValidateJobSet,
        "UPDATE",
        old.clone(),
        Some(old.clone()),
    )
    .await;
    assert_eq!(same["allowed"], true);
    let mut changed = jobset(
        "Intel",
        json!({"mpi-webhook.io/container": "worker"}),
        rjobs(),
    );
    changed["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"] =
        json!([container("worker", json!({}))]);
    let response = review(Route::ValidateJobSet, "UPDATE", changed, Some(old.clone())).await;
    assert_eq!(
        response["status"]["message"],
        r#"[metadata.labels[mpi-webhook.io/implementation]: Invalid value: "Intel": field is immutable, metadata.annotations[mpi-webhook.io/slots-per-node]: Invalid value: "": field is immutable, metadata.annotations[mpi-webhook.io/container]: Invalid value: "worker": field is immutable]"#
    );
    let mut unlabelled = old.clone();
    unlabelled["metadata"]["labels"] = json!({});
    unlabelled["metadata"]["annotations"] = json!({});
    let response = review(
        Route::ValidateJobSet,
        "UPDATE",
        unlabelled.clone(),
        Some(old),
    )
    .await;
    assert_eq!(
        response["status"]["message"],
        r#"[metadata.labels[mpi-webhook.io/implementation]: Invalid value: "": field is immutable, metadata.annotations[mpi-webhook.io/slots-per-node]: Invalid value: "": field is immutable, metadata.annotations[mpi-webhook.io/ssh-setup]: Invalid value: "": field is immutable]"#
    );
    let added = jobset("OpenMPI", json!({}), rjobs());
    let response = review(
        Route::ValidateJobSet,
        "UPDATE",
        added.clone(),
        Some(unlabelled),
    )
    .await;
    assert_eq!(
        response["status"]["message"],
        r#"[metadata.labels[mpi-webhook.io/implementation]: Invalid value: "OpenMPI": field is immutable, metadata.annotations[mpi-webhook.io/ssh-setup]: Invalid value: "image": field is immutable]"#
    );
    let ported = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/ssh-port": "2222", "mpi-webhook.io/preflight": "false"}),
        rjobs(),
    );
    let response = review(Route::ValidateJobSet, "UPDATE", ported, Some(added)).await;
    assert_eq!(
        response["status"]["message"],
        r#"[metadata.annotations[mpi-webhook.io/ssh-port]: Invalid value: "2222": field is immutable, metadata.annotations[mpi-webhook.io/preflight]: Invalid value: "false": field is immutable]"#
    );
}

#[tokio::test]
async fn the_label_on_a_trainjob_owned_jobset_is_denied_and_trainjob_mode_wins() {
    let mut js = jobset("OpenMPI", json!({}), rjobs());
    js["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "name": "pi", "uid": "tj-uid", "controller": true
    }]);
    let response = validate(js.clone()).await;
    assert_eq!(
        response["status"]["message"],
        r#"metadata.labels[mpi-webhook.io/implementation]: Invalid value: "OpenMPI": must not be set on a JobSet owned by a TrainJob: its MPI policy comes from the TrainJob's runtime"#
    );
    // The mutator reads it in TrainJob mode: the TrainJob is looked up (and here not found).
    let mutated = review(Route::MutateJobSet, "CREATE", js, None).await;
    assert_eq!(
        mutated["status"]["message"],
        r#"TrainJob "default/pi", the controller owner of this JobSet, was not found; retry once it exists"#
    );
}

#[tokio::test]
async fn a_launcher_not_waiting_for_ready_nodes_is_admitted_with_a_warning() {
    let mut rjobs = rjobs();
    rjobs[1]["dependsOn"] = json!([{"name": "node", "status": "Complete"}]);
    let js = jobset("OpenMPI", json!({}), rjobs);
    let response = validate(js.clone()).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"],
        json!([
            "spec.replicatedJobs[1].dependsOn: the launcher does not wait for the workers: without dependsOn [{name: node, status: Ready}] it may start before their sshd listens"
        ])
    );
    let mutated = review(Route::MutateJobSet, "CREATE", js, None).await;
    assert_eq!(mutated["allowed"], true);
    assert_eq!(mutated.get("warnings"), None, "the validator warns, once");
}

#[tokio::test]
async fn unlabelled_jobsets_are_left_alone() {
    let mut js = jobset("OpenMPI", json!({}), vec![]);
    js["metadata"]["labels"] = json!({"app": "x"});
    assert_eq!(validate(js.clone()).await["allowed"], true);
    let mutated = review(Route::MutateJobSet, "CREATE", js, None).await;
    assert_eq!(mutated["allowed"], true);
    assert_eq!(mutated.get("patch"), None);
}

#[tokio::test]
async fn an_unreadable_jobset_is_denied_naming_the_field() {
    let mut js = jobset("OpenMPI", json!({}), rjobs());
    js["spec"]["replicatedJobs"][0]["replicas"] = json!("2");
    let expected = r#"JobSet cannot be read: spec.replicatedJobs[0].replicas: invalid type: string "2", expected i32"#;
    assert_eq!(denial(js).await, expected);
}

// ---------------------------------------------------------------------------------------------
// Every edit of a JobSet-mode review is answered, on both routes, and mutated as the reference
// mutates it

#[tokio::test]
async fn every_edit_of_a_jobset_mode_review_is_answered_as_the_reference_answers() {
    let mut js = jobset(
        "Intel",
        json!({"mpi-webhook.io/container": "worker", "mpi-webhook.io/slots-per-node": "2"}),
        rjobs(),
    );
    js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"] =
        json!([container(
            "worker",
            json!({"env": [{"name": "A", "value": "1"}]})
        )]);
    js["spec"]["network"] = json!({"subdomain": "pi"});
    let objects = Snapshot::default();
    let create = admission_review(JOBSET, "CREATE", js.clone());
    assert!(every_edit_is_answered(Route::MutateJobSet, &create, &objects).await > 0);
    assert!(every_edit_is_answered(Route::ValidateJobSet, &create, &objects).await > 0);
    let mut update = admission_review(JOBSET, "UPDATE", js.clone());
    update["request"]["oldObject"] = js;
    assert!(every_edit_is_answered(Route::ValidateJobSet, &update, &objects).await > 0);
}

// ---------------------------------------------------------------------------------------------
// mpi-webhook.io/network-policy: read by the reconciler only, validated and fixed here

const NETWORK_POLICY: &str = "mpi-webhook.io/network-policy";

#[tokio::test]
async fn network_policy_annotation_must_be_true_or_false() {
    for value in ["yes", "True", ""] {
        assert_eq!(
            denial(jobset("OpenMPI", json!({NETWORK_POLICY: value}), rjobs())).await,
            format!(
                r#"metadata.annotations[mpi-webhook.io/network-policy]: Unsupported value: "{value}": supported values: "true", "false""#
            )
        );
    }
}

#[tokio::test]
async fn network_policy_annotation_is_admitted_and_changes_nothing_in_the_patch() {
    let plain = review(
        Route::MutateJobSet,
        "CREATE",
        jobset("OpenMPI", json!({}), rjobs()),
        None,
    )
    .await;
    for value in ["true", "false"] {
        let js = jobset("OpenMPI", json!({NETWORK_POLICY: value}), rjobs());
        assert_eq!(validate(js.clone()).await["allowed"], true, "{value}");
        let mutated = review(Route::MutateJobSet, "CREATE", js, None).await;
        assert_eq!(patch_of(&mutated), patch_of(&plain), "{value}");
    }
}

#[tokio::test]
async fn network_policy_annotation_is_immutable_on_update() {
    let field = "metadata.annotations[mpi-webhook.io/network-policy]";
    let on = jobset("OpenMPI", json!({NETWORK_POLICY: "true"}), rjobs());
    let off = jobset("OpenMPI", json!({NETWORK_POLICY: "false"}), rjobs());
    let absent = jobset("OpenMPI", json!({}), rjobs());
    for (old, new, shown) in [
        (&on, &off, "false"),
        (&on, &absent, ""),
        (&absent, &on, "true"),
    ] {
        let response = review(
            Route::ValidateJobSet,
            "UPDATE",
            new.clone(),
            Some(old.clone()),
        )
        .await;
        assert_eq!(
            response["status"]["message"],
            format!(r#"{field}: Invalid value: "{shown}": field is immutable"#)
        );
    }
    let same = review(Route::ValidateJobSet, "UPDATE", on.clone(), Some(on)).await;
    assert_eq!(same["allowed"], true);
}

// ---------------------------------------------------------------------------------------------
// Defaults (docs/jobset-mode.md "Defaults"): filled in where unset, never over the
// user's value, idempotent

const IMAGE: &str = "ghcr.io/mpi-webhook/mpi-webhook:0.1.0";

/// `node` (2 workers) then `launcher`, written minimally: no command on the workers, no probe,
/// no dependsOn.
fn minimal_rjobs() -> Vec<Value> {
    vec![
        rjob(
            "node",
            json!({"parallelism": 2, "completions": 2}),
            vec![container("worker", json!({}))],
        ),
        rjob(
            "launcher",
            json!({}),
            vec![container(
                "launcher",
                json!({"command": ["mpirun", "hostname"]}),
            )],
        ),
    ]
}

/// The mutating answer of `serve --preflight-image image`.
async fn mutate_with(object: Value, image: &str) -> Value {
    let options = Options {
        preflight_image: image.to_string(),
    };
    let body = admission_review(JOBSET, "CREATE", object);
    respond_with(Route::MutateJobSet, &body, &Snapshot::default(), &options).await["response"]
        .clone()
}

/// `object` with the patch of `response` applied.
fn patched(object: &Value, response: &Value) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(patch_of(response)).expect("RFC 6902");
    let mut object = object.clone();
    json_patch::patch(&mut object, &patch).expect("applies");
    object
}

/// Mutates `object` as `serve --preflight-image image` does, checks that a second pass yields
/// no patch and that the validator admits the result; returns it.
async fn defaulted(object: Value, image: &str) -> Value {
    let response = mutate_with(object.clone(), image).await;
    assert_eq!(response["allowed"], true, "{response}");
    let once = patched(&object, &response);
    let again = mutate_with(once.clone(), image).await;
    assert_eq!(again.get("patch"), None, "a second pass changes nothing");
    let validated = validate(once.clone()).await;
    assert_eq!(validated["allowed"], true, "{validated}");
    once
}

fn preflight(port: &str) -> Value {
    crate::preflight::preflight_container(IMAGE, port)
}

/// Decision 21: the launcher's and the workers' Jobs fail at their first failure where the user
/// set no `backoffLimit`; a limit the user wrote, 0 or not, is kept.
#[tokio::test]
async fn a_lost_worker_or_failed_launcher_fails_its_job_unless_the_user_set_a_backoff_limit() {
    let js = jobset("OpenMPI", json!({}), minimal_rjobs());
    let js = defaulted(js, IMAGE).await;
    for i in 0..2 {
        assert_eq!(
            js["spec"]["replicatedJobs"][i]["template"]["spec"]["backoffLimit"],
            0
        );
    }
    let mut rjobs = minimal_rjobs();
    rjobs[0]["template"]["spec"]["backoffLimit"] = json!(4);
    rjobs[1]["template"]["spec"]["backoffLimit"] = json!(null);
    let js = defaulted(jobset("OpenMPI", json!({}), rjobs), IMAGE).await;
    assert_eq!(
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"],
        4
    );
    assert_eq!(
        js["spec"]["replicatedJobs"][1]["template"]["spec"]["backoffLimit"],
        0
    );
}

/// Decision 21, run for real: the worker command the patch writes, with a stand-in for sshd,
/// exits 143 when the container is told to stop, and never 0 however its sshd ends.
#[tokio::test]
async fn the_workers_command_ends_as_a_failure_whatever_ends_it() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let js = defaulted(jobset("OpenMPI", json!({}), minimal_rjobs()), IMAGE).await;
    let command = pod_spec(&js, 0)["containers"][0]["command"].clone();
    let words: Vec<String> = command
        .as_array()
        .expect("a command")
        .iter()
        .map(|w| w.as_str().expect("a word").to_string())
        .collect();
    // The words up to the script's `$0`, then a stand-in for sshd.
    let run = |sshd: &[&str]| {
        let mut child = Command::new(&words[0]);
        child.args(&words[1..4]).args(sshd).stdin(Stdio::null());
        child
    };
    let code = |mut command: Command| command.status().expect("sh runs").code();
    assert_eq!(code(run(&["true"])), Some(1), "sshd ending with 0");
    assert_eq!(
        code(run(&["sh", "-c", "exit 5"])),
        Some(5),
        "sshd's own code"
    );
    let mut stopped = run(&["sleep", "60"]).spawn().expect("sh runs");
    // The trap is set before sshd starts: a SIGTERM at any time after that ends it with 143.
    std::thread::sleep(Duration::from_millis(300));
    let pid = stopped.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = stopped.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(143));
}

#[tokio::test]
async fn a_minimal_jobset_gets_sshd_a_probe_dependson_and_the_preflight() {
    let js = jobset("OpenMPI", json!({}), minimal_rjobs());
    let response = mutate_with(js.clone(), IMAGE).await;
    let ops: Vec<(String, String)> = patch_of(&response)
        .as_array()
        .expect("ops")
        .iter()
        .map(|op| {
            let op_name: String = op["op"].as_str().expect("op").into();
            let path: String = op["path"].as_str().expect("path").into();
            (op_name, path)
        })
        .filter(|(_, path): &(String, String)| !path.contains("/volume") && !path.contains("/env"))
        .collect();
    let pod = |i: usize| format!("/spec/replicatedJobs/{i}/template/spec/template/spec");
    let add = |path: String| ("add".to_string(), path);
    assert_eq!(
        ops,
        [
            add(format!("{}/containers/0/command", pod(0))),
            add(format!("{}/containers/0/readinessProbe", pod(0))),
            add("/spec/replicatedJobs/0/template/spec/backoffLimit".to_string()),
            add(format!("{}/containers/0/terminationMessagePolicy", pod(1))),
            add(format!("{}/initContainers", pod(1))),
            add("/spec/replicatedJobs/1/template/spec/backoffLimit".to_string()),
            add("/spec/replicatedJobs/1/dependsOn".to_string()),
            add("/spec/successPolicy".to_string()),
        ]
    );
    let js = defaulted(js, IMAGE).await;
    let worker = &pod_spec(&js, 0)["containers"][0];
    assert_eq!(
        worker["command"],
        worker_command(&["/usr/sbin/sshd", "-De", "-p", "22"])
    );
    assert_eq!(worker["readinessProbe"], json!({"tcpSocket": {"port": 22}}));
    assert_eq!(worker.get("args"), None);
    assert_eq!(
        js["spec"]["replicatedJobs"][1]["dependsOn"],
        json!([{"name": "node", "status": "Ready"}])
    );
    assert_eq!(pod_spec(&js, 1)["initContainers"], json!([preflight("22")]));
    assert_eq!(
        pod_spec(&js, 1)["containers"][0]["command"],
        json!(["mpirun", "hostname"]),
        "the launcher's command is the user's"
    );
    assert_eq!(
        pod_spec(&js, 1)["containers"][0].get("readinessProbe"),
        None
    );
}

#[tokio::test]
async fn another_ssh_port_reaches_sshd_the_probe_the_ssh_args_and_the_preflight() {
    let annotations = json!({"mpi-webhook.io/ssh-port": "2222"});
    let cases = [
        (
            "OpenMPI",
            vec!["OMPI_MCA_plm_rsh_args", "PRTE_MCA_plm_ssh_args"],
        ),
        ("Intel", vec!["I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"]),
        ("MPICH", vec!["HYDRA_LAUNCHER_EXTRA_ARGS"]),
    ];
    for (implementation, ssh_args) in cases {
        let js = jobset(implementation, annotations.clone(), minimal_rjobs());
        let js = defaulted(js, IMAGE).await;
        let worker = &pod_spec(&js, 0)["containers"][0];
        assert_eq!(
            worker["command"],
            worker_command(&["/usr/sbin/sshd", "-De", "-p", "2222"])
        );
        assert_eq!(
            worker["readinessProbe"],
            json!({"tcpSocket": {"port": 2222}})
        );
        assert_eq!(
            pod_spec(&js, 1)["initContainers"],
            json!([preflight("2222")])
        );
        let env = pod_spec(&js, 1)["containers"][0]["env"]
            .as_array()
            .expect("env")
            .clone();
        let with_port: Vec<&str> = env
            .iter()
            .filter(|e| e["value"] == "-o ConnectionAttempts=10 -p 2222")
            .map(|e| e["name"].as_str().expect("name"))
            .collect();
        assert_eq!(with_port, ssh_args, "{implementation}");
    }
}

#[tokio::test]
async fn defaults_never_replace_what_the_user_wrote() {
    let mut rjobs = minimal_rjobs();
    let user_probe = json!({"exec": {"command": ["true"]}});
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"] = json!([container(
        "worker",
        json!({"args": ["-De"], "readinessProbe": user_probe})
    )]);
    let user_preflight = json!({"name": "mpi-preflight", "image": "mine:1"});
    rjobs[1]["template"]["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "setup", "image": "setup:1"}, user_preflight]);
    rjobs[1]["dependsOn"] = json!([{"name": "node", "status": "Complete"}]);
    let js = defaulted(jobset("MPICH", json!({}), rjobs.clone()), IMAGE).await;
    let worker = &pod_spec(&js, 0)["containers"][0];
    assert_eq!(
        worker.get("command"),
        None,
        "args alone: the user's entrypoint"
    );
    assert_eq!(worker["args"], json!(["-De"]));
    assert_eq!(worker["readinessProbe"], user_probe);
    assert_eq!(
        pod_spec(&js, 1)["initContainers"],
        json!([{"name": "setup", "image": "setup:1"}, user_preflight])
    );
    assert_eq!(
        js["spec"]["replicatedJobs"][1]["dependsOn"],
        json!([{"name": "node", "status": "Complete"}])
    );
    // Other init containers of the user's: the pre-flight goes first, before them.
    rjobs[1]["template"]["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "setup", "image": "setup:1"}]);
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"] = json!([container(
        "worker",
        json!({"command": ["/bin/sshd-wrapper"]})
    )]);
    let js = defaulted(jobset("MPICH", json!({}), rjobs), IMAGE).await;
    assert_eq!(
        pod_spec(&js, 1)["initContainers"],
        json!([preflight("22"), {"name": "setup", "image": "setup:1"}])
    );
    let worker = &pod_spec(&js, 0)["containers"][0];
    assert_eq!(worker["command"], json!(["/bin/sshd-wrapper"]));
    assert_eq!(worker["readinessProbe"], json!({"tcpSocket": {"port": 22}}));
}

#[tokio::test]
async fn node_listed_after_the_launcher_gets_no_dependson_and_a_warning_saying_why() {
    let mut rjobs = minimal_rjobs();
    rjobs.reverse();
    let js = jobset("OpenMPI", json!({}), rjobs);
    let mutated = defaulted(js, IMAGE).await;
    assert_eq!(mutated["spec"]["replicatedJobs"][0].get("dependsOn"), None);
    assert_eq!(
        validate(mutated).await["warnings"],
        json!([
            "spec.replicatedJobs[0].dependsOn: the launcher does not wait for the workers: without dependsOn [{name: node, status: Ready}] it may start before their sshd listens; none was added because node is listed after launcher, and JobSet lets a replicatedJob depend only on those listed before it: list node first"
        ])
    );
    // Listed first and unset: the mutation adds it, so even the unmutated JobSet is no risk.
    let first = validate(jobset("OpenMPI", json!({}), minimal_rjobs())).await;
    assert_eq!(first["allowed"], true);
    assert_eq!(first.get("warnings"), None);
}

/// A pod's container names are unique across its init containers and containers: a launcher
/// container the user named `mpi-preflight` keeps the name, and no pre-flight is added.
#[tokio::test]
async fn a_launcher_container_named_mpi_preflight_gets_no_preflight() {
    let mut rjobs = minimal_rjobs();
    rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] = json!([
        container("launcher", json!({"command": ["mpirun", "hostname"]})),
        container("mpi-preflight", json!({})),
    ]);
    let js = defaulted(jobset("OpenMPI", json!({}), rjobs), IMAGE).await;
    assert_eq!(pod_spec(&js, 1).get("initContainers"), None);
}

/// JobSet refuses `dependsOn` next to `startupPolicyOrder: InOrder` (a CEL rule of its CRD), and
/// InOrder already starts the launcher once the workers are Ready: no dependsOn, no warning.
#[tokio::test]
async fn a_jobset_started_in_order_gets_no_dependson() {
    let mut js = jobset("OpenMPI", json!({}), minimal_rjobs());
    js["spec"]["startupPolicy"] = json!({"startupPolicyOrder": "InOrder"});
    let mutated = defaulted(js, IMAGE).await;
    assert_eq!(mutated["spec"]["replicatedJobs"][1].get("dependsOn"), None);
    assert_eq!(
        pod_spec(&mutated, 0)["containers"][0]["readinessProbe"],
        json!({"tcpSocket": {"port": 22}}),
        "the other defaults stay"
    );
    assert_eq!(validate(mutated).await.get("warnings"), None);
    let mut js = jobset("OpenMPI", json!({}), minimal_rjobs());
    js["spec"]["startupPolicy"] = json!({"startupPolicyOrder": "AnyOrder"});
    let mutated = defaulted(js, IMAGE).await;
    assert_eq!(
        mutated["spec"]["replicatedJobs"][1]["dependsOn"],
        json!([{"name": "node", "status": "Ready"}])
    );
}

/// `mpi-webhook.io/preflight-timeout` reaches the pre-flight's `--timeout` as written (the
/// pre-flight reads it the way the webhook checked it); it is denied when it is not a duration
/// from 1s to 1h, and fixed at creation like every setting.
#[tokio::test]
async fn a_preflight_timeout_reaches_the_preflights_command_and_is_fixed_at_creation() {
    const TIMEOUT: &str = "mpi-webhook.io/preflight-timeout";
    let js = jobset("OpenMPI", json!({TIMEOUT: "20s"}), minimal_rjobs());
    let defaulted_js = defaulted(js.clone(), IMAGE).await;
    assert_eq!(
        pod_spec(&defaulted_js, 1)["initContainers"],
        json!([crate::preflight::preflight_container_with_timeout(
            IMAGE,
            "22",
            Some("20s")
        )])
    );
    assert_eq!(
        denial(jobset("OpenMPI", json!({TIMEOUT: "2h"}), minimal_rjobs())).await,
        r#"metadata.annotations[mpi-webhook.io/preflight-timeout]: Invalid value: "2h": must be a duration from 1s to 1h, e.g. 30s or 10m"#
    );
    let mut changed = js.clone();
    changed["metadata"]["annotations"][TIMEOUT] = json!("30s");
    let response = review(Route::ValidateJobSet, "UPDATE", changed, Some(js)).await;
    assert_eq!(
        response["status"]["message"],
        r#"metadata.annotations[mpi-webhook.io/preflight-timeout]: Invalid value: "30s": field is immutable"#
    );
}

#[tokio::test]
async fn no_preflight_without_an_image_or_with_the_annotation_false() {
    let js = defaulted(jobset("Intel", json!({}), minimal_rjobs()), "").await;
    assert_eq!(pod_spec(&js, 1).get("initContainers"), None, "no image");
    let opted_out = jobset(
        "Intel",
        json!({"mpi-webhook.io/preflight": "false"}),
        minimal_rjobs(),
    );
    let js = defaulted(opted_out, IMAGE).await;
    assert_eq!(pod_spec(&js, 1).get("initContainers"), None, "opted out");
    assert_eq!(
        pod_spec(&js, 0)["containers"][0]["command"],
        worker_command(&["/usr/sbin/sshd", "-De", "-p", "22"]),
        "the other defaults stay"
    );
}

#[tokio::test]
async fn every_edit_of_a_minimal_review_is_defaulted_as_the_reference_defaults() {
    let mut rjobs = minimal_rjobs();
    rjobs[1]["template"]["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "setup", "image": "setup:1"}]);
    let js = jobset("OpenMPI", json!({"mpi-webhook.io/ssh-port": "2222"}), rjobs);
    let options = Options {
        preflight_image: IMAGE.to_string(),
    };
    let create = admission_review(JOBSET, "CREATE", js);
    let objects = Snapshot::default();
    assert!(
        every_edit_is_answered_with(Route::MutateJobSet, &create, &objects, &options).await > 0
    );
}

/// The pre-flight is admitted under the `restricted` Pod Security Standard: checked on the init
/// container alone, with the launcher pod's volumes (the user's containers are theirs).
#[tokio::test]
async fn the_preflight_meets_the_restricted_pod_security_standard() {
    let js = defaulted(jobset("OpenMPI", json!({}), minimal_rjobs()), IMAGE).await;
    let launcher = pod_spec(&js, 1);
    let alone = json!({
        "initContainers": launcher["initContainers"],
        "volumes": launcher["volumes"],
    });
    assert_eq!(
        super::pss::restricted_violations(&alone),
        Vec::<String>::new()
    );
}

// `mpi-webhook.io/ssh-setup` (interface.md "JobSet mode on hardened clusters").

/// The wired containers' mounts under `generated`: the emptyDir, and `/etc/passwd` from it.
fn runtime_mounts() -> Value {
    json!([
        {"name": "mpi-ssh-runtime", "mountPath": "/run/mpi-ssh"},
        {"name": "mpi-ssh-runtime", "mountPath": "/etc/passwd", "subPath": "passwd"}
    ])
}

fn names_of(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[tokio::test]
async fn generated_is_the_default_and_wires_an_init_container_in_both_pods() {
    let js = defaulted(
        generated_jobset("OpenMPI", json!({}), minimal_rjobs()),
        IMAGE,
    )
    .await;
    let (worker, launcher) = (pod_spec(&js, 0), pod_spec(&js, 1));
    let secret = json!({"name": "mpi-ssh-auth", "secret": {
        "secretName": "pi-mpi-ssh-auth", "defaultMode": 292,
        "items": [{"key": "ssh-privatekey", "path": "id_rsa"},
                  {"key": "ssh-publickey", "path": "id_rsa.pub"}]}});
    let runtime = json!({"name": "mpi-ssh-runtime", "emptyDir": {}});
    assert_eq!(worker["volumes"], json!([secret, runtime]));
    assert_eq!(
        launcher["volumes"],
        json!([secret, hostfile_volume("pi"), runtime])
    );
    // First in both pods, before the pre-flight; in the wired container's image.
    assert_eq!(names_of(&worker["initContainers"]), ["mpi-ssh-setup"]);
    assert_eq!(
        names_of(&launcher["initContainers"]),
        ["mpi-ssh-setup", "mpi-preflight"]
    );
    assert_eq!(launcher["initContainers"][1], preflight("2222"));
    let setup = &worker["initContainers"][0];
    assert_eq!(setup["image"], "mpi:latest");
    assert_eq!(
        setup["command"],
        json!([
            "sh",
            "-c",
            mpi_webhook::mpi::jobset_mode::ssh_setup::script(2222)
        ])
    );
    assert_eq!(
        setup["volumeMounts"],
        json!([
            {"name": "mpi-ssh-auth", "mountPath": "/run/mpi-ssh-secret", "readOnly": true},
            {"name": "mpi-ssh-runtime", "mountPath": "/run/mpi-ssh"}
        ])
    );
    // The wired containers never mount the Secret.
    let node = &worker["containers"][0];
    assert_eq!(node["volumeMounts"], runtime_mounts());
    assert_eq!(
        node["command"],
        worker_command(&["/usr/sbin/sshd", "-De", "-f", "/run/mpi-ssh/sshd_config"])
    );
    assert_eq!(node["readinessProbe"], json!({"tcpSocket": {"port": 2222}}));
    let mpirun = &launcher["containers"][0];
    let mut mounts = runtime_mounts();
    mounts
        .as_array_mut()
        .expect("list")
        .insert(0, json!({"name": "mpi-hostfile", "mountPath": "/etc/mpi"}));
    mounts.as_array_mut().expect("list").rotate_left(1);
    assert_eq!(mpirun["volumeMounts"], mounts);
    let args: Vec<&Value> = mpirun["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.ends_with("_args")))
        .map(|e| &e["value"])
        .collect();
    assert_eq!(
        args,
        [
            "-o ConnectionAttempts=10 -F /run/mpi-ssh/ssh_config",
            "-o ConnectionAttempts=10 -F /run/mpi-ssh/ssh_config"
        ]
    );
}

#[tokio::test]
async fn the_setup_runs_as_the_wired_container_and_another_port_reaches_everything() {
    let mut rjobs = minimal_rjobs();
    let user = json!({"runAsUser": 1000, "runAsGroup": 0, "runAsNonRoot": true,
                      "readOnlyRootFilesystem": true});
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["securityContext"] = user;
    let js = defaulted(
        generated_jobset(
            "MPICH",
            json!({"mpi-webhook.io/ssh-port": "2022", "mpi-webhook.io/ssh-setup": "generated"}),
            rjobs,
        ),
        IMAGE,
    )
    .await;
    let setup = &pod_spec(&js, 0)["initContainers"][0];
    assert_eq!(
        setup["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 0, "runAsNonRoot": true,
               "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert!(
        setup["command"][2]
            .as_str()
            .is_some_and(|s| s.contains("'  Port 2022'") && s.contains("'Port 2022'"))
    );
    assert_eq!(
        pod_spec(&js, 0)["containers"][0]["readinessProbe"],
        json!({"tcpSocket": {"port": 2022}})
    );
    assert_eq!(pod_spec(&js, 1)["initContainers"][1], preflight("2022"));
    let env = &pod_spec(&js, 1)["containers"][0]["env"];
    assert_eq!(
        env[1],
        json!({"name": "HYDRA_LAUNCHER_EXTRA_ARGS",
               "value": "-o ConnectionAttempts=10 -F /run/mpi-ssh/ssh_config"})
    );
}

#[tokio::test]
async fn image_gives_the_patch_of_jobset_mode_before_generated() {
    let js = defaulted(
        jobset(
            "OpenMPI",
            json!({"mpi-webhook.io/ssh-setup": "image"}),
            minimal_rjobs(),
        ),
        IMAGE,
    )
    .await;
    assert_eq!(pod_spec(&js, 0)["volumes"], json!([strict_ssh_volume()]));
    assert_eq!(
        names_of(&pod_spec(&js, 0)["initContainers"]),
        Vec::<&str>::new()
    );
    assert_eq!(pod_spec(&js, 1)["initContainers"], json!([preflight("22")]));
    assert_eq!(
        pod_spec(&js, 0)["containers"][0]["command"],
        worker_command(&["/usr/sbin/sshd", "-De", "-p", "22"])
    );
}

#[tokio::test]
async fn ssh_setup_values_are_checked_and_the_mount_path_needs_image() {
    assert_eq!(
        denial(generated_jobset(
            "OpenMPI",
            json!({"mpi-webhook.io/ssh-setup": "root"}),
            rjobs()
        ))
        .await,
        r#"metadata.annotations[mpi-webhook.io/ssh-setup]: Unsupported value: "root": supported values: "generated", "image""#
    );
    let want = r#"metadata.annotations[mpi-webhook.io/ssh-auth-mount-path]: Invalid value: "/home/mpi/.ssh": must not be set when mpi-webhook.io/ssh-setup is "generated" (the default): the SSH key is no longer mounted there; set mpi-webhook.io/ssh-setup: "image" to mount it there"#;
    for annotations in [
        json!({"mpi-webhook.io/ssh-auth-mount-path": "/home/mpi/.ssh"}),
        json!({"mpi-webhook.io/ssh-auth-mount-path": "/home/mpi/.ssh",
               "mpi-webhook.io/ssh-setup": "generated"}),
    ] {
        assert_eq!(
            denial(generated_jobset("OpenMPI", annotations, rjobs())).await,
            want
        );
    }
    let image = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/ssh-auth-mount-path": "/home/mpi/.ssh"}),
        rjobs(),
    );
    assert_eq!(validate(image).await["allowed"], true);
}

#[tokio::test]
async fn ssh_setup_is_fixed_at_creation_and_old_jobsets_stay_image() {
    let old = generated_jobset("OpenMPI", json!({}), rjobs());
    let new = generated_jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/ssh-setup": "image"}),
        rjobs(),
    );
    let response = review(Route::ValidateJobSet, "UPDATE", new, Some(old)).await;
    assert_eq!(
        response["status"]["message"],
        r#"metadata.annotations[mpi-webhook.io/ssh-setup]: Invalid value: "image": field is immutable"#
    );
    // A JobSet the webhook wired before `generated` was the default (the Secret mounted in the
    // launcher's container, the env without ` -F`, a mount path of its own): its UPDATEs are
    // judged as `image`, as it was made.
    let annotations = json!({"mpi-webhook.io/ssh-auth-mount-path": "/home/mpi/.ssh"});
    let made = defaulted(jobset("Intel", annotations.clone(), rjobs()), IMAGE).await;
    let mut before = made.clone();
    before["metadata"]["annotations"] = annotations;
    let response = review(
        Route::ValidateJobSet,
        "UPDATE",
        before.clone(),
        Some(before),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn generated_pods_meet_the_restricted_pod_security_standard() {
    let restricted = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    let mut rjobs = minimal_rjobs();
    for rjob in &mut rjobs {
        let pod = &mut rjob["template"]["spec"]["template"]["spec"];
        pod["securityContext"] = restricted.clone();
        pod["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    }
    let js = defaulted(generated_jobset("OpenMPI", json!({}), rjobs), IMAGE).await;
    for i in [0, 1] {
        assert_eq!(
            super::pss::restricted_violations(pod_spec(&js, i)),
            Vec::<String>::new()
        );
        // The webhook's init containers meet it on their own, but for runAsNonRoot, which the
        // pod (or the platform) gives every container.
        let alone = json!({
            "securityContext": {"runAsNonRoot": true},
            "initContainers": pod_spec(&js, i)["initContainers"],
            "volumes": pod_spec(&js, i)["volumes"],
        });
        assert_eq!(
            super::pss::restricted_violations(&alone),
            Vec::<String>::new()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// successPolicy: the JobSet finishes with its launcher, unless the user chose otherwise

/// The `successPolicy` op of the mutating answer for a minimal JobSet with `policy` (`None`:
/// no `successPolicy` member), and the policy of the defaulted JobSet.
async fn success_policy_of(policy: Option<Value>) -> (Vec<Value>, Value) {
    let mut js = jobset("OpenMPI", json!({}), minimal_rjobs());
    if let Some(policy) = policy {
        js["spec"]["successPolicy"] = policy;
    }
    let ops = patch_of(&mutate_with(js.clone(), IMAGE).await)
        .as_array()
        .expect("ops")
        .iter()
        .filter(|op| {
            op["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/spec/successPolicy"))
        })
        .cloned()
        .collect();
    let defaulted = defaulted(js, IMAGE).await;
    (ops, defaulted["spec"]["successPolicy"].clone())
}

#[tokio::test]
async fn no_success_policy_gets_the_launchers() {
    let (ops, policy) = success_policy_of(None).await;
    let launcher = json!({"operator": "All", "targetReplicatedJobs": ["launcher"]});
    assert_eq!(
        ops,
        [json!({"op": "add", "path": "/spec/successPolicy", "value": launcher})]
    );
    assert_eq!(policy, launcher);
}

/// A `null` successPolicy is no policy (found by the `mutation` fuzz target): it is replaced.
#[tokio::test]
async fn a_null_success_policy_gets_the_launchers() {
    let (ops, policy) = success_policy_of(Some(Value::Null)).await;
    let launcher = json!({"operator": "All", "targetReplicatedJobs": ["launcher"]});
    assert_eq!(
        ops,
        [json!({"op": "replace", "path": "/spec/successPolicy", "value": launcher})]
    );
    assert_eq!(policy, launcher);
}

#[tokio::test]
async fn all_with_no_targets_as_jobset_defaults_it_gets_the_launcher() {
    let (ops, policy) = success_policy_of(Some(json!({"operator": "All"}))).await;
    assert_eq!(
        ops,
        [
            json!({"op": "add", "path": "/spec/successPolicy/targetReplicatedJobs",
                "value": ["launcher"]})
        ]
    );
    assert_eq!(
        policy,
        json!({"operator": "All", "targetReplicatedJobs": ["launcher"]})
    );
}

#[tokio::test]
async fn all_with_empty_targets_gets_the_launcher() {
    let (ops, policy) =
        success_policy_of(Some(json!({"operator": "All", "targetReplicatedJobs": []}))).await;
    assert_eq!(
        ops,
        [
            json!({"op": "add", "path": "/spec/successPolicy/targetReplicatedJobs/0",
                "value": "launcher"})
        ]
    );
    assert_eq!(
        policy,
        json!({"operator": "All", "targetReplicatedJobs": ["launcher"]})
    );
}

#[tokio::test]
async fn a_success_policy_the_user_chose_is_kept() {
    for chosen in [
        json!({"operator": "All", "targetReplicatedJobs": ["node", "launcher"]}),
        json!({"operator": "Any"}),
        json!({"operator": "Any", "targetReplicatedJobs": []}),
    ] {
        let (ops, policy) = success_policy_of(Some(chosen.clone())).await;
        assert_eq!(ops, Vec::<Value>::new(), "{chosen}");
        assert_eq!(policy, chosen);
    }
}

// ---------------------------------------------------------------------------------------------
// Worker groups (Decision 20): several replicatedJobs of MPI hosts

const GROUPS: &str = "mpi-webhook.io/worker-groups";
const SLOTS_PER_GROUP: &str = "mpi-webhook.io/slots-per-group";

/// `small` (2 hosts, container `worker`), `big` (1 host, container `worker`), then `launcher`
/// (container `launcher`, running `mpirun`): the sample's shape.
fn group_rjobs() -> Vec<Value> {
    let mut rjobs = minimal_rjobs();
    let mut small = rjobs.remove(0);
    small["name"] = json!("small");
    let mut big = small.clone();
    big["name"] = json!("big");
    big["template"]["spec"] = json!({"parallelism": 1, "completions": 1,
        "template": {"spec": {"containers": [container("worker", json!({}))]}}});
    vec![small, big, rjobs.remove(0)]
}

/// The JobSet `pi` with worker groups `small,big` and `annotations` besides.
fn groups_jobset(implementation: &str, annotations: Value, rjobs: Vec<Value>) -> Value {
    let mut annotations = annotations;
    annotations[GROUPS] = json!("small,big");
    generated_jobset(implementation, annotations, rjobs)
}

/// The ConfigMap data the reconciler applies for `jobset` (the same code as `render`).
fn reconciled_hostfile(jobset: &Value) -> String {
    let typed: JobSet = serde_json::from_value(jobset.clone()).expect("JobSet");
    let configmap = desired(Owned::JobSet(&typed), &objects_for::Options::default())
        .expect("builds")
        .expect("JobSet mode")
        .configmap;
    configmap.data.expect("data")["hostfile"].clone()
}

#[tokio::test]
async fn every_worker_group_gets_the_wiring_node_gets() {
    for ssh_setup in ["generated", "image"] {
        let annotations = json!({SSH_SETUP: ssh_setup});
        let groups = defaulted(
            groups_jobset("OpenMPI", annotations.clone(), group_rjobs()),
            IMAGE,
        )
        .await;
        let node = defaulted(
            generated_jobset("OpenMPI", annotations, minimal_rjobs()),
            IMAGE,
        )
        .await;
        // Each group's pod template is wired exactly as `node`'s: ssh setup or Secret mount,
        // sshd command, readiness probe, the one key of the JobSet.
        assert_eq!(pod_spec(&groups, 0), pod_spec(&node, 0), "{ssh_setup}");
        assert_eq!(pod_spec(&groups, 1), pod_spec(&node, 0), "{ssh_setup}");
        assert_eq!(pod_spec(&groups, 2), pod_spec(&node, 1), "{ssh_setup}");
        assert_eq!(
            groups["spec"]["replicatedJobs"][2]["dependsOn"],
            json!([{"name": "small", "status": "Ready"}, {"name": "big", "status": "Ready"}]),
            "the launcher waits for every group, in the groups' order"
        );
    }
}

#[tokio::test]
async fn a_worker_groups_jobset_gets_this_exact_dependson_and_no_other_change_of_its_shape() {
    let js = groups_jobset("MPICH", json!({}), group_rjobs());
    let response = mutate_with(js.clone(), "").await;
    let ops: Vec<Value> = patch_of(&response)
        .as_array()
        .expect("ops")
        .iter()
        .filter(|op| {
            !op["path"]
                .as_str()
                .is_some_and(|p| p.contains("/template/"))
        })
        .cloned()
        .collect();
    assert_eq!(
        ops,
        [
            json!({"op": "add", "path": "/spec/replicatedJobs/2/dependsOn", "value": [
                {"name": "small", "status": "Ready"}, {"name": "big", "status": "Ready"}]}),
            json!({"op": "add", "path": "/spec/successPolicy",
                   "value": {"operator": "All", "targetReplicatedJobs": ["launcher"]}}),
        ]
    );
}

#[test]
fn the_hostfile_lists_the_groups_in_their_order_each_with_its_slots() {
    // The annotation's order, not the template's.
    let mut rjobs = group_rjobs();
    rjobs.swap(0, 1);
    let annotations = json!({SLOTS_PER_GROUP: "big=3"});
    let js = groups_jobset("OpenMPI", annotations.clone(), rjobs.clone());
    let open_mpi = "pi-small-0-0.pi slots=1\npi-small-0-1.pi slots=1\npi-big-0-0.pi slots=3\n";
    assert_eq!(hostfile_of(&js), open_mpi);
    assert_eq!(reconciled_hostfile(&js), open_mpi, "the reconciler's");
    for implementation in ["Intel", "MPICH"] {
        let js = groups_jobset(implementation, annotations.clone(), rjobs.clone());
        let hydra = "pi-small-0-0.pi:1\npi-small-0-1.pi:1\npi-big-0-0.pi:3\n";
        assert_eq!(hostfile_of(&js), hydra, "{implementation}");
        assert_eq!(reconciled_hostfile(&js), hydra, "{implementation}");
    }
    // Replicas, then pods, within a group.
    let mut rjobs = group_rjobs();
    rjobs[1]["replicas"] = json!(2);
    rjobs[1]["template"]["spec"]["parallelism"] = json!(2);
    assert_eq!(
        hostfile_of(&groups_jobset("MPICH", json!({}), rjobs)),
        "pi-small-0-0.pi:1\npi-small-0-1.pi:1\npi-big-0-0.pi:1\npi-big-0-1.pi:1\npi-big-1-0.pi:1\npi-big-1-1.pi:1\n"
    );
}

#[test]
fn each_group_has_its_override_else_slots_per_node_else_its_own_gpus() {
    let mut rjobs = group_rjobs();
    let gpus = |n: i64| {
        json!([container(
            "worker",
            json!({"resources": {"limits": {"nvidia.com/gpu": n}}})
        )])
    };
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"] = gpus(4);
    rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] = gpus(8);
    let slots = |annotations: Value| {
        let plan = plan(&groups_jobset("OpenMPI", annotations, rjobs.clone()));
        let groups: Vec<(String, i64)> = plan
            .worker_groups
            .iter()
            .map(|g| (g.name.clone(), g.slots))
            .collect();
        (groups, plan.slots)
    };
    let named = |small: i64, big: i64| vec![("small".to_string(), small), ("big".to_string(), big)];
    assert_eq!(slots(json!({})), (named(4, 8), 4), "each group's GPUs");
    assert_eq!(
        slots(json!({"mpi-webhook.io/slots-per-node": "2"})),
        (named(2, 2), 2),
        "slots-per-node for every group"
    );
    assert_eq!(
        slots(json!({"mpi-webhook.io/slots-per-node": "2", SLOTS_PER_GROUP: " big = 3 "})),
        (named(2, 3), 2),
        "the override for its group; the env vars carry the first group's"
    );
    assert_eq!(slots(json!({SLOTS_PER_GROUP: "small=1"})), (named(1, 8), 1));
    let js = groups_jobset(
        "OpenMPI",
        json!({SLOTS_PER_GROUP: "small=1"}),
        rjobs.clone(),
    );
    let response = plan(&js);
    let env: Vec<(&str, String)> = response
        .launcher_env()
        .filter(|(name, _)| name.ends_with("_slots"))
        .collect();
    assert_eq!(
        env,
        [
            ("OMPI_MCA_orte_set_default_slots", "1".to_string()),
            ("PRTE_MCA_prte_set_default_slots", "1".to_string())
        ]
    );
}

#[test]
fn the_launcher_as_a_node_comes_before_the_groups_when_listed_before_them_else_after() {
    let as_node = json!({"mpi-webhook.io/run-launcher-as-node": "true", SLOTS_PER_GROUP: "big=3"});
    let after = groups_jobset("OpenMPI", as_node.clone(), group_rjobs());
    assert_eq!(
        hostfile_of(&after),
        "pi-small-0-0.pi slots=1\npi-small-0-1.pi slots=1\npi-big-0-0.pi slots=3\npi-launcher-0-0.pi slots=1\n"
    );
    let mut rjobs = group_rjobs();
    rjobs.rotate_right(1);
    let before = groups_jobset("Intel", as_node, rjobs);
    assert_eq!(
        hostfile_of(&before),
        "pi-launcher-0-0:1\npi-small-0-0.pi:1\npi-small-0-1.pi:1\npi-big-0-0.pi:3\n"
    );
    // `node` alone keeps the template order, as before worker groups.
    let mut rjobs = minimal_rjobs();
    rjobs.reverse();
    let node = jobset(
        "OpenMPI",
        json!({"mpi-webhook.io/run-launcher-as-node": "true"}),
        rjobs,
    );
    assert_eq!(
        hostfile_of(&node),
        "pi-launcher-0-0.pi slots=1\npi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\n"
    );
}

#[tokio::test]
async fn a_group_listed_after_the_launcher_means_no_dependson_and_a_warning_naming_it() {
    let mut rjobs = group_rjobs();
    rjobs.swap(1, 2);
    let js = groups_jobset("OpenMPI", json!({}), rjobs);
    let mutated = defaulted(js, IMAGE).await;
    assert_eq!(mutated["spec"]["replicatedJobs"][1].get("dependsOn"), None);
    assert_eq!(
        validate(mutated.clone()).await["warnings"],
        json!([
            "spec.replicatedJobs[1].dependsOn: the launcher does not wait for the workers: without dependsOn [{name: small, status: Ready}, {name: big, status: Ready}] it may start before their sshd listens; none was added because big is listed after launcher, and JobSet lets a replicatedJob depend only on those listed before it: list big first"
        ])
    );
    // A dependsOn on some groups only is the user's, and warned of.
    let mut partial = mutated;
    partial["spec"]["replicatedJobs"][1]["dependsOn"] =
        json!([{"name": "small", "status": "Ready"}]);
    assert_eq!(
        validate(partial).await["warnings"],
        json!([
            "spec.replicatedJobs[1].dependsOn: the launcher does not wait for the workers: without dependsOn [{name: small, status: Ready}, {name: big, status: Ready}] it may start before their sshd listens"
        ])
    );
}

#[tokio::test]
async fn worker_groups_that_do_not_parse_or_name_no_replicatedjob_are_denied() {
    let cases = [
        (
            "small,,big",
            r#"metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "small,,big": must be replicatedJob names separated by commas"#,
        ),
        (
            "",
            r#"metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "": must be replicatedJob names separated by commas"#,
        ),
        (
            "small,big,small",
            r#"metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "small,big,small": must name each replicatedJob once: "small" is named twice"#,
        ),
        (
            "small,launcher",
            r#"metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "small,launcher": must not name the launcher: set mpi-webhook.io/run-launcher-as-node to make it a host too"#,
        ),
        (
            "small,gpu,big,cpu",
            r#"[metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "small,gpu,big,cpu": must name replicatedJobs of this JobSet: there is no replicatedJob "gpu", metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "small,gpu,big,cpu": must name replicatedJobs of this JobSet: there is no replicatedJob "cpu"]"#,
        ),
    ];
    for (groups, message) in cases {
        let js = generated_jobset("OpenMPI", json!({GROUPS: groups}), group_rjobs());
        assert_eq!(denial(js).await, message, "{groups:?}");
    }
    // Named, a group is required even with the launcher as a node; `node` is no group then.
    let as_node = json!({GROUPS: "node", "mpi-webhook.io/run-launcher-as-node": "true"});
    assert_eq!(
        denial(generated_jobset("OpenMPI", as_node, group_rjobs())).await,
        r#"metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "node": must name replicatedJobs of this JobSet: there is no replicatedJob "node""#
    );
}

#[tokio::test]
async fn slots_per_group_that_does_not_parse_or_names_no_group_is_denied() {
    let cases = [
        (
            "big=0",
            r#"metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "big=0": must be <group>=<slots> entries separated by commas, slots an integer >= 1"#,
        ),
        (
            "big:3",
            r#"metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "big:3": must be <group>=<slots> entries separated by commas, slots an integer >= 1"#,
        ),
        (
            "=3",
            r#"metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "=3": must be <group>=<slots> entries separated by commas, slots an integer >= 1"#,
        ),
        (
            "big=2,big=3",
            r#"metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "big=2,big=3": must name each worker group once: "big" is named twice"#,
        ),
        (
            "big=2,launcher=1",
            r#"metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "big=2,launcher=1": must name worker groups of mpi-webhook.io/worker-groups: "launcher" is not one"#,
        ),
    ];
    for (slots, message) in cases {
        let js = groups_jobset("OpenMPI", json!({SLOTS_PER_GROUP: slots}), group_rjobs());
        assert_eq!(denial(js).await, message, "{slots:?}");
    }
    // Without worker-groups the one group is `node`, which an override may name.
    let node = jobset("MPICH", json!({SLOTS_PER_GROUP: "node=2"}), rjobs());
    assert_eq!(validate(node.clone()).await["allowed"], true);
    assert_eq!(hostfile_of(&node), "pi-node-0-0.pi:2\npi-node-0-1.pi:2\n");
}

#[tokio::test]
async fn every_group_must_have_the_wired_container() {
    let mut rjobs = group_rjobs();
    for i in [0, 2] {
        rjobs[i]["template"]["spec"]["template"]["spec"]["containers"] =
            json!([container("mpi", json!({}))]);
    }
    let js = groups_jobset("OpenMPI", json!({"mpi-webhook.io/container": "mpi"}), rjobs);
    assert_eq!(
        denial(js).await,
        r#"spec.replicatedJobs[1].template.spec.template.spec.containers: Invalid value: "mpi": must contain the container named by annotation mpi-webhook.io/container"#
    );
    let mut rjobs = group_rjobs();
    rjobs[1]["template"]["spec"]["template"]["spec"]["containers"] = json!([]);
    assert_eq!(
        denial(groups_jobset("OpenMPI", json!({}), rjobs)).await,
        "spec.replicatedJobs[1].template.spec.template.spec.containers: Required value: JobSet mode wires the first container of the launcher's and every worker group's pod template"
    );
}

#[tokio::test]
async fn a_hostfile_over_a_configmap_counts_every_group() {
    // Each group alone fits (about 0.6 MiB); together they do not.
    let mut rjobs = group_rjobs();
    for i in [0, 1] {
        rjobs[i]["template"]["spec"]["parallelism"] = json!(25_000);
    }
    let alone = |name: &str| {
        let mut rjobs = group_rjobs();
        rjobs[0]["template"]["spec"]["parallelism"] = json!(25_000);
        rjobs[0]["name"] = json!(name);
        let one = generated_jobset(
            "OpenMPI",
            json!({GROUPS: name}),
            vec![rjobs.remove(0), rjobs.remove(1)],
        );
        hostfile(&plan(&one)).map(|text| text.len())
    };
    assert_eq!(alone("small"), Ok(688_890));
    assert_eq!(
        denial(groups_jobset("OpenMPI", json!({}), rjobs)).await,
        "spec.replicatedJobs[0].template.spec.parallelism: Invalid value: 25000: the MPI hostfile would be 1327780 bytes, over the 1048576-byte limit of a ConfigMap"
    );
}

#[tokio::test]
async fn worker_groups_and_slots_per_group_are_immutable_on_update() {
    let old = groups_jobset("OpenMPI", json!({SLOTS_PER_GROUP: "big=3"}), group_rjobs());
    let same = review(
        Route::ValidateJobSet,
        "UPDATE",
        old.clone(),
        Some(old.clone()),
    )
    .await;
    assert_eq!(same["allowed"], true);
    let mut changed = old.clone();
    changed["metadata"]["annotations"][GROUPS] = json!("big,small");
    changed["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations")
        .remove(SLOTS_PER_GROUP);
    let response = review(Route::ValidateJobSet, "UPDATE", changed, Some(old)).await;
    assert_eq!(
        response["status"]["message"],
        r#"[metadata.annotations[mpi-webhook.io/worker-groups]: Invalid value: "big,small": field is immutable, metadata.annotations[mpi-webhook.io/slots-per-group]: Invalid value: "": field is immutable]"#
    );
}

#[tokio::test]
async fn intel_with_groups_of_different_slots_warns_unless_mpirun_reads_the_machinefile() {
    let annotations = json!({SLOTS_PER_GROUP: "big=2"});
    let warnings = |implementation: &str, annotations: Value, command: Value| {
        let mut rjobs = group_rjobs();
        rjobs[2]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = command;
        let js = groups_jobset(implementation, annotations, rjobs);
        async move { validate(js).await.get("warnings").cloned() }
    };
    assert_eq!(
        warnings("Intel", annotations.clone(), json!(["mpirun", "hostname"])).await,
        Some(json!([
            "spec.replicatedJobs[2].template.spec.template.spec.containers[0].command: Intel MPI starts I_MPI_PERHOST ranks on every host of I_MPI_HYDRA_HOST_FILE, whatever its slots: with worker groups of different slots, add -machinefile /etc/mpi/hostfile to the launcher's command"
        ]))
    );
    let machinefile = json!(["mpirun", "-machinefile", "/etc/mpi/hostfile", "hostname"]);
    assert_eq!(
        warnings("Intel", annotations.clone(), machinefile).await,
        None
    );
    let script = json!(["sh", "-c", "mpirun -machinefile /etc/mpi/hostfile hostname"]);
    assert_eq!(warnings("Intel", annotations.clone(), script).await, None);
    // Open MPI and MPICH keep each line's slots; equal slots need nothing.
    for implementation in ["OpenMPI", "MPICH"] {
        let command = json!(["mpirun", "hostname"]);
        assert_eq!(
            warnings(implementation, annotations.clone(), command).await,
            None
        );
    }
    assert_eq!(
        warnings("Intel", json!({}), json!(["mpirun", "hostname"])).await,
        None
    );
}

#[test]
fn the_network_policy_admits_every_groups_pods_by_the_jobsets_name() {
    // JobSet labels every pod of every replicatedJob with the JobSet's name: the policy selects
    // and admits by that label alone, so no group is left out and none needs naming.
    let typed: JobSet =
        serde_json::from_value(groups_jobset("OpenMPI", json!({}), group_rjobs())).expect("JobSet");
    let on = objects_for::Options {
        network_policy_default: true,
    };
    let policy = desired(Owned::JobSet(&typed), &on)
        .expect("builds")
        .expect("JobSet mode")
        .network_policy
        .expect("on");
    let spec = serde_json::to_value(policy.spec).expect("JSON");
    let own = json!({"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}});
    assert_eq!(
        spec,
        json!({"podSelector": own, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": own}]}]})
    );
}
