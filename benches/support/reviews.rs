//! The inputs of the review benchmarks (`policy`, `instructions`): the README's sample
//! AdmissionReviews and the objects they need, the shipped runtimes plus the TrainJob the sample
//! JobSet is owned by.

use std::path::Path;
use std::task::{Context, Poll, Waker};

use mpi_webhook::api::TrainJob;
use mpi_webhook::objects::Snapshot;
use serde_json::Value;

const REVIEWS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/samples/reviews");
/// The validate route's sample: a TrainJob of the shipped deepspeed runtime, allowed.
pub const VALIDATE_SAMPLE: &str = "trainjob-create-allowed.json";
/// The mutate route's sample: a JobSet as Trainer creates it for that TrainJob.
pub const MUTATE_SAMPLE: &str = "jobset-create-owned-by-trainjob.json";

/// Runs a future that never waits (every [`Snapshot`] lookup is ready at once) to completion.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}

/// The bytes of sample review `name`.
pub fn sample(name: &str) -> Vec<u8> {
    let path = Path::new(REVIEWS).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `bytes` as JSON.
pub fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("sample is JSON")
}

/// The sample TrainJob of the mutate review with `num_nodes` nodes (same name and uid as
/// `manifests/samples/trainjob-pi-deepspeed.yaml`, so the sample JobSet's ownerReference
/// matches), as raw JSON.
pub fn train_job_json(num_nodes: i64) -> Value {
    let mut train_job = json(&sample(VALIDATE_SAMPLE))["request"]["object"].take();
    train_job["metadata"]["name"] = "pi-deepspeed".into();
    train_job["metadata"]["uid"] = "6b1f4a52-1c3e-4d8a-9f20-3a7e5c9d0b11".into();
    train_job["spec"]["trainer"]["numNodes"] = num_nodes.into();
    train_job
}

/// The shipped runtimes plus `train_job`.
pub fn snapshot_with(train_job: &TrainJob) -> Snapshot {
    let mut snapshot = Snapshot::shipped_runtimes().expect("shipped runtimes load");
    snapshot.insert_train_job(train_job.clone());
    snapshot
}
