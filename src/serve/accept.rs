//! The HTTPS accept loop of `serve`: TLS handshakes (bounded in time), one hyper connection per
//! client serving the router, and the two-step shutdown.
//!
//! tokio-rustls + hyper-util directly (no axum-server): the certificate comes from the
//! [`ReloadingCert`](crate::tls::ReloadingCert) resolver inside the acceptor, so a reload never
//! touches the listener.
//!
//! Shutdown has two steps ([`Phase`]). While [`Phase::Closing`] (the `--shutdown-delay` after
//! SIGTERM) the listener still accepts, because endpoints and kube-proxy keep sending new
//! connections for a few seconds, but every HTTP/1 response carries `Connection: close` and
//! every HTTP/2 connection gets GOAWAY, so clients that reuse connections (the apiserver) move
//! to another replica after their current request. Idle HTTP/1 connections are left open in
//! that window: closing one races with a request the client may be writing, and a POST on a
//! connection the server closed after reading it is not retried by Go's transport. At
//! [`Phase::Stopped`] the listener closes, every connection is shut down gracefully (idle ones
//! at once, busy ones after their response) and the drain is bounded by the grace.
//!
//! The protocol is taken from ALPN, not sniffed from the first bytes: hyper-util's auto
//! detection drops a connection whose first bytes have not arrived when it is shut down, which
//! in the shutdown delay would be every new HTTP/2 connection (told to go away as it opens) and
//! its first request. Served as HTTP/2 from the start, such a connection answers the requests
//! its client sends before the GOAWAY reaches it (hyper's two-step GOAWAY), then closes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header::{CONNECTION, HeaderValue};
use axum::http::{Request, Version};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A TLS handshake that takes longer than this is dropped (slow or stuck clients).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/1 client that sends no complete request headers for this long is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `serve` is in its life; only ever moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// Normal serving.
    Serving,
    /// The shutdown delay: still accepting, but telling every client to close.
    Closing,
    /// The listener is closed; open connections drain.
    Stopped,
}

/// Accepts TLS connections on `listener` and serves `router` on each until `phase` reaches
/// [`Phase::Stopped`], then waits up to `grace` for the open connections.
pub(super) async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    mut phase: watch::Receiver<Phase>,
    grace: Duration,
) {
    // Each connection task holds a receiver of this channel: `closed()` on the sender is
    // "every connection has ended".
    let (connections, _) = watch::channel(());
    let builders = Arc::new(Builders::new());
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning or exiting.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop_requested(&mut phase) => break,
        };
        let tracked = connections.subscribe();
        let phase = phase.clone();
        let acceptor = acceptor.clone();
        let router = router.clone();
        let builders = Arc::clone(&builders);
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let protocol = Protocol::of(tls.get_ref().1.alpn_protocol());
            let builder = builders.for_protocol(protocol);
            serve_connection(builder, TokioIo::new(tls), router, phase, protocol, peer).await;
            drop(tracked);
        });
    }
    drop(listener);
    let open = connections.receiver_count();
    tracing::info!(
        connections = open,
        "stopped accepting; waiting for in-flight requests"
    );
    if tokio::time::timeout(grace, connections.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_seconds = grace.as_secs_f64(),
            "in-flight requests did not finish within the shutdown grace; closing them"
        );
    }
}

/// The HTTP protocol of a connection, from the ALPN its TLS handshake agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// ALPN `http/1.1`.
    Http1,
    /// ALPN `h2`.
    Http2,
    /// No ALPN: sniffed from the first bytes (HTTP/1.1 in practice; HTTP/2 with prior knowledge).
    Sniffed,
}

impl Protocol {
    fn of(alpn: Option<&[u8]>) -> Self {
        match alpn {
            Some(b"h2") => Self::Http2,
            Some(_) => Self::Http1,
            None => Self::Sniffed,
        }
    }

    /// The phase at which a connection of this protocol is shut down gracefully: HTTP/2 from
    /// [`Phase::Closing`] (GOAWAY, after which the client opens a new connection for its next
    /// request), the others at [`Phase::Stopped`] (their responses carry `Connection: close`
    /// before that).
    fn shut_at(self) -> Phase {
        match self {
            Self::Http2 => Phase::Closing,
            Self::Http1 | Self::Sniffed => Phase::Stopped,
        }
    }
}

/// One connection builder per [`Protocol`], with the same settings.
struct Builders {
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
    sniffed: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new() -> Self {
        let mut sniffed = auto::Builder::new(TokioExecutor::new());
        sniffed
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        Self {
            http1: sniffed.clone().http1_only(),
            http2: sniffed.clone().http2_only(),
            sniffed,
        }
    }

    fn for_protocol(&self, protocol: Protocol) -> &auto::Builder<TokioExecutor> {
        match protocol {
            Protocol::Http1 => &self.http1,
            Protocol::Http2 => &self.http2,
            Protocol::Sniffed => &self.sniffed,
        }
    }
}

/// Serves one connection, shutting it down gracefully once `phase` reaches
/// [`Protocol::shut_at`].
async fn serve_connection<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    router: Router,
    mut phase: watch::Receiver<Phase>,
    protocol: Protocol,
    peer: std::net::SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let shut_at = protocol.shut_at();
    let service = CloseWhenClosing {
        inner: TowerToHyperService::new(router),
        phase: phase.clone(),
    };
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            // A closed channel (the server is gone) shuts down as well.
            _ = phase.wait_for(|now| *now >= shut_at), if !shutting_down => {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The router, adding `Connection: close` to HTTP/1 responses once shutdown started, so hyper
/// closes the connection after writing the response and the client dials a ready replica.
#[derive(Debug, Clone)]
struct CloseWhenClosing<S> {
    inner: S,
    phase: watch::Receiver<Phase>,
}

impl<S, B> Service<Request<Incoming>> for CloseWhenClosing<S>
where
    S: Service<Request<Incoming>, Response = axum::http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let http1 = request.version() < Version::HTTP_2;
        let phase = self.phase.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // Read when the response is ready: a request in flight when SIGTERM arrives closes too.
            if http1 && *phase.borrow() >= Phase::Closing {
                response
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// Resolves once the phase reaches [`Phase::Stopped`] (or the sender is gone).
pub(super) async fn stop_requested(phase: &mut watch::Receiver<Phase>) {
    // The returned guard is dropped here, so callers' futures stay Send.
    let _ = phase.wait_for(|now| *now == Phase::Stopped).await;
}
