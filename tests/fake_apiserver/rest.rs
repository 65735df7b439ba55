//! The HTTP side: REST paths, query parameters, label selectors, watches and RBAC checks, mapped
//! onto the store's calls.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::authz::{Attributes, Authorizer};
use super::kinds::*;
use super::store::*;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Response body type.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body the fake server reads.
const MAX_BODY: usize = 3 << 20;

/// What a metadata-only client sees of an object.
fn partial_metadata(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": object["metadata"].clone()})
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_params(request: &Request<Incoming>) -> HashMap<String, String> {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// A request's target: resource, namespace (from the URL) and object name.
struct Target {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
}

fn target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
            (Some(percent_decode(namespace)), rest)
        }
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] => (*plural, Some(percent_decode(name))),
        _ => return None,
    };
    let kind = *KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
    // A cluster-scoped resource has no namespace; a namespaced object needs one.
    if (!kind.namespaced && namespace.is_some())
        || (kind.namespaced && name.is_some() && namespace.is_none())
    {
        return None;
    }
    Some(Target {
        kind,
        namespace,
        name,
    })
}

/// Counts the request while it is being answered (not while a watch streams).
struct InFlight<'a>(&'a FakeApi);

impl<'a> InFlight<'a> {
    fn start(api: &'a FakeApi) -> Self {
        lock(&api.stats).in_flight += 1;
        Self(api)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut stats = lock(&self.0.stats);
        stats.in_flight = stats.in_flight.saturating_sub(1);
        stats.last_done = Instant::now();
    }
}

async fn handle(api: Arc<FakeApi>, request: Request<Incoming>) -> Response<Body> {
    let _in_flight = InFlight::start(&api);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let params = query_params(&request);
    let Some(target) = target(&path) else {
        let error = ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        );
        return unexpected(&api, &method, request.uri(), error);
    };
    let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let forced = matches!(params.get("force").map(String::as_str), Some("true" | "1"));
    let verb = match (&method, target.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PATCH, true) if content_type.starts_with("application/apply-patch") => {
            if forced {
                "apply-force"
            } else {
                "apply"
            }
        }
        (&Method::PATCH, true) => "patch",
        _ => {
            let error = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path} is not implemented by the fake API server"),
            );
            return unexpected(&api, &method, request.uri(), error);
        }
    };
    *lock(&api.stats)
        .requests
        .entry((verb, target.kind.plural.to_string()))
        .or_default() += 1;
    if let Err(error) = authorize(&api, verb, &target) {
        return error.response();
    }
    let metadata_only = request
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadata"));
    let uri = request.uri().to_string();
    match answer(&api, request, verb, &target, &params, metadata_only).await {
        Ok(response) => response,
        Err(error) if error.code == StatusCode::NOT_IMPLEMENTED => {
            unexpected(&api, &method, &uri, error)
        }
        Err(error) => error.response(),
    }
}

/// RBAC on the request itself (the API server's authorization filter). An apply is a `patch`;
/// one that creates the object also needs `create` (checked where the object is looked up).
fn authorize(api: &FakeApi, verb: &str, target: &Target) -> Result<(), ApiError> {
    let verb = match verb {
        "apply" | "apply-force" => "patch",
        verb => verb,
    };
    authorize_verb(api, verb, target)
}

/// `create` for an apply of an object that does not exist yet.
fn authorize_apply_create(api: &FakeApi, target: &Target, key: &Key) -> Result<(), ApiError> {
    if api.options.authorizer.is_none() || api.get(target.kind, key).is_ok() {
        return Ok(());
    }
    authorize_verb(api, "create", target)
}

/// Whether the authorizer, if there is one, allows `verb` on `target`.
fn authorize_verb(api: &FakeApi, verb: &str, target: &Target) -> Result<(), ApiError> {
    let Some(authorizer) = &api.options.authorizer else {
        return Ok(());
    };
    let attributes = Attributes {
        verb,
        group: target.kind.group,
        resource: target.kind.plural,
        subresource: "",
        namespace: target.namespace.as_deref(),
        name: target.name.as_deref(),
    };
    if authorizer.allows(&attributes) {
        Ok(())
    } else {
        Err(Authorizer::forbidden(&attributes))
    }
}

/// The field manager of a write: `fieldManager`, else (as the API server derives it from the
/// User-Agent) the client's program name.
fn field_manager(params: &HashMap<String, String>, user_agent: &str) -> String {
    params
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            user_agent
                .split('/')
                .next()
                .filter(|m| !m.is_empty())
                .unwrap_or("unknown")
                .to_string()
        })
}

/// Answers a request the fake does not implement with `error`, and records it: any such
/// request fails the run.
fn unexpected(
    api: &FakeApi,
    method: &Method,
    uri: impl std::fmt::Display,
    error: ApiError,
) -> Response<Body> {
    lock(&api.stats)
        .unexpected
        .push(format!("{method} {uri}: {}", error.message));
    error.response()
}

async fn read_body(request: Request<Incoming>, content_type: &str) -> Result<Value, ApiError> {
    let bytes = Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    match serde_json::from_slice(&bytes) {
        Ok(value) => Ok(value),
        // An apply body may be YAML.
        Err(_) if content_type.contains("yaml") => std::str::from_utf8(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("the body is not YAML: {e}"))),
        Err(e) => Err(ApiError::bad_request(format!("the body is not JSON: {e}"))),
    }
}

async fn answer(
    api: &Arc<FakeApi>,
    request: Request<Incoming>,
    verb: &'static str,
    target: &Target,
    params: &HashMap<String, String>,
    metadata_only: bool,
) -> Result<Response<Body>, ApiError> {
    let kind = target.kind;
    let view = |object: &Value| {
        if metadata_only {
            partial_metadata(object)
        } else {
            object.clone()
        }
    };
    let selector = Selector::parse(params.get("labelSelector").map_or("", String::as_str))?;
    if params.get("fieldSelector").is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::unsupported(
            "the fake API server does not implement field selectors",
        ));
    }
    let object_key = || -> Key {
        (
            target.namespace.clone().unwrap_or_default(),
            target.name.clone().unwrap_or_default(),
        )
    };
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let user_agent = request
        .headers()
        .get(hyper::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let manager = field_manager(params, &user_agent);
    match verb {
        "get" => Ok(json_response(
            StatusCode::OK,
            &view(api.get(kind, &object_key())?.as_ref()),
        )),
        "list" => {
            let limit = match params.get("limit") {
                Some(l) => Some(
                    l.parse::<usize>()
                        .map_err(|e| ApiError::bad_request(format!("limit {l:?}: {e}")))?,
                )
                .filter(|l| *l > 0),
                None => None,
            };
            let after: Option<Key> = params
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(|c| {
                    c.split_once('/')
                        .map(|(ns, name)| (ns.to_string(), name.to_string()))
                        .ok_or_else(|| ApiError::bad_request(format!("continue {c:?}")))
                })
                .transpose()?;
            let (items, rv, more) = api.list(
                kind,
                target.namespace.as_deref(),
                &selector,
                limit,
                after.as_ref(),
            );
            let mut metadata = json!({"resourceVersion": rv.to_string()});
            if let Some((ns, name)) = more {
                metadata["continue"] = json!(format!("{ns}/{name}"));
            }
            let (api_version, list_kind) = if metadata_only {
                (
                    "meta.k8s.io/v1".to_string(),
                    "PartialObjectMetadataList".to_string(),
                )
            } else {
                (kind.api_version(), format!("{}List", kind.kind))
            };
            let items: Vec<Value> = items.iter().map(|o| view(o)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"apiVersion": api_version, "kind": list_kind, "metadata": metadata,
                        "items": items}),
            ))
        }
        "watch" => watch_response(api, target, params, selector, metadata_only),
        "create" => {
            let body = read_body(request, &content_type).await?;
            let created = api.create_as(
                Caller::ServiceAccount,
                kind,
                target.namespace.as_deref(),
                body,
                &manager,
            )?;
            Ok(json_response(StatusCode::CREATED, &view(&created)))
        }
        "apply" | "apply-force" => {
            if params.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::bad_request(
                    "PATCH: fieldManager is required for apply requests",
                ));
            }
            authorize_apply_create(api, target, &object_key())?;
            let body = read_body(request, &content_type).await?;
            let (object, created) = api.apply_as(
                Caller::ServiceAccount,
                kind,
                object_key(),
                body,
                &manager,
                verb == "apply-force",
            )?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &view(&object)))
        }
        "patch" => {
            if !content_type.starts_with("application/merge-patch+json")
                && !content_type.starts_with("application/strategic-merge-patch+json")
            {
                return Err(ApiError::unsupported(format!(
                    "the fake API server does not implement PATCH {content_type:?}"
                )));
            }
            let body = read_body(request, &content_type).await?;
            let patched =
                api.merge_patch_as(Caller::ServiceAccount, kind, object_key(), &body, &manager)?;
            Ok(json_response(StatusCode::OK, &view(patched.as_ref())))
        }
        _ => Err(ApiError::bad_request(format!("verb {verb}"))),
    }
}

/// One watch: the changes after `since`, as newline-delimited JSON, until the client leaves or
/// `timeoutSeconds` passes.
struct Watch {
    api: Arc<FakeApi>,
    kind: &'static Kind,
    namespace: Option<String>,
    selector: Selector,
    metadata_only: bool,
    since: u64,
    /// For a watch without a resourceVersion: the current objects, sent as ADDED first.
    initial: Vec<Arc<Value>>,
    changed: watch::Receiver<u64>,
    deadline: tokio::time::Instant,
}

impl Watch {
    fn line(&self, out: &mut Vec<u8>, type_: &str, object: &Value) {
        let wanted = self
            .namespace
            .as_deref()
            .is_none_or(|ns| str_at(object, "/metadata/namespace") == Some(ns))
            && self.selector.matches(object);
        if !wanted {
            return;
        }
        let object = if self.metadata_only {
            partial_metadata(object)
        } else {
            object.clone()
        };
        if let Ok(bytes) = serde_json::to_vec(&json!({"type": type_, "object": object})) {
            out.extend_from_slice(&bytes);
            out.push(b'\n');
        }
    }

    /// Everything new since the last call (possibly nothing).
    fn pending(&mut self) -> Vec<u8> {
        // Mark the current version seen before reading, so a later write wakes `changed()`.
        self.changed.borrow_and_update();
        let mut out = Vec::new();
        for object in std::mem::take(&mut self.initial) {
            self.line(&mut out, "ADDED", &object);
        }
        let (changes, last) = lock(&self.api.state).changes_since(self.kind, self.since);
        self.since = self.since.max(last);
        for (type_, object) in changes {
            self.line(&mut out, type_, &object);
        }
        out
    }
}

fn watch_response(
    api: &Arc<FakeApi>,
    target: &Target,
    params: &HashMap<String, String>,
    selector: Selector,
    metadata_only: bool,
) -> Result<Response<Body>, ApiError> {
    let since = match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|e| ApiError::bad_request(format!("resourceVersion {rv:?}: {e}")))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let (since, initial) = match since {
        Some(rv) => (rv, Vec::new()),
        None => lock(&api.state).snapshot(target.kind),
    };
    let watch = Watch {
        api: api.clone(),
        kind: target.kind,
        namespace: target.namespace.clone(),
        selector,
        metadata_only,
        since,
        initial,
        changed: api.changed.subscribe(),
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
    };
    let stream = futures::stream::unfold(watch, |mut watch| async move {
        loop {
            let chunk = watch.pending();
            if !chunk.is_empty() {
                return Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), watch));
            }
            tokio::select! {
                changed = watch.changed.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(watch.deadline) => return None,
            }
        }
    });
    let mut response = Response::new(StreamBody::new(stream.boxed()).boxed_unsync());
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn serve(listener: TcpListener, api: Arc<FakeApi>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                eprintln!("fake API server: accept: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let api = api.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(handle(api, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

impl ApiError {
    fn response(&self) -> Response<Body> {
        json_response(self.code, &self.status())
    }
}

impl FakeApi {
    /// Serves on a fresh 127.0.0.1 port; returns the address.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(self: &Arc<Self>) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(serve(listener, self.clone()));
        Ok(addr)
    }
}
