//! The reconciler's objects (section D) as `render` builds them, on the real upstream runtimes.

use mpi_webhook::api::{RuntimeKind, TrainingRuntime};
use mpi_webhook::mpi::hostfile::{hostfile, hostfile_configmap};
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::mpi::ssh_secret::{SshKeyPair, generate_key_pair, ssh_secret};
use mpi_webhook::objects::Snapshot;
use mpi_webhook::render::render;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::*;

fn upstream_runtime(name: &str) -> Value {
    super::support::upstream_runtime(&format!("{name}_distributed.yaml"))
}

fn pi(trainer: Value) -> Value {
    let mut tj = train_job(trainer);
    tj["metadata"]["name"] = json!("pi");
    tj["spec"]["runtimeRef"] = json!({"name": "deepspeed-distributed"});
    tj
}

/// numNodes 3 on deepspeed-distributed is section D.3's example: the hostfile is that text, byte for
/// byte (Decision 16: the ConfigMap Trainer applies next to ours holds the same text).
#[test]
fn upstream_runtimes_render_for_one_two_and_three_nodes() {
    for runtime_name in ["deepspeed", "mlx"] {
        let rt = upstream_runtime(runtime_name);
        for (nodes, expected) in [
            (1, "pi-node-0-0.pi slots=1\npi-launcher-0-0.pi slots=1\n"),
            (2, "pi-node-0-0.pi slots=1\npi-launcher-0-0.pi slots=1\n"),
            (
                3,
                "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n",
            ),
        ] {
            let tj = pi(json!({"numNodes": nodes}));
            let plan = plan(&rt, &tj);
            assert_eq!(
                hostfile(&plan).expect("fits"),
                expected,
                "{runtime_name} numNodes {nodes}"
            );
            let patched = mutate(&plan, &jobset(&rt, &tj));
            let workers = json!(std::cmp::max(nodes - 1, 1));
            assert_eq!(job_spec(&patched, "node")["parallelism"], workers);
            let launcher = &pod_spec(&patched, "launcher")["containers"][0];
            assert_eq!(launcher["env"], open_mpi_env(1));
            assert_eq!(
                launcher["volumeMounts"],
                json!([{"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"}, {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}])
            );
            let node = &pod_spec(&patched, "node")["containers"][0];
            assert_eq!(
                node["volumeMounts"],
                json!([{"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"}])
            );
            // The runtime's own fields survive.
            assert_eq!(node["command"], json!(["/usr/sbin/sshd"]));
            assert_eq!(
                pod_spec(&patched, "node")["securityContext"],
                json!({"fsGroup": 1000})
            );
        }
    }
}

/// Section D.3's GPU variant, byte for byte.
#[test]
fn upstream_runtime_with_gpus_uses_gpu_count_as_slots() {
    let rt = upstream_runtime("deepspeed");
    let tj = pi(json!({"numNodes": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}));
    let plan = plan(&rt, &tj);
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "pi-node-0-0.pi slots=4\npi-node-0-1.pi slots=4\npi-launcher-0-0.pi slots=4\n"
    );
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert_eq!(
        pod_spec(&patched, "launcher")["containers"][0]["env"],
        open_mpi_env(4)
    );
}

#[test]
fn upstream_runtime_without_run_launcher_as_node_lists_workers_only() {
    let mut rt = upstream_runtime("deepspeed");
    rt["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = json!(false);
    let plan = plan(&rt, &pi(json!({"numNodes": 3})));
    assert_eq!(
        hostfile(&plan).expect("fits"),
        "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-node-0-2.pi slots=1\n"
    );
}

fn fixed_keys() -> SshKeyPair {
    SshKeyPair {
        private_key_pem: "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"
            .into(),
        public_key_line: "ecdsa-sha2-nistp521 AAAA\n".into(),
    }
}

#[test]
fn secret_and_configmap_have_exactly_the_spec_fields() {
    let rt = upstream_runtime("deepspeed");
    let tj = pi(json!({"numNodes": 2}));
    let typed = typed_train_job(&tj);
    let owner = json!([{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
        "uid": "trainjob-uid", "controller": true, "blockOwnerDeletion": true
    }]);
    let secret = serde_json::to_value(ssh_secret(&typed, &fixed_keys())).expect("serializes");
    assert_eq!(
        secret,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "pi-mpi-ssh-auth", "namespace": "default",
                         "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"}, "ownerReferences": owner},
            "type": "kubernetes.io/ssh-auth",
            "immutable": true,
            "data": {
                "ssh-privatekey": "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCkFBQUEKLS0tLS1FTkQgRUMgUFJJVkFURSBLRVktLS0tLQo=",
                "ssh-publickey": "ZWNkc2Etc2hhMi1uaXN0cDUyMSBBQUFBCg=="
            }
        })
    );
    let configmap = hostfile_configmap(&typed, &plan(&rt, &tj)).expect("fits");
    assert_eq!(
        serde_json::to_value(configmap).expect("serializes"),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "pi-mpi-hostfile", "namespace": "default",
                         "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"}, "ownerReferences": owner},
            "data": {"hostfile": "pi-node-0-0.pi slots=1\npi-launcher-0-0.pi slots=1\n"}
        })
    );
}

#[test]
fn generated_secret_keys_pair_up() {
    let keys = generate_key_pair().expect("keys");
    let (_, der) = sec1::der::pem::decode_vec(keys.private_key_pem.as_bytes()).expect("PEM");
    // AWS-LC checks that the key's stored public point is its scalar's.
    let private = aws_lc_rs::signature::EcdsaKeyPair::from_private_key_der(
        &aws_lc_rs::signature::ECDSA_P521_SHA512_ASN1_SIGNING,
        &der,
    )
    .expect("SEC1 on P-521");
    let public =
        ssh_key::PublicKey::from_openssh(keys.public_key_line.trim_end()).expect("OpenSSH line");
    use aws_lc_rs::signature::KeyPair;
    assert_eq!(
        public.key_data().ecdsa().expect("ecdsa").as_sec1_bytes(),
        private.public_key().as_ref()
    );
}

#[test]
fn webhook_patch_and_reconciler_hostfile_agree_on_counts_and_names() {
    let rt = upstream_runtime("deepspeed");
    for nodes in [1, 2, 3, 7] {
        for launcher_as_node in [true, false] {
            let mut rt = rt.clone();
            rt["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = json!(launcher_as_node);
            let tj = pi(json!({"numNodes": nodes}));
            let plan = plan(&rt, &tj);
            let patched = mutate(&plan, &jobset(&rt, &tj));
            let workers = job_spec(&patched, "node")["parallelism"]
                .as_i64()
                .expect("set");
            let text = hostfile(&plan).expect("fits");
            let listed = text.lines().filter(|l| l.starts_with("pi-node-")).count();
            assert_eq!(
                listed as i64, workers,
                "numNodes {nodes}, launcher as node {launcher_as_node}"
            );
            let volume = &pod_spec(&patched, "launcher")["volumes"][1]["configMap"]["name"];
            assert_eq!(volume, "pi-mpi-hostfile");
        }
    }
}

#[test]
fn render_emits_secret_then_configmap_in_namespace_name_order_and_reports_problems() {
    let mut snapshot = Snapshot::default();
    let rt: TrainingRuntime =
        serde_json::from_value(upstream_runtime("deepspeed")).expect("parses");
    snapshot.insert_runtime(RuntimeKind::ClusterTrainingRuntime, rt);
    for (ns, name, runtime) in [
        ("b", "late", "deepspeed-distributed"),
        ("a", "early", "deepspeed-distributed"),
        ("a", "lost", "missing"),
    ] {
        let mut tj = pi(json!({"numNodes": 2}));
        tj["metadata"]["namespace"] = json!(ns);
        tj["metadata"]["name"] = json!(name);
        tj["spec"]["runtimeRef"] = json!({"name": runtime});
        snapshot.insert_train_job(typed_train_job(&tj));
    }
    let rendered = render(&snapshot, &Default::default(), || Ok(fixed_keys())).expect("renders");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&rendered.yaml).expect("YAML");
    let names: Vec<(&str, &str)> = docs
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("Secret", "early-mpi-ssh-auth"),
            ("ConfigMap", "early-mpi-hostfile"),
            ("Secret", "late-mpi-ssh-auth"),
            ("ConfigMap", "late-mpi-hostfile")
        ]
    );
    assert_eq!(
        docs[1]["data"]["hostfile"],
        "early-node-0-0.early slots=1\nearly-launcher-0-0.early slots=1\n"
    );
    assert_eq!(
        rendered.problems,
        [r#"TrainJob a/lost: ClusterTrainingRuntime "missing" not found"#]
    );
}

/// `kind/name` of every document `render` prints for `snapshot`.
fn rendered_names(snapshot: &Snapshot, network_policy_default: bool) -> Vec<String> {
    let options = mpi_webhook::mpi::objects_for::Options {
        network_policy_default,
    };
    let rendered = render(snapshot, &options, || Ok(fixed_keys())).expect("renders");
    assert_eq!(rendered.problems, Vec::<String>::new());
    let docs: Vec<Value> = serde_saphyr::from_multiple(&rendered.yaml).expect("YAML");
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn jobset_mode_jobset(name: &str, annotations: Value) -> mpi_webhook::api::JobSet {
    let rjob = |rjob: &str| {
        json!({"name": rjob, "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "mpi", "image": "mpi"}]}}}}})
    };
    serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": "a", "uid": format!("{name}-uid"),
                     "labels": {"mpi-webhook.io/implementation": "OpenMPI"},
                     "annotations": annotations},
        "spec": {"replicatedJobs": [rjob("node"), rjob("launcher")]}
    }))
    .expect("JobSet")
}

#[test]
fn render_prints_the_network_policy_where_the_reconciler_would_create_it() {
    let mut snapshot = Snapshot::default();
    let rt: TrainingRuntime =
        serde_json::from_value(upstream_runtime("deepspeed")).expect("parses");
    snapshot.insert_runtime(RuntimeKind::ClusterTrainingRuntime, rt);
    let mut tj = pi(json!({"numNodes": 2}));
    tj["spec"]["runtimeRef"] = json!({"name": "deepspeed-distributed"});
    snapshot.insert_train_job(typed_train_job(&tj));
    snapshot.insert_jobset(jobset_mode_jobset("js-default", json!({})));
    snapshot.insert_jobset(jobset_mode_jobset(
        "js-off",
        json!({"mpi-webhook.io/network-policy": "false"}),
    ));
    snapshot.insert_jobset(jobset_mode_jobset(
        "js-on",
        json!({"mpi-webhook.io/network-policy": "true"}),
    ));
    let common = |policies: &[&str]| {
        let mut names = Vec::new();
        for owner in ["pi", "js-default", "js-off", "js-on"] {
            names.push(format!("Secret/{owner}-mpi-ssh-auth"));
            names.push(format!("ConfigMap/{owner}-mpi-hostfile"));
            if policies.contains(&owner) {
                names.push(format!("NetworkPolicy/{owner}-mpi"));
            }
        }
        names
    };
    // Off by default: only a JobSet that asks for it gets one.
    assert_eq!(rendered_names(&snapshot, false), common(&["js-on"]));
    // On by default: every TrainJob, and every JobSet but the one that says "false".
    assert_eq!(
        rendered_names(&snapshot, true),
        common(&["pi", "js-default", "js-on"])
    );
}

#[test]
fn plan_is_none_for_non_mpi_and_ops_are_empty_for_patched() {
    let rt = upstream_runtime("mlx");
    let tj = pi(json!({"numNodes": 2}));
    let plan = MpiPlan::new(&typed_train_job(&tj), &typed_runtime(&rt))
        .expect("ok")
        .expect("mpi");
    let patched = mutate(&plan, &jobset(&rt, &tj));
    assert!(enforce(&plan, &patched).expect("ok").is_empty());
}
