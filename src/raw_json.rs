//! An object as its client sent it, for the values error messages quote (Decision 9: a denial
//! shows the client's own JSON, not a re-serialized typed struct). The review is read once into
//! a `serde_json::Value`; the rules read their typed views from it and quote it through this.

use serde_json::Value;

/// The client's JSON of one object.
#[derive(Debug, Clone, Copy)]
pub struct RawJson<'a> {
    value: &'a Value,
}

impl<'a> RawJson<'a> {
    /// The whole document.
    pub fn value(&self) -> &'a Value {
        self.value
    }

    /// The JSON at a `/`-separated pointer (RFC 6901), or `null` when absent.
    pub fn at(&self, pointer: &str) -> Value {
        self.value.pointer(pointer).cloned().unwrap_or(Value::Null)
    }
}

impl<'a> From<&'a Value> for RawJson<'a> {
    fn from(value: &'a Value) -> Self {
        Self { value }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_read_the_value() {
        let value = serde_json::json!({"spec": {"runtimeRef": {"name": "x"}}});
        let json = RawJson::from(&value);
        assert_eq!(json.at("/spec/runtimeRef/name"), Value::from("x"));
        assert_eq!(json.at("/spec/missing"), Value::Null);
    }
}
