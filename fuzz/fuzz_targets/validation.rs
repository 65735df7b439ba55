//! Structure-aware edits of every object the validating routes admit (the shipped TrainJob and
//! JobSet sample reviews, and a review of each shipped runtime): never a panic, always a
//! well-formed response, and a denial always names the field it is about.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use mpi_webhook::admission::{Route, Verb};
use mpi_webhook_fuzz::{answer, check_response, edit, names_a_field, seed_reviews};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let bases: Vec<&(Route, Value)> = seed_reviews()
        .iter()
        .filter(|(route, _)| route.verb() == Verb::Validate)
        .collect();
    let Ok((route, base)) = u.choose(&bases).map(|b| (b.0, &b.1)) else {
        return;
    };
    let mut review = base.clone();
    if u.ratio(1, 4).unwrap_or(false) {
        review["request"]["operation"] = Value::from("UPDATE");
        review["request"]["oldObject"] = base["request"]["object"].clone();
    }
    if edit(&mut u, &mut review["request"]["object"]).is_err() {
        return;
    }
    let body = serde_json::to_vec(&review).expect("a Value serializes");
    let Ok(reviewed) = answer(route, &body) else {
        return;
    };
    let response = check_response(&reviewed);
    if response["allowed"] == false {
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(names_a_field(message), "a denial names no field: {message}");
    }
});
