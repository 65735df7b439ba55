//! `mpi-webhook reconcile`: the only part of mpi-webhook that writes to the cluster.
//!
//! For every TrainJob whose runtime has an MPI policy it creates the SSH Secret once (immutable,
//! never updated or rotated; an existing one, Kubeflow Trainer's or ours, is recognised by the
//! create's AlreadyExists and used as is: it never reads a Secret; spec D.1, Decision 22)
//! and server-side applies the hostfile ConfigMap with field manager `mpi-webhook`, so edits and
//! drift are repaired (D.2), but never over Kubeflow Trainer's manager `trainer` (Decision 16): the
//! apply is sent without `force`, and retried with it only when no conflicting manager is Trainer's.
//! Which TrainJobs get objects, and what they hold, is [`crate::mpi::objects_for::desired`]'s
//! answer, the same as `render`'s; the ConfigMap agrees with the webhook's JobSet patch (both
//! start from [`crate::mpi::plan::MpiPlan`]).
//!
//! With `--network-policy-default` (TrainJobs, and JobSet-mode JobSets without the
//! `mpi-webhook.io/network-policy` annotation) or that annotation set to `true`, it also
//! server-side applies the NetworkPolicy `<name>-mpi` the same way as the ConfigMap,
//! before the Secret and the ConfigMap, so the job's pods (which wait for those two volumes)
//! never run unprotected. A policy that is no longer wanted is left in place, never deleted:
//! deleting a live job's isolation on a flag change is not the reconciler's to decide.
//!
//! The files, in the order one depends on the next: `error` (why a reconcile failed),
//! `context` (what it needs, and its retry rule), `cached` (what the caches keep of each object,
//! and a cached JobSet read back), `writes` (each write), `owners` (what a
//! TrainJob and a JobSet-mode JobSet each need), `reconcile` (the controller's two callbacks,
//! one pair for both kinds), `launcher_pods` (failed pre-flights and launcher runs as Events on
//! the JobSet or TrainJob), then `run` (each term's watches and the two controllers over them,
//! leader election and the probe server).

mod cached;
mod conflict;
mod context;
mod error;
mod events;
mod launcher_pods;
mod leader;
mod metrics;
mod owners;
mod reconcile;
mod run;
#[cfg(test)]
mod tests;
mod writes;

pub use context::{Applied, AppliedConfigMaps, Context, ContextParts, EnsuredSecrets};
pub use error::{Error, HostfileConflict, TRAINER_MANAGER};
pub use events::Events;
pub use leader::{LeaseSettings, TermEnd, run_while_leader};
pub use metrics::ReconcileMetrics;
pub use owners::MpiOwner;
pub use reconcile::{Written, error_policy, reconcile};
pub use run::{ReconcileError, run};
