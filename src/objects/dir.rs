//! Loading objects from a directory of YAML / JSON files (`--objects-dir`).
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under the directory is read, recursively and in path
//! order; YAML files may hold several documents. TrainJobs, (Cluster)TrainingRuntimes and
//! JobSets labelled `mpi-webhook.io/implementation` (JobSet mode, for `render`) are kept; other
//! kinds, and unlabelled JobSets, are skipped with a debug log. A file that is not YAML/JSON, or a known kind
//! whose fields have the wrong types, fails the whole load with an error naming the file.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::api::{JOBSET_GROUP, JobSet, RuntimeKind, TRAINER_GROUP, TrainJob, TrainingRuntime};
use crate::mpi::jobset_mode::IMPLEMENTATION_LABEL;

use super::Snapshot;

/// Directory nesting deeper than this is not followed (guards against symlink loops).
const MAX_DEPTH: usize = 16;

/// Loading `--objects-dir` failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A directory or file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid YAML / JSON, or a document is not an object.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A known kind has a field of the wrong type.
    #[error("{path}: document {document} ({kind} {name:?}): {message}")]
    Object {
        /// The file.
        path: PathBuf,
        /// 1-based document number in the file.
        document: usize,
        /// The object's kind.
        kind: String,
        /// The object's name, when readable.
        name: String,
        /// The field and the problem.
        message: Box<crate::json_error::Unreadable>,
    },
}

/// The kinds an objects directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownKind {
    /// A TrainJob.
    TrainJob,
    /// A runtime of either kind.
    Runtime(RuntimeKind),
    /// A JobSet carrying JobSet mode's label.
    JobSet,
}

impl KnownKind {
    /// The known kind of an object, from its `apiVersion` and `kind`.
    pub fn of(value: &Value) -> Option<Self> {
        let api_version = value.get("apiVersion").and_then(Value::as_str)?;
        let kind = value.get("kind").and_then(Value::as_str)?;
        if api_version.split('/').next() == Some(JOBSET_GROUP) && kind == "JobSet" {
            let labelled = value
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .is_some_and(|labels| labels.contains_key(IMPLEMENTATION_LABEL));
            return labelled.then_some(Self::JobSet);
        }
        if api_version.split('/').next() != Some(TRAINER_GROUP) {
            return None;
        }
        match kind {
            "TrainJob" => Some(Self::TrainJob),
            "TrainingRuntime" => Some(Self::Runtime(RuntimeKind::TrainingRuntime)),
            "ClusterTrainingRuntime" => Some(Self::Runtime(RuntimeKind::ClusterTrainingRuntime)),
            _ => None,
        }
    }
}

/// Reads a typed view from raw JSON, naming the offending field on error
/// (e.g. `spec.trainer.numNodes: invalid type: string "3", expected i32`).
///
/// # Errors
/// The field path and serde's message.
pub fn from_value<T: serde::de::DeserializeOwned>(
    value: &Value,
) -> Result<T, crate::json_error::Unreadable> {
    crate::json_error::read(value)
}

/// Parses the documents of one file: JSON for `*.json`, multi-document YAML otherwise.
///
/// # Errors
/// A message saying why the text is not YAML / JSON.
pub fn parse_documents(text: &str, json: bool) -> Result<Vec<Value>, String> {
    if json {
        return serde_json::from_str::<Value>(text)
            .map(|v| vec![v])
            .map_err(|e| format!("not valid JSON: {e}"));
    }
    serde_saphyr::from_multiple::<Value>(text)
        .map(|docs| docs.into_iter().filter(|d| !d.is_null()).collect())
        .map_err(|e| format!("not valid YAML: {e}"))
}

impl Snapshot {
    /// Loads every object file under `dir`.
    ///
    /// # Errors
    /// [`LoadError`] naming the first file that cannot be read or parsed.
    pub fn load_dir(dir: &Path) -> Result<Snapshot, LoadError> {
        let mut snapshot = Snapshot::default();
        for path in &object_files(dir)? {
            load_file(&mut snapshot, path)?;
        }
        Ok(snapshot)
    }
}

/// The object files under `dir`, in path order: the files [`Snapshot::load_dir`] reads.
///
/// # Errors
/// [`LoadError::Read`] when a directory cannot be listed.
pub fn object_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let mut files = Vec::new();
    collect_files(dir, 0, &mut files)?;
    files.sort();
    Ok(files)
}

fn collect_files(dir: &Path, depth: usize, files: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let read_error = |source| LoadError::Read {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        // Hidden entries include the `..data` / `..<timestamp>` directories of a mounted
        // ConfigMap, whose files also appear at the top level.
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            if depth < MAX_DEPTH {
                collect_files(&path, depth + 1, files)?;
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            files.push(path);
        }
    }
    Ok(())
}

fn load_file(snapshot: &mut Snapshot, path: &Path) -> Result<(), LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_text(snapshot, path, &text)
}

fn load_text(snapshot: &mut Snapshot, path: &Path, text: &str) -> Result<(), LoadError> {
    let json = path.extension().and_then(|e| e.to_str()) == Some("json");
    let syntax = |message| LoadError::Syntax {
        path: path.to_path_buf(),
        message,
    };
    for (i, doc) in parse_documents(text, json)
        .map_err(syntax)?
        .into_iter()
        .enumerate()
    {
        if !doc.is_object() {
            return Err(syntax(format!("document {} is not an object", i + 1)));
        }
        let Some(kind) = KnownKind::of(&doc) else {
            tracing::debug!(file = %path.display(), document = i + 1, "skipping object of an unknown kind");
            continue;
        };
        let object_error = |message: crate::json_error::Unreadable| LoadError::Object {
            path: path.to_path_buf(),
            document: i + 1,
            kind: doc
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            name: doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            message: Box::new(message),
        };
        let replaced = match kind {
            KnownKind::TrainJob => {
                snapshot.insert_train_job(from_value::<TrainJob>(&doc).map_err(object_error)?)
            }
            KnownKind::Runtime(kind) => snapshot.insert_runtime(
                kind,
                from_value::<TrainingRuntime>(&doc).map_err(object_error)?,
            ),
            KnownKind::JobSet => {
                snapshot.insert_jobset(from_value::<JobSet>(&doc).map_err(object_error)?)
            }
        };
        if replaced {
            tracing::warn!(file = %path.display(), document = i + 1, "object defined twice; the later file wins");
        }
    }
    Ok(())
}

/// The MPI runtimes of `manifests/runtimes/`, compiled into the binary so that `serve` with no
/// configuration works from any directory (the README's main-job command).
const SHIPPED_RUNTIMES: &[(&str, &str)] = &[
    (
        "manifests/runtimes/deepspeed_distributed.yaml",
        include_str!("../../manifests/runtimes/deepspeed_distributed.yaml"),
    ),
    (
        "manifests/runtimes/mlx_distributed.yaml",
        include_str!("../../manifests/runtimes/mlx_distributed.yaml"),
    ),
    (
        "manifests/runtimes/intel_mpi_distributed.yaml",
        include_str!("../../manifests/runtimes/intel_mpi_distributed.yaml"),
    ),
    (
        "manifests/runtimes/mpich_distributed.yaml",
        include_str!("../../manifests/runtimes/mpich_distributed.yaml"),
    ),
];

impl Snapshot {
    /// The runtimes shipped in `manifests/runtimes/`, embedded at build time.
    ///
    /// # Errors
    /// [`LoadError`] if an embedded file does not parse (a build of a broken tree).
    pub fn shipped_runtimes() -> Result<Snapshot, LoadError> {
        let mut snapshot = Snapshot::default();
        for (path, text) in SHIPPED_RUNTIMES {
            load_text(&mut snapshot, Path::new(path), text)?;
        }
        Ok(snapshot)
    }
}
