//! The HTTPS router of `serve`: the four admission routes, `/healthz` and `/readyz`. Handlers are
//! thin: read the body (bounded in size and time), call [`admission::review`], log one event,
//! record the metrics, and answer.
//!
//! Outcomes: a review answered (allowed, patched or denied) is HTTP 200; a body that is not an
//! AdmissionReview is 400 with a JSON `{"code", "message"}`; a body over 7 MiB is 413; an internal
//! failure or an expired deadline is a 200 *denial* with a generic message and the request's uid
//! (fail closed), with the details in the log.
//!
//! Bounded work: a review the apiserver sends is a few KiB and is read and answered on the async
//! workers as it arrives. A body that may be larger than [`SMALL_BODY_BYTES`] waits for one of
//! [`LARGE_REVIEWS_AT_ONCE`] permits *before* it is read, and is parsed on a blocking thread, so
//! a burst of huge bodies neither holds more than that many in memory nor stalls `/healthz` and
//! the small reviews behind it (docs/operations.md "Bounded work").

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use tokio::sync::Semaphore;

use super::metrics::{Metrics, Outcome};
use crate::admission::{self, BadReview, Reviewed, Route};
use crate::objects::ObjectSource;
use crate::shell::Readiness;
use crate::shell::probes::probe_routes;

/// Largest accepted request body: 7 MiB, the limit controller-runtime uses.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Bodies up to this size are read and reviewed on the async workers as they arrive. A review
/// from the kube-apiserver is a few KiB (a JobSet of a TrainJob, pretty-printed, under 5 KiB);
/// at 64 KiB even the costliest parse stays around a MiB.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

/// Larger bodies (or bodies of unknown length) read and reviewed at once. One may hold its 7 MiB
/// body plus, in the worst case, a `serde_json::Value` of it (an object whose denial quotes the
/// client's JSON, made of the smallest JSON values) of about 30 times the body: some 220 MiB.
/// Large reviews are never the apiserver's normal traffic, so one at a time is plenty, and it
/// leaves the other core to everything else. docs/operations.md states the bound on memory.
pub const LARGE_REVIEWS_AT_ONCE: usize = 1;

/// The apiserver's default webhook timeout, used when a request carries no `?timeout=`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest webhook timeout the apiserver allows; larger `?timeout=` values are capped.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// What the handlers share.
pub struct AppState<S> {
    /// Where TrainJobs and runtimes are looked up.
    pub objects: Arc<S>,
    /// Readiness for `/readyz`.
    pub readiness: Readiness,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// Permits to read and review a body larger than [`SMALL_BODY_BYTES`].
    large_reviews: Arc<Semaphore>,
    /// The policy's configuration (`--preflight-image`).
    pub policy: admission::Options,
}

impl<S> AppState<S> {
    /// The handlers' state, with [`LARGE_REVIEWS_AT_ONCE`] permits for large bodies.
    pub fn new(objects: Arc<S>, readiness: Readiness, metrics: Arc<Metrics>) -> Self {
        Self {
            objects,
            readiness,
            metrics,
            large_reviews: Arc::new(Semaphore::new(LARGE_REVIEWS_AT_ONCE)),
            policy: admission::Options::default(),
        }
    }

    /// The state with the policy configured as `policy`.
    pub fn with_policy(mut self, policy: admission::Options) -> Self {
        self.policy = policy;
        self
    }
}

impl<S> std::fmt::Debug for AppState<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

/// The HTTPS router: one POST route per [`Route`], `GET /healthz`, `GET /readyz`.
pub fn router<S: ObjectSource + 'static>(state: Arc<AppState<S>>) -> Router {
    let probes = probe_routes(state.readiness.clone(), Some(state.metrics.ready()));
    let mut router = Router::new();
    for route in Route::ALL {
        router = router.route(
            route.path(),
            post(
                move |State(state): State<Arc<AppState<S>>>, request: Request| {
                    admit(route, state, request)
                },
            ),
        );
    }
    router.with_state(state).merge(probes)
}

/// What a handler produced, before it is recorded and sent.
enum Answer {
    Reviewed(Reviewed),
    /// A fail-closed denial built by the server (deadline expired).
    TimedOut {
        uid: String,
    },
    /// An HTTP-level error: `{"code": <status>, "message": ...}`.
    Error {
        status: StatusCode,
        outcome: Outcome,
        message: String,
    },
}

impl Answer {
    fn error(status: StatusCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Answer::Error {
            status,
            outcome,
            message: message.into(),
        }
    }
}

async fn admit<S: ObjectSource + 'static>(
    route: Route,
    state: Arc<AppState<S>>,
    request: Request,
) -> Response {
    let started = Instant::now();
    tracing::debug!(route = route.name(), "request received");
    let budget = deadline(request.uri().query());
    let answer = answer(route, &state, request, started + budget).await;
    finish(route, &state.metrics, answer, started)
}

async fn answer<S: ObjectSource + 'static>(
    route: Route,
    state: &Arc<AppState<S>>,
    request: Request,
    deadline: Instant,
) -> Answer {
    let deadline = tokio::time::Instant::from_std(deadline);
    if declared_length(&request).is_some_and(|len| len <= SMALL_BODY_BYTES as u64) {
        let body = match read_body(request, deadline).await {
            Ok(body) => body,
            Err(e) => return e,
        };
        let req = match admission::read(&body) {
            Ok(req) => req,
            Err(bad) => return bad_review(bad),
        };
        let answered = tokio::time::timeout_at(
            deadline,
            admission::answer(route, &req, &*state.objects, &state.policy),
        )
        .await;
        return match answered {
            Ok(reviewed) => Answer::Reviewed(reviewed),
            Err(_) => timed_out(req.request.uid),
        };
    }
    // Waiting for a permit before reading: a body that waits stays in the client's socket,
    // costing this process nothing.
    let Ok(Ok(permit)) =
        tokio::time::timeout_at(deadline, Arc::clone(&state.large_reviews).acquire_owned()).await
    else {
        let body = Limited::new(request.into_body(), MAX_BODY_BYTES);
        discard(body, deadline + DISCARD_GRACE).await;
        return Answer::error(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Busy,
            "too many large reviews in progress; retry",
        );
    };
    let body = match read_body(request, deadline).await {
        Ok(body) => body,
        Err(e) => return e,
    };
    // Parsed and answered on a blocking thread, so the async workers keep answering `/healthz`
    // and the small reviews meanwhile. The permit goes with the work: were the deadline to pass
    // first, the review still counts against the bound until it ends. The uid is sent back as
    // soon as it is read, before the object is parsed, for a denial should the deadline pass.
    let state = Arc::clone(state);
    let (uid_sender, uid) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Handle::current();
    let review = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let req = admission::read_then(&body, |uid| {
            uid_sender.send(uid.to_owned()).ok();
        })?;
        Ok(runtime.block_on(admission::answer(
            route,
            &req,
            &*state.objects,
            &state.policy,
        )))
    });
    match tokio::time::timeout_at(deadline, review).await {
        Ok(Ok(Ok(reviewed))) => Answer::Reviewed(reviewed),
        Ok(Ok(Err(bad))) => bad_review(bad),
        Ok(Err(join_error)) => Answer::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            Outcome::Error,
            format!("the review did not complete: {join_error}"),
        ),
        // The uid comes as soon as the review around the object is read (as long as the old
        // lenient scan of the body for it took); a body that is no review has none.
        Err(_) => timed_out(uid.await.unwrap_or_default()),
    }
}

/// The 400 for a body that is not an AdmissionReview.
fn bad_review(bad: BadReview) -> Answer {
    Answer::error(
        StatusCode::BAD_REQUEST,
        Outcome::BadRequest,
        bad.to_string(),
    )
}

/// Fail closed: the apiserver would otherwise apply failurePolicy to a timeout anyway; a denial
/// that says why, sent before its deadline, is the more useful answer.
fn timed_out(uid: String) -> Answer {
    Answer::TimedOut { uid }
}

/// The body length the request declares, if it declares one.
fn declared_length(request: &Request) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// How long past its deadline an answer waits for the rest of a body it will not review.
const DISCARD_GRACE: Duration = Duration::from_secs(1);

/// Reads the rest of a body frame by frame and drops each, up to [`MAX_BODY_BYTES`] and until
/// `until`, so that the client gets the answer and not a connection reset in the middle of
/// sending its body. Costs no memory beyond one frame.
async fn discard(mut body: Limited<axum::body::Body>, until: tokio::time::Instant) {
    let drain = async { while let Some(Ok(_frame)) = body.frame().await {} };
    let _ = tokio::time::timeout_at(until, drain).await;
}

async fn read_body(request: Request, deadline: tokio::time::Instant) -> Result<Bytes, Answer> {
    let too_large = || {
        Answer::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            Outcome::TooLarge,
            format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    if declared_length(&request).is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Limited::new(request.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout_at(deadline, (&mut body).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(Answer::error(
            StatusCode::BAD_REQUEST,
            Outcome::BadRequest,
            format!("reading the request body failed: {e}"),
        )),
        Err(_) => {
            discard(body, deadline + DISCARD_GRACE).await;
            Err(Answer::error(
                StatusCode::REQUEST_TIMEOUT,
                Outcome::Timeout,
                "the request body did not arrive before the deadline",
            ))
        }
    }
}

/// Message of the fail-closed denial sent when the deadline expires.
pub const TIMEOUT_MESSAGE: &str =
    "mpi-webhook could not evaluate this request before its deadline; retry";

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Logs the answer, records it in the metrics, and turns it into a response.
fn finish(route: Route, metrics: &Metrics, answer: Answer, started: Instant) -> Response {
    let elapsed = started.elapsed();
    let duration_ms = elapsed.as_secs_f64() * 1000.0;
    let route_name = route.name();
    let (outcome, patch_operations, response) = match answer {
        Answer::Reviewed(reviewed) => reviewed_response(route, reviewed, duration_ms),
        Answer::TimedOut { uid } => {
            tracing::error!(
                route = route_name,
                uid,
                duration_ms,
                "deadline expired before the review was evaluated; denied (fail closed)"
            );
            (
                Outcome::Timeout,
                0,
                json_response(admission::denial_review(uid, TIMEOUT_MESSAGE)),
            )
        }
        Answer::Error {
            status,
            outcome,
            message,
        } => {
            tracing::info!(
                route = route_name,
                status = status.as_u16(),
                error = %message,
                duration_ms,
                "request rejected"
            );
            let body = serde_json::json!({ "code": status.as_u16(), "message": message });
            let response = (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response();
            (outcome, 0, response)
        }
    };
    metrics.observe_request(route_name, outcome, elapsed.as_secs_f64(), patch_operations);
    response
}

/// Logs a reviewed request with what identifies it: denials at info, internal errors at error,
/// the rest at debug. Events carry their fields themselves; a span per request would format its
/// fields on every request, logged or not.
fn reviewed_response(
    route: Route,
    reviewed: Reviewed,
    duration_ms: f64,
) -> (Outcome, usize, Response) {
    macro_rules! log {
        ($level:ident, $($rest:tt)*) => {
            tracing::$level!(
                route = route.name(),
                uid = reviewed.uid,
                kind = reviewed.kind,
                namespace = reviewed.namespace,
                name = reviewed.name,
                operation = reviewed.operation,
                allowed = reviewed.outcome.allowed(),
                duration_ms,
                $($rest)*
            )
        };
    }
    match &reviewed.outcome {
        admission::Outcome::InternalError { error } => {
            log!(error, error, "internal error; denied (fail closed)");
        }
        admission::Outcome::Denied { message } => log!(info, message, "denied"),
        admission::Outcome::Patched { operations } => log!(debug, operations, "patched"),
        admission::Outcome::Allowed => log!(debug, "allowed"),
    }
    let outcome = Outcome::from(&reviewed.outcome);
    let operations = reviewed.outcome.patch_operations();
    (outcome, operations, json_response(reviewed.body))
}

/// The time budget of a request: the apiserver's `?timeout=` (a Go duration such as `10s`,
/// capped at 30 s; 10 s when absent or unreadable) minus a margin for the response to travel
/// back: a tenth of the timeout, at least 5 ms and at most 1 s.
pub fn deadline(query: Option<&str>) -> Duration {
    let timeout = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(parse_go_duration)
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(MAX_TIMEOUT);
    let margin = (timeout / 10).clamp(Duration::from_millis(5), Duration::from_secs(1));
    timeout.saturating_sub(margin)
}

/// Parses a Go `time.Duration` string (`10s`, `500ms`, `1m30s`, `1.5s`, `250us`). Negative,
/// empty or malformed input is `None`.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || text.starts_with('-') {
        return None;
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds_per_unit;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_go_duration("10s"), Some(ms(10_000)));
        assert_eq!(parse_go_duration("500ms"), Some(ms(500)));
        assert_eq!(parse_go_duration("1m30s"), Some(ms(90_000)));
        assert_eq!(parse_go_duration("1.5s"), Some(ms(1_500)));
        assert_eq!(parse_go_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "-1s", "1x", "s", "1..2s", "abc"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn deadlines_keep_a_margin() {
        let ms = Duration::from_millis;
        assert_eq!(deadline(Some("timeout=10s")), ms(9_000));
        assert_eq!(deadline(Some("timeout=2s")), ms(1_800));
        assert_eq!(deadline(Some("a=b&timeout=30s")), ms(29_000));
        assert_eq!(deadline(Some("timeout=5m")), ms(29_000));
        assert_eq!(deadline(Some("timeout=20ms")), ms(15));
        assert_eq!(deadline(None), ms(9_000));
        assert_eq!(deadline(Some("timeout=bogus")), ms(9_000));
    }
}
