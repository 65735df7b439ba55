//! Container resources and the quantity arithmetic the GPU count needs.
//!
//! Own types instead of k8s-openapi's: YAML files written by hand carry quantities as numbers
//! (`nvidia.com/gpu: 4`), which the API server accepts and k8s-openapi's string-only `Quantity`
//! would reject.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `resources` of a container: requests and limits by resource name.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ResourceRequirements {
    /// Resource limits.
    #[serde(default)]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Resource requests.
    #[serde(default)]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// A resource quantity as written (`"4"`, `4`, `"500m"`, `"1Ki"`, `"1e3"`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Quantity {
    /// The canonical string form.
    Text(String),
    /// A bare number, as YAML authors write it.
    Number(serde_json::Number),
}

impl Quantity {
    /// The quantity as a whole number, rounded up like Go's `resource.Quantity.Value()`.
    /// Saturates at `i64::MAX`; `None` when the text is not a quantity.
    pub fn ceil_value(&self) -> Option<i64> {
        match self {
            Quantity::Text(s) => parse_ceil(s.trim()),
            Quantity::Number(n) => parse_ceil(&n.to_string()),
        }
    }
}

/// Parses `<sign><digits>[.<digits>][suffix]` and rounds up to an integer.
fn parse_ceil(s: &str) -> Option<i64> {
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    // value = mantissa * base^exp10_or_2 / 10^frac_len
    let (base, exponent): (u32, i32) = match suffix {
        "" => (10, 0),
        "n" => (10, -9),
        "u" => (10, -6),
        "m" => (10, -3),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        e if e.starts_with(['e', 'E']) => (10, e[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    // Work in u128 with saturation; quantities beyond i64 saturate.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Some(if negative { i64::MIN } else { i64::MAX });
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let frac_len = i32::try_from(frac_part.len()).ok()?;
    let (mut numerator, mut denominator) = (mantissa, 1u128);
    let scale_by = |value: u128, factor: u128, times: u32| -> u128 {
        (0..times).fold(value, |acc, _| acc.saturating_mul(factor))
    };
    if base == 10 {
        let exp10 = exponent - frac_len;
        if exp10 >= 0 {
            numerator = scale_by(numerator, 10, exp10.unsigned_abs().min(40));
        } else {
            denominator = scale_by(denominator, 10, exp10.unsigned_abs().min(40));
        }
    } else {
        numerator = scale_by(numerator, 2, exponent.unsigned_abs());
        denominator = scale_by(denominator, 10, frac_len.unsigned_abs().min(40));
    }
    let whole = numerator / denominator + u128::from(numerator % denominator != 0);
    let whole = i64::try_from(whole).unwrap_or(i64::MAX);
    Some(if negative { -whole } else { whole })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Option<i64> {
        Quantity::Text(s.to_string()).ceil_value()
    }

    #[test]
    fn plain_and_suffixed_quantities_round_up() {
        assert_eq!(q("4"), Some(4));
        assert_eq!(q("0"), Some(0));
        assert_eq!(q("500m"), Some(1));
        assert_eq!(q("1.5"), Some(2));
        assert_eq!(q("2k"), Some(2000));
        assert_eq!(q("1Ki"), Some(1024));
        assert_eq!(q("1e3"), Some(1000));
        assert_eq!(q("0.5Ki"), Some(512));
        assert_eq!(q("-2"), Some(-2));
    }

    #[test]
    fn garbage_is_none_and_huge_saturates() {
        assert_eq!(q("four"), None);
        assert_eq!(q(""), None);
        assert_eq!(q("1Zi"), None);
        assert_eq!(q("99999999999999999999999E"), Some(i64::MAX));
        assert_eq!(q("1e999999"), Some(i64::MAX));
    }

    #[test]
    fn numbers_from_yaml_are_accepted() {
        let r: ResourceRequirements =
            serde_json::from_value(serde_json::json!({"limits": {"nvidia.com/gpu": 4}}))
                .expect("parses");
        let limits = r.limits.expect("limits");
        assert_eq!(limits["nvidia.com/gpu"].ceil_value(), Some(4));
    }
}
