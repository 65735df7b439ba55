//! A failed run of a launcher Pod's container, read from the Pod's status, and the Warning
//! Event that says so on the job's owner (docs/operations.md "When a job fails"). Pure: the
//! reconciler's launcher-Pod watch (`src/reconciler/launcher_pods.rs`) does the I/O.
//!
//! Two containers are watched, each a [`Watched`]: JobSet mode's `mpi-preflight` init container
//! (`PreflightFailed`, on the JobSet) and the launcher container itself (`LauncherFailed`, on the
//! JobSet or, in TrainJob mode, the TrainJob). One Event per termination with a non-zero exit
//! code: its name is made of the Pod's UID, the container and the run that failed, so it is the
//! same Event on every resync and after a reconciler restart (a second create is refused as
//! `AlreadyExists`), and a new one after each restart of the container or for each new Pod.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::plan::WiredContainer;
use super::{JOBSET_NAME_LABEL, LAUNCHER, PREFLIGHT_CONTAINER};

/// Label JobSet puts on every Job and Pod of a JobSet: the replicatedJob's name. The reconciler
/// watches the Pods with `launcher` here.
pub const REPLICATED_JOB_LABEL: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// The pre-flight's Event reason.
pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
/// The launcher container's Event reason.
pub const LAUNCHER_FAILED: &str = "LauncherFailed";
/// Longest Event note, in bytes: what `events.k8s.io/v1` accepts (1 kB).
pub const NOTE_MAX_BYTES: usize = 1024;
/// The termination reason kubelet gives a container the kernel killed for its memory limit.
const OOM_KILLED: &str = "OOMKilled";

/// The label selector of the Pods the reconciler watches: every JobSet's Pods, its launchers'
/// for failed runs and its workers' for lost workers ([`super::lost_worker`]). JobSet does not
/// copy the JobSet's own labels to its Pods, so JobSet mode cannot be selected here.
pub fn jobset_pod_selector() -> String {
    REPLICATED_JOB_LABEL.to_string()
}

/// Which container of a launcher Pod is watched for failed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched<'w> {
    /// JobSet mode's `mpi-preflight` init container.
    Preflight,
    /// The launcher container: the one the policy wires (in TrainJob mode, `node`).
    Launcher(&'w WiredContainer),
}

/// What each watched container's Events say, besides the note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `mpi-preflight`: [`PREFLIGHT_FAILED`].
    Preflight,
    /// The launcher container: [`LAUNCHER_FAILED`].
    Launcher,
}

impl Kind {
    /// The Event's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Kind::Preflight => PREFLIGHT_FAILED,
            Kind::Launcher => LAUNCHER_FAILED,
        }
    }

    /// The Event's action.
    fn action(self) -> &'static str {
        match self {
            Kind::Preflight => "Preflight",
            Kind::Launcher => "Launch",
        }
    }

    /// The part of the Event's name between the Pod's UID and the run.
    fn infix(self) -> &'static str {
        match self {
            Kind::Preflight => "preflight",
            Kind::Launcher => "launcher",
        }
    }

    /// The Pod spec's list the container is in.
    fn list(self) -> &'static str {
        match self {
            Kind::Preflight => "initContainers",
            Kind::Launcher => "containers",
        }
    }
}

/// One run of a launcher Pod's watched container that exited with a non-zero code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRun {
    /// Which container.
    pub kind: Kind,
    /// The container's name.
    pub container: String,
    /// The Pod's namespace.
    pub namespace: String,
    /// The JobSet's name (the Pod's `jobset.sigs.k8s.io/jobset-name`; in TrainJob mode also
    /// the TrainJob's).
    pub jobset: String,
    /// The Pod's name.
    pub pod: String,
    /// The Pod's UID.
    pub pod_uid: String,
    /// Which run failed: 0 for the first, `n` after `n` restarts of the container.
    pub run: i32,
    /// The exit code (never 0).
    pub exit_code: i32,
    /// The termination message, trimmed and bounded (its start for the pre-flight, whose first
    /// line names the host; its end for the launcher, whose last lines say why); empty when the
    /// container left none.
    pub message: String,
    /// The termination reason (`Error`, `OOMKilled`, ...); may be empty.
    pub reason: String,
}

impl FailedRun {
    /// The Event's name: the same for the same run of the same Pod, whoever records it.
    pub fn event_name(&self) -> String {
        format!("{}.{}-{}", self.pod_uid, self.kind.infix(), self.run)
    }

    /// The Event's note, at most [`NOTE_MAX_BYTES`]. The pre-flight's: its termination message
    /// (which names the host that was not ready and why), or the exit code and reason when there
    /// is none. The launcher's: the exit code, `OOMKilled` said plainly, then the end of its
    /// output.
    pub fn note(&self) -> String {
        let exited = format!(
            "{} in Pod {} exited with code {}",
            self.container, self.pod, self.exit_code
        );
        let reason = match self.reason.as_str() {
            OOM_KILLED => {
                ": OOMKilled, out of memory (killed for going over its memory limit)".to_string()
            }
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        match (self.kind, self.message.is_empty()) {
            (Kind::Preflight, false) => bounded(self.message.clone(), NOTE_MAX_BYTES),
            (Kind::Preflight, true) | (Kind::Launcher, true) => {
                bounded(format!("{exited}{reason}"), NOTE_MAX_BYTES)
            }
            (Kind::Launcher, false) => {
                let head = format!("{exited}{reason}; its last output:\n");
                let room = NOTE_MAX_BYTES.saturating_sub(head.len());
                bounded(
                    format!("{head}{}", tail(&self.message, room)),
                    NOTE_MAX_BYTES,
                )
            }
        }
    }

    /// The Warning Event on the job's owner `regarding` (its object reference, UID included),
    /// related to the Pod's container, reported by `controller`/`instance` at `now`.
    pub fn event(
        &self,
        regarding: ObjectReference,
        controller: &str,
        instance: &str,
        now: Timestamp,
    ) -> Event {
        let mut pod = pod_reference(&self.namespace, &self.pod, &self.pod_uid);
        pod.field_path = Some(format!("spec.{}{{{}}}", self.kind.list(), self.container));
        warning_event(
            WarningEvent {
                name: self.event_name(),
                reason: self.kind.reason(),
                action: self.kind.action(),
                note: self.note(),
            },
            regarding,
            pod,
            (controller, instance),
            now,
        )
    }
}

/// What tells one of the reconciler's fixed-name Warning Events from another.
pub(crate) struct WarningEvent {
    /// Its name, fixed by what it reports, so that a second create is `AlreadyExists`.
    pub name: String,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// The reference of Pod `name` (UID `uid`) in `namespace`, an Event's related object.
pub(crate) fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(Pod::api_version(&()).into_owned()),
        kind: Some(Pod::kind(&()).into_owned()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: Some(uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// The Warning Event `event` on `regarding`, related to the Pod `related` (in whose namespace
/// it is made), reported by `reporter` (controller, instance) at `now`.
pub(crate) fn warning_event(
    event: WarningEvent,
    regarding: ObjectReference,
    related: ObjectReference,
    (controller, instance): (&str, &str),
    now: Timestamp,
) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(event.name),
            namespace: related.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(event.action.into()),
        reason: Some(event.reason.into()),
        type_: Some("Warning".into()),
        note: Some(event.note),
        regarding: Some(regarding),
        related: Some(related),
        event_time: Some(MicroTime(now)),
        reporting_controller: Some(controller.into()),
        reporting_instance: Some(instance.into()),
        ..Event::default()
    }
}

/// The JobSet a launcher Pod belongs to (its `jobset.sigs.k8s.io/jobset-name`), when `pod` is
/// a launcher Pod of a JobSet.
pub fn launcher_pod_jobset(pod: &Pod) -> Option<&str> {
    let labels = pod.metadata.labels.as_ref()?;
    match labels.get(REPLICATED_JOB_LABEL).map(String::as_str) {
        Some(LAUNCHER) => labels.get(JOBSET_NAME_LABEL).map(String::as_str),
        _ => None,
    }
}

/// Whether any container of `pod` shows a non-zero exit, now or before its last restart: the
/// cheap test before the owner of a launcher Pod is looked up.
pub fn has_failed_container(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let failed = |s: &ContainerStatus| !failed_runs_of(s).is_empty();
    [&status.init_container_statuses, &status.container_statuses]
        .into_iter()
        .flatten()
        .flatten()
        .any(failed)
}

/// The failed runs of `pod`'s `watched` container its status still shows (the current state
/// and the one before the last restart; at most two), when `pod` is a launcher Pod of a
/// JobSet. Fields the status lacks mean no failure, never an error.
pub fn failed_runs(pod: &Pod, watched: Watched<'_>) -> Vec<FailedRun> {
    let Some(jobset) = launcher_pod_jobset(pod) else {
        return Vec::new();
    };
    let (Some(namespace), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_ref(),
        pod.metadata.name.as_ref(),
        pod.metadata.uid.as_ref(),
    ) else {
        return Vec::new();
    };
    let status = pod.status.as_ref();
    let (kind, container, statuses) = match watched {
        Watched::Preflight => (
            Kind::Preflight,
            Some(PREFLIGHT_CONTAINER),
            status.and_then(|s| s.init_container_statuses.as_ref()),
        ),
        Watched::Launcher(wired) => (
            Kind::Launcher,
            // The Pod's own spec says which container is the wired one (by name or first).
            pod.spec.as_ref().and_then(|spec| {
                let names = spec.containers.iter().map(|c| c.name.as_str());
                wired
                    .index_in(names)
                    .map(|i| spec.containers[i].name.as_str())
            }),
            status.and_then(|s| s.container_statuses.as_ref()),
        ),
    };
    let Some(status) = container
        .and_then(|container| statuses.and_then(|all| all.iter().find(|s| s.name == container)))
    else {
        return Vec::new();
    };
    failed_runs_of(status)
        .into_iter()
        .map(|(run, terminated)| {
            let message = terminated.message.as_deref().unwrap_or_default().trim();
            FailedRun {
                kind,
                container: status.name.clone(),
                namespace: namespace.clone(),
                jobset: jobset.to_string(),
                pod: name.clone(),
                pod_uid: uid.clone(),
                run,
                exit_code: terminated.exit_code,
                message: match kind {
                    Kind::Preflight => bounded(message.into(), NOTE_MAX_BYTES),
                    Kind::Launcher => tail(message, NOTE_MAX_BYTES),
                },
                reason: bounded(terminated.reason.clone().unwrap_or_default(), 64),
            }
        })
        .collect()
}

/// The non-zero terminations in `status` with the run each ended: the current state is run
/// `restartCount`, the last state (kept by kubelet over one restart) the run before it.
fn failed_runs_of(status: &ContainerStatus) -> Vec<(i32, &ContainerStateTerminated)> {
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

const CUT: &str = "…";

/// `text` cut to at most `max` bytes at a character boundary, with `…` where it was cut.
pub(crate) fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(CUT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &text[..end])
}

/// How far into a cut tail a line break may be for the tail to start after it instead: a
/// whole first line reads better than its end, but not at the price of most of the text.
const LINE_SNAP: usize = 128;

/// The end of `text` in at most `max` bytes, with `…` first where it was cut: a failed
/// program's last lines say why. The cut is at a character boundary, and after a line break
/// when one is near.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max.saturating_sub(CUT.len());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let rest = &text[start..];
    let rest = match rest.find('\n') {
        Some(at) if at < LINE_SNAP && at + 1 < rest.len() => &rest[at + 1..],
        _ => rest,
    };
    format!("{CUT}{rest}")
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
        failed_runs(pod, Watched::Preflight)
            .into_iter()
            .map(|f| (f.run, f.exit_code, f.message))
            .collect()
    }

    const LINE: &str = "pi-node-0-1.pi: no DNS answer after 300 s";

    /// The reference of owner `pi` in `team`.
    fn owner(api_version: &str, kind: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some("pi".into()),
            namespace: Some("team".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn a_failed_first_run_is_one_failure_with_its_message() {
        let pod = pod(json!([preflight(
            0,
            terminated(1, &format!("{LINE}\n")),
            json!({})
        )]));
        let failures = failed_runs(&pod, Watched::Preflight);
        assert_eq!(
            failures,
            [FailedRun {
                kind: Kind::Preflight,
                container: "mpi-preflight".into(),
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
        let failure = &failed_runs(
            &pod(json!([preflight(0, terminated(1, &huge), json!({}))])),
            Watched::Preflight,
        )[0];
        let note = failure.note();
        assert!(note.len() <= NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.len() >= NOTE_MAX_BYTES - 4, "{} bytes", note.len());
        assert!(note.starts_with("éé") && note.ends_with('…'));
    }

    #[test]
    fn without_a_message_the_note_says_the_exit_code_and_reason() {
        let failure = &failed_runs(
            &pod(json!([preflight(0, terminated(137, ""), json!({}))])),
            Watched::Preflight,
        )[0];
        assert_eq!(
            failure.note(),
            "mpi-preflight in Pod pi-launcher-0-0-abcde exited with code 137 (Error)"
        );
    }

    #[test]
    fn the_event_regards_the_jobset_and_relates_the_pod() {
        let failure = failed_runs(
            &pod(json!([preflight(0, terminated(1, LINE), json!({}))])),
            Watched::Preflight,
        )
        .remove(0);
        let jobset = owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js-1");
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

    // The launcher container.

    /// A launcher Pod of `pi` whose containers are `log` then `launcher`, with `statuses`.
    fn launcher_pod(statuses: Value) -> Pod {
        let mut pod = pod(json!([]));
        pod.spec = Some(
            serde_json::from_value(json!({"containers": [
                {"name": "log", "image": "l"}, {"name": "launcher", "image": "mpi"}]}))
            .expect("PodSpec"),
        );
        if let Some(status) = pod.status.as_mut() {
            status.container_statuses =
                Some(serde_json::from_value(statuses).expect("container statuses"));
        }
        pod
    }

    fn container_status(name: &str, restarts: i32, state: Value, last: Value) -> Value {
        let mut status = preflight(restarts, state, last);
        status["name"] = json!(name);
        status
    }

    const LAUNCHER_NAMED: WiredContainer = WiredContainer::NamedNode;

    fn launcher_runs(pod: &Pod, wired: &WiredContainer) -> Vec<(String, i32, i32, String)> {
        failed_runs(pod, Watched::Launcher(wired))
            .into_iter()
            .map(|f| (f.container.clone(), f.run, f.exit_code, f.note()))
            .collect()
    }

    const OUTPUT: &str = "rank 1: MPI_ABORT was invoked with errorcode 3";

    #[test]
    fn a_failed_launcher_run_is_one_failure_whose_note_has_the_code_and_the_output() {
        let pod = launcher_pod(json!([
            container_status("log", 0, terminated(1, "not ours"), json!({})),
            container_status(
                "launcher",
                0,
                terminated(3, &format!("{OUTPUT}\n")),
                json!({})
            ),
        ]));
        let named = WiredContainer::Named("launcher".into());
        let failures = failed_runs(&pod, Watched::Launcher(&named));
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].kind, Kind::Launcher);
        assert_eq!(failures[0].event_name(), "u-1.launcher-0");
        assert_eq!(
            failures[0].note(),
            format!(
                "launcher in Pod pi-launcher-0-0-abcde exited with code 3 (Error); its last output:\n{OUTPUT}"
            )
        );
        // The wired container is found by the Pod's own spec: the first is `log` here.
        assert_eq!(
            launcher_runs(&pod, &WiredContainer::First),
            [(
                "log".to_string(),
                0,
                1,
                "log in Pod pi-launcher-0-0-abcde exited with code 1 (Error); its last output:\nnot ours"
                    .to_string()
            )]
        );
        // TrainJob mode wires the container named `node`: none here, so nothing.
        assert_eq!(launcher_runs(&pod, &LAUNCHER_NAMED), []);
    }

    #[test]
    fn an_oom_killed_launcher_says_so() {
        let oom = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
        let pod = launcher_pod(json!([container_status("node", 0, oom, json!({}))]));
        let mut pod = pod;
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[1].name = "node".into();
        }
        assert_eq!(
            launcher_runs(&pod, &LAUNCHER_NAMED),
            [(
                "node".to_string(),
                0,
                137,
                "node in Pod pi-launcher-0-0-abcde exited with code 137: OOMKilled, out of memory (killed for going over its memory limit)".to_string()
            )]
        );
    }

    #[test]
    fn each_launcher_run_is_named_apart_and_success_is_none() {
        let named = WiredContainer::Named("launcher".into());
        let waiting = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let restarted = launcher_pod(json!([container_status(
            "launcher",
            2,
            waiting,
            terminated(3, "second")
        )]));
        let names: Vec<String> = failed_runs(&restarted, Watched::Launcher(&named))
            .iter()
            .map(FailedRun::event_name)
            .collect();
        assert_eq!(names, ["u-1.launcher-1"]);
        for state in [
            terminated(0, "done"),
            json!({"running": {"startedAt": "2026-12-06T10:00:00Z"}}),
            json!({}),
        ] {
            let pod = launcher_pod(json!([container_status("launcher", 0, state, json!({}))]));
            assert_eq!(launcher_runs(&pod, &named), []);
            assert!(!has_failed_container(&pod));
        }
        assert!(has_failed_container(&restarted));
        // A Pod without a spec or without statuses: no failure, no panic.
        let mut no_spec = restarted.clone();
        no_spec.spec = None;
        assert_eq!(launcher_runs(&no_spec, &named), []);
        let mut no_status = restarted;
        no_status.status = None;
        assert_eq!(launcher_runs(&no_status, &named), []);
        assert!(!has_failed_container(&no_status));
    }

    /// The note of a `launcher` container (wired by name) that exited with `code` and left
    /// `message`.
    fn launcher_note(code: i32, message: &str) -> String {
        let named = WiredContainer::Named("launcher".into());
        let pod = launcher_pod(json!([container_status(
            "launcher",
            0,
            terminated(code, message),
            json!({})
        )]));
        failed_runs(&pod, Watched::Launcher(&named))
            .remove(0)
            .note()
    }

    #[test]
    fn the_launcher_note_keeps_the_end_of_any_output_within_1024_bytes() {
        // 2 KiB of multi-byte text, as kubelet keeps at most, then the line that says why.
        let output = format!("{}\nfatal: out of disk", "日本".repeat(400));
        let note = launcher_note(1, &output);
        assert!(note.len() <= NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.len() >= NOTE_MAX_BYTES - 4, "{} bytes", note.len());
        assert!(
            note.starts_with("launcher in Pod pi-launcher-0-0-abcde exited with code 1 (Error); its last output:\n…日"),
            "{note}"
        );
        assert!(note.ends_with("\nfatal: out of disk"), "{note}");
        // Control characters and invalid-looking text are passed as they are, bounded.
        let odd = "\u{0}\u{7f}\u{202e}x".repeat(500);
        assert!(launcher_note(1, &odd).len() <= NOTE_MAX_BYTES);
    }

    #[test]
    fn a_cut_output_starts_at_a_whole_line_when_one_starts_near_the_cut() {
        let output = format!("{}done: exit 3", "step 1 of 1000 done\n".repeat(100));
        let note = launcher_note(3, &output);
        let (_, tail) = note.split_once("its last output:\n").expect("the output");
        assert!(tail.starts_with("…step 1 of 1000 done\n"), "{tail}");
        assert!(tail.ends_with("done: exit 3"), "{tail}");
        assert!(note.len() <= NOTE_MAX_BYTES && note.len() > NOTE_MAX_BYTES - 21);
    }

    #[test]
    fn the_launcher_event_names_its_container() {
        let named = WiredContainer::Named("launcher".into());
        let pod = launcher_pod(json!([container_status(
            "launcher",
            0,
            terminated(3, OUTPUT),
            json!({})
        )]));
        let train_job = owner("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj-1");
        let now: Timestamp = "2026-12-06T10:00:01Z".parse().expect("time");
        let event = failed_runs(&pod, Watched::Launcher(&named))
            .remove(0)
            .event(train_job, "mpi-webhook", "replica-a", now);
        let json = serde_json::to_value(&event).expect("json");
        assert_eq!(json["metadata"]["name"], "u-1.launcher-0");
        assert_eq!(json["reason"], "LauncherFailed");
        assert_eq!(json["action"], "Launch");
        assert_eq!(json["type"], "Warning");
        assert_eq!(json["regarding"]["kind"], "TrainJob");
        assert_eq!(json["related"]["fieldPath"], "spec.containers{launcher}");
    }
}
