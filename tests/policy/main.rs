//! Policy tests: every behaviour of the MPI policy (upstream's own MPI test cases and the
//! Decisions) asserted on exact outputs, through the library's pure API. No network.

mod admission;
mod coexistence;
mod enforce;
mod golden;
mod jobset_mode;
mod oracle;
#[path = "../support/preflight.rs"]
mod preflight;
#[path = "../support/pss.rs"]
mod pss;
mod render;
mod ssa;
mod support;
mod trap;
mod validate;
