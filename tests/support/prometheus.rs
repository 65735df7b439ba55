//! Reading the reconciler's `/metrics` (Prometheus' text format), for `tests/envtest` and
//! `benches/scale.rs`.

/// The sum of every sample of `name` (with or without labels) in `text`.
pub fn sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
