//! The apiserver calling `mpi-webhook serve` over TLS through the shipped webhook configurations:
//! what a client sees when it creates TrainJobs and JobSets, and Pod validation of the patched
//! pod templates.

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::control_plane::{self, ControlPlane};
use crate::support::{self, BIN, Webhook, create, eventually, install, json_file};

/// The object of a sample AdmissionReview, moved into `namespace`.
fn sample_object(review: &str, namespace: &str) -> Value {
    let mut object =
        json_file(&format!("manifests/samples/reviews/{review}"))["request"]["object"].clone();
    let metadata = object["metadata"].as_object_mut().expect("metadata");
    for server_set in ["uid", "generation", "creationTimestamp", "resourceVersion"] {
        metadata.remove(server_set);
    }
    metadata.insert("namespace".into(), json!(namespace));
    object
}

/// `object` with the offline `mpi-webhook review mutate` patch for `review` applied: what the
/// apiserver must store.
/// A TrainJob-mode review reads the sample TrainJob and the shipped runtime from a directory.
fn patched_offline(review: &str, object: &Value) -> Value {
    let objects = tempfile::tempdir().expect("tempdir");
    let train_job = json_file("manifests/samples/reviews/trainjob-create-allowed.json")["request"]
        ["object"]
        .clone();
    std::fs::write(objects.path().join("trainjob.json"), train_job.to_string())
        .expect("write the TrainJob");
    std::fs::copy(
        support::repo().join("manifests/runtimes/deepspeed_distributed.yaml"),
        objects.path().join("runtime.yaml"),
    )
    .expect("copy the runtime");
    let out = std::process::Command::new(BIN)
        .args(["review", "mutate", "--objects-dir"])
        .arg(objects.path())
        .arg(
            support::repo()
                .join("manifests/samples/reviews")
                .join(review),
        )
        .output()
        .expect("mpi-webhook review");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("an AdmissionReview");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("a JSON patch");
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies");
    patched
}

/// Whether `stored` holds everything of `expected` (the apiserver may add defaults and metadata).
fn contains(stored: &Value, expected: &Value) -> bool {
    match (stored, expected) {
        (Value::Object(s), Value::Object(e)) => e
            .iter()
            .all(|(k, v)| s.get(k).is_some_and(|sv| contains(sv, v))),
        (Value::Array(s), Value::Array(e)) => {
            s.len() == e.len() && s.iter().zip(e).all(|(sv, ev)| contains(sv, ev))
        }
        _ => stored == expected,
    }
}

/// One Pod per replicated job of `jobset`, from its pod template, named as JobSet names them.
fn pods_of(jobset: &Value) -> Vec<(String, k8s_openapi::api::core::v1::Pod)> {
    jobset["spec"]["replicatedJobs"]
        .as_array()
        .expect("replicatedJobs")
        .iter()
        .map(|job| {
            let template = &job["template"]["spec"]["template"];
            let name = format!(
                "{}-{}-0-0",
                jobset["metadata"]["name"].as_str().unwrap_or_default(),
                job["name"].as_str().unwrap_or_default()
            );
            let mut metadata = template.get("metadata").cloned().unwrap_or(json!({}));
            metadata["name"] = json!(name);
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                             "spec": template["spec"]});
            (name, serde_json::from_value(pod).expect("a Pod"))
        })
        .collect()
}

/// Dry-run creates every Pod of [`pods_of`]: the apiserver's answer for each, by name.
async fn dry_run_pods(
    plane: &ControlPlane,
    jobset: &Value,
) -> Vec<(String, Result<(), kube::Error>)> {
    let namespace = jobset["metadata"]["namespace"].as_str().expect("namespace");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(plane.admin(), namespace);
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut answers = Vec::new();
    for (name, pod) in pods_of(jobset) {
        answers.push((name, pods.create(&dry_run, &pod).await.map(|_| ())));
    }
    answers
}

/// The apiserver's Pod validation and admission (ServiceAccount, PodSecurity) accept a Pod of
/// every pod template of `jobset`.
async fn pods_validate(plane: &ControlPlane, jobset: &Value) {
    for (name, answer) in dry_run_pods(plane, jobset).await {
        if let Err(e) = answer {
            panic!("the apiserver refused the Pod of {name}: {e}\n{jobset:#}");
        }
    }
}

/// The apiserver refuses a Pod of every pod template of `jobset` with 403: the messages.
async fn pods_refused(plane: &ControlPlane, jobset: &Value) -> Vec<String> {
    dry_run_pods(plane, jobset)
        .await
        .into_iter()
        .map(|(name, answer)| match answer {
            Err(kube::Error::Api(e)) if e.code == 403 => e.message,
            other => panic!("the Pod of {name} was not refused: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn an_mpi_trainjob_is_allowed() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let ns = plane.namespace("allowed").await;
    let webhook = Webhook::start(plane, &ns).await;
    let job = sample_object("trainjob-create-allowed.json", &ns);
    let created = create(&plane.admin(), &job).await.expect("allowed");
    assert_eq!(created["spec"]["trainer"], job["spec"]["trainer"]);
    webhook.stop(plane).await;
}

#[tokio::test]
async fn a_trainjob_with_a_reserved_env_is_denied_with_the_exact_message() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let ns = plane.namespace("denied").await;
    let webhook = Webhook::start(plane, &ns).await;
    let job = sample_object("trainjob-create-denied-reserved-env.json", &ns);
    let err = create(&plane.admin(), &job).await.expect_err("denied");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (
            403,
            "Forbidden",
            "admission webhook \"trainjob.validator.mpi-webhook.kubeflow.org\" denied the \
             request: spec.trainer.env: Invalid value: \
             [{\"name\":\"OMPI_MCA_orte_default_hostfile\",\"value\":\"/custom/hostfile\"}]: \
             must not have reserved envs, invalid envs configured: \
             [OMPI_MCA_orte_default_hostfile]"
        )
    );
    webhook.stop(plane).await;
}

/// Creates the object of sample `review` in `ns` through the apiserver (so through `webhook`) and
/// checks that it was stored with the offline `review mutate` patch applied; the stored object.
async fn create_patched(plane: &ControlPlane, webhook: &Webhook, review: &str, ns: &str) -> Value {
    let jobset = sample_object(review, ns);
    let expected = patched_offline(review, &jobset);
    let stored = create(&plane.admin(), &jobset)
        .await
        .unwrap_or_else(|e| panic!("{review}: {e}\n{}", webhook.process.log_tail()));
    assert!(
        contains(&stored["spec"], &expected["spec"]),
        "{review}: stored {:#}\nexpected {:#}",
        stored["spec"],
        expected["spec"]
    );
    assert_ne!(stored["spec"], jobset["spec"], "{review}: patched");
    stored
}

/// JobSet mode, every shipped sample: the apiserver stores the JobSet with our patch applied
/// (the same patch the offline `review` answers), and every patched pod template passes the
/// apiserver's Pod validation.
#[tokio::test]
async fn jobset_mode_jobsets_are_stored_patched_and_their_pods_validate() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let ns = plane.namespace("jobset-mode").await;
    let webhook = Webhook::start(plane, &ns).await;
    for review in [
        "jobset-mode-create-openmpi.json",
        "jobset-mode-create-mpich.json",
        "jobset-mode-create-intel.json",
        "jobset-mode-create-openmpi-groups.json",
    ] {
        let stored = create_patched(plane, &webhook, review, &ns).await;
        pods_validate(plane, &stored).await;
    }
    webhook.stop(plane).await;
}

/// JobSet mode on a hardened cluster: in a namespace enforcing the `restricted` Pod Security
/// Standard, the restricted sample (its own image, any UID, no capabilities) is stored patched
/// with the generated ssh setup, and the apiserver's PodSecurity admits every patched pod
/// template; the same Pods without the init container's securityContext are refused, so the
/// check can fail and what passes is the webhook's doing.
#[tokio::test]
async fn in_a_restricted_namespace_the_patched_pods_are_admitted() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let ns = plane.namespace("restricted").await;
    let admin = plane.admin();
    crate::support::enforce_restricted(&admin, &ns).await;
    let webhook = Webhook::start(plane, &ns).await;
    let stored = create_patched(
        plane,
        &webhook,
        "jobset-mode-create-openmpi-restricted.json",
        &ns,
    )
    .await;
    let init = |stored: &Value| -> Vec<String> {
        stored["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            ["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(init(&stored), ["mpi-ssh-setup"], "the generated ssh setup");
    pods_validate(plane, &stored).await;

    // The same Pods with the init container's securityContext removed break `restricted`:
    // PodSecurity refuses them, so what passes above is the webhook's securityContext.
    let mut weakened = stored.clone();
    for job in weakened["spec"]["replicatedJobs"]
        .as_array_mut()
        .expect("replicatedJobs")
    {
        let pod = &mut job["template"]["spec"]["template"]["spec"];
        for init in pod["initContainers"].as_array_mut().into_iter().flatten() {
            if init["name"] == "mpi-ssh-setup" {
                init.as_object_mut().map(|c| c.remove("securityContext"));
            }
        }
    }
    for message in pods_refused(plane, &weakened).await {
        assert!(
            message.contains("violates PodSecurity \"restricted:")
                && message.contains("mpi-ssh-setup"),
            "{message}"
        );
    }
    webhook.stop(plane).await;
}

/// TrainJob mode: the JobSet Trainer creates for an MPI TrainJob (owned by it) is stored with our
/// patch, which `serve` computes from the TrainJob and runtime it reads from the apiserver; its
/// pod templates pass Pod validation.
#[tokio::test]
async fn a_trainjob_owned_jobset_is_stored_patched_and_its_pods_validate() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let ns = plane.namespace("trainjob-mode").await;
    let webhook = Webhook::start(plane, &ns).await;
    let admin = plane.admin();
    let train_job = create(&admin, &sample_object("trainjob-create-allowed.json", &ns))
        .await
        .expect("TrainJob");
    let review = "jobset-create-owned-by-trainjob.json";
    let mut jobset = sample_object(review, &ns);
    jobset["metadata"]["ownerReferences"][0]["uid"] = train_job["metadata"]["uid"].clone();
    let expected = patched_offline(review, &jobset);
    // `serve` learns of the TrainJob from its watch: dry-run until it patches.
    let jobsets = support::api_for(&admin, &jobset, None);
    let typed: kube::api::DynamicObject = serde_json::from_value(jobset.clone()).expect("JobSet");
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("serve patching the TrainJob's JobSet", || async {
        let answer = jobsets.create(&dry_run, &typed).await.ok()?;
        let answer = serde_json::to_value(answer).ok()?;
        contains(&answer["spec"], &expected["spec"]).then_some(())
    })
    .await;
    let stored = create(&admin, &jobset).await.expect("JobSet");
    assert!(
        contains(&stored["spec"], &expected["spec"]),
        "stored {:#}\nexpected {:#}",
        stored["spec"],
        expected["spec"]
    );
    pods_validate(plane, &stored).await;
    webhook.stop(plane).await;
}
