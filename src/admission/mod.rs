//! AdmissionReview in, AdmissionReview out: the one place that reads a review, dispatches it to
//! the policy and turns the verdict into an `admission.k8s.io/v1` response (denials as 403
//! Forbidden, patches as JSONPatch). Shared by `serve` and the offline `review` command, which
//! turns its YAML or JSON into the same bytes.
//!
//! One read ([`read`]): the body parsed once, the request into kube-core's `AdmissionRequest`,
//! the object kept as JSON, from which the route reads its typed views. One answer
//! ([`answer`]): the route's verdict, then kube-core's `AdmissionResponse` and one
//! [`Outcome`] for the response, the log and the metrics. Pure apart from the lookups in the
//! given [`ObjectSource`].

mod mutate;
mod read;
mod validate;

use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation, SerializePatchError};
use kube::core::{DynamicObject, Status};
use serde_json::Value;

use crate::json_error::Unreadable;
use crate::objects::{LookupError, ObjectSource};

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

/// The body is not an AdmissionReview (answered with HTTP 400), or, for the `review`
/// subcommand, one no route serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReview {
    /// The body does not parse as JSON.
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    /// The body is JSON, but not an object.
    #[error("request body is not a JSON object")]
    NotAnObject,
    /// A member of the review is of the wrong shape.
    #[error("not an AdmissionReview: {0}")]
    Unreadable(Unreadable),
    /// Another kind of object.
    #[error(
        "expected apiVersion \"{REVIEW_API_VERSION}\" and kind \"{REVIEW_KIND}\", got {api_version:?} and {kind:?}"
    )]
    WrongKind {
        /// The body's `apiVersion`.
        api_version: String,
        /// The body's `kind`.
        kind: String,
    },
    /// No `request` (or `null`).
    #[error("AdmissionReview has no request")]
    NoRequest,
    /// `review`: no `request.kind` to route by.
    #[error("request.kind is missing")]
    NoKind,
    /// `review`: no route serves the kind for the verb.
    #[error("no {verb} route serves kind {kind:?} of group {group:?}")]
    NoRoute {
        /// `validate` or `mutate`.
        verb: &'static str,
        /// `request.kind.kind`.
        kind: String,
        /// `request.kind.group`.
        group: String,
    },
}

/// What became of one review: computed once, from the verdict, and used by the response, the
/// log line and the metrics alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed without a patch.
    Allowed,
    /// Allowed with a JSON patch of this many operations.
    Patched {
        /// The number of operations.
        operations: usize,
    },
    /// Denied with this message, as sent.
    Denied {
        /// The message.
        message: String,
    },
    /// The policy could not be evaluated: denied with [`INTERNAL_ERROR_MESSAGE`]; the error is
    /// logged, never sent to the client.
    InternalError {
        /// What went wrong.
        error: String,
    },
}

impl Outcome {
    /// Whether the request was allowed.
    pub fn allowed(&self) -> bool {
        matches!(self, Outcome::Allowed | Outcome::Patched { .. })
    }

    /// The number of patch operations returned (0 without a patch).
    pub fn patch_operations(&self) -> usize {
        match self {
            Outcome::Patched { operations } => *operations,
            _ => 0,
        }
    }
}

/// A review answered: the response to send, and what happened, for the log line and the
/// metrics. Holds no object content beyond what the denial message quotes.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The `admission.k8s.io/v1` AdmissionReview response to send, as JSON bytes.
    pub body: Vec<u8>,
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
    /// The outcome.
    pub outcome: Outcome,
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
        patch: Option<json_patch::Patch>,
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
    /// A patch that could not be serialized (it always can).
    #[error(transparent)]
    Patch(#[from] SerializePatchError),
}

/// `apiVersion` of the reviews read and written.
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of the reviews read and written.
const REVIEW_KIND: &str = "AdmissionReview";

/// What the policy is configured with besides the objects it looks up: the plan's options,
/// plain data from the command line of `serve` and `review`.
pub use crate::mpi::plan::Options;

pub use read::{Request, request as read, request_then as read_then};

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

/// Answers one AdmissionReview (JSON bytes) on `route` with `options`: [`read`], then
/// [`answer`].
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review_with<S: ObjectSource>(
    route: Route,
    body: &[u8],
    objects: &S,
    options: &Options,
) -> Result<Reviewed, BadReview> {
    let req = read(body)?;
    Ok(answer(route, &req, objects, options).await)
}

/// Answers the request `req` read from a review on `route` with `options`.
pub async fn answer<S: ObjectSource>(
    route: Route,
    req: &Request,
    objects: &S,
    options: &Options,
) -> Reviewed {
    let verdict = match (precheck(route, req), &req.object) {
        (Some(verdict), _) => verdict,
        (None, None) => Verdict::allow(),
        (None, Some(object)) => policy(route, req, object, objects, options).await,
    };
    respond(req, verdict)
}

/// The verdict of `route`'s policy on `object`.
async fn policy<S: ObjectSource>(
    route: Route,
    req: &Request,
    object: &Value,
    objects: &S,
    options: &Options,
) -> Verdict {
    match route {
        Route::ValidateTrainJob => validate::train_job(req, object, objects).await,
        Route::ValidateTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::TrainingRuntime)
        }
        Route::ValidateClusterTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::ClusterTrainingRuntime)
        }
        Route::ValidateJobSet => validate::jobset(req, object, options),
        Route::MutateJobSet if req.request.operation == Operation::Create => {
            mutate::jobset(req, object, objects, options).await
        }
        Route::MutateJobSet => Verdict::allow(),
    }
}

/// The route the `review` subcommand uses for a review: by `request.kind`, as the webhook
/// configurations route them.
///
/// # Errors
/// [`BadReview`] when the value has no `request.kind` or no route serves that kind for `verb`.
pub fn route_for(verb: Verb, value: &Value) -> Result<Route, BadReview> {
    let kind = value.pointer("/request/kind").ok_or(BadReview::NoKind)?;
    let group = kind
        .get("group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = kind.get("kind").and_then(Value::as_str).unwrap_or_default();
    Route::for_kind(verb, group, name).ok_or_else(|| BadReview::NoRoute {
        verb: match verb {
            Verb::Validate => "validate",
            Verb::Mutate => "mutate",
        },
        kind: name.to_owned(),
        group: group.to_owned(),
    })
}

/// The verdict on a request that no route's policy needs to see: any operation but CREATE and
/// UPDATE (allowed), a kind the route does not admit, or no object. `None` for the others.
fn precheck(route: Route, req: &Request) -> Option<Verdict> {
    let request = &req.request;
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Some(Verdict::allow());
    }
    let (group, kind) = route.group_kind();
    if (request.kind.group.as_str(), request.kind.kind.as_str()) != (group, kind) {
        return Some(Verdict::deny(format!(
            "{} admits {kind}.{group}, not {}.{}: check the webhook configuration's rules",
            route.path(),
            request.kind.kind,
            request.kind.group
        )));
    }
    req.object
        .is_none()
        .then(|| Verdict::deny(format!("request.object is missing from this {kind} review")))
}

/// Message sent instead of an internal error's details, which stay in the logs.
pub const INTERNAL_ERROR_MESSAGE: &str =
    "mpi-webhook could not evaluate this request; its logs have the details";

/// kube-core's response to `req` denying it with `message` as every mpi-webhook denial reads
/// (the product contract): code 403, reason Forbidden. kube-core's `deny` alone leaves the code
/// and reason empty.
fn denied<T: kube::Resource>(req: &AdmissionRequest<T>, message: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req).deny(message);
    response.result = Status::failure(message, "Forbidden").with_code(403);
    response
}

/// A whole response review denying the request with `uid`, for a denial made outside a review
/// (`serve`'s expired deadline), written like every other response.
pub fn denial_review(uid: String, message: &str) -> Vec<u8> {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid;
    response.result = Status::failure(message, "Forbidden").with_code(403);
    review_bytes(response)
}

/// The response review as JSON bytes, with the patch as the base64 string the API expects (a
/// Go `[]byte`; kube-core's serde writes the bytes as an array of numbers), where kube-core
/// puts it: before `patchType`. The review is written without the patch, which is then written
/// in its place, encoded straight into the body (base64 needs no JSON escapes).
fn review_bytes(mut response: AdmissionResponse) -> Vec<u8> {
    use base64::Engine as _;
    let patch = response.patch.take();
    let review = response.into_review();
    let Some(patch) = patch else {
        // Plain strings, numbers and string-keyed maps: serializing them cannot fail.
        return serde_json::to_vec(&review).unwrap_or_else(|_| FAIL_CLOSED_REVIEW.to_vec());
    };
    // The patch member: its start, the base64 string and its closing quote.
    let Some(encoded) = base64::encoded_len(patch.len(), true) else {
        return FAIL_CLOSED_REVIEW.to_vec();
    };
    let member = PATCH_MEMBER.len() + encoded + 1;
    // One buffer: the review around the patch is a few hundred bytes.
    let mut body = Vec::with_capacity(REVIEW_BYTES + member);
    if serde_json::to_writer(&mut body, &review).is_err() {
        return FAIL_CLOSED_REVIEW.to_vec();
    }
    // The member after the patch: written with it (`with_patch`), after `uid`, `allowed` and
    // `status`. A quote in a string is escaped, so these bytes are the member's only.
    let Some(at) = body
        .windows(PATCH_TYPE_MEMBER.len())
        .position(|w| w == PATCH_TYPE_MEMBER)
    else {
        return FAIL_CLOSED_REVIEW.to_vec();
    };
    let end = body.len();
    body.resize(end + member, 0);
    body.copy_within(at..end, at + member);
    let (start, string) = body[at..at + member].split_at_mut(PATCH_MEMBER.len());
    start.copy_from_slice(PATCH_MEMBER);
    let (string, quote) = string.split_at_mut(encoded);
    quote.copy_from_slice(b"\"");
    let engine = &base64::engine::general_purpose::STANDARD;
    match engine.encode_slice(&patch, string) {
        Ok(written) if written == encoded => body,
        _ => FAIL_CLOSED_REVIEW.to_vec(),
    }
}

/// What a response review takes besides its patch, about (`uid`, `status`, warnings).
const REVIEW_BYTES: usize = 512;
/// `patchType` as the response writes it, after the member before it.
const PATCH_TYPE_MEMBER: &[u8] = br#","patchType":"#;
/// The start of the `patch` member, written before [`PATCH_TYPE_MEMBER`], up to its string.
const PATCH_MEMBER: &[u8] = br#","patch":""#;

/// The last-resort answer when a response cannot be written: a denial.
const FAIL_CLOSED_REVIEW: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false}}"#;

/// The response to `req` for `verdict`, as bytes, and what happened.
fn respond(req: &Request, verdict: Verdict) -> Reviewed {
    let request = &req.request;
    let (response, outcome) = match verdict {
        Verdict::Allow { warnings, patch } => {
            // An empty patch is no patch.
            let patch = patch.filter(|p| !p.0.is_empty());
            let operations = patch.as_ref().map_or(0, |p| p.0.len());
            let response = with_warnings(AdmissionResponse::from(request), warnings);
            match patch {
                None => (response, Outcome::Allowed),
                Some(patch) => match response.with_patch(patch) {
                    Ok(patched) => (patched, Outcome::Patched { operations }),
                    // A patch that cannot be written must not become an allowed answer without it.
                    Err(error) => internal(request, InternalError::Patch(error)),
                },
            }
        }
        Verdict::Deny { message, warnings } => (
            with_warnings(denied(request, &message), warnings),
            Outcome::Denied { message },
        ),
        Verdict::Internal(error) => internal(request, error),
    };
    Reviewed {
        body: review_bytes(response),
        uid: request.uid.clone(),
        kind: format!(
            "{}/{}, Kind={}",
            request.kind.group, request.kind.version, request.kind.kind
        ),
        namespace: request.namespace.clone().unwrap_or_default(),
        name: request.name.clone(),
        operation: match request.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        },
        outcome,
    }
}

fn internal(
    request: &AdmissionRequest<DynamicObject>,
    error: InternalError,
) -> (AdmissionResponse, Outcome) {
    (
        denied(request, INTERNAL_ERROR_MESSAGE),
        Outcome::InternalError {
            error: error.to_string(),
        },
    )
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    response.warnings = (!warnings.is_empty()).then_some(warnings);
    response
}
