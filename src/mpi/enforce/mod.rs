//! The JobSet mutation (spec section C: what Trainer's controller puts into the JobSet for MPI):
//! RFC 6902 operations at the paths the MPI policy owns, and nowhere else, written as the JSON
//! the response carries.
//!
//! The JobSet is read once, borrowed, into a [`JobSetView`] of what the policy looks at; the
//! user's object is never round-tripped through typed structs, so fields this crate does not
//! model survive. Lists are upserted (volumes and env by `name`, mounts by `mountPath`): an
//! entry already there with that key is read, and replaced only if it differs; a missing entry
//! is appended; a missing list or parent object is added with the entry inside. Applying the
//! patch and mutating again yields no operations. One writer serves TrainJob mode and JobSet
//! mode; `tests/policy/oracle.rs` holds the reference it is checked against, on a
//! `serde_json::Value`.

mod items;
mod view;

pub use view::{Element, JobSetView, JsonType};

use std::borrow::Cow;
use std::io::Write as _;

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use items::{EnvVar, HostfileVolume, Mount, SshAuthVolume};
use view::{Count, JobSpec, PodSpec, ReplicatedJob, Set, Slot};

use super::plan::MpiPlan;
use super::{LAUNCHER, NODE, PREFLIGHT_CONTAINER};

/// The JobSet has a value of the wrong JSON type where the policy must write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: Invalid value: {found}: must be {expected}")]
pub struct MutationError {
    /// Dotted field path, e.g. `spec.replicatedJobs[1].template.spec.template.spec.volumes`.
    pub field: String,
    /// `"string"`, `"number"`, ... as Go names JSON types.
    pub found: &'static str,
    /// `an object` or `an array`.
    pub expected: &'static str,
}

/// A JSON Patch (RFC 6902) as the bytes of its JSON array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchJson {
    /// The JSON array of operations.
    pub json: Vec<u8>,
    /// How many operations it holds.
    pub operations: usize,
}

/// The operations that give the JobSet read as `jobset` the MPI wiring of `plan`. Empty when
/// the JobSet already has it.
///
/// # Errors
/// [`MutationError`] when a location the policy writes holds a value of the wrong JSON type.
pub fn enforce_mpi_policy(
    plan: &MpiPlan,
    jobset: &JobSetView<'_>,
) -> Result<PatchJson, MutationError> {
    let mut patch = Patch::new();
    let rjobs = match &jobset.spec {
        Slot::Present(spec) => &spec.replicated_jobs,
        // Without a spec object there is no list of replicatedJobs to wire.
        Slot::Missing | Slot::Wrong(_) => return Ok(patch.finish()),
    };
    let mut path = String::with_capacity(128);
    path.push_str("/spec/replicatedJobs");
    let rjobs = match rjobs {
        Slot::Missing => return Ok(patch.finish()),
        Slot::Wrong(found) => return Err(wrong_type(&path, *found, "an array")),
        Slot::Present(rjobs) => rjobs,
    };
    let items = Items::new(plan);
    // Whether a `node` is listed before the replicatedJob at hand: JobSet lets a replicatedJob
    // depend only on those listed before it, and on none under `startupPolicyOrder: InOrder`
    // (the two are mutually exclusive; InOrder already starts the launcher after Ready workers).
    let in_order = spec_in_order(&jobset.spec);
    let mut node_before = false;
    for (i, rjob) in rjobs.iter().enumerate() {
        let Element::Object(rjob) = rjob else {
            continue;
        };
        let name = rjob.name.as_deref().unwrap_or_default();
        if name != LAUNCHER && name != NODE {
            continue;
        }
        let at = path.len();
        push_index(&mut path, i);
        let mut job = JobWriter::new(&mut patch, &mut path, rjob);
        let role = match name {
            LAUNCHER => Role::Launcher {
                may_depend_on_node: node_before && !in_order,
            },
            _ => Role::Node,
        };
        job.enforce(plan, &items, role)?;
        path.truncate(at);
        node_before |= name == NODE;
    }
    Ok(patch.finish())
}

/// Whether the JobSet asks `startupPolicy.startupPolicyOrder: InOrder`.
fn spec_in_order(spec: &Slot<view::Spec<'_>>) -> bool {
    match spec {
        Slot::Present(spec) => match &spec.startup_policy {
            Slot::Present(policy) => policy.startup_policy_order.as_deref() == Some(IN_ORDER),
            Slot::Missing | Slot::Wrong(_) => false,
        },
        Slot::Missing | Slot::Wrong(_) => false,
    }
}

/// Whether `containers` has one named `name`.
fn has_container(containers: &Slot<Vec<Element<view::Container<'_>>>>, name: &str) -> bool {
    match containers {
        Slot::Present(list) => list
            .iter()
            .any(|c| matches!(c, Element::Object(c) if c.name.as_deref() == Some(name))),
        Slot::Missing | Slot::Wrong(_) => false,
    }
}

/// JobSet's `startupPolicyOrder` that excludes `dependsOn`.
const IN_ORDER: &str = "InOrder";

/// Which of the two replicatedJobs the policy wires.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// `launcher`, with whether JobSet lets it depend on `node`: `node` is listed before it and
    /// the JobSet has no `startupPolicyOrder: InOrder`.
    Launcher { may_depend_on_node: bool },
    /// `node`.
    Node,
}

/// The entries the policy writes, each serialized once per JobSet with its key.
struct Items {
    ssh_volume: Item,
    hostfile_volume: Item,
    ssh_mount: Item,
    hostfile_mount: Item,
    env: Vec<Item>,
    /// JobSet mode only.
    defaults: Option<Defaults>,
}

/// What JobSet mode fills in where the user left it unset, serialized once per JobSet.
struct Defaults {
    sshd_command: Vec<u8>,
    readiness_probe: Vec<u8>,
    depends_on: Vec<u8>,
    /// The pre-flight init container, when the plan has an image for it.
    preflight: Option<Item>,
}

impl Defaults {
    fn new(plan: &MpiPlan) -> Option<Self> {
        plan.jobset_defaults.as_ref()?;
        let port = plan.ssh_port();
        let json = |value: Value| serde_json::to_vec(&value).unwrap_or_default();
        Some(Self {
            sshd_command: json(items::sshd_command(port)),
            readiness_probe: json(items::sshd_readiness_probe(port)),
            depends_on: json(items::depends_on_ready_nodes()),
            preflight: plan.preflight_image().map(|image| {
                Item::new(
                    "name",
                    PREFLIGHT_CONTAINER,
                    &items::preflight_container(image, port),
                )
            }),
        })
    }
}

/// One entry: the member holding the key it is upserted by, that key, and its JSON.
struct Item {
    by: &'static str,
    key: Cow<'static, str>,
    json: Vec<u8>,
}

impl Item {
    fn new(by: &'static str, key: impl Into<Cow<'static, str>>, entry: &impl Serialize) -> Self {
        Self {
            by,
            key: key.into(),
            // Structs of strings and integers: serializing them cannot fail.
            json: serde_json::to_vec(entry).unwrap_or_default(),
        }
    }

    /// The item as the only entry of a new list: `[item]`.
    fn listed(&self) -> Vec<u8> {
        let mut list = Vec::with_capacity(self.json.len() + 2);
        list.push(b'[');
        list.extend_from_slice(&self.json);
        list.push(b']');
        list
    }

    /// Whether `entry` (the user's, with this item's key) equals this item, as JSON values.
    fn equals(&self, entry: &RawValue) -> bool {
        let entry = serde_json::from_str::<Value>(entry.get());
        let item = serde_json::from_slice::<Value>(&self.json);
        matches!((entry, item), (Ok(entry), Ok(item)) if entry == item)
    }
}

impl Items {
    fn new(plan: &MpiPlan) -> Self {
        let ssh_volume = SshAuthVolume::new(plan);
        let hostfile_volume = HostfileVolume::new(&plan.jobset_name);
        let ssh_mount = Mount::ssh_auth(plan);
        let hostfile_mount = Mount::hostfile();
        Self {
            ssh_volume: Item::new("name", ssh_volume.name(), &ssh_volume),
            hostfile_volume: Item::new("name", hostfile_volume.name(), &hostfile_volume),
            ssh_mount: Item::new("mountPath", ssh_mount.mount_path.to_owned(), &ssh_mount),
            hostfile_mount: Item::new(
                "mountPath",
                hostfile_mount.mount_path.to_owned(),
                &hostfile_mount,
            ),
            env: plan
                .launcher_env()
                .map(|(name, value)| Item::new("name", name, &EnvVar { name, value }))
                .collect(),
            defaults: Defaults::new(plan),
        }
    }
}

/// The member names from a replicatedJob down to its pod spec: the Job template, the Job spec,
/// the pod template, the pod spec.
const LEVELS: [&str; 4] = ["template", "spec", "template", "spec"];
/// How many of [`LEVELS`] lead to the Job spec, and to the pod spec.
const JOB_SPEC: usize = 2;
const POD_SPEC: usize = 4;

/// A location's state as the operations written so far leave it.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Absent or `null`.
    Missing,
    /// An object, or an array for a list.
    Present,
    /// Of another JSON type.
    Wrong(JsonType),
}

impl<T> From<&Slot<T>> for State {
    fn from(slot: &Slot<T>) -> Self {
        match slot {
            Slot::Missing => State::Missing,
            Slot::Present(_) => State::Present,
            Slot::Wrong(found) => State::Wrong(*found),
        }
    }
}

/// The operations of one replicatedJob. The view tells what the JobSet holds; [`JobWriter::levels`]
/// tracks which objects down to the pod spec exist once the operations so far are applied, so
/// each operation is written against the JobSet as the earlier ones leave it.
struct JobWriter<'p, 'v> {
    patch: &'p mut Patch,
    /// The replicatedJob's JSON pointer, extended and truncated back as operations are written.
    path: &'p mut String,
    levels: [State; 4],
    /// Whether the replicatedJob has a `dependsOn`.
    depends_on: Set,
    /// The Job spec and the pod spec, where the JobSet has them.
    job_spec: Option<&'v JobSpec<'v>>,
    pod_spec: Option<&'v PodSpec<'v>>,
}

impl<'p, 'v> JobWriter<'p, 'v> {
    fn new(patch: &'p mut Patch, path: &'p mut String, rjob: &'v ReplicatedJob<'v>) -> Self {
        let template = &rjob.template;
        let job_spec = present(template).map(|t| &t.spec);
        let pod_template = job_spec.and_then(present).map(|j| &j.template);
        let pod_spec = pod_template.and_then(present).map(|p| &p.spec);
        let state = |slot: Option<State>| slot.unwrap_or(State::Missing);
        Self {
            patch,
            path,
            levels: [
                State::from(template),
                state(job_spec.map(State::from)),
                state(pod_template.map(State::from)),
                state(pod_spec.map(State::from)),
            ],
            depends_on: rjob.depends_on,
            job_spec: job_spec.and_then(present),
            pod_spec: pod_spec.and_then(present),
        }
    }

    fn enforce(&mut self, plan: &MpiPlan, items: &Items, role: Role) -> Result<(), MutationError> {
        let is_launcher = matches!(role, Role::Launcher { .. });
        // C.1: the worker count, only when the TrainJob sets numNodes.
        if let (false, Some(count)) = (is_launcher, plan.node_count) {
            let (parallelism, completions) =
                self.job_spec.map_or((Count::Missing, Count::Missing), |j| {
                    (j.parallelism, j.completions)
                });
            self.set_count("parallelism", parallelism, count)?;
            self.set_count("completions", completions, count)?;
        }
        // JobSet mode: the launcher waits for the workers' sshd, where JobSet allows it.
        if let (
            Role::Launcher {
                may_depend_on_node: true,
            },
            Some(defaults),
            Set(false),
        ) = (role, &items.defaults, self.depends_on)
        {
            let at = self.extend(&["dependsOn"]);
            self.patch.push("add", self.path, &defaults.depends_on);
            self.path.truncate(at);
        }
        // C.3: volumes, by name.
        let mut volumes = List::of(self.pod_spec.map(|p| &p.volumes));
        self.upsert_below(POD_SPEC, "volumes", &mut volumes, &items.ssh_volume)?;
        if is_launcher {
            self.upsert_below(POD_SPEC, "volumes", &mut volumes, &items.hostfile_volume)?;
        }
        // JobSet mode: the pre-flight runs first in the launcher pod, unless the user has one,
        // or a container of that name (a pod's container names are unique across both lists).
        let preflight = items.defaults.as_ref().and_then(|d| d.preflight.as_ref());
        let taken = self
            .pod_spec
            .is_some_and(|p| has_container(&p.containers, PREFLIGHT_CONTAINER));
        if let (true, Some(item), false) = (is_launcher, preflight, taken) {
            let init_containers = List::of(self.pod_spec.map(|p| &p.init_containers));
            self.insert_first(init_containers, "initContainers", item)?;
        }
        // C.4 and C.5: mounts by mountPath and env by name, on the wired containers only (in
        // TrainJob mode those named `node`). The pod spec exists now: the volumes are in it.
        let at = self.extend(&LEVELS);
        self.path.push_str("/containers");
        let containers = match self.pod_spec.map(|p| &p.containers) {
            None | Some(Slot::Missing) => &[][..],
            Some(Slot::Wrong(found)) => return Err(wrong_type(self.path, *found, "an array")),
            Some(Slot::Present(containers)) => containers.as_slice(),
        };
        for (c, container) in containers.iter().enumerate() {
            let (container, name) = match container {
                Element::Object(container) => (Ok(container), container.name.as_deref()),
                Element::Other(found) => (Err(*found), None),
            };
            if !plan.wired_container.wires(c, name) {
                continue;
            }
            let container_at = self.path.len();
            push_index(self.path, c);
            let container = container.map_err(|found| wrong_type(self.path, found, "an object"))?;
            let mut mounts = List::of(Some(&container.volume_mounts));
            self.upsert(&mut mounts, "volumeMounts", &items.ssh_mount)?;
            if is_launcher {
                self.upsert(&mut mounts, "volumeMounts", &items.hostfile_mount)?;
                let mut env = List::of(Some(&container.env));
                for item in &items.env {
                    self.upsert(&mut env, "env", item)?;
                }
            }
            // JobSet mode: the workers run sshd and are ready once it listens.
            if let (false, Some(defaults)) = (is_launcher, &items.defaults) {
                if let (Set(false), Set(false)) = (container.command, container.args) {
                    self.add_member("command", &defaults.sshd_command);
                }
                if container.readiness_probe == Set(false) {
                    self.add_member("readinessProbe", &defaults.readiness_probe);
                }
            }
            self.path.truncate(container_at);
        }
        self.path.truncate(at);
        Ok(())
    }

    /// Appends `members` to the path; returns the length to truncate back to.
    fn extend(&mut self, members: &[&str]) -> usize {
        let at = self.path.len();
        for member in members {
            self.path.push('/');
            self.path.push_str(member);
        }
        at
    }

    /// Makes sure the first `depth` levels exist, writing below them `member` set to `value`
    /// (asked for only then): `true` when that is done (an `add` of the first missing level,
    /// `value` nested inside), `false` when every level already exists.
    fn reach(
        &mut self,
        depth: usize,
        member: &str,
        value: impl FnOnce() -> Vec<u8>,
    ) -> Result<bool, MutationError> {
        for level in 0..depth {
            match self.levels[level] {
                State::Present => {}
                State::Wrong(found) => {
                    let at = self.extend(&LEVELS[..=level]);
                    let error = wrong_type(self.path, found, "an object");
                    self.path.truncate(at);
                    return Err(error);
                }
                State::Missing => {
                    let at = self.extend(&LEVELS[..=level]);
                    let value = value();
                    let mut nested = Vec::with_capacity(value.len() + 64);
                    let inner = LEVELS[level + 1..depth].iter().chain([&member]);
                    for key in inner.clone() {
                        write!(nested, "{{\"{key}\":").ok();
                    }
                    nested.extend_from_slice(&value);
                    nested.extend(inner.map(|_| b'}'));
                    self.patch.push("add", self.path, &nested);
                    self.path.truncate(at);
                    self.levels[level..depth].fill(State::Present);
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Sets the Job spec's `member` (parallelism or completions) to `count`.
    fn set_count(&mut self, member: &str, current: Count, count: i64) -> Result<(), MutationError> {
        let value = count.to_string();
        if self.reach(JOB_SPEC, member, || value.clone().into_bytes())? {
            return Ok(());
        }
        let op = match current {
            Count::Missing => "add",
            Count::Integer(n) if n == count => return Ok(()),
            Count::Integer(_) | Count::Other => "replace",
        };
        let at = self.extend(&LEVELS[..JOB_SPEC]);
        self.extend(&[member]);
        self.patch.push(op, self.path, value.as_bytes());
        self.path.truncate(at);
        Ok(())
    }

    /// Upserts `item` into the list `member` of the level `depth` down (the pod spec).
    fn upsert_below(
        &mut self,
        depth: usize,
        member: &str,
        list: &mut List<'_>,
        item: &Item,
    ) -> Result<(), MutationError> {
        if self.reach(depth, member, || item.listed())? {
            *list = List::Present(&[]);
            return Ok(());
        }
        let at = self.extend(&LEVELS[..depth]);
        let result = self.upsert(list, member, item);
        self.path.truncate(at);
        result
    }

    /// Adds `member` set to `value` to the object at the current path, which exists and has no
    /// such member.
    fn add_member(&mut self, member: &str, value: &[u8]) {
        let at = self.extend(&[member]);
        self.patch.push("add", self.path, value);
        self.path.truncate(at);
    }

    /// Puts `item` first in the pod spec's list `member`, unless an entry with its key is
    /// there (the user's, left as it is). The pod spec exists.
    fn insert_first(
        &mut self,
        list: List<'_>,
        member: &str,
        item: &Item,
    ) -> Result<(), MutationError> {
        let at = self.extend(&LEVELS);
        self.extend(&[member]);
        let result = match list {
            List::Missing => {
                self.patch.push("add", self.path, &item.listed());
                Ok(())
            }
            List::Wrong(found) => Err(wrong_type(self.path, found, "an array")),
            List::Present(entries) => {
                let has_key = entries.iter().any(|entry| {
                    view::member_string(entry, item.by).as_deref() == Some(&*item.key)
                });
                if !has_key {
                    self.path.push_str("/0");
                    self.patch.push("add", self.path, &item.json);
                }
                Ok(())
            }
        };
        self.path.truncate(at);
        result
    }

    /// Upserts `item` into the list `member` of the object at the current path, which exists.
    fn upsert(
        &mut self,
        list: &mut List<'_>,
        member: &str,
        item: &Item,
    ) -> Result<(), MutationError> {
        let at = self.extend(&[member]);
        let result = match list {
            List::Missing => {
                self.patch.push("add", self.path, &item.listed());
                *list = List::Present(&[]);
                Ok(())
            }
            List::Wrong(found) => Err(wrong_type(self.path, *found, "an array")),
            List::Present(entries) => {
                let same_key = entries.iter().position(|entry| {
                    view::member_string(entry, item.by).as_deref() == Some(&*item.key)
                });
                match same_key {
                    Some(i) if item.equals(entries[i]) => {}
                    Some(i) => {
                        push_index(self.path, i);
                        self.patch.push("replace", self.path, &item.json);
                    }
                    None => {
                        self.path.push_str("/-");
                        self.patch.push("add", self.path, &item.json);
                    }
                }
                Ok(())
            }
        };
        self.path.truncate(at);
        result
    }
}

/// A list the policy upserts into, as the operations so far leave it. Entries appended by the
/// policy are never looked up again: the entries of one list have distinct keys (the plan
/// refuses an SSH mount on the hostfile's path).
#[derive(Debug, Clone, Copy)]
enum List<'v> {
    Missing,
    /// The user's entries.
    Present(&'v [&'v RawValue]),
    Wrong(JsonType),
}

impl<'v> List<'v> {
    fn of(slot: Option<&'v Slot<Vec<&'v RawValue>>>) -> Self {
        match slot {
            None | Some(Slot::Missing) => List::Missing,
            Some(Slot::Present(entries)) => List::Present(entries),
            Some(Slot::Wrong(found)) => List::Wrong(*found),
        }
    }
}

/// The value of a slot holding an object of the expected type.
fn present<T>(slot: &Slot<T>) -> Option<&T> {
    match slot {
        Slot::Present(value) => Some(value),
        Slot::Missing | Slot::Wrong(_) => None,
    }
}

/// Operations written straight to JSON as they are found, in the layout `serde_json` gives a
/// `json_patch::PatchOperation` (`op`, `path`, `value`).
struct Patch {
    json: Vec<u8>,
    operations: usize,
}

impl Patch {
    fn new() -> Self {
        Self {
            json: Vec::with_capacity(4096),
            operations: 0,
        }
    }

    /// Writes one operation. `path` holds member names of the policy's (no character of them
    /// needs escaping in JSON or in a JSON pointer), indices and `-`; `value` is JSON.
    fn push(&mut self, op: &str, path: &str, value: &[u8]) {
        self.json
            .push(if self.operations == 0 { b'[' } else { b',' });
        self.json.extend_from_slice(b"{\"op\":\"");
        self.json.extend_from_slice(op.as_bytes());
        self.json.extend_from_slice(b"\",\"path\":\"");
        self.json.extend_from_slice(path.as_bytes());
        self.json.extend_from_slice(b"\",\"value\":");
        self.json.extend_from_slice(value);
        self.json.push(b'}');
        self.operations += 1;
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

/// Appends `/` and `i` to a JSON pointer.
fn push_index(path: &mut String, i: usize) {
    use std::fmt::Write as _;
    write!(path, "/{i}").ok();
}

/// The error for `found` at the JSON pointer `path` where `expected` belongs, the path dotted as
/// Kubernetes writes field paths: `spec.replicatedJobs[1].template`.
fn wrong_type(path: &str, found: JsonType, expected: &'static str) -> MutationError {
    let mut field = String::with_capacity(path.len() + 8);
    for segment in path.split('/').skip(1) {
        if segment.bytes().all(|b| b.is_ascii_digit()) {
            field.push('[');
            field.push_str(segment);
            field.push(']');
        } else {
            if !field.is_empty() {
                field.push('.');
            }
            field.push_str(segment);
        }
    }
    MutationError {
        field,
        found: found.quoted(),
        expected,
    }
}
