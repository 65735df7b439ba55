//! mpi-webhook: Kubeflow Trainer's MPI plugin as a standalone Kubernetes admission webhook and
//! reconciler.
//!
//! The domain ([`mpi`], [`admission`], [`field_error`], [`api`]) is pure and shared by every
//! subcommand; I/O lives at the edges ([`objects`] loading, the CLI in `main.rs`).

pub mod admission;
pub mod api;
pub mod api_calls;
pub mod certs;
pub mod cli;
pub mod field_error;
pub mod json_error;
pub mod mpi;
pub mod objects;
pub mod offline;
pub mod preflight;
pub mod raw_json;
pub mod reconciler;
pub mod render;
pub mod serve;
pub mod shell;
pub mod shutdown;
pub mod tls;
