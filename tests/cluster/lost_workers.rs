//! Losing a worker while `mpirun` runs, on a real kubelet (Decision 21, docs/operations.md "When
//! a worker is lost"): a worker Pod deleted, evicted through the Eviction API (what `kubectl
//! drain` does) or whose container is killed ends `Failed`, its Job fails at once, and the
//! JobSet's `failurePolicy` restarts the whole job (which then completes with the same Secret)
//! or, without one, the JobSet fails; a `WorkerLost` Event on the JobSet names the Pod and why.
//! The time from the loss to the JobSet's reaction is printed; the waits are bounds, not
//! measurements.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, EvictParams, LogParams};
use serde_json::{Value, json};

use crate::cluster::{self, Cluster};
use crate::jobs::{containers, finished, name_of, pods_of, sample, until};
use crate::scenarios::trainjob_and_its_jobset;
use crate::support::{api_for, create, events, get};

/// How long the first attempt's ranks may take to start on both workers.
const START_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the JobSet may take to restart or fail after a worker is lost: the minute.
const LOSS_TIMEOUT: Duration = Duration::from_secs(60);
/// What each rank of the first attempt prints before it waits to be stopped.
const STARTED: &str = "rank-started";

/// The Open MPI sample whose first attempt runs until a worker is lost (one rank per worker
/// prints [`STARTED`], then sleeps), and whose later attempts finish at once (`mpirun hostname`).
/// With `restarts`, `failurePolicy.maxRestarts` is that.
fn long_first_attempt(ns: &str, restarts: Option<u32>) -> Value {
    let mut jobset = sample("manifests/samples/jobset-pi-openmpi.yaml", ns);
    let launcher = &mut containers(&mut jobset, "launcher")[0];
    launcher["command"] = json!([
        "sh",
        "-c",
        format!(
            "if [ \"$ATTEMPT\" = 0 ]; then exec mpirun --allow-run-as-root -n 2 sh -c 'echo {STARTED}; exec sleep 600'; \
         else exec mpirun --allow-run-as-root -n 2 hostname; fi"
        )
    ]);
    launcher["env"] = json!([{"name": "ATTEMPT", "valueFrom": {"fieldRef":
        {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}}]);
    if let Some(restarts) = restarts {
        jobset["spec"]["failurePolicy"] = json!({"maxRestarts": restarts});
    }
    jobset
}

/// Creates `jobset` and waits until both ranks of its first attempt run; the worker Pods then.
async fn running(cluster: &Cluster, jobset: &Value) -> Vec<Pod> {
    create(&cluster.admin(), jobset)
        .await
        .expect("create the JobSet");
    let ns = jobset["metadata"]["namespace"].as_str().unwrap_or_default();
    ranks_started(cluster, ns, &name_of(jobset), "launcher").await
}

/// Waits until two ranks of JobSet `name` printed [`STARTED`] in the log of its launcher's
/// container `container`; the worker Pods then.
async fn ranks_started(cluster: &Cluster, ns: &str, name: &str, container: &str) -> Vec<Pod> {
    let client = cluster.admin();
    let name = name.to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (client, name) = (&client, &name);
    let pods = &pods;
    until(
        cluster,
        ns,
        "both ranks started",
        START_TIMEOUT,
        || async move {
            let launcher = pods_of(client, ns, name, "launcher").await.pop()?;
            let params = LogParams {
                container: Some(container.into()),
                ..Default::default()
            };
            let log = pods
                .logs(&launcher.metadata.name.unwrap_or_default(), &params)
                .await
                .ok()?;
            (log.matches(STARTED).count() >= 2).then_some(())
        },
    )
    .await;
    pods_of(client, ns, name, "node").await
}

/// The JobSet's `status.restarts` and whether it has condition `kind`.
async fn jobset_state(cluster: &Cluster, ns: &str, name: &str) -> (i64, bool, bool) {
    let jobset = get(
        &cluster.admin(),
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        ns,
        name,
    )
    .await
    .unwrap_or_default();
    let is = |kind: &str| {
        jobset["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == kind && c["status"] == "True")
    };
    (
        jobset["status"]["restarts"].as_i64().unwrap_or(0),
        is("Completed"),
        is("Failed"),
    )
}

/// The job's Secret's UID and resourceVersion.
async fn secret_version(
    cluster: &Cluster,
    ns: &str,
    name: &str,
) -> (Option<String>, Option<String>) {
    let secrets: Api<Secret> = Api::namespaced(cluster.admin(), ns);
    let secret = secrets
        .get_metadata(&format!("{name}-mpi-ssh-auth"))
        .await
        .expect("the job's Secret");
    (secret.metadata.uid, secret.metadata.resource_version)
}

/// Waits for the namespace's `WorkerLost` Event and checks that it regards JobSet `name` and
/// names `pod` and `cause`; its note.
async fn worker_lost(cluster: &Cluster, ns: &str, name: &str, pod: &str, cause: &str) -> String {
    let client = cluster.admin();
    let event = until(cluster, ns, "WorkerLost Event", LOSS_TIMEOUT, || async {
        events(&client, ns, "WorkerLost").await.pop()
    })
    .await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "JobSet");
    assert_eq!(event["regarding"]["name"], json!(name));
    assert_eq!(event["related"]["name"], json!(pod));
    let note = event["note"].as_str().unwrap_or_default().to_string();
    assert!(
        note.starts_with(&format!("worker Pod {pod} ")) && note.contains(cause),
        "{note}"
    );
    note
}

/// With `failurePolicy`, the JobSet restarts within [`LOSS_TIMEOUT`] of `lost_at`, then
/// completes, with one `WorkerLost` Event and the Secret it had.
async fn restarts_and_completes(
    cluster: &Cluster,
    jobset: &Value,
    lost_at: Instant,
    secret: (Option<String>, Option<String>),
) {
    let ns = jobset["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = name_of(jobset);
    until(
        cluster,
        ns,
        "the JobSet's restart",
        LOSS_TIMEOUT,
        || async { (jobset_state(cluster, ns, &name).await.0 >= 1).then_some(()) },
    )
    .await;
    eprintln!(
        "cluster: {ns}/{name} restarted {:.1?} after its worker was lost",
        lost_at.elapsed()
    );
    finished(cluster, ns, &name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(jobset_state(cluster, ns, &name).await.0, 1, "one restart");
    assert_eq!(
        events(&cluster.admin(), ns, "WorkerLost").await.len(),
        1,
        "one WorkerLost Event for the attempt"
    );
    assert_eq!(
        secret_version(cluster, ns, &name).await,
        secret,
        "the Secret was re-made"
    );
    delete(cluster, jobset).await;
}

async fn delete(cluster: &Cluster, jobset: &Value) {
    let _ = api_for(&cluster.admin(), jobset, None)
        .delete(&name_of(jobset), &DeleteParams::background())
        .await;
}

/// A JobSet with `failurePolicy` in a namespace `prefix-N` whose last worker `lose` ends mid-run:
/// a `WorkerLost` Event naming it and `cause`, then the restart and completion.
async fn lost_and_restarted(prefix: &str, cause: &str, lose: impl AsyncFnOnce(&Cluster, &Pod)) {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace(prefix).await;
    let jobset = long_first_attempt(&ns, Some(2));
    let name = name_of(&jobset);
    let workers = running(cluster, &jobset).await;
    let secret = secret_version(cluster, &ns, &name).await;
    let lost = workers.last().expect("a worker");
    let lost_name = lost.metadata.name.clone().unwrap_or_default();
    let lost_at = Instant::now();
    lose(cluster, lost).await;
    worker_lost(cluster, &ns, &name, &lost_name, cause).await;
    restarts_and_completes(cluster, &jobset, lost_at, secret).await;
}

#[tokio::test]
async fn a_deleted_worker_restarts_the_jobset_which_completes_with_its_secret() {
    lost_and_restarted("lost-deleted", "was deleted", async |cluster, worker| {
        let ns = worker.metadata.namespace.as_deref().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(cluster.admin(), ns);
        let name = worker.metadata.name.as_deref().unwrap_or_default();
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete the worker");
    })
    .await;
}

#[tokio::test]
async fn a_worker_whose_container_is_killed_restarts_the_jobset() {
    lost_and_restarted(
        "lost-killed",
        "node exited with code 137",
        async |cluster, worker| {
            let container_id = worker
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.iter().find(|c| c.name == "node"))
                .and_then(|c| c.container_id.clone())
                .expect("the worker's container ID");
            cluster
                .kill_container(&container_id)
                .unwrap_or_else(|e| panic!("{e}"));
        },
    )
    .await;
}

#[tokio::test]
async fn an_evicted_worker_fails_a_jobset_without_failure_policy_and_says_so() {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace("lost-evicted").await;
    let jobset = long_first_attempt(&ns, None);
    let name = name_of(&jobset);
    let workers = running(cluster, &jobset).await;
    let lost = workers.first().expect("a worker");
    let lost_name = lost.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), &ns);
    let lost_at = Instant::now();
    pods.evict(&lost_name, &EvictParams::default())
        .await
        .expect("evict the worker");
    until(
        cluster,
        &ns,
        "the JobSet's failure",
        LOSS_TIMEOUT,
        || async { jobset_state(cluster, &ns, &name).await.2.then_some(()) },
    )
    .await;
    eprintln!(
        "cluster: {ns}/{name} Failed {:.1?} after its worker was evicted",
        lost_at.elapsed()
    );
    worker_lost(
        cluster,
        &ns,
        &name,
        &lost_name,
        "was evicted through the Eviction API (kubectl drain)",
    )
    .await;
    let (_, completed, _) = jobset_state(cluster, &ns, &name).await;
    assert!(!completed, "a JobSet that lost a worker never completes");
    delete(cluster, &jobset).await;
}

/// TrainJob mode keeps Trainer's worker command (`sshd -De`, which exits 0 on SIGTERM) and Job
/// settings: what losing a worker does there is printed for the record, and only what we add is
/// asserted: the `WorkerLost` Event, on the TrainJob.
#[tokio::test]
async fn a_lost_trainjob_worker_is_an_event_on_the_trainjob() {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    let ns = cluster.plane.namespace("lost-trainjob").await;
    let name = trainjob_and_its_jobset(cluster, &ns, |jobset| {
        containers(jobset, "launcher")[0]["command"] = json!([
            "sh",
            "-c",
            format!(
                "exec mpirun --hostfile /etc/mpi/hostfile sh -c 'echo {STARTED}; exec sleep 600'"
            )
        ]);
    })
    .await;
    let workers = ranks_started(cluster, &ns, &name, "node").await;
    let lost = workers.last().expect("a worker");
    let lost_name = lost.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), &ns);
    pods.delete(&lost_name, &DeleteParams::default())
        .await
        .expect("delete the worker");
    let client = cluster.admin();
    let event = until(cluster, &ns, "WorkerLost Event", LOSS_TIMEOUT, || async {
        events(&client, &ns, "WorkerLost").await.pop()
    })
    .await;
    assert_eq!(event["regarding"]["kind"], "TrainJob");
    assert_eq!(event["regarding"]["name"], json!(name));
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&lost_name) && note.contains("was deleted"),
        "{note}"
    );
    // For the record: what Trainer's own settings make of the loss a little later.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let job = get(&client, "batch/v1", "Job", &ns, &format!("{name}-node-0"))
        .await
        .unwrap_or_default();
    let (restarts, completed, failed) = jobset_state(cluster, &ns, &name).await;
    eprintln!(
        "cluster: TrainJob mode, 20 s after a worker was deleted: its Job's status {}, the \
         JobSet restarts {restarts}, Completed {completed}, Failed {failed}",
        job["status"]
    );
    let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                        "metadata": {"name": name, "namespace": ns}});
    delete(cluster, &jobset).await;
}
