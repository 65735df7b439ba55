//! Next to the real Kueue (`tests/cluster/kueue.rs`) and the real Trainer: a queue with room for
//! one job at a time, a TrainJob and a JobSet-mode JobSet in it. Kueue suspends both at create,
//! admits one, injects its ResourceFlavor's node selector and toleration into the admitted job's
//! pod templates while resuming it (an UPDATE our webhook sees), and admits the other when the
//! first finishes. Every assertion reads what Kueue, the controllers and the kubelet did.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{self, Cluster};
use crate::jobs::{JOB_TIMEOUT, containers, diagnose, finished, name_of, pods_of, sample, until};
use crate::scenarios::{
    TRAINJOB, cluster_with, completes_with_a_rank_on_every_host, neighbour_missing, true_conditions,
};
use crate::support::{apply, create, get, list};
use crate::{kueue, trainer};

/// The label that puts a job in a LocalQueue.
const QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
/// The node label and the toleration the ResourceFlavor makes Kueue inject when it admits a job.
const FLAVOR_NODE_LABEL: (&str, &str) = ("kubernetes.io/os", "linux");
const FLAVOR_TOLERATION: &str = "mpi-webhook.io/kueue-flavor";
const JOBSET: (&str, &str) = ("jobset.x-k8s.io/v1alpha2", "JobSet");
/// The label that gives a job a WorkloadPriorityClass.
const PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";
/// The shipped Open MPI JobSet-mode sample.
const JOBSET_SAMPLE: &str = "manifests/samples/jobset-pi-openmpi.yaml";
/// The cluster with Kueue running; `None` when the cluster suite is opted out of.
async fn with_kueue() -> Option<&'static Cluster> {
    let cluster = cluster::shared().await?;
    if neighbour_missing(kueue::missing()) {
        return None;
    }
    kueue::running(cluster)
        .await
        .unwrap_or_else(|e| panic!("Kueue: {e}"));
    Some(cluster)
}

/// The cluster with Kueue and Trainer `version` running; `None` when the cluster suite is
/// opted out of.
async fn with_kueue_and_trainer(
    version: &str,
) -> Option<(
    &'static Cluster,
    tokio::sync::RwLockReadGuard<'static, Option<trainer::Running>>,
)> {
    with_kueue().await?;
    cluster_with(version).await
}

/// A ResourceFlavor, a ClusterQueue with quota for `pods` Pods of it (CPU and memory to spare:
/// the pods Pods never run short of them) where a job of higher priority preempts one of lower,
/// and a LocalQueue `ns` feeding it; the queue's name.
async fn queue_with_room_for(cluster: &Cluster, ns: &str, pods: u32) -> String {
    let admin = cluster.admin();
    let name = ns.to_owned();
    let (label, value) = FLAVOR_NODE_LABEL;
    for object in [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": name},
               "spec": {"nodeLabels": {label: value},
                        "tolerations": [{"key": FLAVOR_TOLERATION, "operator": "Exists",
                                         "effect": "NoSchedule"}]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
               "metadata": {"name": name},
               "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                        "preemption": {"withinClusterQueue": "LowerPriority"},
                        "resourceGroups": [{"coveredResources": ["cpu", "memory", "pods"],
                            "flavors": [{"name": name, "resources": [
                                {"name": "cpu", "nominalQuota": "16"},
                                {"name": "memory", "nominalQuota": "64Gi"},
                                {"name": "pods", "nominalQuota": pods}]}]}]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"clusterQueue": name}}),
    ] {
        apply(&admin, &object, "cluster").await;
    }
    name
}

/// Whether a JobSet or TrainJob is held by Kueue (`spec.suspend: true`).
fn suspended(object: &Value) -> bool {
    object["spec"]["suspend"] == json!(true)
}

/// Whether a pod spec carries the flavor's node selector and toleration.
fn has_flavor(pod_spec: &Value) -> bool {
    let (label, value) = FLAVOR_NODE_LABEL;
    pod_spec["nodeSelector"][label] == value
        && pod_spec["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == FLAVOR_TOLERATION)
}

/// A queue with room for one three-Pod job; a TrainJob (Trainer's `deepspeed-distributed`, a
/// launcher and two nodes) then a JobSet-mode JobSet (two workers and a launcher) queued in it:
/// the JobSet waits suspended, with no Pod, until the TrainJob is `Complete`; then it is admitted
/// with Kueue's node selector and toleration (our webhook allows that UPDATE), runs wired (the
/// ssh set-up, the pre-flight), and completes.
async fn a_trainjob_and_a_jobset_take_turns(version: &str, prefix: &str) {
    let Some((cluster, _trainer)) = with_kueue_and_trainer(version).await else {
        return;
    };
    let client = cluster.admin();
    let ns = cluster.plane.namespace(prefix).await;
    let queue = queue_with_room_for(cluster, &ns, 3).await;

    let mut train_job = crate::scenarios::train_job_sample(crate::scenarios::DEEPSPEED, &ns);
    train_job["metadata"]["labels"] = json!({QUEUE_NAME: queue});
    let train_job_name = name_of(&train_job);
    create(&client, &train_job)
        .await
        .unwrap_or_else(|e| panic!("create TrainJob {ns}/{train_job_name}: {e}"));
    until(
        cluster,
        &ns,
        "the TrainJob admitted",
        JOB_TIMEOUT,
        || async {
            let train_job = get(&client, TRAINJOB.0, TRAINJOB.1, &ns, &train_job_name).await?;
            (!suspended(&train_job)).then_some(())
        },
    )
    .await;

    let mut jobset = sample(JOBSET_SAMPLE, &ns);
    jobset["metadata"]["labels"][QUEUE_NAME] = json!(queue);
    let jobset_name = name_of(&jobset);
    create(&client, &jobset)
        .await
        .unwrap_or_else(|e| panic!("create JobSet {ns}/{jobset_name}: {e}"));

    // Held while the TrainJob runs. The JobSet is read first: Kueue frees the quota only after
    // the TrainJob is `Complete`, so a JobSet running before that is a JobSet run out of turn.
    let started = Instant::now();
    loop {
        let jobset = get(&client, JOBSET.0, JOBSET.1, &ns, &jobset_name)
            .await
            .unwrap_or_else(|| panic!("no JobSet {ns}/{jobset_name}"));
        let train_job = get(&client, TRAINJOB.0, TRAINJOB.1, &ns, &train_job_name)
            .await
            .unwrap_or_default();
        let conditions = true_conditions(&train_job);
        if conditions.iter().any(|c| c == "Complete") {
            break;
        }
        assert!(
            !conditions.iter().any(|c| c == "Failed") && started.elapsed() < JOB_TIMEOUT,
            "TrainJob {ns}/{train_job_name} not Complete: {}\n{}",
            train_job["status"],
            diagnose(cluster, &ns).await
        );
        assert!(
            suspended(&jobset) && pods_of(&client, &ns, &jobset_name, "node").await.is_empty(),
            "the JobSet ran while the TrainJob held the queue: suspend {}\n{}",
            jobset["spec"]["suspend"],
            diagnose(cluster, &ns).await
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    completes_with_a_rank_on_every_host(cluster, version, &ns, &train_job_name).await;

    let took = finished(cluster, &ns, &jobset_name)
        .await
        .unwrap_or_else(|e| panic!("after its turn: {e}"));
    eprintln!("next to Kueue: JobSet {ns}/{jobset_name} Completed (waited {took:.0?} more)");
    // Both JobSets as they ran: every pod template carries the flavor Kueue injected when it
    // admitted the job (Trainer's through the TrainJob's `runtimePatches`), and ours is wired.
    for (name, ours) in [(&jobset_name, true), (&train_job_name, false)] {
        let jobset = get(&client, JOBSET.0, JOBSET.1, &ns, name)
            .await
            .unwrap_or_else(|| panic!("no JobSet {ns}/{name}"));
        for job in jobset["spec"]["replicatedJobs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let pod_spec = &job["template"]["spec"]["template"]["spec"];
            assert!(
                has_flavor(pod_spec),
                "{name}/{}: without Kueue's node selector and toleration: {} {}",
                job["name"],
                pod_spec["nodeSelector"],
                pod_spec["tolerations"]
            );
            let init: Vec<&str> = pod_spec["initContainers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            assert!(
                !ours || init.contains(&"mpi-ssh-setup"),
                "{name}/{}: not wired by mpi-webhook: init containers {init:?}",
                job["name"]
            );
        }
    }
}

/// The SSH Secret and hostfile ConfigMap of JobSet `name`: uid and resourceVersion.
async fn made_for(client: &kube::Client, ns: &str, name: &str) -> [(Value, Value); 2] {
    let mut made = [(Value::Null, Value::Null), (Value::Null, Value::Null)];
    for (slot, (kind, suffix)) in made
        .iter_mut()
        .zip([("Secret", "mpi-ssh-auth"), ("ConfigMap", "mpi-hostfile")])
    {
        let object = get(client, "v1", kind, ns, &format!("{name}-{suffix}"))
            .await
            .unwrap_or_default();
        *slot = (
            object["metadata"]["uid"].clone(),
            object["metadata"]["resourceVersion"].clone(),
        );
    }
    made
}

/// A queue with room for one three-Pod job; a JobSet-mode JobSet of low priority runs in it
/// (its launcher sleeping a while before each rank's line) when one of high priority arrives:
/// Kueue preempts the first (`spec.suspend: true`, its Workload `Evicted` for `Preempted`), runs
/// the second to `Completed`, then admits the first again, which resumes and completes with the
/// SSH Secret and hostfile it had before (the same uid and resourceVersion: nothing re-made).
async fn a_preempted_jobset_resumes_with_its_secret(prefix: &str) {
    let Some(cluster) = with_kueue().await else {
        return;
    };
    let client = cluster.admin();
    let ns = cluster.plane.namespace(prefix).await;
    let queue = queue_with_room_for(cluster, &ns, 3).await;
    for (name, value) in [("low", 100), ("high", 1000)] {
        let class = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                           "metadata": {"name": format!("{ns}-{name}")}, "value": value});
        apply(&client, &class, "cluster").await;
    }
    let queued = |name: &str, priority: &str| {
        let mut jobset = sample(JOBSET_SAMPLE, &ns);
        jobset["metadata"]["name"] = json!(name);
        jobset["metadata"]["labels"][QUEUE_NAME] = json!(queue);
        jobset["metadata"]["labels"][PRIORITY_CLASS] = json!(format!("{ns}-{priority}"));
        jobset
    };

    let mut low = queued("low", "low");
    containers(&mut low, "launcher")[0]["command"] = json!([
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "2",
        "sh",
        "-c",
        "sleep 20; hostname"
    ]);
    create(&client, &low)
        .await
        .unwrap_or_else(|e| panic!("create JobSet {ns}/low: {e}"));
    until(
        cluster,
        &ns,
        "the low-priority launcher running",
        JOB_TIMEOUT,
        || async {
            let launchers = pods_of(&client, &ns, "low", "launcher").await;
            launchers
                .iter()
                .any(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
        },
    )
    .await;
    let before = made_for(&client, &ns, "low").await;
    assert!(
        !before[0].0.is_null(),
        "no SSH Secret for the running low-priority JobSet"
    );

    create(&client, &queued("high", "high"))
        .await
        .unwrap_or_else(|e| panic!("create JobSet {ns}/high: {e}"));
    until(
        cluster,
        &ns,
        "the low-priority JobSet preempted",
        JOB_TIMEOUT,
        || async {
            let low = get(&client, JOBSET.0, JOBSET.1, &ns, "low").await?;
            suspended(&low).then_some(())
        },
    )
    .await;
    let preempted = list(&client, "kueue.x-k8s.io/v1beta2", "Workload", &ns)
        .await
        .expect("list Workloads")
        .into_iter()
        .filter(|w| w["metadata"]["ownerReferences"][0]["name"] == "low")
        .flat_map(|w| {
            w["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .any(|c| c["type"] == "Evicted" && c["reason"] == "Preempted");
    assert!(
        preempted,
        "the low-priority Workload is not Evicted for Preempted"
    );

    finished(cluster, &ns, "high")
        .await
        .unwrap_or_else(|e| panic!("the high-priority JobSet: {e}"));
    let took = finished(cluster, &ns, "low")
        .await
        .unwrap_or_else(|e| panic!("the preempted JobSet, admitted again: {e}"));
    eprintln!("next to Kueue: the preempted JobSet {ns}/low Completed {took:.0?} after the other");
    assert_eq!(
        made_for(&client, &ns, "low").await,
        before,
        "the preempted JobSet's Secret and hostfile (uid, resourceVersion)"
    );
}

#[tokio::test]
async fn a_jobset_preempted_by_kueue_resumes_with_the_same_secret() {
    a_preempted_jobset_resumes_with_its_secret("kueue-preempted").await;
}

#[tokio::test]
async fn a_trainjob_and_a_jobset_take_turns_in_a_kueue_queue_next_to_trainer_v2_3() {
    a_trainjob_and_a_jobset_take_turns("v2.3", "kueue-turns").await;
}
