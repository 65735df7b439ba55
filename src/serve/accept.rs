//! The HTTPS accept loop of `serve`: TLS handshakes (bounded in time), one hyper connection per
//! client serving the router, and the graceful drain at shutdown.
//!
//! tokio-rustls + hyper-util directly (no axum-server): the certificate comes from the
//! [`ReloadingCert`](crate::tls::ReloadingCert) resolver inside the acceptor, so a reload never
//! touches the listener; connections are tracked by hyper-util's `GracefulShutdown`, so shutdown
//! stops accepting, lets in-flight requests finish (closing idle keep-alive connections at once),
//! and gives up after a bound.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A TLS handshake that takes longer than this is dropped (slow or stuck clients).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/1 client that sends no complete request headers for this long is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts TLS connections on `listener` and serves `router` on each until `shutdown` says stop,
/// then waits up to `grace` for the open connections.
pub(super) async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = Arc::new(builder);
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
            () = stop_requested(&mut shutdown) => break,
        };
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let router = router.clone();
        let builder = Arc::clone(&builder);
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
            let service = TowerToHyperService::new(router);
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(
        connections = open,
        "stopped accepting; waiting for in-flight requests"
    );
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_seconds = grace.as_secs_f64(),
            "in-flight requests did not finish within the shutdown grace; closing them"
        );
    }
}

/// Resolves once `true` is sent (or the sender is gone).
pub(super) async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    // The returned guard is dropped here, so callers' futures stay Send.
    let _ = shutdown.wait_for(|stop| *stop).await;
}
