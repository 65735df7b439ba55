//! An object as its client sent it, for the values error messages quote (Decision 9: a denial
//! shows the client's own JSON, not a re-serialized typed struct).
//!
//! `serve` reads an object straight from the review's bytes into typed structs; building a
//! `serde_json::Value` of it as well would cost more than the whole validation. Only a denial
//! needs one, so [`RawJson`] parses the text the first time an error asks for a value.

use std::sync::OnceLock;

use serde_json::Value;
use serde_json::value::RawValue;

/// The client's JSON of one object: raw text parsed on first use, or an already parsed value.
#[derive(Debug)]
pub struct RawJson<'a> {
    text: Option<&'a str>,
    parsed: OnceLock<Value>,
    value: Option<&'a Value>,
}

impl<'a> RawJson<'a> {
    /// Raw JSON text, parsed only if a value is asked for.
    pub fn text(raw: &'a RawValue) -> Self {
        Self {
            text: Some(raw.get()),
            parsed: OnceLock::new(),
            value: None,
        }
    }

    /// The whole document as a `Value`. A [`RawValue`] is valid JSON, so parsing it cannot fail
    /// (were it to, the document would read as `null`).
    pub fn value(&self) -> &Value {
        if let Some(value) = self.value {
            return value;
        }
        self.parsed.get_or_init(|| {
            self.text
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or(Value::Null)
        })
    }

    /// The JSON at a `/`-separated pointer (RFC 6901), or `null` when absent.
    pub fn at(&self, pointer: &str) -> Value {
        self.value()
            .pointer(pointer)
            .cloned()
            .unwrap_or(Value::Null)
    }
}

impl<'a> From<&'a Value> for RawJson<'a> {
    fn from(value: &'a Value) -> Self {
        Self {
            text: None,
            parsed: OnceLock::new(),
            value: Some(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_parsed_on_demand_and_pointers_read_it() {
        let raw: Box<RawValue> =
            serde_json::from_str(r#"{"spec":{"env":[{"name":"A"}]}}"#).expect("valid JSON");
        let json = RawJson::text(&raw);
        assert!(
            json.parsed.get().is_none(),
            "nothing parsed before it is asked for"
        );
        assert_eq!(json.at("/spec/env/0/name"), Value::from("A"));
        assert_eq!(json.at("/spec/missing"), Value::Null);
    }

    #[test]
    fn a_parsed_value_is_read_as_is() {
        let value = serde_json::json!({"spec": {"runtimeRef": {"name": "x"}}});
        let json = RawJson::from(&value);
        assert_eq!(json.at("/spec/runtimeRef/name"), Value::from("x"));
    }
}
