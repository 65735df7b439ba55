//! Scenarios against a real control plane: etcd and kube-apiserver (and kube-controller-manager's
//! garbage collector where a test needs it) from `KUBEBUILDER_ASSETS`, started once for this
//! binary by [`control_plane`]; every test works in a namespace of its own, so they run in
//! parallel (the reconciler, which watches the whole cluster, takes turns). Without assets every
//! test fails saying how to get them, unless `SKIP_TEST_SUITES=envtest` opts out
//! (`tests/support/prerequisites.rs`).
//!
//! Every wait is bounded and polls; nothing asserts a duration.

mod admission;
mod authorizer;
mod control_plane;
mod harness;
mod helm;
#[path = "../support/prerequisites.rs"]
mod prerequisites;
#[path = "../support/prometheus.rs"]
mod prometheus;
mod reconciler;
mod restart;
mod support;
