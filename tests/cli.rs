//! The offline CLI (`review`, `render`) as a user runs it: the real binary on the shipped
//! samples and on broken input. Exit codes, stdout and stderr are asserted.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use base64::Engine;
use mpi_webhook::mpi::jobset_mode::ssh_setup;
use pretty_assertions::assert_eq;
use serde_json::Value;

#[path = "support/preflight.rs"]
mod preflight;
#[path = "support/pss.rs"]
mod pss;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `mpi-webhook render --objects-dir <dir>`.
fn render_dir(dir: &Path) -> Output {
    run(
        &["render", "--objects-dir", dir.to_str().expect("utf-8")],
        None,
    )
}

/// A temporary directory holding copies of the repository's `manifests/<file>` for each file.
fn manifests_dir(files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for file in files {
        let from = repo(&format!("manifests/{file}"));
        std::fs::copy(&from, dir.path().join(from.file_name().expect("name"))).expect("copy");
    }
    dir
}

/// The documents `render` prints for `dir`, which it must render without a problem.
fn rendered(dir: &Path) -> Vec<Value> {
    let out = render_dir(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&out)
}

/// The YAML documents a command printed.
fn documents(out: &Output) -> Vec<Value> {
    serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("YAML")
}

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("writes");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("binary exits")
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

#[test]
fn review_validate_allows_the_sample_trainjob() {
    let out = run(
        &[
            "review",
            "validate",
            "manifests/samples/reviews/trainjob-create-allowed.json",
            "--objects-dir",
            "manifests",
        ],
        None,
    );
    let review = stdout_json(&out);
    assert_eq!(
        review["response"]["uid"],
        "0a7c3f0e-5b2d-4e61-8a9f-1d2c3b4a5e01"
    );
    assert_eq!(review["response"]["allowed"], true);
}

#[test]
fn review_validate_denies_a_reserved_env_with_exit_zero() {
    let out = run(
        &[
            "review",
            "validate",
            "manifests/samples/reviews/trainjob-create-denied-reserved-env.json",
            "--objects-dir",
            "manifests",
        ],
        None,
    );
    let review = stdout_json(&out);
    assert_eq!(review["response"]["allowed"], false);
    assert_eq!(review["response"]["status"]["code"], 403);
    let message = review["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.starts_with("spec.trainer.env: Invalid value: [{"),
        "{message}"
    );
    assert!(
        message.ends_with("invalid envs configured: [OMPI_MCA_orte_default_hostfile]"),
        "{message}"
    );
}

#[test]
fn review_mutate_patches_the_sample_jobset_and_reads_stdin_and_yaml() {
    let file = repo("manifests/samples/reviews/jobset-create-owned-by-trainjob.json");
    let json = std::fs::read(&file).expect("sample");
    let value: Value = serde_json::from_slice(&json).expect("sample JSON");
    let yaml = serde_saphyr::to_string(&value).expect("as YAML");
    for input in [json.clone(), yaml.into_bytes()] {
        let review = stdout_json(&run(
            &["review", "mutate", "-", "--objects-dir", "manifests"],
            Some(&input),
        ));
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(review["response"]["patch"].as_str().expect("base64 string"))
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("RFC 6902");
        let mut jobset = value["request"]["object"].clone();
        json_patch::patch(&mut jobset, &patch).expect("applies");
        let launcher = jobset["spec"]["replicatedJobs"]
            .as_array()
            .expect("rjobs")
            .iter()
            .find(|r| r["name"] == "launcher")
            .expect("launcher");
        let env = &launcher["template"]["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env.as_array()
                .expect("env")
                .iter()
                .any(|e| e["name"] == "PRTE_MCA_prte_default_hostfile")
        );
    }
}

#[test]
fn review_of_a_kind_without_that_route_is_an_error() {
    let out = run(
        &[
            "review",
            "mutate",
            "manifests/samples/reviews/trainjob-create-allowed.json",
            "--objects-dir",
            "manifests",
        ],
        None,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains(r#"no mutate route serves kind "TrainJob" of group "trainer.kubeflow.org""#),
        "{stderr}"
    );
}

/// `review` takes a JobSet-mode review without `--objects-dir`: everything is in the JobSet.
#[test]
fn review_of_jobset_mode_samples_needs_no_objects_dir() {
    for implementation in ["openmpi", "intel", "mpich"] {
        let file = format!("manifests/samples/reviews/jobset-mode-create-{implementation}.json");
        let validated = stdout_json(&run(&["review", "validate", &file], None));
        assert_eq!(
            validated["response"],
            serde_json::json!({"uid": validated["response"]["uid"], "allowed": true, "status": {}}),
            "{implementation}: allowed, no warning"
        );
        let mutated = stdout_json(&run(&["review", "mutate", &file], None));
        assert_eq!(mutated["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(mutated["response"]["patch"].as_str().expect("patch"))
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("RFC 6902");
        let review: Value =
            serde_json::from_str(&std::fs::read_to_string(repo(&file)).expect("review"))
                .expect("JSON");
        let mut jobset = review["request"]["object"].clone();
        json_patch::patch(&mut jobset, &patch).expect("applies");
        let ssh = &jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["volumes"]
            [0]["secret"];
        assert_eq!(
            ssh["items"][0],
            serde_json::json!({"key": "ssh-privatekey", "path": "id_rsa"}),
            "{implementation}: generated projects the key 0444 for the ssh setup to copy"
        );
    }
}

/// The worker-groups sample (Decision 20) as a user runs it offline: `review validate` allows it
/// without a warning, `review mutate` wires both groups as `node` is and makes the launcher wait
/// for both, and `render` prints the hostfile docs/jobset-mode.md shows, group by group with
/// each group's slots.
#[test]
fn the_worker_groups_sample_is_admitted_wired_and_rendered() {
    let file = "manifests/samples/reviews/jobset-mode-create-openmpi-groups.json";
    let validated = stdout_json(&run(&["review", "validate", file], None));
    assert_eq!(
        validated["response"],
        serde_json::json!({"uid": validated["response"]["uid"], "allowed": true, "status": {}})
    );
    let mutated = stdout_json(&run(&["review", "mutate", file], None));
    let patch = base64::engine::general_purpose::STANDARD
        .decode(mutated["response"]["patch"].as_str().expect("patch"))
        .expect("base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("RFC 6902");
    let review: Value =
        serde_json::from_str(&std::fs::read_to_string(repo(file)).expect("review")).expect("JSON");
    let mut jobset = review["request"]["object"].clone();
    json_patch::patch(&mut jobset, &patch).expect("applies");
    let rjobs = &jobset["spec"]["replicatedJobs"];
    for group in [0, 1] {
        let container = &rjobs[group]["template"]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["command"],
            generated_worker_command(),
            "group {group}"
        );
        assert_eq!(
            container["readinessProbe"],
            serde_json::json!({"tcpSocket": {"port": 2222}}),
            "group {group}"
        );
    }
    assert_eq!(
        rjobs[2]["dependsOn"],
        serde_json::json!([{"name": "node-small", "status": "Ready"},
                           {"name": "node-big", "status": "Ready"}])
    );
    let dir = manifests_dir(&["samples/jobset-pi-openmpi-groups.yaml"]);
    let docs = rendered(dir.path());
    let hostfile = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .map(|d| d["data"]["hostfile"].clone());
    assert_eq!(
        hostfile,
        Some(serde_json::json!(
            "pi-groups-node-small-0-0.pi-groups slots=1\npi-groups-node-small-0-1.pi-groups slots=1\npi-groups-node-big-0-0.pi-groups slots=3\n"
        ))
    );
}

/// `review mutate --preflight-image` on the minimal OpenMPI sample (`ssh-port: "2222"`, nothing
/// else set): the patch fills in exactly the defaults of docs/jobset-mode.md "Defaults", the
/// pre-flight only with an image, and that init container meets the restricted Pod
/// Security Standard.
#[test]
fn review_mutate_fills_in_the_defaults_of_a_minimal_sample() {
    let file = "manifests/samples/reviews/jobset-mode-create-openmpi.json";
    let image = "ghcr.io/mpi-webhook/mpi-webhook:0.1.0";
    let patch_of = |args: &[&str]| -> Vec<Value> {
        let mutated = stdout_json(&run(args, None));
        let patch = base64::engine::general_purpose::STANDARD
            .decode(mutated["response"]["patch"].as_str().expect("patch"))
            .expect("base64");
        serde_json::from_slice(&patch).expect("JSON")
    };
    // The ops that only JobSet mode's defaults write.
    let defaults = |patch: &[Value]| -> Vec<Value> {
        patch
            .iter()
            .filter(|op| {
                let path = op["path"].as_str().unwrap_or_default();
                [
                    "/command",
                    "/readinessProbe",
                    "/backoffLimit",
                    "/dependsOn",
                    "/initContainers",
                ]
                .iter()
                .any(|end| path.ends_with(end))
            })
            .cloned()
            .collect()
    };
    let pod = |i: usize| format!("/spec/replicatedJobs/{i}/template/spec/template/spec");
    // The sample says no ssh-setup: generated, whose init container writes sshd's configuration.
    let review: Value =
        serde_json::from_str(&std::fs::read_to_string(repo(file)).expect("review")).expect("JSON");
    let wired = |i: usize| {
        review["request"]["object"]["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]
            ["spec"]["containers"][0]
            .clone()
    };
    let setup = |i: usize| ssh_setup::init_container(&wired(i), 2222);
    // The script is the library's; the container around it is the contract's.
    for i in [0, 1] {
        let init = setup(i);
        assert_eq!(init["name"], "mpi-ssh-setup");
        assert_eq!(init["image"], "docker.io/mpioperator/openmpi");
        assert_eq!(
            (&init["command"][0], &init["command"][1]),
            (&Value::from("sh"), &Value::from("-c"))
        );
        assert_eq!(
            init["securityContext"],
            serde_json::json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                               "seccompProfile": {"type": "RuntimeDefault"}})
        );
    }
    let mut expected = vec![
        serde_json::json!({"op": "add", "path": format!("{}/containers/0/command", pod(0)),
                           "value": generated_worker_command()}),
        serde_json::json!({"op": "add", "path": format!("{}/containers/0/readinessProbe", pod(0)),
                           "value": {"tcpSocket": {"port": 2222}}}),
        serde_json::json!({"op": "add", "path": format!("{}/initContainers", pod(0)),
                           "value": [setup(0)]}),
        serde_json::json!({"op": "add", "path": "/spec/replicatedJobs/0/template/spec/backoffLimit",
                           "value": 0}),
        serde_json::json!({"op": "add", "path": format!("{}/initContainers", pod(1)),
                           "value": [setup(1)]}),
        serde_json::json!({"op": "add", "path": "/spec/replicatedJobs/1/template/spec/backoffLimit",
                           "value": 0}),
        serde_json::json!({"op": "add", "path": "/spec/replicatedJobs/1/dependsOn",
                           "value": [{"name": "node", "status": "Ready"}]}),
    ];
    let without_image = patch_of(&["review", "mutate", file]);
    assert_eq!(
        defaults(&without_image),
        expected,
        "no image: no pre-flight"
    );
    // The launcher's ssh reaches the workers' sshd through the generated client configuration.
    let mut jobset = review["request"]["object"].clone();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(without_image.clone())).expect("RFC 6902");
    json_patch::patch(&mut jobset, &patch).expect("applies");
    let env = &jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"]
        [0]["env"];
    let ssh_args: Vec<(&str, &str)> = env
        .as_array()
        .expect("env list")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().expect("name"),
                e["value"].as_str().expect("value"),
            )
        })
        .filter(|(name, _)| name.ends_with("_args"))
        .collect();
    assert_eq!(
        ssh_args,
        [
            (
                "OMPI_MCA_plm_rsh_args",
                "-o ConnectionAttempts=10 -F /run/mpi-ssh/ssh_config"
            ),
            (
                "PRTE_MCA_plm_ssh_args",
                "-o ConnectionAttempts=10 -F /run/mpi-ssh/ssh_config"
            ),
        ]
    );
    let preflight = preflight::preflight_container(image, "2222");
    // The pre-flight comes after the ssh setup in the launcher's init containers.
    expected[4] = serde_json::json!({
        "op": "add",
        "path": format!("{}/initContainers", pod(1)),
        "value": [setup(1), preflight.clone()],
    });
    let with_image = patch_of(&["review", "mutate", file, "--preflight-image", image]);
    assert_eq!(defaults(&with_image), expected);
    let others = |patch: &[Value]| -> Vec<Value> {
        let defaults = defaults(patch);
        patch
            .iter()
            .filter(|op| !defaults.contains(op))
            .cloned()
            .collect()
    };
    assert_eq!(
        others(&with_image),
        others(&without_image),
        "the image adds only the pre-flight"
    );
    let pod_of_preflight = serde_json::json!({"initContainers": [preflight]});
    assert_eq!(
        pss::restricted_violations(&pod_of_preflight),
        Vec::<String>::new()
    );
}

#[test]
fn garbage_review_input_fails_cleanly() {
    for input in [
        &b"\x00\xff\xfe{{{"[..],
        b"- a\n- b\n",
        b"{\"kind\": \"AdmissionReview\"",
        b"---\na: 1\n---\nb: 2\n",
        b"",
    ] {
        let out = run(
            &[
                "review",
                "validate",
                "-",
                "--objects-dir",
                "manifests/runtimes",
            ],
            Some(input),
        );
        assert_eq!(out.status.code(), Some(1), "input {input:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("Error: "), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn malformed_objects_dir_file_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("ok.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: pi}\nspec:\n  trainer:\n    numNodes: three\n",
    )
    .expect("write");
    let out = render_dir(dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml: document 1 (TrainJob \"pi\"): spec.trainer.numNodes: invalid type: string \"three\", expected i32"), "{stderr}");
    std::fs::write(dir.path().join("bad.yaml"), "a: [unclosed\n").expect("write");
    let stderr = String::from_utf8_lossy(&render_dir(dir.path()).stderr).to_string();
    assert!(stderr.contains("bad.yaml: not valid YAML"), "{stderr}");
}

#[test]
fn render_prints_secret_then_configmap_per_trainjob_and_reports_missing_runtimes() {
    let dir = manifests_dir(&[
        "runtimes/deepspeed_distributed.yaml",
        "samples/trainjob-pi-deepspeed.yaml",
    ]);
    let docs = rendered(dir.path());
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["Secret", "ConfigMap"]);
    assert_eq!(
        docs[1]["data"]["hostfile"],
        "pi-deepspeed-node-0-0.pi-deepspeed slots=1\npi-deepspeed-node-0-1.pi-deepspeed slots=1\npi-deepspeed-launcher-0-0.pi-deepspeed slots=1\n"
    );
    std::fs::write(
        dir.path().join("orphan.yaml"),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: orphan, namespace: default}\nspec:\n  runtimeRef: {name: nowhere}\n",
    )
    .expect("write");
    let out = render_dir(dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        r#"skipped TrainJob default/orphan: ClusterTrainingRuntime "nowhere" not found"#
    );
    let docs = documents(&out);
    assert_eq!(docs.len(), 2, "the good TrainJob is still rendered");
}

/// JobSet-mode JobSets are rendered after the TrainJobs, owned by the JobSet; one whose label
/// names no implementation is reported and skipped.
#[test]
fn render_renders_jobset_mode_jobsets_after_trainjobs() {
    let dir = manifests_dir(&[
        "runtimes/mpich_distributed.yaml",
        "samples/trainjob-pi-mpich.yaml",
        "samples/jobset-pi-mpich.yaml",
    ]);
    let docs = rendered(dir.path());
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "pi-mpich-mpi-ssh-auth",
            "pi-mpich-mpi-hostfile",
            "pi-jobset-mpich-mpi-ssh-auth",
            "pi-jobset-mpich-mpi-hostfile"
        ]
    );
    assert_eq!(
        docs[3]["data"]["hostfile"],
        "pi-jobset-mpich-node-0-0.pi-jobset-mpich:1\npi-jobset-mpich-node-0-1.pi-jobset-mpich:1\n"
    );
    for doc in &docs[2..] {
        assert_eq!(
            doc["metadata"]["ownerReferences"],
            serde_json::json!([{
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "name": "pi-jobset-mpich", "uid": "8c2e5b63-2d4f-4e9b-a031-4b8f6d0e1c23",
                "controller": true, "blockOwnerDeletion": true
            }])
        );
    }
    std::fs::write(
        dir.path().join("lam.yaml"),
        "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata:\n  name: lam\n  namespace: default\n  labels: {mpi-webhook.io/implementation: LAM}\n",
    )
    .expect("write");
    let out = render_dir(dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        r#"skipped JobSet default/lam: metadata.labels[mpi-webhook.io/implementation]: Unsupported value: "LAM": supported values: "OpenMPI", "Intel", "MPICH""#
    );
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["serve", "reconcile", "review", "render", "certs"] {
        let out = run(&[sub, "--help"], None);
        assert!(out.status.success(), "{sub} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: mpi-webhook"),
            "{sub}"
        );
    }
}

/// The workers' default command with the generated ssh setup: sshd under the library's worker
/// script (Decision 21), whose own words `tests/policy` checks.
fn generated_worker_command() -> Value {
    serde_json::json!([
        "/bin/sh",
        "-c",
        ssh_setup::WORKER_SCRIPT,
        "mpi-worker",
        "/usr/sbin/sshd",
        "-De",
        "-f",
        "/run/mpi-ssh/sshd_config"
    ])
}
