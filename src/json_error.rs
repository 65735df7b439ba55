//! The one "explain where the JSON is wrong" helper: JSON (a value, or the text of a review)
//! read as a typed view, and on failure the path of the field at fault with serde's message, as
//! the review reader (`admission`) and the objects dir loader (`objects::dir`) report it.

use serde::Deserialize;
use serde_json::Value;

/// A JSON value that does not read as the type asked for: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct Unreadable {
    /// The dotted path of the field at fault (`spec.trainer.numNodes`), `None` for the value as
    /// a whole (its JSON type, a missing required member).
    pub field: Option<String>,
    /// serde's message: `invalid type: string "3", expected i32`.
    pub message: String,
}

impl Unreadable {
    /// The same error for a value that sits at `root` of a larger document, whose own fields
    /// are members of `prefix`: the value as a whole is named `root`, a field `prefix.field`.
    #[must_use]
    pub fn within(self, root: &str, prefix: &str) -> Self {
        let field = match self.field {
            None => root.to_owned(),
            Some(field) => format!("{prefix}{field}"),
        };
        Self {
            field: Some(field),
            message: self.message,
        }
    }
}

/// Reads `value` as `T`, borrowing from it where `T` does.
///
/// # Errors
/// [`Unreadable`] naming the field at fault.
pub fn read<'de, T: Deserialize<'de>>(value: &'de Value) -> Result<T, Unreadable> {
    // Tracking the path costs an allocation per field visited, and only the error message needs
    // it: the plain read runs first, the tracked one only to explain a failure.
    T::deserialize(value).or_else(|_| {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            Unreadable {
                field: (path != ".").then_some(path),
                message: e.into_inner().to_string(),
            }
        })
    })
}

/// Why JSON text does not read as the type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Not JSON to serde_json: its whole message, with the line and column. Within a value
    /// that parses, serde_json says so too for a struct read from an array with more elements
    /// than the struct has fields, and for `null` where an enum belongs.
    #[error("{0}")]
    Syntax(String),
    /// JSON, of the wrong shape.
    #[error(transparent)]
    Unreadable(Unreadable),
}

/// Reads JSON text as `T`, borrowing from it where `T` does.
///
/// # Errors
/// [`TextError`]: the text is not JSON, or which field is of the wrong shape.
pub fn read_text<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, TextError> {
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let (path, error) = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => match deserializer.end() {
            Ok(()) => return Ok(value),
            Err(error) => (".".to_owned(), error),
        },
        Err(error) => (error.path().to_string(), error.into_inner()),
    };
    let full = error.to_string();
    if error.is_syntax() || error.is_eof() {
        return Err(TextError::Syntax(full));
    }
    // A review is one line: the position says nothing the path does not.
    let position = format!(" at line {} column {}", error.line(), error.column());
    Err(TextError::Unreadable(Unreadable {
        field: (path != ".").then_some(path),
        message: full.strip_suffix(&position).unwrap_or(&full).to_owned(),
    }))
}

/// A JSON type's name as Go writes it in a field error: `array`.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    struct Spec {
        #[allow(dead_code)]
        replicas: i32,
    }

    #[derive(Debug, Deserialize)]
    struct Thing {
        #[allow(dead_code)]
        spec: Spec,
    }

    #[test]
    fn the_field_at_fault_is_named() {
        let error = read::<Thing>(&json!({"spec": {"replicas": "2"}})).expect_err("a string");
        assert_eq!(
            error.to_string(),
            r#"spec.replicas: invalid type: string "2", expected i32"#
        );
        let error = read::<Thing>(&json!({})).expect_err("no spec");
        assert_eq!(error.to_string(), "missing field `spec`");
        assert_eq!(
            error.within("request.object", "").to_string(),
            "request.object: missing field `spec`"
        );
        let error = read::<Spec>(&json!({"replicas": true})).expect_err("a boolean");
        assert_eq!(
            error.within("metadata", "metadata.").to_string(),
            "metadata.replicas: invalid type: boolean `true`, expected i32"
        );
    }
}
