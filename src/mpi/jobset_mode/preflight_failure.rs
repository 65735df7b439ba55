//! JobSet mode: a launcher pre-flight that gave up, read from its Pod's status, and the Warning
//! Event that says so on the JobSet (docs/jobset-mode.md "When it does not start"). Pure: the
//! reconciler's launcher-Pod watch (`src/reconciler/preflight.rs`) does the I/O.
//!
//! One Event per termination of the `mpi-preflight` init container with a non-zero exit code:
//! its name is made of the Pod's UID and the run that failed, so it is the same Event on every
//! resync and after a reconciler restart (a second create is refused as `AlreadyExists`), and a
//! new one after each restart of the container or for each new Pod.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::super::{JOBSET_NAME_LABEL, LAUNCHER, PREFLIGHT_CONTAINER};

/// Label JobSet puts on every Job and Pod of a JobSet: the replicatedJob's name. The reconciler
/// watches the Pods with `launcher` here.
pub const REPLICATED_JOB_LABEL: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// The Event's reason.
pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
/// Longest Event note, in bytes: what `events.k8s.io/v1` accepts (1 kB).
pub const NOTE_MAX_BYTES: usize = 1024;

/// The label selector of the Pods the reconciler watches: every JobSet's launcher Pods (JobSet
/// does not copy the JobSet's own labels to its Pods, so JobSet mode cannot be selected here).
pub fn launcher_pod_selector() -> String {
    format!("{REPLICATED_JOB_LABEL}={LAUNCHER}")
}

/// One run of a launcher Pod's `mpi-preflight` that exited with a non-zero code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightFailure {
    /// The Pod's namespace.
    pub namespace: String,
    /// The JobSet's name (the Pod's `jobset.sigs.k8s.io/jobset-name`).
    pub jobset: String,
    /// The Pod's name.
    pub pod: String,
    /// The Pod's UID.
    pub pod_uid: String,
    /// Which run failed: 0 for the first, `n` after `n` restarts of the container.
    pub run: i32,
    /// The exit code (never 0).
    pub exit_code: i32,
    /// The termination message, trimmed; empty when the container left none.
    pub message: String,
    /// The termination reason (`Error`, `OOMKilled`, ...); may be empty.
    pub reason: String,
}

impl PreflightFailure {
    /// The Event's name: the same for the same run of the same Pod, whoever records it.
    pub fn event_name(&self) -> String {
        format!("{}.preflight-{}", self.pod_uid, self.run)
    }

    /// The Event's note: the termination message (which names the host that was not ready and
    /// why), or the exit code and reason when there is none; at most [`NOTE_MAX_BYTES`].
    pub fn note(&self) -> String {
        let note = if self.message.is_empty() {
            let reason = match self.reason.as_str() {
                "" => String::new(),
                reason => format!(" ({reason})"),
            };
            format!(
                "{PREFLIGHT_CONTAINER} in Pod {} exited with code {}{reason}",
                self.pod, self.exit_code
            )
        } else {
            self.message.clone()
        };
        bounded(note, NOTE_MAX_BYTES)
    }

    /// The Warning Event on `jobset` (its object reference, UID included), related to the Pod,
    /// reported by `controller`/`instance` at `now`.
    pub fn event(
        &self,
        jobset: ObjectReference,
        controller: &str,
        instance: &str,
        now: Timestamp,
    ) -> Event {
        let pod = ObjectReference {
            api_version: Some(Pod::api_version(&()).into_owned()),
            kind: Some(Pod::kind(&()).into_owned()),
            name: Some(self.pod.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.pod_uid.clone()),
            field_path: Some(format!("spec.initContainers{{{PREFLIGHT_CONTAINER}}}")),
            ..ObjectReference::default()
        };
        Event {
            metadata: ObjectMeta {
                name: Some(self.event_name()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some("Preflight".into()),
            reason: Some(PREFLIGHT_FAILED.into()),
            type_: Some("Warning".into()),
            note: Some(self.note()),
            regarding: Some(jobset),
            related: Some(pod),
            event_time: Some(MicroTime(now)),
            reporting_controller: Some(controller.into()),
            reporting_instance: Some(instance.into()),
            ..Event::default()
        }
    }
}

/// The failed runs of `pod`'s `mpi-preflight` init container its status still shows (the
/// current state and the one before the last restart; at most two), when `pod` is a launcher Pod
/// of a JobSet. Fields the status lacks mean no failure, never an error.
pub fn preflight_failures(pod: &Pod) -> Vec<PreflightFailure> {
    let labels = pod.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let (Some(jobset), Some(LAUNCHER)) = (label(JOBSET_NAME_LABEL), label(REPLICATED_JOB_LABEL))
    else {
        return Vec::new();
    };
    let (Some(namespace), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_ref(),
        pod.metadata.name.as_ref(),
        pod.metadata.uid.as_ref(),
    ) else {
        return Vec::new();
    };
    let Some(status) = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|all| all.iter().find(|s| s.name == PREFLIGHT_CONTAINER))
    else {
        return Vec::new();
    };
    failed_runs(status)
        .into_iter()
        .map(|(run, terminated)| PreflightFailure {
            namespace: namespace.clone(),
            jobset: jobset.to_string(),
            pod: name.clone(),
            pod_uid: uid.clone(),
            run,
            exit_code: terminated.exit_code,
            message: bounded(
                terminated
                    .message
                    .as_deref()
                    .unwrap_or_default()
                    .trim()
                    .into(),
                NOTE_MAX_BYTES,
            ),
            reason: bounded(terminated.reason.clone().unwrap_or_default(), 64),
        })
        .collect()
}

/// The non-zero terminations in `status` with the run each ended: the current state is run
/// `restartCount`, the last state (kept by kubelet over one restart) the run before it.
fn failed_runs(status: &ContainerStatus) -> Vec<(i32, &ContainerStateTerminated)> {
    let restarts = status.restart_count.max(0);
    let current = status.state.as_ref().and_then(|s| s.terminated.as_ref());
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    let mut runs = Vec::new();
    if let (Some(terminated), true) = (last, restarts > 0) {
        runs.push((restarts - 1, terminated));
    }
    if let Some(terminated) = current {
        runs.push((restarts, terminated));
    }
    runs.retain(|(_, t)| t.exit_code != 0);
    runs
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` where it was cut.
fn bounded(text: String, max: usize) -> String {
    const CUT: &str = "…";
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(CUT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &text[..end])
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    use super::*;

    fn pod(init_statuses: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "pi-launcher-0-0-abcde", "namespace": "team", "uid": "u-1",
                "labels": {"jobset.sigs.k8s.io/jobset-name": "pi",
                           "jobset.sigs.k8s.io/replicatedjob-name": "launcher"}},
            "status": {"initContainerStatuses": init_statuses}
        }))
        .expect("Pod")
    }

    fn terminated(code: i32, message: &str) -> Value {
        json!({"terminated": {"exitCode": code, "reason": "Error", "message": message,
                              "finishedAt": "2026-12-06T10:00:00Z"}})
    }

    fn preflight(restarts: i32, state: Value, last: Value) -> Value {
        json!({"name": "mpi-preflight", "image": "i", "imageID": "", "ready": false,
               "restartCount": restarts, "state": state, "lastState": last})
    }

    fn runs(pod: &Pod) -> Vec<(i32, i32, String)> {
        preflight_failures(pod)
            .into_iter()
            .map(|f| (f.run, f.exit_code, f.message))
            .collect()
    }

    const LINE: &str = "pi-node-0-1.pi: no DNS answer after 300 s";

    #[test]
    fn a_failed_first_run_is_one_failure_with_its_message() {
        let pod = pod(json!([preflight(
            0,
            terminated(1, &format!("{LINE}\n")),
            json!({})
        )]));
        let failures = preflight_failures(&pod);
        assert_eq!(
            failures,
            [PreflightFailure {
                namespace: "team".into(),
                jobset: "pi".into(),
                pod: "pi-launcher-0-0-abcde".into(),
                pod_uid: "u-1".into(),
                run: 0,
                exit_code: 1,
                message: LINE.into(),
                reason: "Error".into(),
            }]
        );
        assert_eq!(failures[0].event_name(), "u-1.preflight-0");
        assert_eq!(failures[0].note(), LINE);
    }

    #[test]
    fn exit_zero_and_running_and_waiting_are_no_failure() {
        for state in [
            terminated(0, ""),
            json!({"running": {"startedAt": "2026-12-06T10:00:00Z"}}),
            json!({"waiting": {"reason": "PodInitializing"}}),
            json!({}),
        ] {
            assert_eq!(runs(&pod(json!([preflight(0, state, json!({}))]))), []);
        }
    }

    #[test]
    fn another_init_container_failing_is_none_of_ours() {
        let mut other = preflight(0, terminated(1, "nope"), json!({}));
        other["name"] = json!("mpi-ssh-setup");
        assert_eq!(runs(&pod(json!([other]))), []);
    }

    #[test]
    fn after_a_restart_the_last_state_is_the_run_before() {
        // Restarted once, running again: the failure kubelet keeps is run 0.
        let waiting = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let pod1 = pod(json!([preflight(1, waiting, terminated(1, LINE))]));
        assert_eq!(runs(&pod1), [(0, 1, LINE.to_string())]);
        // Its second run failed too: runs 0 and 1, the same names whichever status shows them.
        let pod2 = pod(json!([preflight(
            1,
            terminated(1, "again"),
            terminated(1, LINE)
        )]));
        assert_eq!(
            runs(&pod2),
            [(0, 1, LINE.to_string()), (1, 1, "again".to_string())]
        );
        // Succeeded on the second run: only the first failed.
        let pod3 = pod(json!([preflight(
            1,
            terminated(0, ""),
            terminated(2, "bad")
        )]));
        assert_eq!(runs(&pod3), [(0, 2, "bad".to_string())]);
    }

    #[test]
    fn a_status_that_lacks_fields_is_no_failure() {
        let bare: Pod = serde_json::from_value(json!({})).expect("Pod");
        assert_eq!(runs(&bare), []);
        let mut no_status = pod(json!([]));
        no_status.status = None;
        assert_eq!(runs(&no_status), []);
        assert_eq!(runs(&pod(json!([]))), []);
        // No jobset-name label, or not the launcher: not a pod of ours to report.
        let mut unlabelled = pod(json!([preflight(0, terminated(1, LINE), json!({}))]));
        unlabelled.metadata.labels = None;
        assert_eq!(runs(&unlabelled), []);
        let mut worker = pod(json!([preflight(0, terminated(1, LINE), json!({}))]));
        if let Some(labels) = worker.metadata.labels.as_mut() {
            labels.insert(REPLICATED_JOB_LABEL.into(), "node".into());
        }
        assert_eq!(runs(&worker), []);
        // A negative restart count reads as none.
        let odd = pod(json!([preflight(
            -3,
            terminated(1, LINE),
            terminated(1, "x")
        )]));
        assert_eq!(runs(&odd), [(0, 1, LINE.to_string())]);
    }

    #[test]
    fn a_megabyte_message_makes_a_note_of_at_most_1024_bytes() {
        let huge = "é".repeat(1 << 20);
        let failure =
            &preflight_failures(&pod(json!([preflight(0, terminated(1, &huge), json!({}))])))[0];
        let note = failure.note();
        assert!(note.len() <= NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.len() >= NOTE_MAX_BYTES - 4, "{} bytes", note.len());
        assert!(note.starts_with("éé") && note.ends_with('…'));
    }

    #[test]
    fn without_a_message_the_note_says_the_exit_code_and_reason() {
        let failure =
            &preflight_failures(&pod(json!([preflight(0, terminated(137, ""), json!({}))])))[0];
        assert_eq!(
            failure.note(),
            "mpi-preflight in Pod pi-launcher-0-0-abcde exited with code 137 (Error)"
        );
    }

    #[test]
    fn the_event_regards_the_jobset_and_relates_the_pod() {
        let failure =
            preflight_failures(&pod(json!([preflight(0, terminated(1, LINE), json!({}))])))
                .remove(0);
        let jobset = ObjectReference {
            api_version: Some("jobset.x-k8s.io/v1alpha2".into()),
            kind: Some("JobSet".into()),
            name: Some("pi".into()),
            namespace: Some("team".into()),
            uid: Some("js-1".into()),
            ..ObjectReference::default()
        };
        let now: Timestamp = "2026-12-06T10:00:01Z".parse().expect("time");
        let event = failure.event(jobset, "mpi-webhook", "replica-a", now);
        assert_eq!(
            serde_json::to_value(&event).expect("json"),
            json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "u-1.preflight-0", "namespace": "team"},
                "action": "Preflight",
                "reason": "PreflightFailed",
                "type": "Warning",
                "note": LINE,
                "eventTime": "2026-12-06T10:00:01.000000Z",
                "reportingController": "mpi-webhook",
                "reportingInstance": "replica-a",
                "regarding": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                              "name": "pi", "namespace": "team", "uid": "js-1"},
                "related": {"apiVersion": "v1", "kind": "Pod", "name": "pi-launcher-0-0-abcde",
                            "namespace": "team", "uid": "u-1",
                            "fieldPath": "spec.initContainers{mpi-preflight}"}
            })
        );
    }
}
