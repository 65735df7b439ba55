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

use json_patch::PatchOperation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::plan::MpiPlan;
use super::super::{LAUNCHER, NODE};
use super::items::{EnvVar, HostfileVolume, Mount, SshAuthVolume};
use super::{Path, Token, child, keys};

/// What the mutation reads of a JobSet. Unknown members are skipped unread; a member of another
/// JSON type than declared fails the read.
#[derive(Debug, Deserialize)]
pub struct JobSetView<'a> {
    /// The JobSet's metadata, read whole (owner references, namespace). Absent reads as empty,
    /// as in the reference; `null` fails the read, so the reference reports it.
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(borrow, default)]
    spec: Option<Obj<Spec<'a>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    #[serde(borrow, default)]
    replicated_jobs: Option<Vec<Obj<ReplicatedJob<'a>>>>,
}

#[derive(Debug, Deserialize)]
struct ReplicatedJob<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    template: Option<Obj<JobTemplate<'a>>>,
}

#[derive(Debug, Deserialize)]
struct JobTemplate<'a> {
    #[serde(borrow, default)]
    spec: Option<Obj<JobSpec<'a>>>,
}

#[derive(Debug, Deserialize)]
struct JobSpec<'a> {
    #[serde(default)]
    parallelism: Option<Value>,
    #[serde(default)]
    completions: Option<Value>,
    #[serde(borrow, default)]
    template: Option<Obj<PodTemplate<'a>>>,
}

#[derive(Debug, Deserialize)]
struct PodTemplate<'a> {
    #[serde(borrow, default)]
    spec: Option<Obj<PodSpec<'a>>>,
}

#[derive(Debug, Deserialize)]
struct PodSpec<'a> {
    #[serde(borrow, default)]
    volumes: Option<Vec<Obj<Named<'a>>>>,
    #[serde(borrow, default)]
    containers: Option<Vec<Obj<Container<'a>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    volume_mounts: Option<Vec<Obj<MountView<'a>>>>,
    #[serde(borrow, default)]
    env: Option<Vec<Obj<Named<'a>>>>,
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
struct MountView<'a> {
    #[serde(borrow, default)]
    mount_path: Option<Cow<'a, str>>,
}

impl<'a> JobSetView<'a> {
    /// Reads a JobSet's raw JSON, or `None` when it is not in the shape this view accepts.
    pub fn read(raw: &'a str) -> Option<Self> {
        serde_json::from_str::<Obj<Self>>(raw).ok().map(|o| o.0)
    }
}

/// A JSON object read as `T`, and nothing else. serde's derived structs also accept a JSON array
/// (its elements taken as the fields in order); the reference reads an array as an array, so a
/// view must refuse one where it expects an object.
#[derive(Debug)]
pub struct Obj<T>(pub T);

impl<T> std::ops::Deref for Obj<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
            type Value = Obj<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }
}

/// A JSON Patch (RFC 6902) as the bytes of its JSON array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchJson {
    /// The JSON array of operations.
    pub json: Vec<u8>,
    /// How many operations it holds.
    pub operations: usize,
}

impl PatchJson {
    /// `operations` written as JSON: the bytes kube-core's `with_patch` would send.
    ///
    /// # Errors
    /// serde_json's error, were an operation's value not serializable (a map with non-string
    /// keys, which a parsed JSON value cannot hold).
    pub fn from_operations(operations: &[PatchOperation]) -> serde_json::Result<Self> {
        Ok(Self {
            json: serde_json::to_vec(operations)?,
            operations: operations.len(),
        })
    }
}

/// Operations written straight to JSON as they are found, in the layout `serde_json` gives a
/// `json_patch::PatchOperation` (`op`, `path`, `value`), so both paths send the same bytes.
struct PatchWriter {
    json: Vec<u8>,
    operations: usize,
    /// The pointer of the operation being written, reused from one operation to the next.
    pointer: String,
}

impl PatchWriter {
    fn new() -> Self {
        Self {
            json: Vec::with_capacity(4096),
            operations: 0,
            pointer: String::with_capacity(128),
        }
    }

    /// Writes one operation at `path` followed by `tail`; `None` if its value cannot be
    /// serialized (it always can).
    fn push(
        &mut self,
        op: &'static str,
        path: &[Token],
        tail: &[Token],
        value: &impl Serialize,
    ) -> Option<()> {
        #[derive(Serialize)]
        struct Operation<'a, V> {
            op: &'static str,
            path: &'a str,
            value: &'a V,
        }
        self.pointer.clear();
        for token in path.iter().chain(tail) {
            push_pointer_token(&mut self.pointer, *token);
        }
        self.json
            .push(if self.operations == 0 { b'[' } else { b',' });
        let operation = Operation {
            op,
            path: &self.pointer,
            value,
        };
        serde_json::to_writer(&mut self.json, &operation).ok()?;
        self.operations += 1;
        Some(())
    }

    fn finish(mut self) -> PatchJson {
        if self.operations == 0 {
            self.json.push(b'[');
        }
        self.json.push(b']');
        PatchJson {
            json: self.json,
            operations: self.operations,
        }
    }
}

/// Appends one RFC 6901 reference token, with its `/`. Built by hand: through `fmt`, a path
/// cost more than its operation.
fn push_pointer_token(pointer: &mut String, token: Token) {
    pointer.push('/');
    match token {
        Token::Key(key) if key.contains(['~', '/']) => {
            pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
        }
        Token::Key(key) => pointer.push_str(key),
        Token::Index(i) => push_decimal(pointer, i),
        Token::End => pointer.push('-'),
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: usize) {
    if n >= 10 {
        push_decimal(out, n / 10);
    }
    // `n % 10` is a single digit.
    out.push(char::from(b'0' + (n % 10) as u8));
}

/// The patch of [`super::enforce_mpi_policy`] for a fresh JobSet, or `None` when the JobSet is
/// not fresh (the reference then decides).
pub fn enforce_fresh(plan: &MpiPlan, jobset: &JobSetView<'_>) -> Option<PatchJson> {
    let mut patch = PatchWriter::new();
    // Built once, written into every replicatedJob that gets them.
    let volumes = (
        SshAuthVolume::new(plan),
        HostfileVolume::new(&plan.jobset_name),
    );
    let rjobs = jobset
        .spec
        .as_ref()
        .and_then(|s| s.replicated_jobs.as_ref());
    for (i, rjob) in rjobs.into_iter().flatten().enumerate() {
        let name = rjob.name.as_deref().unwrap_or_default();
        if name != LAUNCHER && name != NODE {
            continue;
        }
        let rjob_path = child(&keys(["spec", "replicatedJobs"]), &[Token::Index(i)]);
        let job = (&**rjob, rjob_path.as_slice(), name == LAUNCHER);
        fresh_replicated_job(&mut patch, plan, &volumes, job)?;
    }
    Some(patch.finish())
}

/// One replicatedJob (`rjob` at `rjob_path`, the launcher or not).
fn fresh_replicated_job(
    patch: &mut PatchWriter,
    plan: &MpiPlan,
    (ssh_auth, hostfile): &(SshAuthVolume, HostfileVolume),
    (rjob, rjob_path, is_launcher): (&ReplicatedJob<'_>, &[Token], bool),
) -> Option<()> {
    let job = rjob.template.as_ref()?.spec.as_ref()?;
    let pod = job.template.as_ref()?.spec.as_ref()?;
    let job_spec = child(rjob_path, &keys(["template", "spec"]));
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (false, Some(count)) = (is_launcher, plan.node_count) {
        set_count(
            patch,
            &job_spec,
            "parallelism",
            job.parallelism.as_ref(),
            count,
        )?;
        set_count(
            patch,
            &job_spec,
            "completions",
            job.completions.as_ref(),
            count,
        )?;
    }
    // C.3: volumes, by name.
    let pod_spec = child(&job_spec, &keys(["template", "spec"]));
    let mut volumes = List::new(
        &pod_spec,
        "volumes",
        pod.volumes.as_deref(),
        |v: &Obj<Named>| v.name.as_deref(),
    );
    volumes.append(patch, ssh_auth.name(), ssh_auth)?;
    if is_launcher {
        volumes.append(patch, hostfile.name(), hostfile)?;
    }
    // C.4 and C.5: mounts by mountPath and env by name, on the wired containers only.
    let containers = child(&pod_spec, &keys(["containers"]));
    for (c, container) in pod.containers.iter().flatten().enumerate() {
        if !plan.wired_container.wires(c, container.name.as_deref()) {
            continue;
        }
        let container_path = child(&containers, &[Token::Index(c)]);
        let mut mounts = List::new(
            &container_path,
            "volumeMounts",
            container.volume_mounts.as_deref(),
            |m: &Obj<MountView>| m.mount_path.as_deref(),
        );
        let ssh_auth_mount = Mount::ssh_auth(plan);
        mounts.append(patch, ssh_auth_mount.mount_path, &ssh_auth_mount)?;
        if is_launcher {
            let hostfile_mount = Mount::hostfile();
            mounts.append(patch, hostfile_mount.mount_path, &hostfile_mount)?;
            let mut env = List::new(
                &container_path,
                "env",
                container.env.as_deref(),
                |e: &Obj<Named>| e.name.as_deref(),
            );
            for (name, value) in plan.implementation.env_pairs(plan.slots) {
                env.append(patch, name, &EnvVar { name, value })?;
            }
        }
    }
    Some(())
}

/// Sets parallelism or completions: `add` when absent or null, `replace` when different.
fn set_count(
    patch: &mut PatchWriter,
    job_spec: &[Token],
    field: &'static str,
    current: Option<&Value>,
    count: i64,
) -> Option<()> {
    let field = [Token::Key(field)];
    match current {
        None => patch.push("add", job_spec, &field, &count),
        // `Value` equality with the count: the same integer (a float or a string is not).
        Some(current) if current.as_i64() == Some(count) => Some(()),
        Some(_) => patch.push("replace", job_spec, &field, &count),
    }
}

/// A list the policy appends to: where it is, the keys of its entries (the user's and those
/// appended so far), and whether it exists yet.
struct List<'k> {
    path: Path,
    keys: Vec<&'k str>,
    exists: bool,
}

impl<'k> List<'k> {
    /// The list `field` of the object at `parent`, its entries keyed by `key_of`. An entry
    /// without a key (or with a null one) matches no item, as in the reference.
    fn new<T>(
        parent: &[Token],
        field: &'static str,
        entries: Option<&'k [T]>,
        key_of: impl Fn(&'k T) -> Option<&'k str>,
    ) -> Self {
        Self {
            path: child(parent, &[Token::Key(field)]),
            keys: entries.into_iter().flatten().filter_map(key_of).collect(),
            exists: entries.is_some(),
        }
    }

    /// Appends `item`, keyed `key`: adds the list when it does not exist, else adds at its end.
    /// `None` when an entry with that key is already there: that needs the reference's
    /// comparison.
    fn append(
        &mut self,
        patch: &mut PatchWriter,
        key: &'k str,
        item: &impl Serialize,
    ) -> Option<()> {
        if self.keys.contains(&key) {
            return None;
        }
        self.keys.push(key);
        if self.exists {
            patch.push("add", &self.path, &[Token::End], item)
        } else {
            self.exists = true;
            patch.push("add", &self.path, &[], &[item])
        }
    }
}
