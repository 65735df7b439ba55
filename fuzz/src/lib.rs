//! What the fuzz targets share: the objects the webhook looks up (`--objects-dir manifests`), the
//! shipped sample reviews they start from, structure-aware edits of a JSON document, and the
//! properties every answer must have.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use base64::Engine as _;
use mpi_webhook::admission::{BadReview, Reviewed, Route, Verb, review};
use mpi_webhook::mpi::jobset_mode::settings;
use mpi_webhook::objects::Snapshot;
use serde_json::{Map, Value, json};

/// The repository's `manifests/`: shipped runtimes, sample TrainJobs and reviews.
pub fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// The objects `serve --objects-dir manifests` looks up, loaded once.
pub fn objects() -> &'static Snapshot {
    static OBJECTS: OnceLock<Snapshot> = OnceLock::new();
    OBJECTS.get_or_init(|| Snapshot::load_dir(&manifests()).expect("manifests/ loads"))
}

/// Every shipped sample review (`manifests/samples/reviews/*.json`), and a CREATE review of each
/// shipped runtime, with the route `serve` answers it on.
pub fn seed_reviews() -> &'static [(Route, Value)] {
    static REVIEWS: OnceLock<Vec<(Route, Value)>> = OnceLock::new();
    REVIEWS.get_or_init(|| {
        let samples = documents_in(&manifests().join("samples/reviews"), "json");
        let runtimes = documents_in(&manifests().join("runtimes"), "yaml");
        samples
            .into_iter()
            .chain(runtimes.iter().map(review_of))
            .flat_map(|review| {
                routes_of(&review)
                    .into_iter()
                    .map(move |r| (r, review.clone()))
            })
            .collect()
    })
}

/// The first document of every `*.<extension>` file in `dir`, in path order.
fn documents_in(dir: &Path, extension: &str) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("a shipped file reads");
            mpi_webhook::objects::dir::parse_documents(&text, extension == "json")
                .expect("a shipped file parses")
                .remove(0)
        })
        .collect()
}

/// The routes that serve `review`'s kind, validating and mutating.
fn routes_of(review: &Value) -> Vec<Route> {
    let kind = &review["request"]["kind"];
    let (group, name) = (
        kind["group"].as_str().unwrap_or_default(),
        kind["kind"].as_str().unwrap_or_default(),
    );
    [Verb::Validate, Verb::Mutate]
        .into_iter()
        .filter_map(|verb| Route::for_kind(verb, group, name))
        .collect()
}

/// A CREATE AdmissionReview of `object` as the apiserver sends it.
pub fn review_of(object: &Value) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "fuzz"},
            "object": object,
        }
    })
}

/// Answers `body` on `route` exactly as `serve` does (after the body was read).
pub fn answer(route: Route, body: &[u8]) -> std::result::Result<Reviewed, BadReview> {
    futures::executor::block_on(review(route, body, objects()))
}

/// Checks that `reviewed` is a well-formed `admission.k8s.io/v1` response (a denial is 403
/// Forbidden with a message, a patch is a base64 JSON Patch) and returns its `response`.
pub fn check_response(reviewed: &Reviewed) -> Value {
    let review: Value = serde_json::from_slice(&reviewed.body).expect("the response is JSON");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let response = review["response"].clone();
    assert!(response["uid"].is_string(), "uid: {response}");
    match response["allowed"].as_bool() {
        Some(true) => {}
        Some(false) => {
            assert_eq!(response["status"]["code"], 403, "{response}");
            assert_eq!(response["status"]["reason"], "Forbidden", "{response}");
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "a denial says why: {response}");
        }
        None => panic!("allowed is not a boolean: {response}"),
    }
    if let Some(patch) = response.get("patch") {
        assert_eq!(response["patchType"], "JSONPatch", "{response}");
        patch_of(&response).unwrap_or_else(|| panic!("patch is not a base64 JSON Patch: {patch}"));
    }
    response
}

/// The JSON Patch of a response, if it has one.
pub fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let text = response.get("patch")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Member names the policy reads, so that edits reach the code that reads them.
const KEYS: &[&str] = &[
    "metadata",
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "ownerReferences",
    "kind",
    "apiVersion",
    "controller",
    "spec",
    "replicatedJobs",
    "replicas",
    "template",
    "parallelism",
    "completions",
    "containers",
    "volumes",
    "volumeMounts",
    "mountPath",
    "env",
    "value",
    "resources",
    "limits",
    "requests",
    "nvidia.com/gpu",
    "node",
    "launcher",
    "network",
    "subdomain",
    "enableDNSHostnames",
    "dependsOn",
    "status",
    "trainer",
    "numNodes",
    "numProcPerNode",
    "runtimeRef",
    "mlPolicy",
    "mpi",
    "mpiImplementation",
    "sshAuthMountPath",
    "runLauncherAsNode",
    "trainer.kubeflow.org/trainjob-ancestor-step",
    "gpu",
];

/// Strings worth trying where the policy compares values.
const STRINGS: &[&str] = &[
    "",
    "node",
    "launcher",
    "OpenMPI",
    "Intel",
    "MPICH",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "99999999999",
    "/root/.ssh",
    "relative",
    "TrainJob",
    "trainer.kubeflow.org/v1alpha1",
    "trainer",
    "1500m",
    "4",
    "Ready",
    "mpi-ssh-auth",
    "mpi-hostfile",
    "/etc/mpi",
    "2222",
    "65536",
    "node,gpu",
    "gpu,node",
    "node,node",
    "launcher,node",
    "gpu=2",
    "node=1,gpu=4",
    "gpu=0",
];

/// The keys the policy reads: [`KEYS`], JobSet mode's label and every setting annotation (the
/// library's own list, so a new setting is fuzzed without an edit here).
fn known_keys() -> &'static [&'static str] {
    static ALL: OnceLock<Vec<&'static str>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all = KEYS.to_vec();
        all.push(settings::IMPLEMENTATION_LABEL);
        all.extend(settings::SETTING_ANNOTATIONS);
        all
    })
}

/// A key: mostly one the policy reads, sometimes arbitrary.
fn key(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(7, 8)? {
        Ok((*u.choose(known_keys())?).to_string())
    } else {
        u.arbitrary()
    }
}

/// An arbitrary JSON value nested at most `depth` levels, biased towards what the policy reads.
pub fn arbitrary_json(u: &mut Unstructured<'_>, depth: u32) -> Result<Value> {
    let choices = if depth == 0 { 6 } else { 8 };
    Ok(match u.choose_index(choices)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => json!(*u.choose(&[
            0i64,
            1,
            -1,
            2,
            3,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::MAX,
            i64::MIN
        ])?),
        3 => json!(u.arbitrary::<i64>()?),
        4 => json!(
            u.arbitrary::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .unwrap_or(2.5)
        ),
        5 => {
            if u.ratio(3, 4)? {
                json!(*u.choose(STRINGS)?)
            } else {
                json!(u.arbitrary::<String>()?)
            }
        }
        6 => {
            let len = u.int_in_range(0..=3)?;
            Value::Array(
                (0..len)
                    .map(|_| arbitrary_json(u, depth - 1))
                    .collect::<Result<_>>()?,
            )
        }
        _ => {
            let len = u.int_in_range(0..=3)?;
            let mut map = Map::new();
            for _ in 0..len {
                map.insert(key(u)?, arbitrary_json(u, depth - 1)?);
            }
            Value::Object(map)
        }
    })
}

/// Every JSON pointer into `value`, parents before children.
pub fn pointers(value: &Value, at: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let path = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(path.clone());
                pointers(child, &path, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let path = format!("{at}/{i}");
                out.push(path.clone());
                pointers(child, &path, out);
            }
        }
        _ => {}
    }
}

/// Applies one to four edits to `doc`: replace a location by an arbitrary value, remove it, or
/// add a member to an object (or an element to an array).
pub fn edit(u: &mut Unstructured<'_>, doc: &mut Value) -> Result<()> {
    for _ in 0..u.int_in_range(1..=4)? {
        let mut locations = vec![String::new()];
        pointers(doc, "", &mut locations);
        let at = u.choose(&locations)?.clone();
        let depth = u.int_in_range(0..=3)?;
        match u.choose_index(3)? {
            0 => {
                let value = arbitrary_json(u, depth)?;
                if let Some(slot) = doc.pointer_mut(&at) {
                    *slot = value;
                }
            }
            1 => {
                if let Some((parent, last)) = at.rsplit_once('/') {
                    let last = last.replace("~1", "/").replace("~0", "~");
                    match doc.pointer_mut(parent) {
                        Some(Value::Object(map)) => {
                            map.shift_remove(&last);
                        }
                        Some(Value::Array(items)) => {
                            if let Ok(i) = last.parse::<usize>()
                                && i < items.len()
                            {
                                items.remove(i);
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {
                let (name, value) = (key(u)?, arbitrary_json(u, depth)?);
                match doc.pointer_mut(&at) {
                    Some(Value::Object(map)) => {
                        map.insert(name, value);
                    }
                    Some(Value::Array(items)) => items.push(value),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Whether a denial message names the field it is about (`spec.x: ...`, `metadata.labels[...]`,
/// `request.object ...`), or is upstream's one field-less text (`unsupported runtime: ...`).
pub fn names_a_field(message: &str) -> bool {
    message.starts_with("unsupported runtime: ")
        || message.split_whitespace().any(|word| {
            let word = word.trim_start_matches('[');
            ["spec", "metadata", "request.object"].iter().any(|root| {
                word.strip_prefix(root)
                    .and_then(|rest| rest.chars().next())
                    .is_some_and(|c| matches!(c, '.' | '[' | ':'))
                    || word == *root
            })
        })
}
