//! The two kinds of owner the reconciler serves and what each needs: a TrainJob whose runtime
//! has an MPI policy, and a JobSet-mode JobSet (labelled `mpi-webhook.io/implementation`, not
//! owned by a TrainJob). Which owners get objects, and what the objects hold, is decided in
//! [`crate::mpi::objects_for`], the same code as `render`; everything after that (the writes,
//! the Events, the retries) is the same for both kinds.

use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Resource;

use crate::api::{JobSet, TrainJob};
use crate::mpi::Owner;
use crate::mpi::objects_for::{
    Unresolved, hostfile_for, jobset_hostfile, jobset_network_policy, runtime_of,
    train_job_network_policy,
};

use super::context::Context;
use super::error::Error;

/// The objects one owner needs besides its Secret.
#[derive(Debug)]
pub struct Desired {
    /// The hostfile ConfigMap.
    pub configmap: ConfigMap,
    /// The NetworkPolicy, when isolation is on for this owner.
    pub network_policy: Option<NetworkPolicy>,
}

/// An owner of MPI objects: a [`TrainJob`] or a JobSet-mode [`JobSet`].
pub trait MpiOwner:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Reason of the Warning Event for objects that could not be built or written (upstream's
    /// for TrainJobs).
    const FAILED_REASON: &'static str;

    /// The objects this owner needs, or `None` when it is not ours: a TrainJob whose runtime has
    /// no MPI policy, a JobSet that is not in JobSet mode.
    fn desired(&self, ctx: &Context)
    -> impl Future<Output = Result<Option<Desired>, Error>> + Send;

    /// Who the objects are owned by.
    fn owner(&self) -> Owner;
}

impl MpiOwner for TrainJob {
    const FAILED_REASON: &'static str = "TrainJobResourcesCreationFailed";

    async fn desired(&self, ctx: &Context) -> Result<Option<Desired>, Error> {
        let runtime = runtime_of(&ctx.objects, self, self.namespace())
            .await
            .map_err(|e| match e {
                Unresolved::Problem(problem) => Error::Policy(problem),
                Unresolved::Lookup(error) => Error::RuntimeLookup(error),
            })?;
        let Some(configmap) = hostfile_for(self, &runtime).map_err(Error::Policy)? else {
            tracing::debug!(name = self.name(), "runtime has no MPI policy");
            return Ok(None);
        };
        Ok(Some(Desired {
            configmap,
            network_policy: train_job_network_policy(self, ctx.network_policy_default),
        }))
    }

    fn owner(&self) -> Owner {
        Owner::from(self)
    }
}

impl MpiOwner for JobSet {
    const FAILED_REASON: &'static str = "MPIResourcesCreationFailed";

    async fn desired(&self, ctx: &Context) -> Result<Option<Desired>, Error> {
        let Some(configmap) = jobset_hostfile(self).map_err(Error::Policy)? else {
            tracing::debug!(name = self.name(), "not in JobSet mode");
            return Ok(None);
        };
        let network_policy =
            jobset_network_policy(self, ctx.network_policy_default).map_err(Error::Policy)?;
        Ok(Some(Desired {
            configmap,
            network_policy,
        }))
    }

    fn owner(&self) -> Owner {
        Owner::from(self)
    }
}
