//! Arbitrary bytes to every route's handler: never a panic or a hang; always either a well-formed
//! AdmissionReview response or the documented 400 (`BadReview`, with a message). The 413 for a
//! body over 7 MiB is decided before the handler, from the length alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpi_webhook::admission::Route;
use mpi_webhook_fuzz::{answer, check_response};

fuzz_target!(|body: &[u8]| {
    for route in Route::ALL {
        match answer(route, body) {
            Ok(reviewed) => {
                check_response(&reviewed);
            }
            Err(bad) => assert!(!bad.to_string().is_empty(), "a 400 says what is wrong"),
        }
    }
});
