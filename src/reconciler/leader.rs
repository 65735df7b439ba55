//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager), and the gate that runs
//! the controller only while this replica holds it.
//!
//! Safety rule: any error while holding or renewing the Lease publishes "not leader" at once and
//! rebuilds the manager; writing resumes only once the Lease is confirmed ours again. The renewal
//! client times out well before the Lease expires, so a replica cut off from the API server
//! stops writing before another replica may take over.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;

/// Seconds a Lease stays valid after its last renewal.
pub const LEASE_DURATION_SECS: u64 = 15;
/// Seconds before expiry at which the holder renews. The renewal request times out sooner
/// (see `run::LEASE_REQUEST_TIMEOUT`), so a failed renewal is noticed before expiry.
pub const LEASE_GRACE_SECS: u64 = 5;
/// Resolves when a leadership term ends (the Lease was lost, or shutdown was requested).
pub type TermEnd = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// Pause before building a new manager after an error.
const RETRY_DELAY: Duration = Duration::from_secs(2);
/// How often a standby looks at the Lease again (client-go's `RetryPeriod`). The manager alone
/// sleeps until the holder's Lease would expire, so a Lease released early (a leader that got
/// SIGTERM) would wait for the full duration; a fresh manager reads the Lease as it is now.
const STANDBY_RECHECK: Duration = Duration::from_secs(2);

/// Why [`hold`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Shutdown was requested.
    Shutdown,
    /// The manager failed; this replica stepped down.
    Failed,
    /// A standby's recheck is due.
    Recheck,
}

/// Where the Lease lives and who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (holder).
    pub holder: String,
}

/// Keeps competing for the Lease until `shutdown` becomes true, publishing leadership on
/// `leader`; then releases the Lease so a standby takes over without waiting for expiry.
pub async fn elect(
    client: Client,
    settings: LeaseSettings,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let manager = tokio::select! {
            built = build(&client, &settings) => built,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match manager {
            Ok(manager) => match hold(&manager, &leader, &mut shutdown).await {
                Held::Shutdown => {
                    leader.send_replace(false);
                    // Clears holderIdentity and leaseDurationSeconds, as client-go's
                    // ReleaseOnCancel does: a standby takes the Lease at its next recheck.
                    match manager.release().await {
                        Ok(()) => tracing::info!(lease = %settings.name, "released the Lease"),
                        Err(error) => tracing::warn!(%error, "releasing the Lease on shutdown"),
                    }
                    return;
                }
                Held::Recheck => continue,
                Held::Failed => {}
            },
            Err(error) => tracing::warn!(%error, lease = %settings.name, "Lease manager"),
        }
        leader.send_replace(false);
        tokio::select! {
            _ = tokio::time::sleep(RETRY_DELAY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

async fn build(
    client: &Client,
    settings: &LeaseSettings,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    LeaseManagerBuilder::new(client.clone(), &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.holder)
        .with_duration(LEASE_DURATION_SECS)
        .with_grace(LEASE_GRACE_SECS)
        .build()
        .await
}

/// Follows the manager's state changes until shutdown, an error, or (while not leading) the
/// standby's recheck.
async fn hold(
    manager: &LeaseManager,
    leader: &watch::Sender<bool>,
    shutdown: &mut watch::Receiver<bool>,
) -> Held {
    loop {
        let standby = !*leader.borrow();
        tokio::select! {
            changed = manager.changed() => match changed {
                Ok(is_leader) => {
                    tracing::info!(is_leader, "Lease state changed");
                    leader.send_replace(is_leader);
                }
                Err(error) => {
                    tracing::warn!(%error, "Lease renewal failed: stepping down");
                    return Held::Failed;
                }
            },
            // Only a standby: dropping a holder's manager mid-renewal is never needed.
            () = tokio::time::sleep(STANDBY_RECHECK), if standby => return Held::Recheck,
            _ = shutdown.wait_for(|stop| *stop) => return Held::Shutdown,
        }
    }
}

/// Runs `lead` each time `leader` becomes true, handing it a future that resolves when the
/// leadership ends or `shutdown` becomes true; returns on shutdown (or when the leadership
/// channel closes). `lead` must stop writing promptly when that future resolves.
pub async fn run_while_leader<F, Fut>(
    mut leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    mut lead: F,
) where
    F: FnMut(TermEnd) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        tokio::select! {
            became = leader.wait_for(|l| *l) => if became.is_err() { return },
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        tracing::info!("leading: starting the controller");
        lead(ended(leader.clone(), shutdown.clone())).await;
        if *shutdown.borrow() {
            return;
        }
        tracing::info!("lost the Lease: controller stopped");
    }
}

fn ended(mut leader: watch::Receiver<bool>, mut shutdown: watch::Receiver<bool>) -> TermEnd {
    Box::pin(async move {
        tokio::select! {
            _ = leader.wait_for(|l| !*l) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    })
}
