//! The trap the writer must never fall into: overwriting what a user wrote at a path the policy
//! writes. For each JobSet below, every path where the wired copy differs from the JobSet (the
//! paths of its patch) is tried with a user's value in place and an unknown sibling member next
//! to it; the patched JobSet must keep every such value, except where the contract replaces it:
//! the worker counts (C.1) and a list entry with the key of one of the policy's entries (volumes
//! and env by `name`, mounts by `mountPath`: replaced in place by the policy's entry, but for
//! the default entries of [`DEFAULT_ENTRIES`], which the user's keeps). Generic
//! over the paths, so a rule added later is covered without a line here.

use mpi_webhook::api::JobSet;
use mpi_webhook::mpi::enforce::enforce_mpi_policy;
use mpi_webhook::mpi::plan::MpiPlan;
use serde_json::{Value, json};

use super::support::{jobset, plan, rjob, runtime, train_job};

/// The fields the policy owns: a user's value there is replaced.
const OWNED: [&str; 2] = ["parallelism", "completions"];

/// The lists upserted by a key: a user's entry with the key of a policy entry is replaced.
const UPSERTED: [(&str, &str); 3] = [
    ("volumes", "name"),
    ("volumeMounts", "mountPath"),
    ("env", "name"),
];

/// Entries of an upserted list that are defaults all the same: a user's entry of that name is
/// kept (JobSet mode's GPU-hiding env on the launcher, docs/jobset-mode.md "Defaults").
const DEFAULT_ENTRIES: [(&str, &str); 2] = [
    ("env", "NVIDIA_VISIBLE_DEVICES"),
    ("env", "NVIDIA_DRIVER_CAPABILITIES"),
];

/// An unknown member a user (or a newer API) put there.
const SIBLING: &str = "x-user-field";

fn cases() -> Vec<(&'static str, MpiPlan, Value)> {
    let rt = runtime(
        json!({"mpiImplementation": "OpenMPI", "sshAuthMountPath": "/root/.ssh"}),
        vec![
            rjob("launcher", true, &["node"]),
            rjob("node", false, &["node", "sidecar"]),
        ],
    );
    let tj = train_job(json!({"numNodes": 3}));
    let js_mode = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "pi", "namespace": "default", "uid": "pi-uid",
            "labels": {"mpi-webhook.io/implementation": "OpenMPI"}
        },
        "spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"parallelism": 2, "template": {"spec": {
                "containers": [{"name": "worker", "image": "w"}]}}}}},
            {"name": "launcher", "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "launcher", "image": "l"}]}}}}}
        ]}
    });
    let typed: JobSet = serde_json::from_value(js_mode.clone()).expect("JobSet");
    let options = mpi_webhook::admission::Options {
        preflight_image: "ghcr.io/example/mpi-webhook:trap".into(),
    };
    let js_plan = MpiPlan::for_jobset(&typed, &options).expect("settings parse");
    vec![
        ("TrainJob mode", plan(&rt, &tj), jobset(&rt, &tj)),
        ("JobSet mode", js_plan, js_mode),
    ]
}

/// `jobset` patched by the writer.
fn patched(plan: &MpiPlan, jobset: &Value) -> Value {
    let patch = enforce_mpi_policy(plan, jobset).expect("patchable");
    let mut out = jobset.clone();
    json_patch::patch(&mut out, &patch).expect("the patch applies");
    out
}

/// The pointer of every location the patch of `jobset` writes: a list's entries count as the
/// list.
fn written_paths(plan: &MpiPlan, jobset: &Value) -> Vec<String> {
    let patch = enforce_mpi_policy(plan, jobset).expect("patchable");
    let mut paths: Vec<String> = patch
        .0
        .iter()
        .map(|op| {
            let path = op.path().to_string();
            match path.rsplit_once('/') {
                Some((list, index)) if index.parse::<usize>().is_ok() => list.to_owned(),
                _ => path,
            }
        })
        .collect();
    paths.dedup();
    paths
}

fn parent_and_key(path: &str) -> (&str, &str) {
    path.rsplit_once('/').expect("a path below the root")
}

/// Whether every value of `user` is in `out` where it was: objects member by member, lists as
/// a subsequence (the policy inserts and appends entries, never drops or reorders the user's).
fn survives(user: &Value, out: &Value) -> bool {
    match (user, out) {
        (Value::Object(user), Value::Object(out)) => user
            .iter()
            .all(|(key, value)| out.get(key).is_some_and(|o| survives(value, o))),
        (Value::Array(user), Value::Array(out)) => {
            let mut rest = out.iter();
            user.iter().all(|u| rest.any(|o| survives(u, o)))
        }
        _ => user == out,
    }
}

/// Sets `value` at `path` of `jobset`, making missing objects on the way (the path's parent
/// exists in the wired copy).
fn put(jobset: &mut Value, path: &str, value: Value) {
    let mut at = jobset;
    for token in path.split('/').skip(1) {
        at = match at {
            Value::Array(list) => &mut list[token.parse::<usize>().expect("an index")],
            other => {
                if !other.is_object() {
                    *other = json!({});
                }
                other
                    .as_object_mut()
                    .expect("an object")
                    .entry(token)
                    .or_insert(Value::Null)
            }
        };
    }
    *at = value;
}

/// A user's own value where the wired copy has `wired`: an entry keyed apart from the
/// policy's, an object with an unknown member, a count.
fn user_value(key: &str, wired: &Value) -> Option<Value> {
    match wired {
        Value::Array(entries) if entries.iter().all(Value::is_object) => Some(json!([{
            "name": "user-entry", "mountPath": "/user/entry", "value": "user", SIBLING: 1
        }])),
        Value::Array(_) => Some(json!(["user", "command"])),
        Value::Object(_) => Some(json!({SIBLING: {"kept": true}})),
        Value::Number(_) if OWNED.contains(&key) => Some(json!(99)),
        _ => None,
    }
}

#[test]
fn a_users_value_at_every_written_path_survives_or_is_replaced_as_the_contract_says() {
    let mut tried = 0;
    for (mode, plan, jobset) in cases() {
        let wired = patched(&plan, &jobset);
        for path in written_paths(&plan, &jobset) {
            let (parent, key) = parent_and_key(&path);
            let wired_value = wired.pointer(&path).expect("written");

            // An unknown sibling next to the write survives.
            let mut with_sibling = jobset.clone();
            put(
                &mut with_sibling,
                &format!("{parent}/{SIBLING}"),
                json!({"kept": true}),
            );
            let out = patched(&plan, &with_sibling);
            assert!(
                survives(&with_sibling, &out),
                "{mode}: {parent}/{SIBLING} lost"
            );

            // A user's value at the path survives, but in the fields the policy owns.
            let Some(value) = user_value(key, wired_value) else {
                continue;
            };
            let mut with_value = jobset.clone();
            put(&mut with_value, &path, value);
            let out = patched(&plan, &with_value);
            tried += 1;
            if OWNED.contains(&key) {
                assert_eq!(
                    out.pointer(&path),
                    Some(wired_value),
                    "{mode}: {path} owned"
                );
                continue;
            }
            assert!(
                survives(&with_value, &out),
                "{mode}: the user's value at {path} was overwritten:\n{}",
                out.pointer(&path).unwrap_or(&Value::Null)
            );

            // An entry with the key of one of the policy's entries: replaced in place in the
            // lists upserted by key, kept in any other list (a default the user already has),
            // and kept where it has the name of a default entry of an upserted list.
            let entries = wired_value
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let is_default = |entry: &Value| {
                DEFAULT_ENTRIES
                    .iter()
                    .any(|(list, name)| *list == key && entry.get("name") == Some(&json!(name)))
            };
            let upserted = entries.iter().rev().find(|e| !is_default(e));
            let defaults = entries.iter().filter(|e| is_default(e));
            for policy_entry in upserted.into_iter().chain(defaults) {
                let Some(mut clash) = policy_entry.as_object().cloned() else {
                    continue;
                };
                clash.insert(SIBLING.into(), json!(1));
                let clash = Value::Object(clash);
                let mut with_clash = jobset.clone();
                put(&mut with_clash, &path, json!([clash]));
                let out = patched(&plan, &with_clash);
                let list = out
                    .pointer(&path)
                    .and_then(Value::as_array)
                    .expect("a list");
                if UPSERTED.iter().any(|(list, _)| *list == key) && !is_default(policy_entry) {
                    assert_eq!(list[0], *policy_entry, "{mode}: {path}: replaced in place");
                } else {
                    assert!(
                        survives(&with_clash, &out),
                        "{mode}: {path}: the user's {policy_entry} kept"
                    );
                }
            }
        }
    }
    assert!(tried >= 15, "{tried} paths tried");
}
