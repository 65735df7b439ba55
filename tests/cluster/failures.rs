//! Failures users can read, from a real kubelet: a launcher that fails, or is OOM-killed, leaves
//! its last words as a `LauncherFailed` Event on its JobSet (`kubectl describe jobset`), one per
//! failed run, after the kubelet kept them (`terminationMessagePolicy: FallbackToLogsOnError`).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

use crate::cluster::{self, Cluster};
use crate::jobs::{containers, name_of, sample, until};
use crate::scenarios::trainjob_and_its_jobset;
use crate::support::{api_for, create, events};

/// How long until the launcher's first run failed and the reconciler said so.
const EVENT_TIMEOUT: Duration = Duration::from_secs(240);

/// Waits for the first `LauncherFailed` Event of the namespace.
async fn launcher_failed(cluster: &Cluster, ns: &str) -> Value {
    let client = cluster.admin();
    let started = Instant::now();
    let event = until(
        cluster,
        ns,
        "LauncherFailed Event",
        EVENT_TIMEOUT,
        || async { events(&client, ns, "LauncherFailed").await.pop() },
    )
    .await;
    eprintln!(
        "cluster: LauncherFailed in {ns} after {:.0?}",
        started.elapsed()
    );
    event
}

/// A JobSet-mode sample whose launcher runs `command` (and, with a limit, `memory`).
fn failing_jobset(ns: &str, command: Value, memory: Option<&str>) -> Value {
    let mut jobset = sample("manifests/samples/jobset-pi-openmpi.yaml", ns);
    let launcher = &mut containers(&mut jobset, "launcher")[0];
    launcher["command"] = command;
    if let Some(memory) = memory {
        launcher["resources"] = json!({"limits": {"memory": memory, "cpu": "100m"}});
    }
    jobset
}

async fn delete(cluster: &Cluster, jobset: &Value) {
    let name = name_of(jobset);
    let _ = api_for(&cluster.admin(), jobset, None)
        .delete(&name, &DeleteParams::background())
        .await;
}

#[tokio::test]
async fn a_failed_launcher_leaves_its_exit_code_and_last_words_on_the_jobset() {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace("launcher-failed").await;
    let jobset = failing_jobset(
        &ns,
        // One stream: the kubelet keeps stdout and stderr in the order each was read, not
        // necessarily the order they were written.
        json!([
            "sh",
            "-c",
            "echo rank 0 is fine; echo rank 1 lost its input; exit 3"
        ]),
        None,
    );
    let name = name_of(&jobset);
    create(&cluster.admin(), &jobset)
        .await
        .expect("create the JobSet");
    let event = launcher_failed(cluster, &ns).await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "JobSet");
    assert_eq!(event["regarding"]["name"], json!(name));
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains("exited with code 3"), "{note}");
    // The kubelet kept the output (FallbackToLogsOnError) and the Event carries its end.
    assert!(note.ends_with("rank 1 lost its input"), "{note}");
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), &ns);
    let launcher = pods
        .list(&ListParams::default().labels(&format!(
            "jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=launcher"
        )))
        .await
        .expect("list pods")
        .items
        .pop()
        .expect("a launcher pod");
    let policy = launcher
        .spec
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "launcher"))
        .and_then(|c| c.termination_message_policy);
    assert_eq!(policy.as_deref(), Some("FallbackToLogsOnError"));
    delete(cluster, &jobset).await;
}

#[tokio::test]
async fn an_oom_killed_launcher_says_so_on_the_jobset() {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace("launcher-oom").await;
    // `tail` keeps a line that never ends in memory: it grows past the limit.
    let jobset = failing_jobset(
        &ns,
        json!(["sh", "-c", "head -c 200000000 /dev/zero | tail -n 1"]),
        Some("24Mi"),
    );
    create(&cluster.admin(), &jobset)
        .await
        .expect("create the JobSet");
    let event = launcher_failed(cluster, &ns).await;
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains("exited with code 137"), "{note}");
    assert!(note.contains("OOMKilled"), "{note}");
    delete(cluster, &jobset).await;
}

/// TrainJob mode: the Event goes on the TrainJob, and Trainer's launcher template is left as it
/// is (no termination-message policy added: the note holds the exit code).
#[tokio::test]
async fn a_failed_trainjob_launcher_is_an_event_on_the_trainjob() {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace("trainjob-failed").await;
    let name = trainjob_and_its_jobset(cluster, &ns, |jobset| {
        containers(jobset, "launcher")[0]["command"] = json!(["sh", "-c", "exit 4"]);
    })
    .await;
    let event = launcher_failed(cluster, &ns).await;
    assert_eq!(event["regarding"]["kind"], "TrainJob");
    assert_eq!(event["regarding"]["name"], json!(name));
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("node in Pod") && note.contains("exited with code 4"),
        "{note}"
    );
    let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                        "metadata": {"name": name, "namespace": ns}});
    delete(cluster, &jobset).await;
}
