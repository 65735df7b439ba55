//! AdmissionReview in, AdmissionReview out: the one place that reads a review, dispatches it to
//! the policy and turns the verdict into an `admission.k8s.io/v1` response (denials as 403
//! Forbidden, patches as JSONPatch). Shared by `serve` and the offline `review` command, which
//! turns its YAML or JSON into the same bytes.
//!
//! One read ([`read`]): the review straight into borrowed, typed fields, the object as raw
//! JSON, which the route reads into its own types. Pure apart from the lookups in the given
//! [`ObjectSource`].

mod mutate;
mod read;
mod validate;

use kube::core::Status;
use kube::core::admission::Operation;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::mpi::enforce::{Element, JobSetView, PatchJson};
use crate::objects::{LookupError, ObjectSource};

use read::Request;

/// The HTTPS admission routes of `serve` (the product contract: these paths are fixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Validate TrainJob (CREATE, UPDATE).
    ValidateTrainJob,
    /// Validate TrainingRuntime.
    ValidateTrainingRuntime,
    /// Validate ClusterTrainingRuntime.
    ValidateClusterTrainingRuntime,
    /// Mutate JobSet (CREATE): TrainJob mode and JobSet mode.
    MutateJobSet,
    /// Validate JobSet-mode JobSets (CREATE, UPDATE).
    ValidateJobSet,
}

/// Whether a review asks to validate or to mutate (the `review` subcommand's verb).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Validating webhook.
    Validate,
    /// Mutating webhook.
    Mutate,
}

impl Route {
    /// Every route, in the order docs/operations.md lists them.
    pub const ALL: [Route; 5] = [
        Route::ValidateTrainJob,
        Route::ValidateTrainingRuntime,
        Route::ValidateClusterTrainingRuntime,
        Route::MutateJobSet,
        Route::ValidateJobSet,
    ];

    /// The URL path.
    pub fn path(self) -> &'static str {
        match self {
            Route::ValidateTrainJob => "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
            Route::ValidateTrainingRuntime => {
                "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime"
            }
            Route::ValidateClusterTrainingRuntime => {
                "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
            }
            Route::MutateJobSet => "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
            Route::ValidateJobSet => "/validate-jobset-x-k8s-io-v1alpha2-jobset",
        }
    }

    /// The group and kind the route admits.
    pub fn group_kind(self) -> (&'static str, &'static str) {
        match self {
            Route::ValidateTrainJob => (crate::api::TRAINER_GROUP, "TrainJob"),
            Route::ValidateTrainingRuntime => (crate::api::TRAINER_GROUP, "TrainingRuntime"),
            Route::ValidateClusterTrainingRuntime => {
                (crate::api::TRAINER_GROUP, "ClusterTrainingRuntime")
            }
            Route::MutateJobSet | Route::ValidateJobSet => (crate::api::JOBSET_GROUP, "JobSet"),
        }
    }

    /// Validate or mutate.
    pub fn verb(self) -> Verb {
        match self {
            Route::MutateJobSet => Verb::Mutate,
            _ => Verb::Validate,
        }
    }

    /// A short name for metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Route::ValidateTrainJob => "validate-trainjob",
            Route::ValidateTrainingRuntime => "validate-trainingruntime",
            Route::ValidateClusterTrainingRuntime => "validate-clustertrainingruntime",
            Route::MutateJobSet => "mutate-jobset",
            Route::ValidateJobSet => "validate-jobset",
        }
    }

    /// The route serving `verb` for objects of `group`/`kind`, as the webhook configurations
    /// wire them.
    pub fn for_kind(verb: Verb, group: &str, kind: &str) -> Option<Route> {
        Route::ALL
            .into_iter()
            .find(|r| r.verb() == verb && r.group_kind() == (group, kind))
    }
}

/// The body is not an AdmissionReview (answered with HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadReview(pub String);

/// What happened to one review, for logs and metrics. Holds no object content beyond what the
/// denial message quotes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Request uid.
    pub uid: String,
    /// `group/version, Kind=...` of the object.
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Object name (may be empty on CREATE with generateName).
    pub name: String,
    /// CREATE, UPDATE, ...
    pub operation: &'static str,
    /// The verdict.
    pub allowed: bool,
    /// Number of JSON patch operations returned.
    pub patch_operations: usize,
    /// The message of a denial, as sent.
    pub denial: Option<String>,
    /// An internal failure behind a generic denial; logged, never sent to the client.
    pub internal_error: Option<String>,
}

/// A review answered.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The `admission.k8s.io/v1` AdmissionReview response to send, as JSON bytes.
    pub body: Vec<u8>,
    /// What happened.
    pub summary: Summary,
}

impl Reviewed {
    /// The response review as a JSON value (for printing and tests; `serve` sends [`Self::body`]).
    pub fn json(&self) -> Value {
        // The body was serialized by this crate from plain types: it always parses.
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// The verdict of one policy step, before it becomes a response.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Allowed, with warnings for the client and a JSON patch (mutation only).
    Allow {
        warnings: Vec<String>,
        patch: Option<PatchJson>,
    },
    /// Denied with this message; warnings are sent with it.
    Deny {
        message: String,
        warnings: Vec<String>,
    },
    /// The policy could not be evaluated: denied with a generic message, the error logged.
    Internal(InternalError),
}

impl Verdict {
    pub(crate) fn allow() -> Self {
        Verdict::Allow {
            warnings: Vec::new(),
            patch: None,
        }
    }

    pub(crate) fn deny(message: impl Into<String>) -> Self {
        Verdict::Deny {
            message: message.into(),
            warnings: Vec::new(),
        }
    }

    /// Allowed with `warnings` when there is no `denial`, else denied with both.
    pub(crate) fn from_checks(denial: Option<String>, warnings: Vec<String>) -> Self {
        match denial {
            Some(message) => Verdict::Deny { message, warnings },
            None => Verdict::Allow {
                warnings,
                patch: None,
            },
        }
    }
}

/// Why a review could not be evaluated. Logged, never sent to the client.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InternalError {
    /// The TrainJob or runtime could not be looked up (the error names which).
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// JobSet-mode settings that parse gave no plan (they always give one).
    #[error("JobSet mode: no plan and no error")]
    NoPlan,
    /// A review read once could not be read again (it always can).
    #[error("the review could not be read again: {0}")]
    Reread(String),
}

/// `apiVersion` of the reviews read and written.
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of the reviews read and written.
const REVIEW_KIND: &str = "AdmissionReview";

/// What the policy is configured with besides the objects it looks up: plain data from the
/// command line of `serve` and `review`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--preflight-image`: the image of JobSet mode's launcher pre-flight init container;
    /// empty, no pre-flight.
    pub preflight_image: String,
}

/// Answers one AdmissionReview (JSON bytes) on `route`, with the default [`Options`].
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review<S: ObjectSource>(
    route: Route,
    body: &[u8],
    objects: &S,
) -> Result<Reviewed, BadReview> {
    review_with(route, body, objects, &Options::default()).await
}

/// Answers one AdmissionReview (JSON bytes) on `route` with `options`.
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review_with<S: ObjectSource>(
    route: Route,
    body: &[u8],
    objects: &S,
    options: &Options,
) -> Result<Reviewed, BadReview> {
    // The mutation reads the JobSet's view in the same pass as the review; the validations read
    // their objects whole, from the raw JSON.
    if route == Route::MutateJobSet {
        let req = read::request::<Element<JobSetView<'_>>>(body)?;
        let verdict = match (precheck(route, &req), &req.object) {
            (Some(verdict), _) => verdict,
            (None, Some(jobset)) if req.operation == Operation::Create => {
                mutate::jobset(&req, jobset, body, objects, options).await
            }
            (None, _) => Verdict::allow(),
        };
        return Ok(answer(&req, verdict));
    }
    let req = read::request::<&RawValue>(body)?;
    let verdict = match (precheck(route, &req), req.object) {
        (Some(verdict), _) => verdict,
        (None, None) => Verdict::allow(),
        (None, Some(object)) => validate(route, &req, object, objects).await,
    };
    Ok(answer(&req, verdict))
}

/// The response review and summary of `verdict` on `req`.
fn answer<O>(req: &Request<'_, O>, verdict: Verdict) -> Reviewed {
    let mut summary = summarize(req);
    let body = respond(&req.uid, verdict, &mut summary);
    Reviewed { body, summary }
}

/// The last-resort answer when a response cannot be written: a denial.
const FAIL_CLOSED_REVIEW: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false}}"#;

/// `bytes` in base64 as a JSON string. Built as raw JSON: base64 has nothing to escape, and
/// serializing it as a string would scan every character for escapes (a mutation's patch is
/// several KiB).
fn base64_json_string(bytes: &[u8]) -> Option<Box<RawValue>> {
    use base64::Engine as _;
    let mut json = String::with_capacity(bytes.len().div_ceil(3) * 4 + 2);
    json.push('"');
    base64::engine::general_purpose::STANDARD.encode_string(bytes, &mut json);
    json.push('"');
    RawValue::from_string(json).ok()
}

/// A response, as [`review_bytes`] writes it.
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    status: Status,
    patch: Option<&'a [u8]>,
    warnings: &'a [String],
}

/// The response review as JSON bytes, written once, in kube-core's field order, with `patch` as
/// the base64 string the API expects (a Go `[]byte`).
fn review_bytes(response: &Response<'_>) -> Vec<u8> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ReviewOut<'a> {
        api_version: &'static str,
        kind: &'static str,
        response: ResponseOut<'a>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ResponseOut<'a> {
        uid: &'a str,
        allowed: bool,
        status: &'a Status,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch: Option<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch_type: Option<&'static str>,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        warnings: &'a [String],
    }
    // A patch that cannot be written must not become an allowed answer without it.
    let patch = match response.patch.map(base64_json_string) {
        Some(None) => return FAIL_CLOSED_REVIEW.to_vec(),
        patch => patch.flatten(),
    };
    let review = ReviewOut {
        api_version: REVIEW_API_VERSION,
        kind: REVIEW_KIND,
        response: ResponseOut {
            uid: response.uid,
            allowed: response.allowed,
            status: &response.status,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: response.warnings,
        },
    };
    // Sized for the patch, so a mutation's few KiB are not copied while the buffer grows.
    let mut body =
        Vec::with_capacity(512 + review.response.patch.as_ref().map_or(0, |p| p.get().len()));
    // Plain strings, numbers and string-keyed maps: serializing them cannot fail.
    match serde_json::to_writer(&mut body, &review) {
        Ok(()) => body,
        Err(_) => FAIL_CLOSED_REVIEW.to_vec(),
    }
}

/// The route the `review` subcommand uses for a review: by `request.kind`, as the webhook
/// configurations route them.
///
/// # Errors
/// [`BadReview`] when the value has no `request.kind` or no route serves that kind for `verb`.
pub fn route_for(verb: Verb, value: &Value) -> Result<Route, BadReview> {
    let kind = value
        .pointer("/request/kind")
        .ok_or_else(|| BadReview("request.kind is missing".into()))?;
    let group = kind
        .get("group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = kind.get("kind").and_then(Value::as_str).unwrap_or_default();
    Route::for_kind(verb, group, name).ok_or_else(|| {
        BadReview(format!(
            "no {} route serves kind {name:?} of group {group:?}",
            match verb {
                Verb::Validate => "validate",
                Verb::Mutate => "mutate",
            }
        ))
    })
}

fn summarize<O>(req: &Request<'_, O>) -> Summary {
    Summary {
        uid: req.uid.clone().into_owned(),
        kind: format!(
            "{}/{}, Kind={}",
            req.kind.group, req.kind.version, req.kind.kind
        ),
        namespace: req.namespace.clone().unwrap_or_default().into_owned(),
        name: req.name.clone().into_owned(),
        operation: match req.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        },
        ..Summary::default()
    }
}

/// The verdict on a request that no route's policy needs to see: any operation but CREATE and
/// UPDATE (allowed), a kind the route does not admit, or no object. `None` for the others.
fn precheck<O>(route: Route, req: &Request<'_, O>) -> Option<Verdict> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Some(Verdict::allow());
    }
    let (group, kind) = route.group_kind();
    if (req.kind.group.as_ref(), req.kind.kind.as_ref()) != (group, kind) {
        return Some(Verdict::deny(format!(
            "{} admits {kind}.{group}, not {}.{}: check the webhook configuration's rules",
            route.path(),
            req.kind.kind,
            req.kind.group
        )));
    }
    req.object
        .is_none()
        .then(|| Verdict::deny(format!("request.object is missing from this {kind} review")))
}

/// The verdict of a validating route on `object`.
async fn validate<S: ObjectSource>(
    route: Route,
    req: &Request<'_>,
    object: &RawValue,
    objects: &S,
) -> Verdict {
    match route {
        Route::ValidateTrainJob => validate::train_job(req, object, objects).await,
        Route::ValidateTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::TrainingRuntime)
        }
        Route::ValidateClusterTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::ClusterTrainingRuntime)
        }
        Route::ValidateJobSet => validate::jobset(req, object),
        // Answered by `review` before it reads the object raw.
        Route::MutateJobSet => Verdict::allow(),
    }
}

/// Message sent instead of an internal error's details, which stay in the logs.
pub const INTERNAL_ERROR_MESSAGE: &str =
    "mpi-webhook could not evaluate this request; its logs have the details";

/// The status of a denial as every mpi-webhook denial reads (the product contract): code 403,
/// reason Forbidden, and the message. kube-core's `deny` alone leaves the code and reason empty.
fn forbidden(message: &str) -> Status {
    Status::failure(message, "Forbidden").with_code(403)
}

/// A whole response review denying the request with `uid`, for a denial made outside a review
/// (`serve`'s expired deadline), written like every other response.
pub fn denial_review(uid: String, message: &str) -> Vec<u8> {
    review_bytes(&Response {
        uid: &uid,
        allowed: false,
        status: forbidden(message),
        patch: None,
        warnings: &[],
    })
}

/// The response to the request with `uid`, as bytes, and what happened, in `summary`.
fn respond(uid: &str, verdict: Verdict, summary: &mut Summary) -> Vec<u8> {
    let (warnings, patch, denial) = match verdict {
        Verdict::Allow { warnings, patch } => (warnings, patch, None),
        Verdict::Deny { message, warnings } => (warnings, None, Some(message)),
        Verdict::Internal(error) => {
            summary.internal_error = Some(error.to_string());
            (Vec::new(), None, Some(INTERNAL_ERROR_MESSAGE.to_string()))
        }
    };
    if let Some(message) = denial {
        let body = review_bytes(&Response {
            uid,
            allowed: false,
            status: forbidden(&message),
            patch: None,
            warnings: &warnings,
        });
        summary.denial = Some(message);
        return body;
    }
    summary.allowed = true;
    // An empty patch is no patch.
    let patch = patch.filter(|p| p.operations > 0);
    summary.patch_operations = patch.as_ref().map_or(0, |p| p.operations);
    review_bytes(&Response {
        uid,
        allowed: true,
        status: Status::default(),
        patch: patch.as_ref().map(|p| p.json.as_slice()),
        warnings: &warnings,
    })
}
