//! TrainJob mode next to the real Kubeflow Trainer: the single-node cluster of `tests/cluster`
//! (its modules, reused) plus the Trainer controller manager built from its Go module
//! (`scripts/install-neighbours.sh`), one version at a time, chosen per scenario
//! (`tests/cluster/trainer.rs`). Trainer makes the JobSet of every TrainJob here; mpi-webhook's
//! `serve` and `reconcile` run beside it as `manifests/` deploys them.
//!
//! Needs what `tests/cluster` needs plus `target/neighbours/trainer-<version>/`; without them
//! every scenario fails saying what is missing, unless `SKIP_TEST_SUITES=cluster` opts out.
//! docs/development.md "The single-node cluster" says how to run it and where the logs are.
//!
//! Every wait is bounded and polls; nothing asserts a duration.

#[path = "../cluster/cluster.rs"]
#[allow(dead_code)]
mod cluster;
#[path = "../envtest/control_plane.rs"]
mod control_plane;
mod first_runs;
#[path = "../cluster/jobs.rs"]
#[allow(dead_code)]
mod jobs;
#[path = "../cluster/kueue.rs"]
mod kueue;
#[path = "../support/prerequisites.rs"]
mod prerequisites;
#[path = "../support/prometheus.rs"]
#[allow(dead_code)]
mod prometheus;
mod queued;
mod scenarios;
#[path = "../envtest/support.rs"]
#[allow(dead_code)]
mod support;
#[path = "../cluster/trainer.rs"]
mod trainer;
