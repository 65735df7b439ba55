//! The shipped MPI TrainJob samples on each Trainer version, with mpi-webhook installed: the real
//! Trainer makes the JobSet, our webhook wires it, the kubelet runs it; every assertion reads what
//! the controllers and the kubelet did.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{self, Cluster};
use kube::api::{Patch, PatchParams};

use crate::jobs::{
    JOB_TIMEOUT, diagnose, launcher_log, launcher_restarts, name_of, pods_of, report_restarts,
    until,
};
use crate::support::{api_for, create, documents, events, get, list, managers};
use crate::trainer;

/// The sample on Trainer's own MPI runtime, `deepspeed-distributed`.
pub const DEEPSPEED: &str = "manifests/samples/trainjob-pi-deepspeed.yaml";
/// Trainer's Open MPI variable for the hostfile and the four PRTE ones mpi-webhook adds.
const OPEN_MPI_ENV: [&str; 5] = [
    "OMPI_MCA_orte_default_hostfile",
    "PRTE_MCA_prte_default_hostfile",
    "PRTE_MCA_prte_keep_fqdn_hostnames",
    "PRTE_MCA_prte_set_default_slots",
    "PRTE_MCA_plm_ssh_args",
];
pub const TRAINJOB: (&str, &str) = ("trainer.kubeflow.org/v1alpha1", "TrainJob");
static SKIP_NOTICE: std::sync::Once = std::sync::Once::new();

/// Whether a neighbour is not built here (`missing` says which): then the scenario is skipped
/// when the cluster suite is opted out of, and fails saying so otherwise.
pub fn neighbour_missing(missing: Option<String>) -> bool {
    let Some(missing) = missing else {
        return false;
    };
    crate::prerequisites::skip_or_fail(
        "cluster",
        &missing,
        "scripts/install-test-deps.sh builds it",
        &SKIP_NOTICE,
    );
    true
}

/// Whether Trainer `version` is not built here ([`neighbour_missing`]).
fn trainer_missing(version: &str) -> bool {
    neighbour_missing(trainer::missing(version))
}

/// The cluster with Trainer `version` running, for the scenario's lifetime; `None` when the
/// cluster suite is opted out of.
pub async fn cluster_with(
    version: &str,
) -> Option<(
    &'static Cluster,
    tokio::sync::RwLockReadGuard<'static, Option<trainer::Running>>,
)> {
    let cluster = cluster::shared().await?;
    if trainer_missing(version) {
        return None;
    }
    let running = trainer::running(cluster, version)
        .await
        .unwrap_or_else(|e| panic!("Trainer {version}: {e}"));
    Some((cluster, running))
}

/// A shipped TrainJob sample in namespace `ns`, without the uid offline mode needs.
pub fn train_job_sample(path: &str, ns: &str) -> Value {
    let mut train_job = documents(path).remove(0);
    train_job["metadata"]["namespace"] = json!(ns);
    if let Some(meta) = train_job["metadata"].as_object_mut() {
        meta.remove("uid");
    }
    train_job
}

/// The TrainJob's conditions that are `True`, by type.
pub fn true_conditions(train_job: &Value) -> Vec<String> {
    train_job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until TrainJob `name` is `Complete` (`Ok`: how long it took) or `Failed` (`Err`, with
/// what the cluster shows).
async fn train_job_finished(cluster: &Cluster, ns: &str, name: &str) -> Result<Duration, String> {
    let client = cluster.admin();
    let started = Instant::now();
    let mut seen_restarts = 0;
    loop {
        // A failed launcher run's last lines, printed before the kubelet drops them.
        report_restarts(&client, ns, name, &mut seen_restarts).await;
        let train_job = get(&client, TRAINJOB.0, TRAINJOB.1, ns, name)
            .await
            .unwrap_or_default();
        let conditions = true_conditions(&train_job);
        if conditions.iter().any(|c| c == "Complete") {
            return Ok(started.elapsed());
        }
        if conditions.iter().any(|c| c == "Failed") || started.elapsed() > JOB_TIMEOUT {
            return Err(format!(
                "TrainJob {ns}/{name} not Complete within {JOB_TIMEOUT:?}: {}\n{}",
                train_job["status"],
                diagnose(cluster, ns).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The shipped sample at `path` on Trainer `version`: Trainer makes its JobSet (applied by the
/// field manager `trainer`, owned by the TrainJob), it runs to `Complete` with a rank on every
/// host of the hostfile (the launcher's too: the runtimes run the launcher as a node), and the
/// launcher runs once.
async fn shipped_sample_completes(version: &str, path: &str, prefix: &str) {
    let Some((cluster, _trainer)) = cluster_with(version).await else {
        return;
    };
    let ns = cluster.plane.namespace(prefix).await;
    let train_job = train_job_sample(path, &ns);
    let name = name_of(&train_job);
    create(&cluster.admin(), &train_job)
        .await
        .unwrap_or_else(|e| panic!("create TrainJob {ns}/{name}: {e}"));
    completes_with_a_rank_on_every_host(cluster, version, &ns, &name).await;
}

/// TrainJob `name` runs to `Complete` from Trainer's JobSet, with a rank on every host (the
/// launcher's extra runs are reported).
pub async fn completes_with_a_rank_on_every_host(
    cluster: &Cluster,
    version: &str,
    ns: &str,
    name: &str,
) {
    let client = cluster.admin();
    let took = train_job_finished(cluster, ns, name)
        .await
        .unwrap_or_else(|e| panic!("Trainer {version}: {e}"));
    let restarts = launcher_restarts(&client, ns, name, "node").await;
    eprintln!(
        "next to Trainer {version}: TrainJob {ns}/{name} Complete in {took:.0?}, launcher \
         restarts: {restarts}"
    );

    let jobset = get(&client, "jobset.x-k8s.io/v1alpha2", "JobSet", ns, name)
        .await
        .unwrap_or_else(|| panic!("no JobSet {ns}/{name}"));
    assert!(
        managers(&jobset).iter().any(|m| m == "trainer"),
        "the JobSet was not applied by Trainer: managers {:?}",
        managers(&jobset)
    );
    let owner = &jobset["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("TrainJob"), Some(name)),
        "the JobSet's owner"
    );
    // Trainer's Open MPI variables and the four PRTE ones our webhook adds (Open MPI 5 needs
    // them), each once on the launcher's container, after every apply of Trainer's.
    let jobs = jobset["spec"]["replicatedJobs"].as_array().into_iter();
    for job in jobs.flatten().filter(|job| job["name"] == "launcher") {
        for container in job["template"]["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let env: Vec<&str> = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["name"].as_str())
                .collect();
            for wanted in OPEN_MPI_ENV {
                assert_eq!(
                    env.iter().filter(|n| **n == wanted).count(),
                    1,
                    "{wanted} once in {}/{}: {env:?}",
                    job["name"],
                    container["name"]
                );
            }
        }
    }

    let log = launcher_log(&client, ns, name, "node").await;
    let launchers = pods_of(&client, ns, name, "launcher").await;
    assert_eq!(
        launchers.len(),
        1,
        "one launcher pod\n{}",
        diagnose(cluster, ns).await
    );
    let hosts: Vec<String> = launchers
        .into_iter()
        .chain(pods_of(&client, ns, name, "node").await)
        .filter_map(|pod| pod.spec.and_then(|s| s.hostname))
        .collect();
    assert_eq!(hosts.len(), 3, "the launcher and two nodes: {hosts:?}");
    // A rank on every worker: the hosts ssh reaches, which is what the wiring decides. The
    // launcher's own rank is reported, not asserted: once in CI the job completed with the two
    // workers' lines and none from the launcher's local rank (Open MPI runs it without ssh).
    let (launcher_host, workers) = hosts.split_at(1);
    for host in workers {
        assert!(
            log.lines().any(|l| l.trim() == host),
            "no rank on {host} in the launcher's log:\n{log}\n{}",
            diagnose(cluster, ns).await
        );
    }
    if !log.lines().any(|l| l.trim() == launcher_host[0]) {
        eprintln!(
            "next to Trainer {version}: no line from the launcher's own rank on {} in:\n{log}",
            launcher_host[0]
        );
    }
    made_once_next_to_trainer(cluster, version, ns, name).await;
    // Reported, not asserted: TrainJob mode's launcher has no pre-flight and, on a loaded
    // machine, sometimes fails its first run (kubeflow/trainer#3783; 2 of 20 launchers here),
    // then completes on the next. Whether mpi-webhook should add one in TrainJob mode is still
    // to be measured and decided; until then an assertion here would be a flaky test.
    if restarts > 0 {
        eprintln!(
            "next to Trainer {version}: the launcher of {ns}/{name} ran {} times \
             (kubeflow/trainer#3783; its failed runs' last lines are above)",
            restarts + 1
        );
    }
}

/// Next to Trainer, which makes the SSH Secret when it finds none and applies the hostfile
/// ConfigMap as field manager `trainer`: one SSH Secret owned by the TrainJob (whoever made it first;
/// Trainer's is immutable), the hostfile applied by both without a conflict (no
/// `HostfileConflict` Event) and neither rewritten while the reconciles go on (their
/// `resourceVersion` unchanged over 10 s).
async fn made_once_next_to_trainer(cluster: &Cluster, version: &str, ns: &str, name: &str) {
    let client = cluster.admin();
    let secrets: Vec<Value> = list(&client, "v1", "Secret", ns)
        .await
        .expect("list Secrets")
        .into_iter()
        .filter(|s| s["type"] == "kubernetes.io/ssh-auth")
        .filter(|s| {
            s["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["kind"] == "TrainJob" && o["name"] == name)
        })
        .collect();
    let secret_names: Vec<String> = secrets.iter().map(name_of).collect();
    assert_eq!(
        secret_names,
        [format!("{name}-mpi-ssh-auth")],
        "one SSH Secret"
    );
    let versions = |objects: [&Option<Value>; 2]| {
        objects.map(|o| {
            o.as_ref()
                .map(|o| o["metadata"]["resourceVersion"].clone())
                .unwrap_or_default()
        })
    };
    let secret_name = format!("{name}-mpi-ssh-auth");
    let hostfile_name = format!("{name}-mpi-hostfile");
    let secret = get(&client, "v1", "Secret", ns, &secret_name).await;
    let hostfile = get(&client, "v1", "ConfigMap", ns, &hostfile_name).await;
    let hostfile_managers = hostfile.as_ref().map(managers).unwrap_or_default();
    eprintln!(
        "next to Trainer {version}: {ns}: Secret {secret_name} managers {:?}, ConfigMap \
         {hostfile_name} managers {hostfile_managers:?}",
        secret.as_ref().map(managers).unwrap_or_default(),
    );
    assert!(
        hostfile_managers.iter().any(|m| m == "trainer"),
        "Trainer did not apply the hostfile: {hostfile_managers:?}"
    );
    let conflicts = events(&client, ns, "HostfileConflict").await;
    assert!(
        conflicts.is_empty(),
        "HostfileConflict next to Trainer {version}: {conflicts:?}"
    );
    let before = versions([&secret, &hostfile]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = versions([
        &get(&client, "v1", "Secret", ns, &secret_name).await,
        &get(&client, "v1", "ConfigMap", ns, &hostfile_name).await,
    ]);
    assert_eq!(
        before, after,
        "the Secret's and the hostfile's resourceVersion moved"
    );
}

/// A TrainJob created suspended, as Kueue creates it, on Trainer `version`: Trainer makes its
/// JobSet suspended and no Pod starts; resumed (`spec.suspend: false`, as Kueue admits it) it
/// runs to `Complete` with a rank on every host.
async fn suspended_then_resumed(version: &str, prefix: &str) {
    let Some((cluster, _trainer)) = cluster_with(version).await else {
        return;
    };
    let ns = cluster.plane.namespace(prefix).await;
    let name = create_suspended(cluster, &ns).await;
    resume(cluster, &ns, &name).await;
    completes_with_a_rank_on_every_host(cluster, version, &ns, &name).await;
}

/// The upgrade's steps: a suspended TrainJob made under Trainer `from`, the controller replaced
/// by `to` (stopped; `to`'s CRDs, RBAC, webhooks and runtimes applied; started), the TrainJob
/// resumed: it completes under `to`. Upstream says a suspended MPI TrainJob made under v2.3 fails
/// to resume under v2.4; with `from` v2.3 and `to` v2.4 this is that upgrade.
async fn suspended_across_a_replaced_trainer(from: &str, to: &str, prefix: &str) {
    let Some(cluster) = cluster::shared().await else {
        return;
    };
    for version in [from, to] {
        if trainer_missing(version) {
            return;
        }
    }
    let mut running = trainer::exclusive().await;
    if running.as_ref().is_none_or(|r| r.version != from) {
        trainer::switch(cluster, &mut running, from)
            .await
            .unwrap_or_else(|e| panic!("Trainer {from}: {e}"));
    }
    let ns = cluster.plane.namespace(prefix).await;
    let name = create_suspended(cluster, &ns).await;
    trainer::switch(cluster, &mut running, to)
        .await
        .unwrap_or_else(|e| panic!("Trainer {to}: {e}"));
    resume(cluster, &ns, &name).await;
    completes_with_a_rank_on_every_host(cluster, to, &ns, &name).await;
}

/// Creates the deepspeed sample suspended in `ns` and waits until Trainer says it is suspended
/// and its JobSet is; no Pod starts meanwhile. Its name.
async fn create_suspended(cluster: &Cluster, ns: &str) -> String {
    let client = cluster.admin();
    let mut train_job = train_job_sample(DEEPSPEED, ns);
    train_job["spec"]["suspend"] = json!(true);
    let name = name_of(&train_job);
    create(&client, &train_job)
        .await
        .unwrap_or_else(|e| panic!("create TrainJob {ns}/{name}: {e}"));
    until(cluster, ns, "a suspended TrainJob", JOB_TIMEOUT, || async {
        let train_job = get(&client, TRAINJOB.0, TRAINJOB.1, ns, &name).await?;
        true_conditions(&train_job)
            .iter()
            .any(|c| c == "Suspended")
            .then_some(())
    })
    .await;
    let jobset = until(
        cluster,
        ns,
        "Trainer's suspended JobSet",
        JOB_TIMEOUT,
        || get(&client, "jobset.x-k8s.io/v1alpha2", "JobSet", ns, &name),
    )
    .await;
    assert_eq!(
        jobset["spec"]["suspend"],
        json!(true),
        "the JobSet's suspend"
    );
    // A while suspended: no Pod.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pods = list(&client, "v1", "Pod", ns).await.expect("list Pods");
    assert!(
        pods.is_empty(),
        "{} Pods of a suspended TrainJob",
        pods.len()
    );
    name
}

/// Resumes TrainJob `name` as Kueue admits it: `spec.suspend: false`, a merge patch.
async fn resume(cluster: &Cluster, ns: &str, name: &str) {
    let object = json!({"apiVersion": TRAINJOB.0, "kind": TRAINJOB.1,
                        "metadata": {"name": name, "namespace": ns}});
    api_for(&cluster.admin(), &object, None)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap_or_else(|e| panic!("resume TrainJob {ns}/{name}: {e}"));
}

#[tokio::test]
async fn the_deepspeed_sample_completes_next_to_trainer_v2_3() {
    shipped_sample_completes("v2.3", DEEPSPEED, "v23-deepspeed").await;
}

#[tokio::test]
async fn the_mlx_sample_completes_next_to_trainer_v2_3() {
    shipped_sample_completes("v2.3", "manifests/samples/trainjob-pi-mlx.yaml", "v23-mlx").await;
}

#[tokio::test]
async fn a_suspended_trainjob_resumes_and_completes_next_to_trainer_v2_3() {
    suspended_then_resumed("v2.3", "v23-suspended").await;
}

/// The upgrade's machinery on the one Trainer version the module proxy serves (v2.3.0): the
/// controller stopped and started again under a suspended TrainJob. v2.4 takes `to`'s place when
/// tests/neighbours/ pins it.
#[tokio::test]
async fn a_suspended_trainjob_resumes_after_trainer_v2_3_is_replaced() {
    suspended_across_a_replaced_trainer("v2.3", "v2.3", "v23-replaced").await;
}
