//! The JobSet mutation (spec section C: what Trainer's controller puts into the JobSet for MPI):
//! a [`json_patch::Patch`] of RFC 6902 operations at the paths the MPI policy owns, and nowhere
//! else, computed on the JobSet as the client sent it (a `serde_json::Value`), so fields this
//! crate does not model survive.
//!
//! Lists are upserted (volumes and env by `name`, mounts by `mountPath`): an equal entry yields
//! no operation, a different one is replaced in place, a missing one is appended; a missing list
//! or parent object is added with the entry inside. Each replicatedJob is worked on in a copy the
//! operations are applied to as they are made, so later operations see earlier ones. Applying
//! the patch and mutating again yields no operations. One writer serves TrainJob mode and JobSet
//! mode; `tests/policy/oracle.rs` states the same rules on its own, as the JobSet they make
//! (edited in place, no operations), and the golden corpus (`tests/fixtures/golden/`) holds the
//! patches every differential case gets.

mod items;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde::Serialize;
use serde_json::{Value, json};

use items::{EnvVar, HostfileVolume, Mount, SshAuthVolume};

use super::jobset_mode::ssh_setup::{self, SSH_SETUP_CONTAINER};
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

/// JobSet's `startupPolicyOrder` that excludes `dependsOn`.
const IN_ORDER: &str = "InOrder";

/// The operations that give `jobset` the MPI wiring of `plan`. Empty when the JobSet already
/// has it.
///
/// # Errors
/// [`MutationError`] when a location the policy writes holds a value of the wrong JSON type.
pub fn enforce_mpi_policy(plan: &MpiPlan, jobset: &Value) -> Result<Patch, MutationError> {
    let mut ops = Vec::new();
    let rjobs = match jobset.pointer("/spec/replicatedJobs") {
        None | Some(Value::Null) => return Ok(Patch(ops)),
        Some(Value::Array(rjobs)) => rjobs,
        other => {
            return Err(wrong_type(
                &keys(["spec", "replicatedJobs"]),
                other,
                "an array",
            ));
        }
    };
    let items = Items::new(plan);
    // Whether a `node` is listed before the replicatedJob at hand: JobSet lets a replicatedJob
    // depend only on those listed before it, and on none under `startupPolicyOrder: InOrder`
    // (InOrder already starts the launcher after Ready workers).
    let in_order = jobset
        .pointer("/spec/startupPolicy/startupPolicyOrder")
        .and_then(Value::as_str)
        == Some(IN_ORDER);
    let mut node_before = false;
    for (i, rjob) in rjobs.iter().enumerate() {
        let name = rjob.get("name").and_then(Value::as_str).unwrap_or_default();
        if !rjob.is_object() || (name != LAUNCHER && name != NODE) {
            continue;
        }
        let mut job = Job {
            base: child(&keys(["spec", "replicatedJobs"]), &[Token::Index(i)]),
            doc: pruned(rjob, &REPLICATED_JOB),
            ops: &mut ops,
        };
        let role = match name {
            LAUNCHER => Role::Launcher {
                may_depend_on_node: node_before && !in_order,
            },
            _ => Role::Node,
        };
        job.enforce(plan, &items, role)?;
        node_before |= name == NODE;
    }
    Ok(Patch(ops))
}

/// What of a value the policy reads or writes: all of it, or of an object only some members (of
/// an array, those members of each element).
enum Shape {
    Whole,
    Members(&'static [(&'static str, Shape)]),
}

/// What the policy reads or writes of a replicatedJob: the copy it works on holds only that.
const REPLICATED_JOB: Shape = Shape::Members(&[
    ("dependsOn", Shape::Whole),
    (
        "template",
        Shape::Members(&[(
            "spec",
            Shape::Members(&[
                ("parallelism", Shape::Whole),
                ("completions", Shape::Whole),
                (
                    "template",
                    Shape::Members(&[(
                        "spec",
                        Shape::Members(&[
                            ("volumes", Shape::Whole),
                            ("initContainers", Shape::Members(&[("name", Shape::Whole)])),
                            ("containers", Shape::Members(CONTAINER)),
                        ]),
                    )]),
                ),
            ]),
        )]),
    ),
]);

/// What the policy reads or writes of a container.
const CONTAINER: &[(&str, Shape)] = &[
    ("name", Shape::Whole),
    // Read only: `generated`'s init container runs in the wired container's image, as its user.
    ("image", Shape::Whole),
    ("securityContext", Shape::Whole),
    ("volumeMounts", Shape::Whole),
    ("env", Shape::Whole),
    ("command", Shape::Whole),
    ("args", Shape::Whole),
    ("readinessProbe", Shape::Whole),
];

/// The part of `value` that `shape` names, every JSON type kept where it is.
fn pruned(value: &Value, shape: &Shape) -> Value {
    match (shape, value) {
        (Shape::Members(members), Value::Object(map)) => Value::Object(
            members
                .iter()
                .filter_map(|(key, shape)| Some(((*key).to_owned(), pruned(map.get(*key)?, shape))))
                .collect(),
        ),
        (Shape::Members(_), Value::Array(items)) => {
            Value::Array(items.iter().map(|item| pruned(item, shape)).collect())
        }
        _ => value.clone(),
    }
}

/// Which of the two replicatedJobs the policy wires.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// `launcher`, with whether JobSet lets it depend on `node`: `node` is listed before it and
    /// the JobSet has no `startupPolicyOrder: InOrder`.
    Launcher { may_depend_on_node: bool },
    /// `node`.
    Node,
}

/// The entries the policy writes, built once per JobSet.
struct Items {
    ssh_volume: Value,
    hostfile_volume: Value,
    ssh_mount: Value,
    hostfile_mount: Value,
    env: Vec<Value>,
    /// JobSet mode only: what it fills in where the user left it unset.
    defaults: Option<Defaults>,
    /// JobSet mode's `generated` ssh setup: the emptyDir, and the wired containers' mounts of
    /// it (which take the place of `ssh_mount`).
    generated: Option<Generated>,
}

struct Generated {
    runtime_volume: Value,
    mounts: [Value; 2],
    port: u16,
}

struct Defaults {
    sshd_command: Value,
    readiness_probe: Value,
    depends_on: Value,
    /// The pre-flight init container, when the plan has an image for it.
    preflight: Option<Value>,
}

/// `entry` as JSON: structs of strings and integers, which always serialize.
fn to_json(entry: &impl Serialize) -> Value {
    serde_json::to_value(entry).unwrap_or_default()
}

impl Items {
    fn new(plan: &MpiPlan) -> Self {
        let port = plan.ssh_port();
        let generated = plan.generated_ssh();
        Self {
            ssh_volume: if generated {
                ssh_setup::secret_volume(&plan.jobset_name)
            } else {
                to_json(&SshAuthVolume::new(plan))
            },
            hostfile_volume: to_json(&HostfileVolume::new(&plan.jobset_name)),
            ssh_mount: to_json(&Mount::ssh_auth(plan)),
            hostfile_mount: to_json(&Mount::hostfile()),
            env: plan
                .launcher_env()
                .map(|(name, value)| to_json(&EnvVar { name, value }))
                .collect(),
            defaults: plan.jobset_defaults.as_ref().map(|_| Defaults {
                sshd_command: if generated {
                    ssh_setup::sshd_command()
                } else {
                    items::sshd_command(port)
                },
                readiness_probe: items::sshd_readiness_probe(port),
                depends_on: items::depends_on_ready_nodes(),
                preflight: plan
                    .preflight_image()
                    .map(|image| items::preflight_container(image, port)),
            }),
            generated: generated.then(|| Generated {
                runtime_volume: ssh_setup::runtime_volume(),
                mounts: ssh_setup::container_mounts(),
                port,
            }),
        }
    }
}

/// One step of a path into the JobSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// An object member (every member name the policy uses is a constant).
    Key(&'static str),
    /// An array element.
    Index(usize),
    /// The end of an array (`-` in a JSON pointer): where `add` appends.
    End,
}

fn child(base: &[Token], tokens: &[Token]) -> Vec<Token> {
    [base, tokens].concat()
}

fn keys<const N: usize>(names: [&'static str; N]) -> [Token; N] {
    names.map(Token::Key)
}

/// The child of `value` at `token`, if there is one.
fn step<'v>(value: &'v Value, token: &Token) -> Option<&'v Value> {
    match (value, token) {
        (Value::Object(map), Token::Key(key)) => map.get(*key),
        (Value::Array(items), Token::Index(i)) => items.get(*i),
        _ => None,
    }
}

fn step_mut<'v>(value: &'v mut Value, token: &Token) -> Option<&'v mut Value> {
    match (value, token) {
        (Value::Object(map), Token::Key(key)) => map.get_mut(*key),
        (Value::Array(items), Token::Index(i)) => items.get_mut(*i),
        _ => None,
    }
}

/// Whether `value` is absent or `null`: where the policy adds, and JobSet mode fills in.
fn unset(value: Option<&Value>) -> bool {
    value.is_none_or(Value::is_null)
}

/// Whether `list` is an array with an entry whose `name` is `name`.
fn names(list: Option<&Value>, name: &str) -> bool {
    list.and_then(Value::as_array).is_some_and(|l| {
        l.iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(name))
    })
}

/// The operations of one replicatedJob, made against a copy of what the policy reads of it
/// (`doc`, at `base` in the JobSet, whose every level exists) that each operation is applied
/// to as it is made.
struct Job<'o> {
    base: Vec<Token>,
    doc: Value,
    ops: &'o mut Vec<PatchOperation>,
}

impl Job<'_> {
    fn enforce(&mut self, plan: &MpiPlan, items: &Items, role: Role) -> Result<(), MutationError> {
        let rjob = self.base.clone();
        let is_launcher = matches!(role, Role::Launcher { .. });
        let defaults = items.defaults.as_ref();
        // C.1: the worker count, only when the TrainJob sets numNodes.
        if let (false, Some(count)) = (is_launcher, plan.node_count) {
            for member in ["parallelism", "completions"] {
                self.set(
                    &child(&rjob, &keys(["template", "spec", member])),
                    json!(count),
                )?;
            }
        }
        // JobSet mode: the launcher waits for the workers' sshd, where JobSet allows it.
        let depends_on = child(&rjob, &keys(["dependsOn"]));
        if let (
            Role::Launcher {
                may_depend_on_node: true,
            },
            Some(d),
        ) = (role, defaults)
            && unset(self.get(&depends_on))
        {
            self.emit(false, &depends_on, d.depends_on.clone());
        }
        // C.3: volumes, by name.
        let pod_spec = child(&rjob, &keys(["template", "spec", "template", "spec"]));
        let volumes = child(&pod_spec, &keys(["volumes"]));
        self.upsert(&volumes, "name", &items.ssh_volume)?;
        if is_launcher {
            self.upsert(&volumes, "name", &items.hostfile_volume)?;
        }
        if let Some(g) = &items.generated {
            self.upsert(&volumes, "name", &g.runtime_volume)?;
        }
        let containers = child(&pod_spec, &keys(["containers"]));
        let init = child(&pod_spec, &keys(["initContainers"]));
        // `generated`: the ssh setup runs first in both pods, in the wired container's image.
        if let Some(g) = &items.generated
            && let Some(wired) = self.wired_container(plan, &containers)
        {
            let setup = ssh_setup::init_container(&wired, g.port);
            self.insert_init(&containers, &init, SSH_SETUP_CONTAINER, setup, 0)?;
        }
        // JobSet mode: the pre-flight runs first in the launcher pod (after the ssh setup, which
        // writes the files it does not need but the launcher does), unless the user has one, or
        // a container of that name (a pod's container names are unique across both lists).
        let preflight = defaults.and_then(|d| d.preflight.as_ref());
        if let (true, Some(container)) = (is_launcher, preflight) {
            let at = match (&items.generated, self.get(&init)) {
                (Some(_), Some(Value::Array(list))) => list
                    .iter()
                    .position(|c| {
                        c.get("name").and_then(Value::as_str) == Some(SSH_SETUP_CONTAINER)
                    })
                    .map_or(0, |p| p + 1),
                _ => 0,
            };
            self.insert_init(
                &containers,
                &init,
                PREFLIGHT_CONTAINER,
                container.clone(),
                at,
            )?;
        }
        // C.4 and C.5: mounts by mountPath and env by name, on the wired containers only (in
        // TrainJob mode those named `node`).
        let count = match self.get(&containers) {
            None | Some(Value::Null) => 0,
            Some(Value::Array(list)) => list.len(),
            other => return Err(wrong_type(&containers, other, "an array")),
        };
        for c in 0..count {
            let container = child(&containers, &[Token::Index(c)]);
            let name = self
                .get(&child(&container, &keys(["name"])))
                .and_then(Value::as_str);
            if !plan.wired_container.wires(c, name) {
                continue;
            }
            let mounts = child(&container, &keys(["volumeMounts"]));
            match &items.generated {
                Some(g) => {
                    for mount in &g.mounts {
                        self.upsert(&mounts, "mountPath", mount)?;
                    }
                }
                None => self.upsert(&mounts, "mountPath", &items.ssh_mount)?,
            }
            if is_launcher {
                self.upsert(&mounts, "mountPath", &items.hostfile_mount)?;
                let env = child(&container, &keys(["env"]));
                for var in &items.env {
                    self.upsert(&env, "name", var)?;
                }
            }
            // JobSet mode: the workers run sshd, unless they run something of their own, and
            // are ready once it listens.
            if let (false, Some(d)) = (is_launcher, defaults) {
                let command = child(&container, &keys(["command"]));
                let args = child(&container, &keys(["args"]));
                if unset(self.get(&command)) && unset(self.get(&args)) {
                    self.emit(false, &command, d.sshd_command.clone());
                }
                let probe = child(&container, &keys(["readinessProbe"]));
                if unset(self.get(&probe)) {
                    self.emit(false, &probe, d.readiness_probe.clone());
                }
            }
        }
        Ok(())
    }

    /// The first wired container of the pod whose `containers` list is at `containers`, as
    /// the user wrote what the policy reads of it.
    fn wired_container(&self, plan: &MpiPlan, containers: &[Token]) -> Option<Value> {
        let list = self.get(containers)?.as_array()?;
        list.iter()
            .enumerate()
            .find(|(c, entry)| {
                plan.wired_container
                    .wires(*c, entry.get("name").and_then(Value::as_str))
            })
            .map(|(_, entry)| entry.clone())
    }

    /// Inserts init container `container`, named `name`, at index `at` of the list at `init`
    /// (made when unset), unless the pod has a container or an init container of that name.
    fn insert_init(
        &mut self,
        containers: &[Token],
        init: &[Token],
        name: &str,
        container: Value,
        at: usize,
    ) -> Result<(), MutationError> {
        if names(self.get(containers), name) {
            return Ok(());
        }
        match self.get(init) {
            None | Some(Value::Null) => self.emit(false, init, Value::Array(vec![container])),
            Some(Value::Array(_)) if names(self.get(init), name) => {}
            Some(Value::Array(list)) => {
                let at = at.min(list.len());
                self.emit(false, &child(init, &[Token::Index(at)]), container);
            }
            other => return Err(wrong_type(init, other, "an array")),
        }
        Ok(())
    }

    /// `path` below `base`, or `None` for a path outside the copy (never asked for).
    fn local<'p>(&self, path: &'p [Token]) -> Option<&'p [Token]> {
        path.strip_prefix(self.base.as_slice())
    }

    fn get(&self, path: &[Token]) -> Option<&Value> {
        self.local(path)?.iter().try_fold(&self.doc, step)
    }

    /// Records `add` (`replace: false`) or `replace` of `value` at `path` and applies it to the
    /// copy.
    fn emit(&mut self, replace: bool, path: &[Token], value: Value) {
        self.apply(path, &value, !replace);
        let path = pointer(path);
        self.ops.push(if replace {
            PatchOperation::Replace(ReplaceOperation { path, value })
        } else {
            PatchOperation::Add(AddOperation { path, value })
        });
    }

    /// Applies an operation to the copy. Every operation targets a location checked just
    /// before (an absent or null object member, the end of an array, an existing value).
    fn apply(&mut self, path: &[Token], value: &Value, insert: bool) {
        let Some((last, parents)) = self.local(path).and_then(<[Token]>::split_last) else {
            return;
        };
        let parent = parents.iter().try_fold(&mut self.doc, step_mut);
        match (parent, last) {
            (Some(Value::Object(map)), Token::Key(key)) => {
                map.insert((*key).to_string(), value.clone());
            }
            (Some(Value::Array(items)), Token::End) => items.push(value.clone()),
            (Some(Value::Array(items)), Token::Index(i)) if insert && *i <= items.len() => {
                items.insert(*i, value.clone());
            }
            (Some(Value::Array(items)), Token::Index(i)) => {
                if let Some(slot) = items.get_mut(*i) {
                    *slot = value.clone();
                }
            }
            _ => {}
        }
    }

    /// Sets `path` to `value`, adding the first missing parent object with `value` nested
    /// inside; no operation when equal.
    fn set(&mut self, path: &[Token], value: Value) -> Result<(), MutationError> {
        for depth in self.base.len()..path.len() {
            let parent = &path[..depth];
            let node = self.get(parent);
            match node {
                Some(Value::Object(map)) => {
                    // Only member names follow objects in the paths the policy writes.
                    let Token::Key(key) = path[depth] else {
                        return Err(wrong_type(parent, node, "an array"));
                    };
                    if unset(map.get(key)) {
                        let nested =
                            path[depth + 1..].iter().rev().fold(
                                value,
                                |inner, token| match token {
                                    Token::Key(key) => json!({ *key: inner }),
                                    Token::Index(_) | Token::End => json!([inner]),
                                },
                            );
                        self.emit(false, &path[..=depth], nested);
                        return Ok(());
                    }
                }
                // An array only where the path indexes into one; an array where a member name
                // follows is the wrong type, not a place to write (a patch that would not apply).
                Some(Value::Array(_)) if matches!(path[depth], Token::Index(_) | Token::End) => {}
                other => return Err(wrong_type(parent, other, "an object")),
            }
        }
        if self.get(path) != Some(&value) {
            self.emit(true, path, value);
        }
        Ok(())
    }

    /// Upserts `item` into the list at `path`, matching entries on `key`.
    fn upsert(&mut self, path: &[Token], key: &str, item: &Value) -> Result<(), MutationError> {
        let list = match self.get(path) {
            None | Some(Value::Null) => return self.set(path, Value::Array(vec![item.clone()])),
            Some(Value::Array(list)) => list,
            other => return Err(wrong_type(path, other, "an array")),
        };
        match list
            .iter()
            .position(|entry| entry.get(key) == item.get(key))
        {
            Some(i) if &list[i] == item => {}
            Some(i) => self.emit(true, &child(path, &[Token::Index(i)]), item.clone()),
            None => self.emit(false, &child(path, &[Token::End]), item.clone()),
        }
        Ok(())
    }
}

/// `path` as a JSON pointer, parsed in one go from its text: the member names are the policy's
/// constants, none holding a `~` or a `/` to escape (token by token, should the text not parse).
fn pointer(path: &[Token]) -> PointerBuf {
    let mut text = String::with_capacity(96);
    for token in path {
        text.push('/');
        match token {
            Token::Key(key) => text.push_str(key),
            Token::Index(i) => text.push_str(&i.to_string()),
            Token::End => text.push('-'),
        }
    }
    PointerBuf::parse(text).unwrap_or_else(|_| {
        let mut pointer = PointerBuf::new();
        for token in path {
            match token {
                Token::Key(key) => pointer.push_back(*key),
                Token::Index(i) => pointer.push_back(*i),
                Token::End => pointer.push_back("-"),
            }
        }
        pointer
    })
}

/// `path` dotted as Kubernetes writes field paths: `spec.replicatedJobs[1].template`.
fn dotted(path: &[Token]) -> String {
    let mut out = String::new();
    for token in path {
        match token {
            Token::Index(i) => out.push_str(&format!("[{i}]")),
            Token::End => out.push_str("[-]"),
            Token::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
        }
    }
    out
}

/// A JSON type's name as Go writes it in a field error, quoted: `"array"`.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "\"null\"",
        Value::Bool(_) => "\"boolean\"",
        Value::Number(_) => "\"number\"",
        Value::String(_) => "\"string\"",
        Value::Array(_) => "\"array\"",
        Value::Object(_) => "\"object\"",
    }
}

fn wrong_type(path: &[Token], found: Option<&Value>, expected: &'static str) -> MutationError {
    MutationError {
        field: dotted(path),
        found: found.map_or("\"null\"", json_type),
        expected,
    }
}
