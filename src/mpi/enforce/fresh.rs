//! The mutation of a *fresh* JobSet, read straight from its raw JSON: the common case, a JobSet
//! as Trainer creates it, with every level down to the pod specs present and none of the MPI
//! volumes, mounts or env vars there yet.
//!
//! Such a JobSet needs no working copy and no comparison of entries: every list entry the policy
//! upserts is appended (or the list is added), and parallelism and completions are compared as
//! plain numbers. The JobSet is read into small borrowed types holding only what the policy looks
//! at, instead of a `serde_json::Value`, which makes a mutation several times cheaper (issue 6).
//!
//! Anything else is left to [`super::enforce_mpi_policy`], the reference: a JobSet this read
//! does not accept (a value of another type, a missing level, a null where an object belongs)
//! and one already holding an entry the policy owns both get `None` here. Where this path
//! answers, it answers with exactly the reference's operations; `tests/policy` checks both on
//! every JobSet it mutates.

use std::borrow::Cow;

use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::plan::MpiPlan;
use super::super::{LAUNCHER, NODE};
use super::{
    Path, Token, child, env_var, hostfile_mount, hostfile_volume, keys, pointer, ssh_auth_mount,
    ssh_auth_volume,
};

/// What the mutation reads of a JobSet. Unknown members are skipped unread; a member of another
/// JSON type than declared fails the read.
#[derive(Debug, Deserialize)]
pub struct JobSetView<'a> {
    /// The JobSet's metadata, read whole (owner references, namespace). Absent reads as empty,
    /// as in the reference; `null` fails the read, so the reference reports it.
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(borrow, default)]
    spec: Option<Spec<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    #[serde(borrow, default)]
    replicated_jobs: Option<Vec<ReplicatedJob<'a>>>,
}

#[derive(Debug, Deserialize)]
struct ReplicatedJob<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    template: Option<JobTemplate<'a>>,
}

#[derive(Debug, Deserialize)]
struct JobTemplate<'a> {
    #[serde(borrow, default)]
    spec: Option<JobSpec<'a>>,
}

#[derive(Debug, Deserialize)]
struct JobSpec<'a> {
    #[serde(default)]
    parallelism: Option<Value>,
    #[serde(default)]
    completions: Option<Value>,
    #[serde(borrow, default)]
    template: Option<PodTemplate<'a>>,
}

#[derive(Debug, Deserialize)]
struct PodTemplate<'a> {
    #[serde(borrow, default)]
    spec: Option<PodSpec<'a>>,
}

#[derive(Debug, Deserialize)]
struct PodSpec<'a> {
    #[serde(borrow, default)]
    volumes: Option<Vec<Named<'a>>>,
    #[serde(borrow, default)]
    containers: Option<Vec<Container<'a>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    volume_mounts: Option<Vec<Mount<'a>>>,
    #[serde(borrow, default)]
    env: Option<Vec<Named<'a>>>,
}

/// A volume or env var: only its name is compared.
#[derive(Debug, Deserialize)]
struct Named<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

/// A volume mount: only its mountPath is compared.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mount<'a> {
    #[serde(borrow, default)]
    mount_path: Option<Cow<'a, str>>,
}

impl<'a> JobSetView<'a> {
    /// Reads a JobSet's raw JSON, or `None` when it is not in the shape this view accepts.
    pub fn read(raw: &'a str) -> Option<Self> {
        serde_json::from_str(raw).ok()
    }
}

/// The operations of [`super::enforce_mpi_policy`] for a fresh JobSet, or `None` when the JobSet
/// is not fresh (the reference then decides).
pub fn enforce_fresh(plan: &MpiPlan, jobset: &JobSetView<'_>) -> Option<Vec<PatchOperation>> {
    let mut ops = Vec::new();
    let Some(rjobs) = jobset
        .spec
        .as_ref()
        .and_then(|s| s.replicated_jobs.as_ref())
    else {
        return Some(ops);
    };
    for (i, rjob) in rjobs.iter().enumerate() {
        let name = rjob.name.as_deref().unwrap_or_default();
        if name != LAUNCHER && name != NODE {
            continue;
        }
        let rjob_path = child(&keys(["spec", "replicatedJobs"]), &[Token::Index(i)]);
        fresh_replicated_job(&mut ops, plan, rjob, &rjob_path, name == LAUNCHER)?;
    }
    Some(ops)
}

fn fresh_replicated_job(
    ops: &mut Vec<PatchOperation>,
    plan: &MpiPlan,
    rjob: &ReplicatedJob<'_>,
    rjob_path: &[Token],
    is_launcher: bool,
) -> Option<()> {
    let job = rjob.template.as_ref()?.spec.as_ref()?;
    let pod = job.template.as_ref()?.spec.as_ref()?;
    let job_spec = child(rjob_path, &keys(["template", "spec"]));
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (false, Some(count)) = (is_launcher, plan.node_count) {
        set_count(
            ops,
            &job_spec,
            "parallelism",
            job.parallelism.as_ref(),
            count,
        );
        set_count(
            ops,
            &job_spec,
            "completions",
            job.completions.as_ref(),
            count,
        );
    }
    // C.3: volumes, by name.
    let pod_spec = child(&job_spec, &keys(["template", "spec"]));
    let mut volumes = List::new(&pod_spec, "volumes", "name", pod.volumes.as_deref(), |v| {
        v.name.as_deref()
    });
    volumes.append(ops, ssh_auth_volume(&plan.train_job))?;
    if is_launcher {
        volumes.append(ops, hostfile_volume(&plan.train_job))?;
    }
    // C.4 and C.5: mounts by mountPath and env by name, on containers named `node` only.
    let containers = child(&pod_spec, &keys(["containers"]));
    for (c, container) in pod.containers.iter().flatten().enumerate() {
        if container.name.as_deref() != Some(NODE) {
            continue;
        }
        let container_path = child(&containers, &[Token::Index(c)]);
        let mut mounts = List::new(
            &container_path,
            "volumeMounts",
            "mountPath",
            container.volume_mounts.as_deref(),
            |m| m.mount_path.as_deref(),
        );
        mounts.append(ops, ssh_auth_mount(plan))?;
        if is_launcher {
            mounts.append(ops, hostfile_mount())?;
            let mut env = List::new(
                &container_path,
                "env",
                "name",
                container.env.as_deref(),
                |e| e.name.as_deref(),
            );
            for (name, value) in plan.implementation.env_pairs(plan.slots) {
                env.append(ops, env_var(name, value))?;
            }
        }
    }
    Some(())
}

/// Sets parallelism or completions: `add` when absent or null, `replace` when different.
fn set_count(
    ops: &mut Vec<PatchOperation>,
    job_spec: &[Token],
    field: &'static str,
    current: Option<&Value>,
    count: i64,
) {
    let value = json!(count);
    let path = pointer(&child(job_spec, &[Token::Key(field)]));
    match current {
        None => ops.push(PatchOperation::Add(AddOperation { path, value })),
        Some(current) if *current == value => {}
        Some(_) => ops.push(PatchOperation::Replace(ReplaceOperation { path, value })),
    }
}

/// A list the policy appends to: where it is, the keys of its entries (the user's and those
/// appended so far), and whether it exists yet.
struct List<'k> {
    path: Path,
    key: &'static str,
    keys: Vec<Cow<'k, str>>,
    exists: bool,
}

impl<'k> List<'k> {
    /// The list `field` of the object at `parent`, whose entries are matched on `key`. An entry
    /// without a key (or with a null one) matches no item, as in the reference.
    fn new<T>(
        parent: &[Token],
        field: &'static str,
        key: &'static str,
        entries: Option<&'k [T]>,
        key_of: impl Fn(&'k T) -> Option<&'k str>,
    ) -> Self {
        Self {
            path: child(parent, &[Token::Key(field)]),
            key,
            keys: entries
                .into_iter()
                .flatten()
                .filter_map(|e| key_of(e).map(Cow::Borrowed))
                .collect(),
            exists: entries.is_some(),
        }
    }

    /// Appends `item`: adds the list when it does not exist, else adds at its end. `None` when
    /// an entry with the same key is already there: that needs the reference's comparison.
    fn append(&mut self, ops: &mut Vec<PatchOperation>, item: Value) -> Option<()> {
        let key = item.get(self.key)?.as_str()?.to_string();
        if self.keys.iter().any(|k| *k == key) {
            return None;
        }
        self.keys.push(Cow::Owned(key));
        let (path, value) = if self.exists {
            (child(&self.path, &[Token::End]), item)
        } else {
            self.exists = true;
            (self.path.clone(), Value::Array(vec![item]))
        };
        ops.push(PatchOperation::Add(AddOperation {
            path: pointer(&path),
            value,
        }));
        Some(())
    }
}
