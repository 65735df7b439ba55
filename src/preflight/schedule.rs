//! When to try a host again: exponential backoff from [`FIRST_DELAY`], doubling up to
//! [`MAX_DELAY`], never past the deadline. Short first waits because a cluster is usually a few
//! seconds from ready; a cap so that a host that comes up late is noticed within seconds.

use std::time::Duration;

/// The wait after the first failed attempt.
pub const FIRST_DELAY: Duration = Duration::from_millis(200);
/// The longest wait between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// The wait after failed attempt number `attempt` (0 = the first): 200 ms, 400 ms, 800 ms, ...,
/// at most 5 s.
pub fn backoff(attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    FIRST_DELAY.saturating_mul(factor).min(MAX_DELAY)
}

/// How long to wait before the next attempt, `elapsed` into a run of `timeout`: the backoff,
/// shortened to end at the deadline; `None` when the deadline has passed (give up).
pub fn next_wait(attempt: u32, elapsed: Duration, timeout: Duration) -> Option<Duration> {
    let left = timeout.checked_sub(elapsed).filter(|d| !d.is_zero())?;
    Some(backoff(attempt).min(left))
}

/// The budget of one step (a DNS lookup, a connect, reading the banner): [`MAX_DELAY`] or what is
/// left of the run, whichever is shorter, so that no step outlives the deadline by much and a
/// black-holed address cannot eat the whole timeout in one try.
pub fn step_budget(elapsed: Duration, timeout: Duration) -> Duration {
    timeout
        .saturating_sub(elapsed)
        .min(MAX_DELAY)
        .max(Duration::from_millis(50))
}

/// A duration as the messages say it: whole seconds as `300 s`, else one decimal, `0.2 s`.
pub fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let waits: Vec<Duration> = (0..7).map(backoff).collect();
        assert_eq!(
            waits,
            vec![
                MS(200),
                MS(400),
                MS(800),
                MS(1600),
                MS(3200),
                MS(5000),
                MS(5000)
            ]
        );
        assert_eq!(backoff(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn the_last_wait_ends_at_the_deadline() {
        let timeout = Duration::from_secs(300);
        assert_eq!(next_wait(0, Duration::ZERO, timeout), Some(MS(200)));
        assert_eq!(
            next_wait(9, Duration::from_secs(100), timeout),
            Some(MS(5000))
        );
        assert_eq!(next_wait(9, MS(298_500), timeout), Some(MS(1500)));
        assert_eq!(next_wait(9, timeout, timeout), None);
        assert_eq!(next_wait(0, Duration::from_secs(301), timeout), None);
    }

    #[test]
    fn a_step_never_outlives_the_run_by_much() {
        let timeout = Duration::from_secs(10);
        assert_eq!(step_budget(Duration::ZERO, timeout), MS(5000));
        assert_eq!(step_budget(MS(8000), timeout), MS(2000));
        assert_eq!(step_budget(MS(9990), timeout), MS(50));
        assert_eq!(step_budget(MS(12_000), timeout), MS(50));
    }

    #[test]
    fn seconds_read_as_the_messages_say_them() {
        assert_eq!(seconds(Duration::from_secs(300)), "300 s");
        assert_eq!(seconds(MS(5000)), "5 s");
        assert_eq!(seconds(MS(230)), "0.2 s");
        assert_eq!(seconds(MS(1260)), "1.3 s");
        assert_eq!(seconds(Duration::ZERO), "0 s");
    }
}
