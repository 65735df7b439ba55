//! A measurement, not a check (`#[ignore]`d; run with `-- --ignored`): how often Trainer's
//! launcher fails its first run in TrainJob mode (kubeflow/trainer#3783, `ORTE was unable to
//! reliably start one or more daemons`), on Trainer v2.3 with mpi-webhook installed.
//!
//! - **idle**: the deepspeed sample, `MEASURE_RUNS` times (default 10) one after another, each
//!   alone on the node (the previous one's Pods gone first);
//! - **busy**: the same, each time with two other deepspeed TrainJobs created in the same instant
//!   beside it, so that six Pods start and three launchers wait for their workers together.
//!
//! `MEASURE_CASES` (default `idle,busy`) chooses the cases, so each can be run alone. Every
//! TrainJob must reach `Complete` (else the scenario fails, with what the cluster shows); how
//! often a launcher ran more than once is only printed: a summary table at the end, with the first
//! lines of each failed run's log (read from the kubelet while the restarted container still has
//! it) and the `LauncherFailed` Events mpi-webhook's reconciler recorded.

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::json;

use crate::cluster::Cluster;
use crate::jobs::{JOB_TIMEOUT, diagnose, launcher_restarts, name_of, pods_of, report_restarts};
use crate::scenarios::{DEEPSPEED, TRAINJOB, cluster_with, train_job_sample, true_conditions};
use crate::support::{api_for, create, events, get, list};

/// How long the previous run's Pods may take to go before the next run starts anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// One TrainJob's launcher, as measured.
struct Launcher {
    name: String,
    /// How many times its container ran (restarts + 1, over its launcher Pods).
    runs: i32,
    took: Duration,
    /// The failed runs' logs, as the kubelet kept them (`previous`), one per failed run.
    failed_logs: Vec<String>,
}

/// One run of a case: the measured TrainJob and, when busy, the two beside it.
struct Outcome {
    case: &'static str,
    run: usize,
    ns: String,
    /// `/proc/loadavg`'s first figure when the run started (the machine is shared).
    load: String,
    measured: Launcher,
    others: Vec<Launcher>,
    /// The `LauncherFailed` Events' notes in the run's namespace.
    launcher_failed: Vec<String>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Waits until TrainJob `name` is `Complete`, collecting its launcher's failed runs; panics when
/// it fails or takes longer than [`JOB_TIMEOUT`].
async fn measure_until_complete(cluster: &Cluster, ns: &str, name: &str) -> Launcher {
    let client = cluster.admin();
    let started = Instant::now();
    let mut seen = 0;
    let mut failed_logs = Vec::new();
    loop {
        failed_logs.extend(report_restarts(&client, ns, name, &mut seen).await);
        let train_job = get(&client, TRAINJOB.0, TRAINJOB.1, ns, name)
            .await
            .unwrap_or_default();
        let conditions = true_conditions(&train_job);
        if conditions.iter().any(|c| c == "Complete") {
            break;
        }
        assert!(
            !conditions.iter().any(|c| c == "Failed") && started.elapsed() < JOB_TIMEOUT,
            "#3783: TrainJob {ns}/{name} not Complete within {JOB_TIMEOUT:?}: {}\n{}",
            train_job["status"],
            diagnose(cluster, ns).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = started.elapsed();
    failed_logs.extend(report_restarts(&client, ns, name, &mut seen).await);
    let launchers = pods_of(&client, ns, name, "launcher").await.len();
    let restarts = launcher_restarts(&client, ns, name, "node").await;
    let runs = restarts + i32::try_from(launchers).unwrap_or(1);
    Launcher {
        name: name.to_owned(),
        runs,
        took,
        failed_logs,
    }
}

/// Deletes the run's TrainJobs and waits (bounded) until no Pod of them is left, so the next run
/// starts on a node with nothing of this one running.
async fn drain(cluster: &Cluster, ns: &str, names: &[String]) {
    let client = cluster.admin();
    for name in names {
        let object = json!({"apiVersion": TRAINJOB.0, "kind": TRAINJOB.1,
                            "metadata": {"name": name, "namespace": ns}});
        let _ = api_for(&client, &object, None)
            .delete(name, &DeleteParams::background())
            .await;
    }
    let started = Instant::now();
    while started.elapsed() < DRAIN_TIMEOUT {
        if list(&client, "v1", "Pod", ns)
            .await
            .unwrap_or_default()
            .is_empty()
        {
            eprintln!("#3783: {ns} drained in {:.0?}", started.elapsed());
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("#3783: {ns} still has Pods after {DRAIN_TIMEOUT:?}; going on");
}

/// One run: the measured deepspeed TrainJob, and `others` more created in the same instant.
async fn one_run(cluster: &Cluster, case: &'static str, run: usize, others: usize) -> Outcome {
    let client = cluster.admin();
    let ns = cluster.plane.namespace(&format!("m3783-{case}")).await;
    let measured = train_job_sample(DEEPSPEED, &ns);
    let mut jobs = vec![measured];
    for n in 1..=others {
        let mut other = train_job_sample(DEEPSPEED, &ns);
        other["metadata"]["name"] = json!(format!("pi-other-{n}"));
        jobs.push(other);
    }
    let names: Vec<String> = jobs.iter().map(name_of).collect();
    let load = load_average();
    // Created together: each create on its own task, all started before any is awaited.
    let creates: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let client = client.clone();
            tokio::spawn(async move { create(&client, &job).await.map(|_| name_of(&job)) })
        })
        .collect();
    for created in creates {
        let name = created
            .await
            .expect("the create task")
            .unwrap_or_else(|e| panic!("create TrainJob in {ns}: {e}"));
        eprintln!("#3783: {case} run {run}: created TrainJob {ns}/{name}");
    }
    let mut launchers = Vec::new();
    {
        // The waits poll together (each one's polls are short), so no restart goes unread.
        let mut waits: Vec<_> = names
            .iter()
            .map(|name| Box::pin(measure_until_complete(cluster, &ns, name)))
            .collect();
        while !waits.is_empty() {
            let (launcher, _, rest) = select_all(waits).await;
            launchers.push(launcher);
            waits = rest;
        }
    }
    launchers.sort_by_key(|l| names.iter().position(|n| *n == l.name));
    let launcher_failed = events(&client, &ns, "LauncherFailed")
        .await
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e["regarding"]["name"].as_str().unwrap_or_default(),
                e["note"].as_str().unwrap_or_default()
            )
        })
        .collect();
    drain(cluster, &ns, &names).await;
    let mut launchers = launchers.into_iter();
    let measured = launchers.next().expect("the measured launcher");
    let outcome = Outcome {
        case,
        run,
        ns,
        load,
        measured,
        others: launchers.collect(),
        launcher_failed,
    };
    eprintln!(
        "#3783: {case} run {run}: {}/{} Complete in {:.0?}, its launcher ran {} time(s); others \
         ran {:?}; load {}",
        outcome.ns,
        outcome.measured.name,
        outcome.measured.took,
        outcome.measured.runs,
        outcome.others.iter().map(|l| l.runs).collect::<Vec<_>>(),
        outcome.load
    );
    outcome
}

/// The first of `futures` to finish, its index and the others (a small `select_all`: the
/// dev-dependencies have no `futures` crate).
async fn select_all<F: std::future::Future + Unpin>(
    mut futures: Vec<F>,
) -> (F::Output, usize, Vec<F>) {
    let (output, index) = std::future::poll_fn(|cx| {
        for (i, f) in futures.iter_mut().enumerate() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready((out, i));
            }
        }
        std::task::Poll::Pending
    })
    .await;
    drop(futures.remove(index));
    (output, index, futures)
}

/// The first `n` lines of a failed run's log that say something (not the banner of dashes).
fn first_lines(log: &str, n: usize) -> String {
    log.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .take(n)
        .collect::<Vec<_>>()
        .join(" | ")
}

fn summary(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "\n#3783 summary (Trainer v2.3, deepspeed sample, launcher runs per TrainJob)\n\
         | case | run | namespace | load | measured launcher runs | took | others' runs |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        out += &format!(
            "| {} | {} | {} | {} | {} | {:.0?} | {:?} |\n",
            o.case,
            o.run,
            o.ns,
            o.load,
            o.measured.runs,
            o.measured.took,
            o.others.iter().map(|l| l.runs).collect::<Vec<_>>()
        );
    }
    for case in ["idle", "busy"] {
        let of_case: Vec<&Outcome> = outcomes.iter().filter(|o| o.case == case).collect();
        if of_case.is_empty() {
            continue;
        }
        let more = of_case.iter().filter(|o| o.measured.runs > 1).count();
        let others: Vec<&Launcher> = of_case.iter().flat_map(|o| &o.others).collect();
        let others_more = others.iter().filter(|l| l.runs > 1).count();
        out += &format!(
            "{case}: {more} of {} measured launchers ran more than once",
            of_case.len()
        );
        if !others.is_empty() {
            out += &format!(
                "; {others_more} of {} launchers beside them; all launchers: {} of {}",
                others.len(),
                more + others_more,
                of_case.len() + others.len()
            );
        }
        out += "\n";
    }
    for o in outcomes {
        for l in std::iter::once(&o.measured).chain(&o.others) {
            for log in &l.failed_logs {
                out += &format!(
                    "failed run, {} run {} {}/{}: {}\n",
                    o.case,
                    o.run,
                    o.ns,
                    l.name,
                    first_lines(log, 4)
                );
            }
        }
        for event in &o.launcher_failed {
            out += &format!(
                "LauncherFailed, {} run {} {}: {}\n",
                o.case,
                o.run,
                o.ns,
                first_lines(event, 3)
            );
        }
    }
    out
}

/// The measurement: `MEASURE_RUNS` (default 10) runs of each case in `MEASURE_CASES` (default
/// `idle,busy`). Fails only when a TrainJob does not reach `Complete`.
#[tokio::test]
#[ignore = "a measurement of kubeflow/trainer#3783 (minutes); run with -- --ignored"]
async fn launcher_first_runs_idle_and_busy() {
    let Some((cluster, _trainer)) = cluster_with("v2.3").await else {
        return;
    };
    let runs: usize = env_or("MEASURE_RUNS", 10);
    let cases = std::env::var("MEASURE_CASES").unwrap_or_else(|_| "idle,busy".into());
    let mut outcomes = Vec::new();
    for case in ["idle", "busy"] {
        if !cases.split(',').any(|c| c.trim() == case) {
            continue;
        }
        let others = if case == "busy" { 2 } else { 0 };
        for run in 1..=runs {
            outcomes.push(one_run(cluster, case, run, others).await);
        }
    }
    eprintln!("{}", summary(&outcomes));
}
