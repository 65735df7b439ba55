//! Policy tests: every behaviour of ../shared/spec/mpi-policy.md (upstream cases E.1-E.3 and the
//! Decisions) asserted on exact outputs, through the library's pure API. No network.

mod admission;
mod enforce;
mod render;
mod support;
mod validate;
