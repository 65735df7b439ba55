//! The controller's two callbacks, the same for both kinds of owner ([`MpiOwner`]):
//! [`reconcile`] writes what the owner needs (the NetworkPolicy when on, then the Secret unless
//! this term made or found it, then the ConfigMap if it differs from the cache) and reports it as an Event;
//! [`error_policy`] counts and logs a failure and picks the next attempt's delay.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use crate::mpi::{hostfile_configmap_name, network_policy_name, ssh_secret_name};

use super::context::Context;
use super::error::Error;
use super::owners::MpiOwner;
use super::writes::{apply_configmap, apply_network_policy, ensure_secret};

/// What a successful reconcile wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The Secret was created.
    pub secret: bool,
    /// The ConfigMap was applied (created, changed or repaired).
    pub configmap: bool,
    /// The NetworkPolicy was applied (created, changed or repaired).
    pub network_policy: bool,
}

/// Reconciles one owner. Logs what it wrote, and publishes a Warning Event when it failed.
///
/// # Errors
/// [`Error`] for anything that should be retried; [`error_policy`] decides when.
pub async fn reconcile<K: MpiOwner>(owner: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start_reconcile();
    if owner.meta().deletion_timestamp.is_some() {
        // Garbage collection deletes the owned objects.
        return Ok(Action::await_change());
    }
    let result = write_children(owner.as_ref(), &ctx).await;
    if result.is_ok() {
        ctx.retries
            .forget(&ObjectRef::from_obj(owner.as_ref()).erase());
    }
    report(&ctx, owner.as_ref(), result).await
}

/// Logs and counts the failure, then requeues: quickly at first, doubling up to 5 minutes, or
/// after 5 minutes at once when only a change can fix it ([`Error::retries_slowly`]).
pub fn error_policy<K: MpiOwner>(owner: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failure(error.metric_label());
    let delay = ctx
        .retries
        .next_delay(ObjectRef::from_obj(owner.as_ref()).erase(), error);
    tracing::warn!(
        kind = K::kind(&()).as_ref(),
        namespace = owner.meta().namespace.as_deref().unwrap_or_default(),
        name = owner.meta().name.as_deref().unwrap_or_default(),
        %error,
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

async fn write_children<K: MpiOwner>(owner: &K, ctx: &Context) -> Result<Written, Error> {
    let Some(desired) = owner.desired(ctx).await? else {
        return Ok(Written::default());
    };
    ctx.caches_synced().await;
    // First, so the job's pods (which wait for the Secret and ConfigMap volumes) never run
    // unprotected.
    let network_policy = match &desired.network_policy {
        Some(policy) => apply_network_policy(policy, ctx).await?,
        None => false,
    };
    // Upstream order (spec D): a failed Secret create emits nothing, not even the ConfigMap.
    let secret = ensure_secret(&owner.owner(), ctx).await?;
    let configmap = apply_configmap(&desired.configmap, ctx).await?;
    Ok(Written {
        secret,
        configmap,
        network_policy,
    })
}

/// The outcome of one owner's reconcile as a log line or an Event, and the controller's answer:
/// an info line for what was written; a Warning Event for a failure, with the owner kind's reason
/// or `HostfileConflict`; nothing when this replica is no longer the leader.
async fn report<K: MpiOwner>(
    ctx: &Context,
    owner: &K,
    result: Result<Written, Error>,
) -> Result<Action, Error> {
    match result {
        Ok(written) => {
            let name = owner.meta().name.as_deref().unwrap_or_default();
            // No Event for a success: the objects and the writes metric say it, and at one
            // more API write per job (a third of them) it cost the whole cluster's throughput.
            if let Some(note) = written_note(name, written) {
                tracing::info!(
                    kind = K::kind(&()).as_ref(),
                    namespace = owner.meta().namespace.as_deref().unwrap_or_default(),
                    name,
                    "{note}"
                );
            }
            Ok(Action::await_change())
        }
        Err(Error::NotLeader) => Ok(Action::await_change()),
        Err(error) => {
            let note = error.to_string();
            let reason = error.event_reason(K::FAILED_REASON);
            ctx.events
                .publish(owner, EventType::Warning, reason, note)
                .await;
            Err(error)
        }
    }
}

/// The log line for the objects of the TrainJob or JobSet named `owner`, in
/// the order they were written: `Applied NetworkPolicy <owner>-mpi, created Secret … and applied
/// ConfigMap …`.
fn written_note(owner: &str, written: Written) -> Option<String> {
    let parts: Vec<String> = [
        (
            written.network_policy,
            format!("applied NetworkPolicy {}", network_policy_name(owner)),
        ),
        (
            written.secret,
            format!("created Secret {}", ssh_secret_name(owner)),
        ),
        (
            written.configmap,
            format!("applied ConfigMap {}", hostfile_configmap_name(owner)),
        ),
    ]
    .into_iter()
    .filter_map(|(written, part)| written.then_some(part))
    .collect();
    let (last, rest) = parts.split_last()?;
    let note = if rest.is_empty() {
        last.clone()
    } else {
        format!("{} and {last}", rest.join(", "))
    };
    let mut chars = note.chars();
    let first = chars.next()?;
    Some(first.to_uppercase().chain(chars).collect())
}
