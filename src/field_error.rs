//! Kubernetes-style field errors (`k8s.io/apimachinery/pkg/util/validation/field`), rendered byte for
//! byte as the Go webhook renders them, because clients match on these texts (spec Decision 1).
//!
//! Pure: no I/O.

use std::fmt;

use serde_json::Value;

/// The value shown after `Invalid value:` / `Unsupported value:`.
#[derive(Clone, Debug, PartialEq)]
pub enum BadValue {
    /// Printed bare (`2`), as Go prints integers.
    Int(i64),
    /// Printed Go-quoted (`"object"`), as Go's `%q`.
    Str(String),
    /// Printed as compact JSON with Go's HTML escaping (`<` as `\u003c`, ...). Keep the request's
    /// own JSON here (not a re-serialized struct) so the key order is the client's (Decision 9).
    Json(Value),
}

/// What kind of problem a [`FieldError`] reports (the subset of `field.ErrorType` we emit).
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorKind {
    /// `field.Invalid`
    Invalid(BadValue),
    /// `field.NotSupported`, with the supported values in the order given.
    Unsupported(BadValue, Vec<&'static str>),
    /// `field.Required`: the field is missing; no value is shown.
    Required,
}

/// One field error: `<field>: <type>: <value>: <detail>`.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// Dotted field path, e.g. `spec.trainer.numNodes`.
    pub field: String,
    /// The error type and the offending value.
    pub kind: ErrorKind,
    /// Human-readable reason (may be empty).
    pub detail: String,
}

impl FieldError {
    /// `field.Invalid(path, value, detail)`.
    pub fn invalid(field: impl Into<String>, value: BadValue, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: ErrorKind::Invalid(value),
            detail: detail.into(),
        }
    }

    /// `field.Required(path, detail)`.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: ErrorKind::Required,
            detail: detail.into(),
        }
    }

    /// `field.NotSupported(path, value, supported)`.
    pub fn unsupported(
        field: impl Into<String>,
        value: BadValue,
        supported: &[&'static str],
    ) -> Self {
        let detail = format!(
            "supported values: {}",
            supported
                .iter()
                .map(|s| go_quote(s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Self {
            field: field.into(),
            kind: ErrorKind::Unsupported(value, supported.to_vec()),
            detail,
        }
    }
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadValue::Int(n) => write!(f, "{n}"),
            BadValue::Str(s) => f.write_str(&go_quote(s)),
            BadValue::Json(v) => f.write_str(&go_json(v)),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Invalid(v) => write!(f, "{}: Invalid value: {v}", self.field)?,
            ErrorKind::Unsupported(v, _) => write!(f, "{}: Unsupported value: {v}", self.field)?,
            ErrorKind::Required => write!(f, "{}: Required value", self.field)?,
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Renders an error list the way `field.ErrorList.ToAggregate().Error()` does: duplicates removed
/// (first occurrence kept), one error alone, several as `[e1, e2]`. `None` for an empty list.
pub fn aggregate(errors: &[FieldError]) -> Option<String> {
    let mut texts: Vec<String> = Vec::with_capacity(errors.len());
    for text in errors.iter().map(ToString::to_string) {
        if !texts.contains(&text) {
            texts.push(text);
        }
    }
    match texts.len() {
        0 => None,
        1 => texts.pop(),
        _ => Some(format!("[{}]", texts.join(", "))),
    }
}

/// Compact JSON as Go's `encoding/json` writes it: `<`, `>`, `&`, U+2028 and U+2029 escaped.
/// The replacement is safe on serialized JSON because those characters can only occur inside
/// string literals there.
pub fn go_json(value: &Value) -> String {
    let compact = value.to_string();
    let mut out = String::with_capacity(compact.len());
    for c in compact.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A string quoted as Go's `%q` / `strconv.Quote` does: printable characters kept, `"` and `\`
/// escaped, control characters as `\n`-style or `\xNN` / `\uNNNN` escapes.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() || c == '\u{feff}' => {
                let n = c as u32;
                if n > 0xffff {
                    out.push_str(&format!("\\U{n:08x}"));
                } else {
                    out.push_str(&format!("\\u{n:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn invalid_int_prints_bare() {
        let e = FieldError::invalid("spec.trainer.numNodes", BadValue::Int(2), "must be 1");
        assert_eq!(
            e.to_string(),
            "spec.trainer.numNodes: Invalid value: 2: must be 1"
        );
    }

    #[test]
    fn invalid_string_is_go_quoted() {
        let e = FieldError::invalid("spec.mlPolicy", BadValue::Str("object".into()), "only one");
        assert_eq!(
            e.to_string(),
            r#"spec.mlPolicy: Invalid value: "object": only one"#
        );
    }

    #[test]
    fn unsupported_lists_quoted_values() {
        let e = FieldError::unsupported("f", BadValue::Str(String::new()), &["OpenMPI", "Intel"]);
        assert_eq!(
            e.to_string(),
            r#"f: Unsupported value: "": supported values: "OpenMPI", "Intel""#
        );
    }

    #[test]
    fn required_shows_no_value() {
        let e = FieldError::required("spec.replicatedJobs", "needs a launcher");
        assert_eq!(
            e.to_string(),
            "spec.replicatedJobs: Required value: needs a launcher"
        );
    }

    #[test]
    fn json_value_escapes_html_like_go() {
        let v = json!([{"name": "A", "value": "<b>&"}]);
        assert_eq!(
            go_json(&v),
            r#"[{"name":"A","value":"\u003cb\u003e\u0026"}]"#
        );
    }

    #[test]
    fn go_quote_escapes_controls() {
        assert_eq!(go_quote("a\"b\\\n\u{1}é"), r#""a\"b\\\n\x01é""#);
    }

    #[test]
    fn aggregate_dedups_and_brackets() {
        let a = FieldError::invalid("a", BadValue::Int(1), "x");
        let b = FieldError::invalid("b", BadValue::Int(2), "y");
        assert_eq!(aggregate(&[]), None);
        assert_eq!(
            aggregate(std::slice::from_ref(&a)).as_deref(),
            Some("a: Invalid value: 1: x")
        );
        assert_eq!(
            aggregate(&[a.clone(), b, a]).as_deref(),
            Some("[a: Invalid value: 1: x, b: Invalid value: 2: y]")
        );
    }
}
