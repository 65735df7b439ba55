//! The shutdown signals shared by `serve` and `reconcile`.

use std::future::Future;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The installed SIGTERM and SIGINT handlers; [`Signals::recv`] waits for the next of either.
///
/// The handlers are installed before the caller starts serving: a signal that arrives between
/// "listening" and the first wait would otherwise kill the process with the default action,
/// skipping the graceful drain. Kept as a value (not a one-shot future) so `serve` can also
/// notice a second signal during its shutdown delay.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers.
    ///
    /// # Errors
    /// The I/O error of installing a handler.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT and names it.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on either.
///
/// # Errors
/// The I/O error of installing a handler.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut signals = Signals::install()?;
    Ok(async move {
        signals.recv().await;
    })
}
