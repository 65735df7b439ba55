//! The two kinds of owner the reconciler serves: a TrainJob whose runtime has an MPI policy,
//! and a JobSet-mode JobSet (labelled `mpi-webhook.io/implementation`, not owned by a
//! TrainJob). What each needs is [`crate::mpi::objects_for::desired`]'s answer, the same as
//! `render`'s; this module only looks up a TrainJob's runtime first. Everything after that (the
//! writes, the Events, the retries) is the same for both kinds.

use std::future::Future;

use kube::Resource;

use crate::api::{JobSet, TrainJob};
use crate::mpi::Owner;
use crate::mpi::objects_for::{Desired, Owned, desired};
use crate::objects::{Unresolved, runtime_of};

use super::cached::jobset_as_read;
use super::context::Context;
use super::error::Error;

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
        let desired =
            desired(Owned::TrainJob(self, &runtime), &ctx.object_options).map_err(Error::Policy)?;
        if desired.is_none() {
            tracing::debug!(name = self.name(), "runtime has no MPI policy");
        }
        Ok(desired)
    }

    fn owner(&self) -> Owner {
        Owner::from(self)
    }
}

impl MpiOwner for JobSet {
    const FAILED_REASON: &'static str = "MPIResourcesCreationFailed";

    async fn desired(&self, ctx: &Context) -> Result<Option<Desired>, Error> {
        // The cached JobSet keeps its label in its annotation map (`jobset_read`).
        let jobset = jobset_as_read(self);
        let desired =
            desired(Owned::JobSet(&jobset), &ctx.object_options).map_err(Error::Policy)?;
        if desired.is_none() {
            tracing::debug!(name = self.name(), "not in JobSet mode");
        }
        Ok(desired)
    }

    fn owner(&self) -> Owner {
        Owner::from(self)
    }
}
