//! Readiness, and the routes of the plain-HTTP server: `GET /metrics` (OpenMetrics text),
//! `GET /healthz` and `GET /readyz`. `serve` puts the probes on its HTTPS router and only
//! `/metrics` on `--metrics-listen`; `reconcile` puts all three on `--metrics-listen`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Something a process waits for before it is ready. Its text is what `/readyz` answers (503)
/// while it is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate(pub &'static str);

/// Readiness of a process: ready once every gate it waits for is passed, until shutdown starts.
/// Cheap to clone; whoever passes a gate holds a clone.
#[derive(Debug, Clone)]
pub struct Readiness(Arc<Gates>);

#[derive(Debug)]
struct Gates {
    awaited: Vec<(Gate, AtomicBool)>,
    draining: AtomicBool,
}

impl Readiness {
    /// Not ready until each of `gates` is [passed](Self::pass).
    pub fn waiting_for(gates: &[Gate]) -> Self {
        Self(Arc::new(Gates {
            awaited: gates.iter().map(|g| (*g, AtomicBool::new(false))).collect(),
            draining: AtomicBool::new(false),
        }))
    }

    /// `gate` is passed (a gate this readiness does not wait for is ignored).
    pub fn pass(&self, gate: Gate) {
        for (awaited, passed) in &self.0.awaited {
            if *awaited == gate {
                passed.store(true, Ordering::Release);
            }
        }
    }

    /// Shutdown started: report not ready so no new traffic is routed here.
    pub fn set_draining(&self) {
        self.0.draining.store(true, Ordering::Release);
    }

    /// `Ok` when ready, else the first thing missing (`shutting down` once draining).
    ///
    /// # Errors
    /// A short reason for the 503 body.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.0.draining.load(Ordering::Acquire) {
            return Err("shutting down");
        }
        match self
            .0
            .awaited
            .iter()
            .find(|(_, passed)| !passed.load(Ordering::Acquire))
        {
            Some((gate, _)) => Err(gate.0),
            None => Ok(()),
        }
    }
}

/// `GET /healthz` (200 `ok` while the process answers) and `GET /readyz` (200 `ok`, or 503 and
/// what is awaited). `ready`, when given, is set to 1 or 0 by every `/readyz` answer.
pub fn probe_routes(readiness: Readiness, ready: Option<Gauge>) -> Router {
    let readyz = move || {
        let status = readiness.check();
        if let Some(gauge) = &ready {
            gauge.set(i64::from(status.is_ok()));
        }
        async move {
            match status {
                Ok(()) => "ok".into_response(),
                Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
            }
        }
    };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
}

/// `GET /metrics`: every metric of `registry`, as OpenMetrics text.
pub fn metrics_route(registry: Arc<Registry>) -> Router {
    let metrics = move || {
        let mut body = String::new();
        let encoded = prometheus_client::encoding::text::encode(&mut body, &registry);
        async move {
            if let Err(error) = encoded {
                tracing::error!(%error, "encoding metrics");
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
            (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                body,
            )
                .into_response()
        }
    };
    Router::new().route("/metrics", get(metrics))
}

/// Serves `router` in plain HTTP on `listener` until `stop` resolves; a failure is logged as
/// `"{what} failed"`.
pub fn serve(
    what: &'static str,
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(%error, "{what} failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    const FIRST: Gate = Gate("first not yet");
    const SECOND: Gate = Gate("second not yet");

    #[test]
    fn ready_once_every_gate_is_passed_until_draining() {
        let r = Readiness::waiting_for(&[FIRST, SECOND]);
        assert_eq!(r.check(), Err("first not yet"));
        r.pass(SECOND);
        assert_eq!(r.check(), Err("first not yet"));
        r.pass(FIRST);
        assert_eq!(r.check(), Ok(()));
        r.set_draining();
        assert_eq!(r.check(), Err("shutting down"));
    }

    async fn get_text(router: &Router, path: &str) -> (u16, String, Option<String>) {
        let request = Request::get(path).body(Body::empty()).expect("a request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = response.into_body().collect().await.expect("a body");
        let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        (status, text, content_type)
    }

    #[tokio::test]
    async fn probes_answer_and_follow_readiness_and_the_gauge() {
        let readiness = Readiness::waiting_for(&[FIRST]);
        let gauge = Gauge::default();
        let router = probe_routes(readiness.clone(), Some(gauge.clone()));
        assert_eq!(get_text(&router, "/healthz").await.0, 200);
        let (status, body, _) = get_text(&router, "/readyz").await;
        assert_eq!(
            (status, body.as_str(), gauge.get()),
            (503, "first not yet", 0)
        );
        readiness.pass(FIRST);
        let (status, body, _) = get_text(&router, "/readyz").await;
        assert_eq!((status, body.as_str(), gauge.get()), (200, "ok", 1));
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let mut registry = Registry::with_prefix("mpi_webhook");
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("things", "Things", counter.clone());
        counter.inc();
        let router = metrics_route(Arc::new(registry));
        let (status, body, content_type) = get_text(&router, "/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(
            content_type.as_deref(),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        assert!(body.contains("mpi_webhook_things_total 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
