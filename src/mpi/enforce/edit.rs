//! The edits the JobSet mutation is made of, on a `serde_json::Value` copy of the JobSet: an
//! [`Obj`] is a JSON object of the copy with its field path, so that a value of the wrong JSON
//! type where the policy must write becomes a [`MutationError`] naming that field, and never a
//! value silently overwritten.

use serde_json::{Map, Value};

use super::MutationError;

/// A JSON object of the edited copy and where it is, dotted as Kubernetes writes field paths
/// (`spec.replicatedJobs[1].template`).
pub struct Obj<'v> {
    /// The object.
    pub map: &'v mut Map<String, Value>,
    /// Its field path.
    pub field: String,
}

impl<'v> Obj<'v> {
    /// `value` at `field` as an object.
    ///
    /// # Errors
    /// [`MutationError`] when `value` is not an object.
    pub fn new(value: &'v mut Value, field: String) -> Result<Self, MutationError> {
        match value {
            Value::Object(map) => Ok(Self { map, field }),
            other => Err(wrong_type(field, other, "an object")),
        }
    }

    /// The path of member `key`.
    pub fn at(&self, key: &str) -> String {
        at(&self.field, key)
    }

    /// Member `key`, `None` when absent or `null`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The object at the path of member names `keys`, each made an empty object when absent or
    /// `null`: only on the way to a write, since the empty object is itself a change.
    ///
    /// # Errors
    /// [`MutationError`] at the first member that holds another JSON type.
    pub fn path(&mut self, keys: &[&str]) -> Result<Obj<'_>, MutationError> {
        let mut obj = Obj {
            map: &mut *self.map,
            field: self.field.clone(),
        };
        for key in keys {
            let field = obj.at(key);
            let slot = obj.map.entry(*key).or_insert(Value::Null);
            if slot.is_null() {
                *slot = Value::Object(Map::new());
            }
            obj = Obj::new(slot, field)?;
        }
        Ok(obj)
    }

    /// The array at member `key`, `None` when absent or `null` (nothing made: for reading, or
    /// for edits that only change entries already there).
    ///
    /// # Errors
    /// [`MutationError`] when the member holds another JSON type.
    pub fn existing_list(&mut self, key: &str) -> Result<Option<&mut Vec<Value>>, MutationError> {
        match self.map.get_mut(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(list)) => Ok(Some(list)),
            Some(other) => Err(wrong_type(at(&self.field, key), other, "an array")),
        }
    }

    /// The array at member `key`, made an empty one when absent or `null`.
    ///
    /// # Errors
    /// [`MutationError`] when the member holds another JSON type.
    pub fn list(&mut self, key: &str) -> Result<&mut Vec<Value>, MutationError> {
        let slot = self.map.entry(key).or_insert(Value::Null);
        if slot.is_null() {
            *slot = Value::Array(Vec::new());
        }
        match slot {
            Value::Array(list) => Ok(list),
            // The path is written only for the error.
            other => Err(wrong_type(at(&self.field, key), other, "an array")),
        }
    }

    /// Upserts `item` into the list at member `key`, matching entries on their member `by`: an
    /// equal entry stays, a different one is replaced where it is, a missing one is appended.
    ///
    /// # Errors
    /// [`MutationError`] when the member holds something other than an array.
    pub fn upsert(&mut self, key: &str, by: &str, item: &Value) -> Result<(), MutationError> {
        upsert(self.list(key)?, by, item);
        Ok(())
    }

    /// Appends `item` to the list at member `key` unless an entry there has the same member
    /// `by`: a default entry, which never replaces the user's (env vars the user may set).
    ///
    /// # Errors
    /// [`MutationError`] when the member holds something other than an array.
    pub fn add_missing(&mut self, key: &str, by: &str, item: &Value) -> Result<(), MutationError> {
        let list = self.list(key)?;
        let key = item.get(by);
        if !list.iter().any(|entry| entry.get(by) == key) {
            list.push(item.clone());
        }
        Ok(())
    }

    /// Sets member `key` to `value`, whatever it held: for the fields the policy owns.
    pub fn set(&mut self, key: &str, value: Value) {
        self.map.insert(key.to_owned(), value);
    }

    /// Sets member `key` to `value` when it is absent or `null`: a default, which never
    /// replaces what the user wrote.
    pub fn fill(&mut self, key: &str, value: &Value) {
        if self.get(key).is_none() {
            self.set(key, value.clone());
        }
    }
}

/// The path of member `key` of the object at `field`.
fn at(field: &str, key: &str) -> String {
    if field.is_empty() {
        key.to_owned()
    } else {
        format!("{field}.{key}")
    }
}

/// `item` in `list`: in place of the entry whose member `by` is the same, else at the end.
pub fn upsert(list: &mut Vec<Value>, by: &str, item: &Value) {
    let key = item.get(by);
    match list.iter_mut().find(|entry| entry.get(by) == key) {
        Some(entry) if entry == item => {}
        Some(entry) => *entry = item.clone(),
        None => list.push(item.clone()),
    }
}

/// Whether `list` has an entry whose `name` is `name`.
pub fn names(list: &[Value], name: &str) -> bool {
    list.iter()
        .any(|entry| entry.get("name").and_then(Value::as_str) == Some(name))
}

/// A JSON type's name as Go writes it in a field error, quoted: `"array"`.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "\"null\"",
        Value::Bool(_) => "\"boolean\"",
        Value::Number(_) => "\"number\"",
        Value::String(_) => "\"string\"",
        Value::Array(_) => "\"array\"",
        Value::Object(_) => "\"object\"",
    }
}

/// The error for `found` at `field` where `expected` belongs.
pub fn wrong_type(field: String, found: &Value, expected: &'static str) -> MutationError {
    MutationError {
        field,
        found: json_type(found),
        expected,
    }
}
