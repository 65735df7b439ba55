//! Structure-aware edits of the shipped JobSet reviews (every mode the samples cover), mutated as
//! `serve` does. Whenever a patch is returned: it applies cleanly to the request's object; the
//! policy run again on the result returns no patch; and every location the policy does not own
//! is unchanged.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use mpi_webhook::admission::Route;
use mpi_webhook_fuzz::{answer, check_response, edit, patch_of, pointers, seed_reviews};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let bases: Vec<&Value> = seed_reviews()
        .iter()
        .filter(|(route, _)| *route == Route::MutateJobSet)
        .map(|(_, review)| review)
        .collect();
    let Ok(base) = u.choose(&bases) else {
        return;
    };
    let mut review = (*base).clone();
    if edit(&mut u, &mut review["request"]["object"]).is_err() {
        return;
    }
    let body = serde_json::to_vec(&review).expect("a Value serializes");
    let Ok(reviewed) = answer(Route::MutateJobSet, &body) else {
        return;
    };
    let response = check_response(&reviewed);
    let Some(patch) = patch_of(&response) else {
        return;
    };
    let object = review["request"]["object"].clone();
    let mut patched = object.clone();
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        panic!("the returned patch does not apply: {e}\npatch: {patch:?}\nobject: {object}");
    }

    let mut again = review.clone();
    again["request"]["object"] = patched.clone();
    let body = serde_json::to_vec(&again).expect("a Value serializes");
    let second = answer(Route::MutateJobSet, &body).expect("the patched review is a review");
    let second = check_response(&second);
    assert_eq!(
        second["allowed"], true,
        "the patched JobSet is admitted: {second}"
    );
    assert!(
        second.get("patch").is_none(),
        "a second pass returns a patch: {:?}",
        patch_of(&second)
    );

    let mut locations = Vec::new();
    pointers(&object, "", &mut locations);
    for at in locations {
        let Some(before) = object.pointer(&at) else {
            continue;
        };
        if before.is_object() || before.is_array() {
            continue;
        }
        let tokens: Vec<&str> = at.split('/').skip(1).collect();
        if owned(&tokens) || (before.is_null() && leads_to_owned(&tokens)) {
            continue;
        }
        assert_eq!(
            patched.pointer(&at),
            Some(before),
            "{at} is not the policy's, but the patch changed it"
        );
    }
});

/// What the policy writes: the worker counts, the pod specs' volumes, the containers' mounts and
/// env, and JobSet mode's successPolicy default, as JSON pointers without the leading `/` (`*`
/// is any index).
const OWNED: &[&str] = &[
    "spec/replicatedJobs/*/template/spec/parallelism",
    "spec/replicatedJobs/*/template/spec/completions",
    "spec/replicatedJobs/*/template/spec/template/spec/volumes",
    "spec/replicatedJobs/*/template/spec/template/spec/containers/*/volumeMounts",
    "spec/replicatedJobs/*/template/spec/template/spec/containers/*/env",
    // JobSet mode: a `null` successPolicy is no policy, and gets the launcher's.
    "spec/successPolicy",
];

/// Whether `tokens` agrees with the [`OWNED`] pattern wherever both have a token.
fn agrees(pattern: &str, tokens: &[&str]) -> bool {
    pattern
        .split('/')
        .zip(tokens)
        .all(|(p, t)| p == *t || (p == "*" && t.parse::<usize>().is_ok()))
}

/// How many tokens an [`OWNED`] pattern has.
fn depth(pattern: &str) -> usize {
    pattern.split('/').count()
}

/// At or below a location the policy owns.
fn owned(tokens: &[&str]) -> bool {
    OWNED
        .iter()
        .any(|p| tokens.len() >= depth(p) && agrees(p, tokens))
}

/// Above a location the policy owns: a `null` there may become the parent it creates.
fn leads_to_owned(tokens: &[&str]) -> bool {
    OWNED
        .iter()
        .any(|p| tokens.len() < depth(p) && agrees(p, tokens))
}
