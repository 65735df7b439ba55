//! The real `mpi-webhook reconcile` process against the fake API server of `fake_apiserver/`,
//! and that fake's own tests.

mod fake_apiserver;
#[path = "fake_apiserver/tests.rs"]
mod fake_apiserver_tests;
