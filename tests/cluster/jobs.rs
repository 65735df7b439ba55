//! What the cluster scenarios share: the shipped samples with the offline images, waits that
//! poll with a bound, the pods of a JobSet's replicatedJobs and their launchers' restarts and
//! logs, and the report a failing scenario writes.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, LogParams};
use serde_json::{Value, json};

use crate::cluster::{Cluster, INTEL_IMAGE, MPICH_IMAGE, OPENMPI_IMAGE};
use crate::support::{documents, get, list};

/// How long a small MPI job may take from create to `Completed` on a loaded 2-core machine.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(240);

/// The images the samples name, and the ones built offline that stand in for them.
const IMAGES: [(&str, &str); 3] = [
    ("docker.io/mpioperator/openmpi", OPENMPI_IMAGE),
    ("docker.io/mpioperator/mpich", MPICH_IMAGE),
    ("docker.io/mpioperator/intel", INTEL_IMAGE),
];

/// A shipped sample in namespace `ns`: its images replaced by the offline ones (which are never
/// pulled), the API server's own uid.
pub fn sample(path: &str, ns: &str) -> Value {
    let mut jobset = documents(path).remove(0);
    jobset["metadata"]["namespace"] = json!(ns);
    if let Some(meta) = jobset["metadata"].as_object_mut() {
        meta.remove("uid");
    }
    for_each_container(&mut jobset, |container| {
        let image = container["image"].as_str().unwrap_or_default();
        if let Some((_, local)) = IMAGES.iter().find(|(from, _)| *from == image) {
            container["image"] = json!(local);
            container["imagePullPolicy"] = json!("Never");
        }
    });
    jobset
}

pub fn for_each_container(jobset: &mut Value, f: impl FnMut(&mut Value)) {
    for_each_container_of(&mut jobset["spec"]["replicatedJobs"], f);
}

/// Calls `f` on every container of the replicatedJobs `rjobs` (a JobSet's, or a runtime's
/// JobSet template's).
pub fn for_each_container_of(rjobs: &mut Value, mut f: impl FnMut(&mut Value)) {
    for job in rjobs.as_array_mut().into_iter().flatten() {
        for container in job["template"]["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            f(container);
        }
    }
}

/// The container list of replicatedJob `name`.
pub fn containers<'a>(jobset: &'a mut Value, name: &str) -> &'a mut Value {
    let jobs = jobset["spec"]["replicatedJobs"]
        .as_array_mut()
        .expect("replicatedJobs");
    let job = jobs
        .iter_mut()
        .find(|j| j["name"] == name)
        .unwrap_or_else(|| panic!("no replicatedJob {name}"));
    &mut job["template"]["spec"]["template"]["spec"]["containers"]
}

/// What a scenario saw, written under `target/cluster/logs/` and returned for a panic message.
pub async fn diagnose(cluster: &Cluster, ns: &str) -> String {
    let client = cluster.admin();
    let mut out = String::new();
    for jobset in list(&client, "jobset.x-k8s.io/v1alpha2", "JobSet", ns)
        .await
        .unwrap_or_default()
    {
        out += &format!(
            "JobSet {}: {}\n",
            jobset["metadata"]["name"], jobset["status"]
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in pods
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = serde_json::to_value(&pod.status).unwrap_or_default();
        out += &format!("Pod {name}: {}\n", status);
        let spec = pod.spec.unwrap_or_default();
        let all = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers);
        for container in all {
            let params = LogParams {
                container: Some(container.name.clone()),
                tail_lines: Some(40),
                ..Default::default()
            };
            let log = pods
                .logs(&name, &params)
                .await
                .unwrap_or_else(|e| format!("({e})"));
            out += &format!("--- log of {name}/{} ---\n{log}\n", container.name);
        }
    }
    for event in list(&client, "events.k8s.io/v1", "Event", ns)
        .await
        .unwrap_or_default()
    {
        out += &format!(
            "Event {} {} {}: {}\n",
            event["regarding"]["kind"].as_str().unwrap_or_default(),
            event["regarding"]["name"].as_str().unwrap_or_default(),
            event["reason"].as_str().unwrap_or_default(),
            event["note"].as_str().unwrap_or_default()
        );
    }
    let file = cluster.logs.join(format!("{ns}.txt"));
    let _ = std::fs::write(&file, &out);
    format!(
        "{out}\n(also in {}; component logs beside it)",
        file.display()
    )
}

/// Waits until JobSet `name` has condition `Completed` (`Ok`) or `Failed` (`Err`, with what
/// the cluster shows).
pub async fn finished(cluster: &Cluster, ns: &str, name: &str) -> Result<Duration, String> {
    let client = cluster.admin();
    let started = Instant::now();
    let mut seen_restarts = 0;
    loop {
        report_restarts(&client, ns, name, &mut seen_restarts).await;
        let jobset = get(&client, "jobset.x-k8s.io/v1alpha2", "JobSet", ns, name).await;
        let conditions = jobset
            .as_ref()
            .and_then(|j| j["status"]["conditions"].as_array().cloned())
            .unwrap_or_default();
        let is = |kind: &str| {
            conditions
                .iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        };
        if is("Completed") {
            return Ok(started.elapsed());
        }
        if is("Failed") {
            return Err(format!(
                "JobSet {ns}/{name} Failed\n{}",
                diagnose(cluster, ns).await
            ));
        }
        if started.elapsed() > JOB_TIMEOUT {
            return Err(format!(
                "JobSet {ns}/{name} did not complete within {JOB_TIMEOUT:?}\n{}",
                diagnose(cluster, ns).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls `check` every half second until it returns `Some`; after `limit`, fails saying what
/// was awaited and what the cluster shows in `ns`.
pub async fn until<T, F, Fut>(
    cluster: &Cluster,
    ns: &str,
    what: &str,
    limit: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < limit,
            "no {what} within {limit:?}\n{}",
            diagnose(cluster, ns).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The name of an object, as JSON.
pub fn name_of(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Prints the log of each failed launcher run seen since the last call (the kubelet drops it
/// once the pod is gone), so a restart that the test tolerates still says why; returns them, each
/// as `exit <code>: <last lines>`.
pub async fn report_restarts(client: &Client, ns: &str, name: &str, seen: &mut i32) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut failed_runs = Vec::new();
    for pod in pods_of(client, ns, name, "launcher").await {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        for status in statuses {
            if status.restart_count <= *seen {
                continue;
            }
            *seen = status.restart_count;
            let params = LogParams {
                container: Some(status.name.clone()),
                previous: true,
                tail_lines: Some(40),
                ..Default::default()
            };
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let log = pods
                .logs(&pod_name, &params)
                .await
                .unwrap_or_else(|e| format!("(no previous log: {e})"));
            let exit = status
                .last_state
                .and_then(|s| s.terminated)
                .map(|t| t.exit_code);
            eprintln!(
                "cluster: {ns}/{pod_name} {} restarted (exit {exit:?}); its last lines:\n{log}",
                status.name
            );
            failed_runs.push(format!("exit {exit:?}: {log}"));
        }
    }
    failed_runs
}

/// The pods of replicatedJob `job` of JobSet `name`, by name.
pub async fn pods_of(client: &Client, ns: &str, name: &str, job: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!(
        "jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name={job}"
    );
    let mut items = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list pods")
        .items;
    items.sort_by_key(|p| p.metadata.name.clone());
    items
}

/// How often the launcher container of the JobSet's launcher pods was restarted, summed.
pub async fn launcher_restarts(client: &Client, ns: &str, name: &str, container: &str) -> i32 {
    pods_of(client, ns, name, "launcher")
        .await
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter(|c| c.name == container)
        .map(|c| c.restart_count)
        .sum()
}

/// The log of the launcher container of the JobSet's (last) launcher pod.
pub async fn launcher_log(client: &Client, ns: &str, name: &str, container: &str) -> String {
    let launcher = pods_of(client, ns, name, "launcher")
        .await
        .pop()
        .expect("a launcher pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = LogParams {
        container: Some(container.to_owned()),
        ..Default::default()
    };
    pods.logs(&launcher.metadata.name.unwrap_or_default(), &params)
        .await
        .expect("the launcher's log")
}
