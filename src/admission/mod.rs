//! AdmissionReview in, AdmissionReview out: the one place that reads a review, dispatches it to
//! the policy and turns the verdict into an `admission.k8s.io/v1` response (denials as 403
//! Forbidden, patches as JSONPatch). Shared by `serve` and the offline `review` command.
//!
//! Pure apart from the lookups in the given [`ObjectSource`].

mod mutate;
pub mod projection;
mod validate;

pub use validate::runtime_kind as runtime_kind_of;

use kube::core::DynamicObject;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;

use crate::objects::ObjectSource;

/// The HTTPS admission routes of `serve` (interface.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Validate TrainJob (CREATE, UPDATE).
    ValidateTrainJob,
    /// Validate TrainingRuntime.
    ValidateTrainingRuntime,
    /// Validate ClusterTrainingRuntime.
    ValidateClusterTrainingRuntime,
    /// Mutate JobSet (CREATE).
    MutateJobSet,
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
    /// Every route, in the order of interface.md.
    pub const ALL: [Route; 4] = [
        Route::ValidateTrainJob,
        Route::ValidateTrainingRuntime,
        Route::ValidateClusterTrainingRuntime,
        Route::MutateJobSet,
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
            Route::MutateJobSet => (crate::api::JOBSET_GROUP, "JobSet"),
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
        }
    }

    /// The parts of a review this route reads ([`projection`]): a JobSet's pod templates are
    /// mostly skipped, the objects validated are read whole.
    pub fn review_shape(self) -> &'static projection::Shape {
        match self {
            Route::MutateJobSet => &projection::JOBSET_REVIEW,
            _ => &projection::WHOLE_OBJECT_REVIEW,
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

/// What happened to one review, for logs and metrics. Holds no object content.
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
    pub operation: String,
    /// The verdict.
    pub allowed: bool,
    /// Number of JSON patch operations returned.
    pub patch_operations: usize,
    /// An internal failure behind a generic denial; logged, never sent to the client.
    pub internal_error: Option<String>,
}

/// A review answered.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The `admission.k8s.io/v1` AdmissionReview response to send, as JSON.
    pub review: Value,
    /// What happened.
    pub summary: Summary,
}

/// The verdict of one policy step, before it becomes a response.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// `Some(message)` denies.
    pub denial: Option<String>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
    /// JSON patch operations (mutation only).
    pub patch: Vec<json_patch::PatchOperation>,
    /// Internal failure: deny with a generic message, log this.
    pub internal_error: Option<String>,
}

impl Verdict {
    pub(crate) fn allow() -> Self {
        Self::default()
    }

    pub(crate) fn deny(message: impl Into<String>) -> Self {
        Self {
            denial: Some(message.into()),
            ..Self::default()
        }
    }

    pub(crate) fn internal(error: impl Into<String>) -> Self {
        Self {
            internal_error: Some(error.into()),
            ..Self::default()
        }
    }
}

/// The request as the policy reads it: the kube request (objects taken out) and the raw objects.
pub(crate) struct Request {
    pub req: AdmissionRequest<DynamicObject>,
    pub object: Option<Value>,
}

/// Answers one AdmissionReview (JSON bytes) on `route`.
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review<S: ObjectSource>(
    route: Route,
    body: &[u8],
    objects: &S,
) -> Result<Reviewed, BadReview> {
    let value = projection::from_slice(route.review_shape(), body)
        .map_err(|e| BadReview(format!("request body is not JSON: {e}")))?;
    review_value(route, value, objects).await
}

/// Like [`review`], for a review already parsed into JSON (the CLI reads YAML too).
///
/// # Errors
/// [`BadReview`] when the value is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review_value<S: ObjectSource>(
    route: Route,
    value: Value,
    objects: &S,
) -> Result<Reviewed, BadReview> {
    let request = parse_request(value)?;
    let mut summary = summarize(&request);
    let verdict = decide(route, &request, objects).await;
    let response = respond(&request.req, verdict, &mut summary);
    Ok(Reviewed {
        review: review_json(response),
        summary,
    })
}

/// The response review as JSON, with `patch` as the base64 string the API expects (a Go
/// `[]byte`); kube-core serializes the bytes as a JSON array of numbers.
fn review_json(response: AdmissionResponse) -> Value {
    use base64::Engine as _;
    let mut response = response;
    // Emptied before serializing: as a JSON array of numbers, a 2 KiB patch would become 2,000
    // Values built only to be thrown away. The empty array keeps `patch` in its place.
    let patch = response.patch.as_mut().map(|bytes| {
        let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
        bytes.clear();
        encoded
    });
    // Serializing kube-core's response types cannot fail: every map in them has string keys.
    let mut review = serde_json::to_value(response.into_review()).unwrap_or(Value::Null);
    if let (Some(patch), Some(slot)) = (patch, review.pointer_mut("/response/patch")) {
        *slot = Value::String(patch);
    }
    review
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

fn parse_request(mut value: Value) -> Result<Request, BadReview> {
    if !value.is_object() {
        return Err(BadReview("request body is not a JSON object".into()));
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if (api_version, kind) != ("admission.k8s.io/v1", "AdmissionReview") {
        return Err(BadReview(format!(
            "expected apiVersion \"admission.k8s.io/v1\" and kind \"AdmissionReview\", got {api_version:?} and {kind:?}"
        )));
    }
    let Some(request) = value.get_mut("request").filter(|r| r.is_object()) else {
        return Err(BadReview("AdmissionReview has no request".into()));
    };
    // The objects are read by the policy from raw JSON (so a malformed object is a denial with
    // the request's uid, not a 400, and no field is lost); the kube types get the rest.
    let object = request
        .get_mut("object")
        .map(Value::take)
        .filter(|o| !o.is_null());
    if let Some(old) = request.get_mut("oldObject") {
        old.take();
    }
    let review: AdmissionReview<DynamicObject> = crate::objects::dir::from_value(&value)
        .map_err(|e| BadReview(format!("not an AdmissionReview: {e}")))?;
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| BadReview("AdmissionReview has no request".into()))?;
    Ok(Request { req, object })
}

fn summarize(request: &Request) -> Summary {
    let req = &request.req;
    Summary {
        uid: req.uid.clone(),
        kind: format!(
            "{}/{}, Kind={}",
            req.kind.group, req.kind.version, req.kind.kind
        ),
        namespace: req.namespace.clone().unwrap_or_default(),
        name: req.name.clone(),
        operation: format!("{:?}", req.operation).to_uppercase(),
        ..Summary::default()
    }
}

async fn decide<S: ObjectSource>(route: Route, request: &Request, objects: &S) -> Verdict {
    let req = &request.req;
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Verdict::allow();
    }
    let (group, kind) = route.group_kind();
    if (req.kind.group.as_str(), req.kind.kind.as_str()) != (group, kind) {
        return Verdict::deny(format!(
            "{} admits {kind}.{group}, not {}.{}: check the webhook configuration's rules",
            route.path(),
            req.kind.kind,
            req.kind.group
        ));
    }
    let Some(object) = request.object.as_ref() else {
        return Verdict::deny(format!("request.object is missing from this {kind} review"));
    };
    match route {
        Route::ValidateTrainJob => validate::train_job(req, object, objects).await,
        Route::ValidateTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::TrainingRuntime)
        }
        Route::ValidateClusterTrainingRuntime => {
            validate::runtime(req, object, crate::api::RuntimeKind::ClusterTrainingRuntime)
        }
        Route::MutateJobSet if req.operation == Operation::Create => {
            mutate::jobset(req, object, objects).await
        }
        Route::MutateJobSet => Verdict::allow(),
    }
}

/// Message sent instead of an internal error's details, which stay in the logs.
pub const INTERNAL_ERROR_MESSAGE: &str =
    "mpi-webhook could not evaluate this request; its logs have the details";

/// Denies `response` the way every mpi-webhook denial reads (interface.md): `allowed: false`,
/// `status.code` 403, `status.reason` Forbidden and the message. kube-core's `deny` alone leaves
/// the code and reason empty.
pub fn forbid(response: AdmissionResponse, message: &str) -> AdmissionResponse {
    let mut denied = response.deny(message);
    denied.result = Status::failure(message, "Forbidden").with_code(403);
    denied
}

fn respond(
    req: &AdmissionRequest<DynamicObject>,
    verdict: Verdict,
    summary: &mut Summary,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req);
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    let denial = match (&verdict.internal_error, verdict.denial) {
        (Some(_), _) => Some(INTERNAL_ERROR_MESSAGE.to_string()),
        (None, denial) => denial,
    };
    summary.internal_error = verdict.internal_error;
    if let Some(message) = denial {
        return forbid(response, &message);
    }
    summary.allowed = true;
    if verdict.patch.is_empty() {
        return response;
    }
    // The operations are moved into the patch, not copied (the verdict is not needed after).
    let operations = verdict.patch.len();
    match response
        .clone()
        .with_patch(json_patch::Patch(verdict.patch))
    {
        Ok(patched) => {
            summary.patch_operations = operations;
            patched
        }
        Err(e) => {
            summary.allowed = false;
            summary.internal_error = Some(format!("serializing the patch failed: {e}"));
            forbid(response, INTERNAL_ERROR_MESSAGE)
        }
    }
}
