//! The golden corpus: the exact answers of the JobSet writer and of whole reviews, recorded once
//! from the writer `serve` shipped before the admission core was rewritten on `serde_json::Value`
//! and `json_patch` (tests/fixtures/golden/). Every differential test compares what `serve`
//! answers now with what it answered then: the same JobSet once patched (the operations may
//! differ), the same bytes otherwise; `oracle.rs` states what the patched JobSet must then be.
//!
//! Each case is keyed by a SHA-256 of its input: for the writer, the JobSet's JSON text and what
//! the oracle reads of the plan ([`plan_fingerprint`]); for a review, the route, the options and
//! the review's bytes. A key maps to the answers recorded for it (more than one when a test sends
//! the same input against different objects, e.g. with and without its TrainJob): the answer now
//! must be one of them.
//!
//! Recording (only when the answers are meant to change; see docs/development.md):
//!
//! ```sh
//! rm -f /tmp/golden.jsonl
//! RECORD_GOLDEN=/tmp/golden.jsonl cargo test --test policy
//! RECORD_GOLDEN=/tmp/golden.jsonl cargo test --test policy golden::write_corpus -- --ignored
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use base64::Engine as _;
use mpi_webhook::admission::{Options, Route, Verb, review_with, route_for};
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::objects::Snapshot;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The environment variable naming the JSON-lines file a recording run appends to.
const RECORD: &str = "RECORD_GOLDEN";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden")
}

/// The corpus files, by kind of case.
const KINDS: [&str; 2] = ["enforce", "reviews"];

/// What the oracle reads of `plan`: the key of a writer case, independent of how `MpiPlan`
/// holds it.
pub fn plan_fingerprint(plan: &MpiPlan) -> Value {
    let mut fingerprint = json!({
        "jobsetName": plan.jobset_name,
        "sshPrivateKeyMode": plan.ssh_private_key_mode,
        "sshAuthMountPath": plan.ssh_auth_mount_path,
        "nodeCount": plan.node_count,
        "wiredContainer": format!("{:?}", plan.wired_container),
        "launcherEnv": plan.launcher_env().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "jobsetDefaults": plan.jobset_defaults.is_some(),
        "sshPort": plan.ssh_port(),
        "preflightImage": plan.preflight_image(),
    });
    // Worker groups (Decision 20) other than `node` alone: keyed too, and only then, so every
    // case recorded before them keeps its key.
    if plan.worker_groups.len() != 1 || plan.worker_groups[0].name != "node" {
        fingerprint["workerGroups"] = json!(
            plan.worker_groups
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
        );
    }
    fingerprint
}

fn key(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the writer's case `plan` x `jobset`.
pub fn enforce_key(plan: &MpiPlan, jobset: &Value) -> String {
    key(&[
        plan_fingerprint(plan).to_string().as_bytes(),
        jobset.to_string().as_bytes(),
    ])
}

/// The key of a review case.
pub fn review_key(route: Route, options: &Options, body: &[u8]) -> String {
    key(&[
        route.name().as_bytes(),
        options.preflight_image.as_bytes(),
        body,
    ])
}

/// A response review with its base64 patch decoded, so the corpus shows the operations.
pub fn readable(response: &Value) -> Value {
    let mut response = response.clone();
    if let Some(patch) = response["response"]["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("patch is base64");
        response["response"]["patch"] = serde_json::from_slice(&bytes).expect("patch is JSON");
    }
    response
}

/// The recording file, when this is a recording run.
fn recorder() -> Option<&'static Mutex<std::fs::File>> {
    static FILE: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::var_os(RECORD)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        Some(Mutex::new(file))
    })
    .as_ref()
}

/// A corpus: the distinct answers, and the answers of each key (indices into them).
type Corpus = (Vec<Value>, BTreeMap<String, Vec<usize>>);

fn corpus(kind: &str) -> &'static Corpus {
    static CORPORA: OnceLock<BTreeMap<&'static str, Corpus>> = OnceLock::new();
    let corpora = CORPORA.get_or_init(|| {
        KINDS
            .into_iter()
            .map(|kind| {
                let path = dir().join(format!("{kind}.json"));
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let mut file: Value = serde_json::from_str(&text).expect("corpus is JSON");
                let answers = file["answers"].as_array().expect("answers").clone();
                let cases = serde_json::from_value(file["cases"].take()).expect("cases");
                (kind, (answers, cases))
            })
            .collect()
    });
    &corpora[kind]
}

/// Checks `answer` for `input` (the JobSet a writer case patches, or the review's bytes)
/// against the corpus of `kind` at `key`, or records it in a recording run.
///
/// A patch is compared by the object it makes: the recorded patch and the patch now are each
/// applied to the input's object, and the two results must be the same JSON (member order within
/// an object aside: the apiserver does not keep it). Everything else (errors, denials, warnings,
/// the rest of a response) is compared byte for byte, the order of members included.
pub fn check(kind: &'static str, key: &str, input: Input<'_>, answer: &Value) {
    if let Some(file) = recorder() {
        let line = json!({"kind": kind, "key": key, "answer": answer}).to_string();
        let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(file, "{line}").expect("recording written");
        return;
    }
    let (answers, cases) = corpus(kind);
    let Some(recorded) = cases.get(key) else {
        panic!(
            "no golden {kind} case for this input (key {key}): record the corpus again, see tests/policy/golden.rs\nanswer: {answer}"
        );
    };
    let object = input.object();
    let now = settled(object.as_ref(), answer);
    let text = serde_json::to_string(&now).ok();
    let matched = recorded
        .iter()
        .find(|&&i| serde_json::to_string(&settled(object.as_ref(), &answers[i])).ok() == text);
    let Some(&matched) = matched else {
        let recorded: Vec<&Value> = recorded.iter().map(|&i| &answers[i]).collect();
        panic!(
            "the answer differs from the golden corpus (key {key})\nnow: {answer}\nrecorded: {}",
            serde_json::to_string_pretty(&recorded).unwrap_or_default()
        );
    };
    stats(kind, key, &answers[matched], answer);
}

/// What a golden case's answer is for: the JobSet of a writer case, or a review's bytes.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// The JobSet the writer patched.
    JobSet(&'a Value),
    /// The review answered (its `request.object` is what a patch applies to).
    Review(&'a [u8]),
}

impl Input<'_> {
    fn object(self) -> Option<Value> {
        match self {
            Input::JobSet(jobset) => Some(jobset.clone()),
            Input::Review(body) => serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|review| review.pointer("/request/object").cloned()),
        }
    }
}

/// Where an answer holds a patch: a writer case's `ok`, a response review's `response.patch`.
const PATCH_AT: [&str; 2] = ["/ok", "/response/patch"];

/// `answer` with its patch replaced by the object it makes of `object`, members sorted.
fn settled(object: Option<&Value>, answer: &Value) -> Value {
    let mut answer = answer.clone();
    for at in PATCH_AT {
        let Some(slot) = answer.pointer_mut(at) else {
            continue;
        };
        let patch: json_patch::Patch =
            serde_json::from_value(slot.clone()).expect("a golden patch is a JSON patch");
        let mut made = object.expect("a patch has an object to apply to").clone();
        json_patch::patch(&mut made, &patch).expect("a golden patch applies to its input");
        let made = sorted(made);
        *slot = json!({"patched": made});
    }
    answer
}

/// `value` with every object's members in key order.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(String, Value)> = map.into_iter().collect();
            members.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(members.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The environment variable naming a JSON-lines file that gets, per case, the size and the
/// operation count of the recorded patch and of the patch now (`scripts/golden-patch-stats.py`
/// sums them up).
const STATS: &str = "GOLDEN_PATCH_STATS";

fn stats(kind: &str, key: &str, recorded: &Value, now: &Value) {
    static FILE: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os(STATS)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        Some(Mutex::new(file))
    });
    let Some(file) = file else { return };
    let measure = |answer: &Value| {
        PATCH_AT
            .iter()
            .find_map(|at| answer.pointer(at))
            .map(|patch| json!({"ops": patch.as_array().map_or(0, Vec::len), "bytes": patch.to_string().len()}))
    };
    let line =
        json!({"kind": kind, "key": key, "before": measure(recorded), "after": measure(now)});
    let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(file, "{line}").expect("stats written");
}

/// Writes the corpus files from a recording run's lines: answers deduplicated and sorted, so
/// that the files do not depend on the order the tests ran in.
#[test]
#[ignore = "records the golden corpus: see the module's documentation"]
fn write_corpus() {
    let path = std::env::var_os(RECORD).expect("RECORD_GOLDEN names the recording");
    let text = std::fs::read_to_string(&path).expect("the recording");
    let mut by_kind: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("a record");
        let kind = record["kind"].as_str().expect("kind").to_owned();
        let key = record["key"].as_str().expect("key").to_owned();
        by_kind
            .entry(kind)
            .or_default()
            .entry(key)
            .or_default()
            .insert(record["answer"].to_string());
    }
    std::fs::create_dir_all(dir()).expect("golden dir");
    for kind in KINDS {
        let cases = by_kind.remove(kind).unwrap_or_default();
        let answers: BTreeSet<&String> = cases.values().flatten().collect();
        let index: BTreeMap<&String, usize> =
            answers.iter().enumerate().map(|(i, a)| (*a, i)).collect();
        let answers: Vec<Value> = answers
            .iter()
            .map(|a| serde_json::from_str(a).expect("JSON"))
            .collect();
        let cases: BTreeMap<&String, Vec<usize>> = cases
            .iter()
            .map(|(key, set)| (key, set.iter().map(|a| index[a]).collect()))
            .collect();
        // One answer and one case a line: reviewable in a diff, a third of the pretty size.
        let lines = |items: Vec<String>| items.join(",\n    ");
        let text = format!(
            "{{\n  \"about\": \"Recorded by tests/policy/golden.rs (write_corpus); do not edit by hand.\",\n  \"answers\": [\n    {}\n  ],\n  \"cases\": {{\n    {}\n  }}\n}}\n",
            lines(answers.iter().map(Value::to_string).collect()),
            lines(
                cases
                    .iter()
                    .map(|(key, answers)| format!("{}: {}", json!(key), json!(answers)))
                    .collect()
            ),
        );
        std::fs::write(dir().join(format!("{kind}.json")), text).expect("corpus written");
    }
}

/// The sample reviews (manifests/samples/reviews), answered on each route that serves their kind
/// against the shipped manifests, with and without a pre-flight image, as recorded.
#[tokio::test]
async fn the_sample_reviews_are_answered_as_recorded() {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let objects = Snapshot::load_dir(&manifests).expect("manifests load");
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifests.join("samples/reviews"))
        .expect("samples")
        .map(|e| e.expect("an entry").path())
        .collect();
    files.sort();
    let with_image = Options {
        preflight_image: "ghcr.io/example/mpi-webhook:golden".into(),
    };
    let mut answered = 0;
    for file in &files {
        let body = std::fs::read(file).expect("sample");
        let value: Value = serde_json::from_slice(&body).expect("JSON");
        for verb in [Verb::Validate, Verb::Mutate] {
            let Ok(route) = route_for(verb, &value) else {
                continue;
            };
            for options in [&Options::default(), &with_image] {
                let response = review_with(route, &body, &objects, options)
                    .await
                    .expect("an AdmissionReview")
                    .json();
                check(
                    "reviews",
                    &review_key(route, options, &body),
                    Input::Review(&body),
                    &readable(&response),
                );
                answered += 1;
            }
        }
    }
    assert!(answered >= 2 * files.len(), "{answered}");
}
