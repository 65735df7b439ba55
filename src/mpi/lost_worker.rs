//! A worker lost before its launcher finished, read from the worker Pod's status, and the
//! Warning Event `WorkerLost` that says so on the job's owner (docs/operations.md "When a worker
//! is lost"). Pure: the reconciler's Pod watch (`src/reconciler/launcher_pods.rs`) does the I/O.
//!
//! A worker is lost when its Pod is evicted, preempted, loses its node, is deleted, or one of its
//! containers ends with a non-zero code (OOM-killed included), all while its JobSet still runs the
//! attempt the Pod belongs to. The JobSet's own teardown (after it completed or failed, when it
//! restarts, is suspended or is deleted) ends its workers the same way, so each candidate is
//! checked against the JobSet as the API server has it then ([`JobSetProgress::runs_attempt_of`]):
//! JobSet writes its status before it deletes a Job.
//!
//! One Event per attempt of the job, naming the first worker lost in it: once one worker is
//! gone its Job fails, and the Job controller deletes that Job's other Pods before JobSet has
//! restarted or failed the JobSet, so a later loss in the same attempt is almost always that
//! teardown, not a loss of its own. The Event's name is the owner's UID and the attempt, so a
//! relist, a resync, a restarted reconciler or a second lost Pod gets `AlreadyExists`.

use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodCondition};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::failed_run::{
    NOTE_MAX_BYTES, REPLICATED_JOB_LABEL, WarningEvent, bounded, pod_reference, warning_event,
};
use super::{JOBSET_NAME_LABEL, LAUNCHER};

/// The Event's reason.
pub const WORKER_LOST: &str = "WorkerLost";
/// The label JobSet puts on its Jobs and Pods: the restart attempt they belong to.
pub const RESTART_ATTEMPT_LABEL: &str = "jobset.sigs.k8s.io/restart-attempt";
/// The Pod condition the control plane sets before it ends a Pod for a disruption.
const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// The termination reason kubelet gives a container the kernel killed for its memory limit.
const OOM_KILLED: &str = "OOMKilled";

/// A worker Pod of a JobSet: not its launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerPod<'p> {
    /// The JobSet's name (in TrainJob mode also the TrainJob's).
    pub jobset: &'p str,
    /// The replicatedJob the Pod is of: `node`, or a worker group's name.
    pub replicated_job: &'p str,
}

/// The JobSet and replicatedJob of `pod` when it is a Pod of a JobSet's replicatedJob other than
/// the launcher.
pub fn worker_pod(pod: &Pod) -> Option<WorkerPod<'_>> {
    let labels = pod.metadata.labels.as_ref()?;
    let replicated_job = labels.get(REPLICATED_JOB_LABEL)?;
    if replicated_job == LAUNCHER {
        return None;
    }
    Some(WorkerPod {
        jobset: labels.get(JOBSET_NAME_LABEL)?,
        replicated_job,
    })
}

/// Why a worker was lost, from the first sign its Pod shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Evicted through the Eviction API (`kubectl drain`, a descheduler).
    Evicted { message: String },
    /// Preempted by the scheduler for a Pod of higher priority (Kueue's preemption suspends the
    /// JobSet instead, which is no loss).
    Preempted { message: String },
    /// Its node went away: the node's `NoExecute` taint or the Pod garbage collector ended it.
    NodeLost { reason: String, message: String },
    /// The kubelet ended it: node-pressure eviction or a node shutting down.
    TerminatedByKubelet { message: String },
    /// Another disruption the control plane named.
    Disrupted { reason: String, message: String },
    /// A container was killed for going over its memory limit.
    OomKilled { container: String },
    /// Deleted, with no disruption named: `kubectl delete pod`, or any other client.
    Deleted,
    /// A container ended with a non-zero code (killed, crashed, or its sshd stopped).
    Exited {
        container: String,
        code: i32,
        reason: String,
    },
    /// The Pod failed without a container's word (the kubelet's `Evicted`, for one).
    Failed { reason: String, message: String },
}

impl Cause {
    /// The part of the note after the Pod's name.
    fn says(&self) -> String {
        let with = |message: &str| {
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        };
        match self {
            Cause::Evicted { message } => {
                format!(
                    "was evicted through the Eviction API (kubectl drain){}",
                    with(message)
                )
            }
            Cause::Preempted { message } => {
                format!("was preempted by the scheduler{}", with(message))
            }
            Cause::NodeLost { reason, message } => {
                format!("lost its node ({reason}){}", with(message))
            }
            Cause::TerminatedByKubelet { message } => {
                format!("was terminated by its node's kubelet{}", with(message))
            }
            Cause::Disrupted { reason, message } => {
                format!("was disrupted ({reason}){}", with(message))
            }
            Cause::OomKilled { container } => {
                format!("was OOM-killed: {container} went over its memory limit (exit code 137)")
            }
            Cause::Deleted => "was deleted".into(),
            Cause::Exited {
                container,
                code,
                reason,
            } => {
                let reason = if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                };
                format!("stopped: {container} exited with code {code}{reason}")
            }
            Cause::Failed { reason, message } => format!("failed ({reason}){}", with(message)),
        }
    }
}

/// A worker Pod lost while its JobSet ran it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWorker {
    /// The Pod's namespace.
    pub namespace: String,
    /// The JobSet's name.
    pub jobset: String,
    /// The Pod's name.
    pub pod: String,
    /// The Pod's UID.
    pub pod_uid: String,
    /// The node it ran on, when it was scheduled.
    pub node: Option<String>,
    /// The JobSet's restart attempt the Pod belongs to (its `restart-attempt` label; 0 without).
    pub attempt: i64,
    pub cause: Cause,
}

/// The loss `pod`, a worker Pod, shows, if any: a `DisruptionTarget` condition, an OOM kill, a
/// deletion, a container's non-zero exit (now or before its last restart) or a failed phase, in
/// that order. A Pod that shows none of these (running, pending, or ended with 0) is not lost.
pub fn lost_worker(pod: &Pod) -> Option<LostWorker> {
    let worker = worker_pod(pod)?;
    let metadata = &pod.metadata;
    let (namespace, name, uid) = (
        metadata.namespace.as_ref()?,
        metadata.name.as_ref()?,
        metadata.uid.as_ref()?,
    );
    let cause = cause(pod)?;
    Some(LostWorker {
        attempt: attempt(pod)?,
        namespace: namespace.clone(),
        jobset: worker.jobset.to_string(),
        pod: name.clone(),
        pod_uid: uid.clone(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        cause,
    })
}

/// What `pod` shows of a loss, first sign first.
fn cause(pod: &Pod) -> Option<Cause> {
    let status = pod.status.as_ref();
    let disruption = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True");
    if let Some(condition) = disruption {
        return Some(disrupted(condition));
    }
    let terminations = status
        .into_iter()
        .flat_map(|s| [&s.init_container_statuses, &s.container_statuses])
        .flatten()
        .flatten()
        .flat_map(|s| {
            let current = s.state.as_ref().and_then(|t| t.terminated.as_ref());
            let last = s.last_state.as_ref().and_then(|t| t.terminated.as_ref());
            [current, last].into_iter().flatten().map(|t| (&s.name, t))
        })
        .filter(|(_, t)| t.exit_code != 0)
        .collect::<Vec<_>>();
    let oom = terminations
        .iter()
        .find(|(_, t)| t.reason.as_deref() == Some(OOM_KILLED));
    if let Some((container, _)) = oom {
        return Some(Cause::OomKilled {
            container: (*container).clone(),
        });
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(Cause::Deleted);
    }
    if let Some((container, terminated)) = terminations.first() {
        return Some(Cause::Exited {
            container: (*container).clone(),
            code: terminated.exit_code,
            reason: bounded(terminated.reason.clone().unwrap_or_default(), 64),
        });
    }
    let status = status?;
    (status.phase.as_deref() == Some("Failed")).then(|| Cause::Failed {
        reason: bounded(status.reason.clone().unwrap_or_default(), 64),
        message: bounded(status.message.clone().unwrap_or_default(), 256),
    })
}

/// The cause a `DisruptionTarget` condition names (its reasons are Kubernetes' own).
fn disrupted(condition: &PodCondition) -> Cause {
    let reason = condition.reason.clone().unwrap_or_default();
    let message = bounded(condition.message.clone().unwrap_or_default(), 256);
    match reason.as_str() {
        "EvictionByEvictionAPI" => Cause::Evicted { message },
        "PreemptionByScheduler" | "PreemptionByKubeScheduler" => Cause::Preempted { message },
        "DeletionByTaintManager" | "DeletionByPodGC" => Cause::NodeLost { reason, message },
        "TerminationByKubelet" => Cause::TerminatedByKubelet { message },
        _ => Cause::Disrupted {
            reason: bounded(reason, 64),
            message,
        },
    }
}

/// The restart attempt `pod` belongs to: its `restart-attempt` label, 0 without one, `None`
/// when the label is not a number.
fn attempt(pod: &Pod) -> Option<i64> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(RESTART_ATTEMPT_LABEL))
        .map_or(Some(0), |a| a.parse().ok())
}

impl LostWorker {
    /// The Event's name for the owner of UID `owner_uid`: one per attempt of the job, whoever
    /// records it and whichever of its workers is seen first.
    pub fn event_name(&self, owner_uid: &str) -> String {
        format!("{owner_uid}.worker-lost-{}", self.attempt)
    }

    /// The Event's note, at most [`NOTE_MAX_BYTES`]: the Pod, what happened to it, and its node.
    pub fn note(&self) -> String {
        let node = self
            .node
            .as_deref()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        bounded(
            format!(
                "worker Pod {}{node} {} before the launcher finished",
                self.pod,
                self.cause.says()
            ),
            NOTE_MAX_BYTES,
        )
    }

    /// The Warning Event on the job's owner `regarding` (its object reference, UID included),
    /// related to the Pod, reported by `controller`/`instance` at `now`.
    pub fn event(
        &self,
        regarding: ObjectReference,
        controller: &str,
        instance: &str,
        now: Timestamp,
    ) -> Event {
        let name = self.event_name(regarding.uid.as_deref().unwrap_or_default());
        warning_event(
            WarningEvent {
                name,
                reason: WORKER_LOST,
                action: "Run",
                note: self.note(),
            },
            regarding,
            pod_reference(&self.namespace, &self.pod, &self.pod_uid),
            (controller, instance),
            now,
        )
    }
}

/// What a fresh read of a JobSet says of its run: whether it is deleted, suspended, finished, and
/// which restart attempt runs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetProgress {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ProgressSpec,
    #[serde(default)]
    pub status: ProgressStatus,
}

/// `spec`, as far as the run goes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProgressSpec {
    #[serde(default)]
    pub suspend: Option<bool>,
}

/// `status`, as far as the run goes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressStatus {
    /// How often the JobSet restarted: the attempt that runs.
    #[serde(default)]
    pub restarts: Option<i64>,
    /// `Completed` or `Failed` once the JobSet finished.
    #[serde(default)]
    pub terminal_state: Option<String>,
    #[serde(default)]
    pub conditions: Vec<ProgressCondition>,
}

/// A JobSet condition's type and status.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProgressCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
}

impl JobSetProgress {
    /// Whether the JobSet still runs the attempt `pod` belongs to: not deleted, not suspended,
    /// not finished, and its restart count the Pod's `restart-attempt` (a Pod without the label
    /// is taken as of attempt 0). Anything else ends workers on purpose.
    pub fn runs_attempt_of(&self, pod: &Pod) -> bool {
        let finished =
            self.status
                .terminal_state
                .as_deref()
                .is_some_and(|s| !s.is_empty())
                || self.status.conditions.iter().any(|c| {
                    matches!(c.type_.as_str(), "Completed" | "Failed") && c.status == "True"
                });
        self.metadata.deletion_timestamp.is_none()
            && self.spec.suspend != Some(true)
            && !finished
            && attempt(pod) == Some(self.status.restarts.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    use super::*;

    /// Worker Pod `pi-node-0-1-x` of JobSet `pi`, attempt 0, on node `n1`, with `status` and
    /// `metadata` merged in.
    fn pod(metadata: Value, status: Value) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "pi-node-0-1-x", "namespace": "team", "uid": "u-1",
                "labels": {"jobset.sigs.k8s.io/jobset-name": "pi",
                           "jobset.sigs.k8s.io/replicatedjob-name": "node",
                           "jobset.sigs.k8s.io/restart-attempt": "0"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "node"}]},
            "status": status
        });
        if let (Some(into), Some(from)) = (pod["metadata"].as_object_mut(), metadata.as_object()) {
            into.extend(from.clone());
        }
        serde_json::from_value(pod).expect("Pod")
    }

    fn running() -> Value {
        json!({"phase": "Running", "containerStatuses": [{"name": "node", "image": "i",
            "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-12-07T10:00:00Z"}}}]})
    }

    fn terminated(code: i32, reason: &str) -> Value {
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        json!({"phase": phase, "containerStatuses": [{"name": "node", "image": "i",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
    }

    fn disruption(reason: &str, message: &str) -> Value {
        let mut status = running();
        status["conditions"] = json!([{"type": "DisruptionTarget", "status": "True",
                                       "reason": reason, "message": message}]);
        status
    }

    const DELETED: &str = "2026-12-07T10:01:00Z";

    fn note(pod: &Pod) -> Option<String> {
        lost_worker(pod).map(|lost| lost.note())
    }

    #[test]
    fn a_running_worker_and_a_launcher_are_not_lost() {
        assert_eq!(lost_worker(&pod(json!({}), running())), None);
        let mut launcher = pod(json!({}), terminated(1, "Error"));
        if let Some(labels) = launcher.metadata.labels.as_mut() {
            labels.insert(REPLICATED_JOB_LABEL.into(), "launcher".into());
        }
        assert_eq!(lost_worker(&launcher), None);
        // A worker that ended with 0 (its own command, not sshd) finished; it is not lost.
        assert_eq!(
            lost_worker(&pod(json!({}), terminated(0, "Completed"))),
            None
        );
    }

    #[test]
    fn a_deleted_worker_says_it_was_deleted() {
        let deleted = pod(json!({"deletionTimestamp": DELETED}), running());
        assert_eq!(
            note(&deleted).as_deref(),
            Some("worker Pod pi-node-0-1-x on node n1 was deleted before the launcher finished")
        );
        // Its script's 143 after the SIGTERM is the deletion's, not an exit of its own.
        let ended = pod(
            json!({"deletionTimestamp": DELETED}),
            terminated(143, "Error"),
        );
        assert_eq!(lost_worker(&ended).map(|l| l.cause), Some(Cause::Deleted));
    }

    #[test]
    fn each_disruption_is_named() {
        let cases = [
            (
                "EvictionByEvictionAPI",
                "Eviction API: evicting",
                "was evicted through the Eviction API (kubectl drain): Eviction API: evicting",
            ),
            (
                "PreemptionByScheduler",
                "team/big on node n1",
                "was preempted by the scheduler: team/big on node n1",
            ),
            (
                "DeletionByTaintManager",
                "Taint manager: deleting due to NoExecute taint key node.kubernetes.io/unreachable",
                "lost its node (DeletionByTaintManager): Taint manager: deleting due to NoExecute taint key node.kubernetes.io/unreachable",
            ),
            (
                "TerminationByKubelet",
                "The node was low on resource: memory.",
                "was terminated by its node's kubelet: The node was low on resource: memory.",
            ),
            ("SomethingNew", "", "was disrupted (SomethingNew)"),
        ];
        for (reason, message, says) in cases {
            let lost = pod(
                json!({"deletionTimestamp": DELETED}),
                disruption(reason, message),
            );
            assert_eq!(
                note(&lost),
                Some(format!(
                    "worker Pod pi-node-0-1-x on node n1 {says} before the launcher finished"
                )),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_killed_or_oom_killed_container_is_a_loss() {
        // Killed and restarted in place (`restartPolicy: OnFailure`): the run before the restart.
        let mut restarted = running();
        restarted["containerStatuses"][0]["restartCount"] = json!(1);
        restarted["containerStatuses"][0]["lastState"] =
            json!({"terminated": {"exitCode": 137, "reason": "Error"}});
        assert_eq!(
            note(&pod(json!({}), restarted)).as_deref(),
            Some(
                "worker Pod pi-node-0-1-x on node n1 stopped: node exited with code 137 (Error) \
                 before the launcher finished"
            )
        );
        assert_eq!(
            note(&pod(json!({}), terminated(137, "OOMKilled"))).as_deref(),
            Some(
                "worker Pod pi-node-0-1-x on node n1 was OOM-killed: node went over its memory \
                 limit (exit code 137) before the launcher finished"
            )
        );
    }

    #[test]
    fn a_failed_pod_without_a_container_word_says_the_kubelets() {
        let status = json!({"phase": "Failed", "reason": "Evicted",
                            "message": "The node was low on resource: ephemeral-storage."});
        assert_eq!(
            note(&pod(json!({}), status)).as_deref(),
            Some(
                "worker Pod pi-node-0-1-x on node n1 failed (Evicted): The node was low on \
                 resource: ephemeral-storage. before the launcher finished"
            )
        );
    }

    #[test]
    fn the_event_is_named_by_the_owner_and_attempt_and_names_the_pod() {
        let lost =
            lost_worker(&pod(json!({"deletionTimestamp": DELETED}), running())).expect("lost");
        let regarding = ObjectReference {
            kind: Some("JobSet".into()),
            name: Some("pi".into()),
            uid: Some("js-1".into()),
            ..ObjectReference::default()
        };
        let event = lost.event(regarding.clone(), "mpi-webhook", "a", Timestamp::UNIX_EPOCH);
        assert_eq!(event.metadata.name.as_deref(), Some("js-1.worker-lost-0"));
        assert_eq!(event.reason.as_deref(), Some(WORKER_LOST));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.regarding, Some(regarding));
        let related = event.related.expect("related");
        assert_eq!(related.name.as_deref(), Some("pi-node-0-1-x"));
        assert_eq!(related.uid.as_deref(), Some("u-1"));
    }

    fn progress(value: Value) -> JobSetProgress {
        serde_json::from_value(value).expect("JobSetProgress")
    }

    #[test]
    fn only_a_running_attempt_loses_workers() {
        let worker = pod(json!({"deletionTimestamp": DELETED}), running());
        assert!(progress(json!({"metadata": {"name": "pi"}})).runs_attempt_of(&worker));
        assert!(progress(json!({"status": {"restarts": 0}})).runs_attempt_of(&worker));
        let teardown = [
            json!({"status": {"restarts": 1}}),
            json!({"status": {"terminalState": "Completed"}}),
            json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}),
            json!({"spec": {"suspend": true}}),
            json!({"metadata": {"deletionTimestamp": DELETED}}),
        ];
        for jobset in teardown {
            assert!(
                !progress(jobset.clone()).runs_attempt_of(&worker),
                "{jobset}"
            );
        }
        // A condition that is not True, or of another type, finishes nothing.
        let running = json!({"status": {"conditions": [
            {"type": "Completed", "status": "False"}, {"type": "StartupPolicyCompleted", "status": "True"}]}});
        assert!(progress(running).runs_attempt_of(&worker));
    }
}
