//! JobSet mode in the reconciler: for every JobSet labelled `mpi-webhook.io/implementation` and
//! not owned by a TrainJob, the Secret `<jobset>-mpi-ssh-auth` (created once) and the ConfigMap
//! `<jobset>-mpi-hostfile` (server-side applied), both owned by the JobSet, and, when its
//! `mpi-webhook.io/network-policy` annotation or `--network-policy-default` says so, the
//! NetworkPolicy `<jobset>-mpi` (server-side applied, owned the same way). The same steps,
//! caches, metrics and leadership checks as for TrainJobs ([`super::ensure_secret`],
//! [`super::apply_configmap`]); only the owner and where the plan comes from differ
//! ([`crate::mpi::objects_for::jobset_hostfile`], shared with `render`).

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::api::JobSet;
use crate::mpi::Owner;
use crate::mpi::objects_for::{jobset_hostfile, jobset_network_policy};

use super::{
    Context, Error, RETRY_MAX, Retries, Written, apply_configmap, apply_network_policy,
    ensure_secret, report,
};

/// Reason of the Warning Event on a JobSet whose objects could not be built or written.
const FAILED_REASON: &str = "MPIResourcesCreationFailed";

/// The context of the JobSet controller: the TrainJob controller's (same caches, client,
/// recorder, metrics and leadership), with retry counters of its own.
pub struct JobSetContext {
    ctx: Arc<Context>,
    retries: Retries<ObjectRef<JobSet>>,
}

impl JobSetContext {
    /// Shares `ctx` with the TrainJob controller.
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            retries: Retries::default(),
        }
    }
}

/// Reconciles one JobSet: nothing unless it is in JobSet mode; else the Secret if absent, then
/// the ConfigMap if it differs from the cache. Events as for TrainJobs, on the JobSet.
///
/// # Errors
/// [`Error`] for anything that should be retried; [`jobset_error_policy`] decides when.
pub async fn reconcile_jobset(
    jobset: Arc<JobSet>,
    jobsets: Arc<JobSetContext>,
) -> Result<Action, Error> {
    let ctx = &jobsets.ctx;
    let _timer = ctx.metrics.start_reconcile();
    if jobset.metadata.deletion_timestamp.is_some() {
        // Garbage collection deletes the owned objects.
        return Ok(Action::await_change());
    }
    let result = reconcile_children(&jobset, ctx).await;
    if result.is_ok() {
        jobsets
            .retries
            .forget(&ObjectRef::from_obj(jobset.as_ref()));
    }
    report(ctx, jobset.as_ref(), jobset.name(), result, FAILED_REASON).await
}

/// Logs and counts the failure, then requeues: quickly at first, doubling up to 5 minutes; a
/// JobSet whose settings do not parse waits 5 minutes (they cannot change after creation).
pub fn jobset_error_policy(
    jobset: Arc<JobSet>,
    error: &Error,
    jobsets: Arc<JobSetContext>,
) -> Action {
    jobsets.ctx.metrics.failure(error.metric_label());
    let delay = match error {
        Error::Policy(_) | Error::HostfileConflict(_) => RETRY_MAX,
        _ => jobsets
            .retries
            .next_delay(ObjectRef::from_obj(jobset.as_ref())),
    };
    tracing::warn!(
        namespace = jobset.namespace(),
        name = jobset.name(),
        %error,
        retry_in = ?delay,
        "reconcile of a JobSet-mode JobSet failed"
    );
    Action::requeue(delay)
}

async fn reconcile_children(jobset: &JobSet, ctx: &Context) -> Result<Written, Error> {
    let Some(configmap) = jobset_hostfile(jobset).map_err(Error::Policy)? else {
        tracing::debug!(name = jobset.name(), "not in JobSet mode");
        return Ok(Written::default());
    };
    let policy =
        jobset_network_policy(jobset, ctx.network_policy_default).map_err(Error::Policy)?;
    ctx.caches_synced().await;
    let network_policy = match policy {
        Some(policy) => apply_network_policy(&policy, ctx).await?,
        None => false,
    };
    let secret = ensure_secret(&Owner::from(jobset), ctx).await?;
    let configmap = apply_configmap(&configmap, ctx).await?;
    Ok(Written {
        secret,
        configmap,
        network_policy,
    })
}
