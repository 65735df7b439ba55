//! The process shell that `serve` and `reconcile` share: the plain-HTTP server of
//! `--metrics-listen` with its routes and readiness ([`probes`]), and the content-polling
//! reloader of what a process reads from disk ([`reload`]).
//!
//! Nothing here knows the policy, the objects or the cluster: each process says what it waits
//! for and what it reloads, and this module does the rest the same way for both.

pub mod probes;
pub mod reload;

pub use probes::{Gate, Readiness};
pub use reload::{Live, Reload, Reloader};
