//! JobSet mode (Decision 18): a JobSet labelled `mpi-webhook.io/implementation` and not owned by
//! a TrainJob gets its MPI wiring from its own label and annotations, without Kubeflow Trainer.
//!
//! This module only reads those settings, turns them into an [`MpiPlan`] and holds the admission
//! rules of the mode. Everything else (the implementation table, the hostfile, the patch writer,
//! the Secret and the ConfigMap) is TrainJob mode's, fed with this plan. Pure: no I/O.
//!
//! [`settings`] reads the label and annotations (below the plan), [`MpiPlan::for_jobset`] makes
//! the plan from them, and [`rules`] holds the admission rules built on both.
//!
//! [`MpiPlan::for_jobset`]: super::plan::MpiPlan::for_jobset

pub mod rules;
pub mod settings;
pub mod ssh_setup;

pub use rules::{Checked, check, host_name_error, immutable_errors, label_on_train_job_error};
pub use settings::*;
