//! Instructions per review, counted by callgrind: the whole review as `serve` answers
//! it (read the AdmissionReview bytes, look up, decide, write the response), in-process, without
//! HTTP or TLS. Unlike a timing, a count does not move with the load of a shared machine, so a
//! before/after comparison holds to a fraction of a percent.
//!
//! `cargo bench --bench instructions` re-runs this binary under `valgrind --tool=callgrind` once
//! with one review and once with [`REVIEWS`] more, for each case, and prints the difference per
//! review: set-up, loading and the first review's one-time costs cancel out. Without `--bench`
//! (as `cargo test --benches` runs it) it answers each case once, untimed, and checks the answer.

use std::process::Command;

use mpi_webhook::admission::{Route, review};
use mpi_webhook::api::TrainJob;

#[path = "support/reviews.rs"]
mod reviews;

use reviews::{MUTATE_SAMPLE, VALIDATE_SAMPLE, block_on, sample};

/// Reviews counted per case, on top of the first.
const REVIEWS: u64 = 2_000;
/// The flag of a counting child: `--count CASE N`.
const COUNT_FLAG: &str = "--count";

/// One case: a route, its sample review, and whether the answer carries a patch.
struct Case {
    name: &'static str,
    route: Route,
    sample: &'static str,
    patched: bool,
}

const CASES: [Case; 4] = [
    Case {
        name: "validate TrainJob",
        route: Route::ValidateTrainJob,
        sample: VALIDATE_SAMPLE,
        patched: false,
    },
    Case {
        name: "mutate JobSet, TrainJob mode",
        route: Route::MutateJobSet,
        sample: MUTATE_SAMPLE,
        patched: true,
    },
    Case {
        name: "validate JobSet, JobSet mode",
        route: Route::ValidateJobSet,
        sample: "jobset-mode-create-openmpi.json",
        patched: false,
    },
    Case {
        name: "mutate JobSet, JobSet mode",
        route: Route::MutateJobSet,
        sample: "jobset-mode-create-openmpi.json",
        patched: true,
    },
];

/// Answers `case`'s review `1 + extra` times and checks the first answer.
fn answer(case: &Case, extra: u64) {
    let train_job: TrainJob =
        serde_json::from_value(reviews::train_job_json(3)).expect("sample TrainJob");
    let snapshot = reviews::snapshot_with(&train_job);
    let body = sample(case.sample);
    let first = block_on(review(case.route, &body, &snapshot)).expect("a review");
    assert!(
        first.outcome.allowed(),
        "{}: {:?}",
        case.name,
        first.outcome
    );
    assert_eq!(
        first.outcome.patch_operations() > 0,
        case.patched,
        "{}",
        case.name
    );
    for _ in 0..extra {
        std::hint::black_box(block_on(review(
            case.route,
            std::hint::black_box(&body),
            &snapshot,
        )))
        .ok();
    }
}

/// Instructions callgrind counts for `1 + extra` reviews of case `index`, this binary re-run.
fn collected(index: usize, extra: u64) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let output = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args([COUNT_FLAG, &index.to_string(), &extra.to_string()])
        .output()
        .map_err(|e| format!("running valgrind (is it installed?): {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("callgrind run failed: {stderr}"));
    }
    stderr
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no instruction count in callgrind's output: {stderr}"))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == COUNT_FLAG) {
        let number = |i: usize| args.get(at + i).and_then(|n| n.parse::<u64>().ok());
        let (Some(index), Some(extra)) = (number(1), number(2)) else {
            return Err(format!("usage: {COUNT_FLAG} CASE N"));
        };
        let case = usize::try_from(index)
            .ok()
            .and_then(|i| CASES.get(i))
            .ok_or("no such case")?;
        answer(case, extra);
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        for case in &CASES {
            answer(case, 0);
        }
        println!("instructions: each case answered once (run `cargo bench --bench instructions`)");
        return Ok(());
    }
    println!("| review (`cargo bench --bench instructions`) | instructions per review |");
    println!("|---|---:|");
    for (index, case) in CASES.iter().enumerate() {
        let one = collected(index, 0)?;
        let many = collected(index, REVIEWS)?;
        let per_review = many.saturating_sub(one) / REVIEWS;
        println!("| {} | {per_review} |", case.name);
    }
    Ok(())
}
