//! The shutdown signal shared by `serve` and `reconcile`.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on either.
///
/// The handlers are installed before the caller starts serving: a signal that arrives between
/// "listening" and the first poll of the future would otherwise kill the process with the
/// default action, skipping the graceful drain.
///
/// # Errors
/// The I/O error of installing a handler.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
