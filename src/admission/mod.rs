//! AdmissionReview in, AdmissionReview out: the one place that reads a review, dispatches it to
//! the policy and turns the verdict into an `admission.k8s.io/v1` response (denials as 403
//! Forbidden, patches as JSONPatch). Shared by `serve` and the offline `review` command.
//!
//! Two reads, one answer. `serve` reads a review the fast way (`wire.rs`: typed fields straight
//! from the bytes, a JobSet as the small view its mutation needs) and, for anything that read
//! does not accept or cannot answer, the general way ([`projection`] into a `serde_json::Value`,
//! the reference). The `review` command reads the whole document. Tests hold all three to the
//! same bytes.
//!
//! Pure apart from the lookups in the given [`ObjectSource`].

mod mutate;
pub mod projection;
mod validate;
mod wire;

pub use validate::runtime_kind as runtime_kind_of;

use std::collections::HashMap;

use kube::core::DynamicObject;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::mpi::enforce::{JobSetView, Obj, PatchJson};
use crate::objects::ObjectSource;
use crate::objects::dir::{from_value, from_value_at};
use crate::raw_json::RawJson;

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
    /// Every route, in the order the README lists them.
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

    /// The parts of a review this route reads ([`projection`]): a JobSet's pod templates are
    /// mostly skipped, the objects validated are read whole, and only the JobSet validation
    /// reads the old object (its metadata).
    pub fn review_shape(self) -> &'static projection::Shape {
        match self {
            Route::MutateJobSet => &projection::JOBSET_REVIEW,
            Route::ValidateJobSet => &projection::OLD_METADATA_REVIEW,
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
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// `Some(message)` denies.
    pub denial: Option<String>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
    /// The JSON patch (mutation only).
    pub patch: Option<PatchJson>,
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

/// The request as the policy reads it: the kube request (objects taken out), the object, and
/// the old object where the route reads it (JobSet validation on UPDATE).
pub(crate) struct Request<'a> {
    pub req: AdmissionRequest<DynamicObject>,
    pub object: Option<Object<'a>>,
    pub old_object: Option<Object<'a>>,
}

/// The object under review: raw JSON text or a JobSet's view from the fast read (`wire.rs`), or
/// a value from the general path. Routes read it into their types with [`Object::read`], which
/// gives the same result either way.
pub(crate) enum Object<'a> {
    Raw(&'a RawValue),
    JobSet(Box<JobSetView<'a>>),
    Parsed(Value),
}

impl Object<'_> {
    /// The object as `T`. Raw text is read straight into `T`; should that fail (a malformed
    /// object, or a duplicate member, which a `Value` resolves by keeping the last), the object
    /// is read as the general path reads it, through a `Value`, whose answer and message count.
    ///
    /// Only a JSON object is an object: serde's derived structs would also read an array, its
    /// elements taken as the fields in order.
    pub(crate) fn read<T: DeserializeOwned>(&self) -> Result<T, String> {
        match self {
            Object::Raw(raw) if !raw.get().starts_with('{') => {
                Err(not_an_object(RawJson::text(raw).value()))
            }
            Object::Raw(raw) => serde_json::from_str(raw.get())
                .or_else(|_| from_value_at(RawJson::text(raw).value(), OBJECT_FIELD)),
            Object::Parsed(value) if !value.is_object() => Err(not_an_object(value)),
            Object::Parsed(value) => from_value_at(value, OBJECT_FIELD),
            Object::JobSet(_) => Err("a JobSet view is read by the mutation only".into()),
        }
    }

    /// The client's JSON, for the values denials quote.
    pub(crate) fn raw_json(&self) -> RawJson<'_> {
        match self {
            Object::Raw(raw) => RawJson::text(raw),
            Object::Parsed(value) => RawJson::from(value),
            Object::JobSet(_) => RawJson::from(&Value::Null),
        }
    }
}

/// Where the object sits in a review: what an error about the object as a whole names.
const OBJECT_FIELD: &str = "request.object";

/// The error for an object that is not a JSON object, naming where it is.
fn not_an_object(value: &Value) -> String {
    let found = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    format!("{OBJECT_FIELD}: invalid type: {found}, expected a JSON object")
}

/// `apiVersion` of the reviews read and written.
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of the reviews read and written.
const REVIEW_KIND: &str = "AdmissionReview";

/// Answers one AdmissionReview (JSON bytes) on `route`.
///
/// The review is read by a fast, typed read (`wire.rs`) when it can be, else by the route's
/// projection ([`review_projected`]); both give the answer [`review_value`] gives.
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review<S: ObjectSource>(
    route: Route,
    body: &[u8],
    objects: &S,
) -> Result<Reviewed, BadReview> {
    // The mutation reads a JobSet's few fields in the same pass as the review; the validations
    // read their objects whole, so they get them as raw text.
    let request = match route {
        Route::MutateJobSet => {
            wire::read::<Obj<JobSetView>, IgnoredAny>(body).map(|(req, o, _)| {
                let object = o.map(|view| Object::JobSet(Box::new(view.0)));
                (req, object, None)
            })
        }
        Route::ValidateJobSet => wire::read::<&RawValue, &RawValue>(body)
            .map(|(req, o, old)| (req, o.map(Object::Raw), old.map(Object::Raw))),
        _ => wire::read::<&RawValue, IgnoredAny>(body)
            .map(|(req, o, _)| (req, o.map(Object::Raw), None)),
    };
    if let Some((req, object, old_object)) = request {
        let request = Request {
            req,
            object,
            old_object,
        };
        if let Some(reviewed) = answer(route, &request, objects).await {
            return Ok(reviewed);
        }
    }
    review_projected(route, body, objects).await
}

/// [`review`] without its fast read: the review parsed through the route's [`projection`]. What
/// `review` falls back to for a body the fast read does not accept, and the place its errors
/// are explained.
///
/// # Errors
/// [`BadReview`] when the body is not an `admission.k8s.io/v1` AdmissionReview with a request.
pub async fn review_projected<S: ObjectSource>(
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
    // A parsed object never needs another read: the answer is always there.
    Ok(answer(route, &request, objects)
        .await
        .unwrap_or_else(|| Reviewed {
            body: FAIL_CLOSED_REVIEW.to_vec(),
            summary: Summary::default(),
        }))
}

/// The answer to a request, or `None` when its object was read by the fast read into a form
/// that cannot answer (a JobSet that is not fresh): the review is then read again, generally.
async fn answer<S: ObjectSource>(
    route: Route,
    request: &Request<'_>,
    objects: &S,
) -> Option<Reviewed> {
    let mut summary = summarize(request);
    let verdict = decide(route, request, objects).await?;
    let response = respond(&request.req, verdict, &mut summary);
    Some(Reviewed {
        body: review_bytes(&response),
        summary,
    })
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

/// The response review as JSON bytes, written once: kube-core's response fields in kube-core's
/// order, except `patch`, which goes out as the base64 string the API expects (a Go `[]byte`)
/// where kube-core would write a JSON array of numbers.
fn review_bytes(response: &AdmissionResponse) -> Vec<u8> {
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
        #[serde(skip_serializing_if = "HashMap::is_empty")]
        audit_annotations: &'a HashMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        warnings: Option<&'a Vec<String>>,
    }
    // A patch that cannot be written must not become an allowed answer without it.
    let patch = match response.patch.as_deref().map(base64_json_string) {
        Some(None) => return FAIL_CLOSED_REVIEW.to_vec(),
        patch => patch.flatten(),
    };
    let review = ReviewOut {
        api_version: REVIEW_API_VERSION,
        kind: REVIEW_KIND,
        response: ResponseOut {
            uid: &response.uid,
            allowed: response.allowed,
            status: &response.result,
            patch,
            // kube-core sets the type with the patch, and JSONPatch is its only type.
            patch_type: response.patch.as_ref().map(|_| "JSONPatch"),
            audit_annotations: &response.audit_annotations,
            warnings: response.warnings.as_ref(),
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

fn parse_request(mut value: Value) -> Result<Request<'static>, BadReview> {
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
    if (api_version, kind) != (REVIEW_API_VERSION, REVIEW_KIND) {
        return Err(BadReview(format!(
            "expected apiVersion \"admission.k8s.io/v1\" and kind \"AdmissionReview\", got {api_version:?} and {kind:?}"
        )));
    }
    let Some(request) = value.get_mut("request").filter(|r| r.is_object()) else {
        return Err(BadReview("AdmissionReview has no request".into()));
    };
    // The objects are read by the policy from raw JSON (so a malformed object is a denial with
    // the request's uid, not a 400, and no field is lost); the kube types get the rest.
    let mut take = |member: &str| {
        request
            .get_mut(member)
            .map(Value::take)
            .filter(|o| !o.is_null())
            .map(Object::Parsed)
    };
    let object = take("object");
    let old_object = take("oldObject");
    let review: AdmissionReview<DynamicObject> =
        from_value(&value).map_err(|e| BadReview(format!("not an AdmissionReview: {e}")))?;
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| BadReview("AdmissionReview has no request".into()))?;
    Ok(Request {
        req,
        object,
        old_object,
    })
}

fn summarize(request: &Request<'_>) -> Summary {
    let req = &request.req;
    Summary {
        uid: req.uid.clone(),
        kind: format!(
            "{}/{}, Kind={}",
            req.kind.group, req.kind.version, req.kind.kind
        ),
        namespace: req.namespace.clone().unwrap_or_default(),
        name: req.name.clone(),
        operation: match req.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        },
        ..Summary::default()
    }
}

/// The verdict on a request; `None` only for a fast-read JobSet that is not fresh.
async fn decide<S: ObjectSource>(
    route: Route,
    request: &Request<'_>,
    objects: &S,
) -> Option<Verdict> {
    let req = &request.req;
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Some(Verdict::allow());
    }
    let (group, kind) = route.group_kind();
    if (req.kind.group.as_str(), req.kind.kind.as_str()) != (group, kind) {
        return Some(Verdict::deny(format!(
            "{} admits {kind}.{group}, not {}.{}: check the webhook configuration's rules",
            route.path(),
            req.kind.kind,
            req.kind.group
        )));
    }
    let Some(object) = request.object.as_ref() else {
        return Some(Verdict::deny(format!(
            "request.object is missing from this {kind} review"
        )));
    };
    match route {
        Route::ValidateTrainJob => Some(validate::train_job(req, object, objects).await),
        Route::ValidateTrainingRuntime => Some(validate::runtime(
            req,
            object,
            crate::api::RuntimeKind::TrainingRuntime,
        )),
        Route::ValidateClusterTrainingRuntime => Some(validate::runtime(
            req,
            object,
            crate::api::RuntimeKind::ClusterTrainingRuntime,
        )),
        Route::MutateJobSet if req.operation == Operation::Create => {
            mutate::jobset(req, object, objects).await
        }
        Route::MutateJobSet => Some(Verdict::allow()),
        Route::ValidateJobSet => Some(validate::jobset(req, object, request.old_object.as_ref())),
    }
}

/// Message sent instead of an internal error's details, which stay in the logs.
pub const INTERNAL_ERROR_MESSAGE: &str =
    "mpi-webhook could not evaluate this request; its logs have the details";

/// Denies `response` the way every mpi-webhook denial reads (the product contract): `allowed: false`,
/// `status.code` 403, `status.reason` Forbidden and the message. kube-core's `deny` alone leaves
/// the code and reason empty.
fn forbid(response: AdmissionResponse, message: &str) -> AdmissionResponse {
    let mut denied = response.deny(message);
    denied.result = Status::failure(message, "Forbidden").with_code(403);
    denied
}

/// A whole response review denying the request with `uid`, for a denial made outside a review
/// (`serve`'s expired deadline), written like every other response.
pub fn denial_review(uid: String, message: &str) -> Vec<u8> {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid;
    review_bytes(&forbid(response, message))
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
        let denied = forbid(response, &message);
        summary.denial = Some(message);
        return denied;
    }
    summary.allowed = true;
    // An empty patch is no patch. The patch's JSON is moved in as it is; `review_bytes` writes
    // `patchType` with it (kube-core's `with_patch` would serialize the operations again).
    if let Some(patch) = verdict.patch.filter(|p| p.operations > 0) {
        summary.patch_operations = patch.operations;
        response.patch = Some(patch.json);
    }
    response
}
