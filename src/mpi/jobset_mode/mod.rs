//! JobSet mode (Decision 18): a JobSet labelled `mpi-webhook.io/implementation` and not owned by
//! a TrainJob gets its MPI wiring from its own label and annotations, without Kubeflow Trainer.
//!
//! This folder holds what the mode adds below the plan: [`settings`] reads the label and the
//! annotations in one pass (and says which mode a JobSet is in), [`ssh_setup`] holds the
//! `generated` ssh setup's entries. [`MpiPlan::from_settings`] makes the plan from the settings
//! once they are read (admission and the reconciler read them once, then check and plan), and
//! the mode's admission rules, built on both, are [`super::jobset_rules`], above the plan.
//! Everything else (the implementation table, the hostfile, the patch writer, the Secret and the
//! ConfigMap) is TrainJob mode's, fed with this plan. Pure: no I/O.
//!
//! [`MpiPlan::from_settings`]: super::plan::MpiPlan::from_settings

pub mod settings;
pub mod ssh_setup;

pub use settings::*;
