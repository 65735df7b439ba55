//! MPI jobs that really run: a single-node cluster (control plane, scheduler, controllers, a
//! kubelet on containerd, cluster DNS, the JobSet controller, and mpi-webhook as `manifests/`
//! deploys it), started once for this binary by [`cluster::shared`], and scenarios that run the
//! shipped samples on it. Each scenario works in a namespace of its own, so they run in parallel.
//!
//! Needs root, the node binaries beside `KUBEBUILDER_ASSETS` and what
//! `scripts/install-test-deps.sh` installs; without them every scenario fails saying what is
//! missing, unless `SKIP_TEST_SUITES=cluster` opts out. docs/development.md "The
//! single-node cluster" says how to run one scenario and where the logs are.
//!
//! Every wait is bounded and polls; nothing asserts a duration.

mod cluster;
#[path = "../envtest/control_plane.rs"]
mod control_plane;
mod failures;
mod jobs;
mod lost_workers;
#[path = "../support/prerequisites.rs"]
mod prerequisites;
#[path = "../support/prometheus.rs"]
#[allow(dead_code)]
mod prometheus;
mod scenarios;
#[path = "../envtest/support.rs"]
#[allow(dead_code)]
mod support;
