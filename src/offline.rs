//! The offline subcommands `review` and `render`: files in, the server's or the reconciler's
//! output on stdout.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::admission::{self, BadReview, Verb};
use crate::cli::{RenderArgs, ReviewArgs, ReviewVerb};
use crate::mpi::ssh_secret::generate_key_pair;
use crate::objects::dir::parse_documents;
use crate::objects::{LoadError, Snapshot};
use crate::render::{RenderError, Rendered, render};

/// An offline subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The objects directory could not be loaded.
    #[error("loading --objects-dir: {0}")]
    Objects(#[from] LoadError),
    /// The review file could not be read.
    #[error("{path}: {source}")]
    ReadReview {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The review file is not one YAML/JSON document.
    #[error("{path}: {message}")]
    ParseReview {
        /// The file.
        path: String,
        /// The problem.
        message: String,
    },
    /// The review is not an AdmissionReview the server would answer.
    #[error("{path}: {source}")]
    BadReview {
        /// The file.
        path: String,
        /// The problem.
        #[source]
        source: BadReview,
    },
    /// Rendering failed.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The response could not be serialized.
    #[error("writing the response: {0}")]
    Output(#[from] serde_json::Error),
}

fn read_review(file: &Path) -> Result<Value, OfflineError> {
    let path = file.display().to_string();
    let mut text = String::new();
    let read = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|t| text = t)
    };
    read.map_err(|source| OfflineError::ReadReview {
        path: path.clone(),
        source,
    })?;
    // JSON is YAML, but serde_json's errors are clearer for JSON input.
    let json = text.trim_start().starts_with('{');
    let mut documents =
        parse_documents(&text, json).map_err(|message| OfflineError::ParseReview {
            path: path.clone(),
            message,
        })?;
    match documents.len() {
        1 => Ok(documents.remove(0)),
        n => Err(OfflineError::ParseReview {
            path,
            message: format!("expected one AdmissionReview document, found {n}"),
        }),
    }
}

/// `review validate|mutate FILE`: the AdmissionReview response JSON the server would send.
///
/// # Errors
/// [`OfflineError`] when the objects or the review cannot be read.
pub async fn review(args: &ReviewArgs) -> Result<String, OfflineError> {
    let snapshot = match &args.objects_dir {
        Some(dir) => Snapshot::load_dir(dir)?,
        None => Snapshot::default(),
    };
    let value = read_review(&args.file)?;
    let path = args.file.display().to_string();
    let verb = match args.verb {
        ReviewVerb::Validate => Verb::Validate,
        ReviewVerb::Mutate => Verb::Mutate,
    };
    let bad = |source| OfflineError::BadReview {
        path: path.clone(),
        source,
    };
    let route = admission::route_for(verb, &value).map_err(bad)?;
    // The same bytes and the same read as `serve`: YAML becomes the JSON it stands for.
    let body = serde_json::to_vec(&value)?;
    let options = admission::Options::from(&args.policy);
    let reviewed = admission::review_with(route, &body, &snapshot, &options)
        .await
        .map_err(bad)?;
    Ok(serde_json::to_string_pretty(&reviewed.json())?)
}

/// `render`: the YAML and the skipped TrainJobs.
///
/// # Errors
/// [`OfflineError`] when the objects cannot be read or keys cannot be generated.
pub fn render_dir(args: &RenderArgs) -> Result<Rendered, OfflineError> {
    let snapshot = Snapshot::load_dir(&args.objects_dir)?;
    Ok(render(
        &snapshot,
        &(&args.objects).into(),
        generate_key_pair,
    )?)
}
