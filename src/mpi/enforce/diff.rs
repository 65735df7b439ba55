//! The patch from the JobSet to its wired copy: `json_patch::diff`'s operations, in its order,
//! with the same paths and values (`tests` checks the two agree), made without what the
//! library's general diff costs and no output needs: it looks each member up by hashing where
//! the copy keeps the original's order, grows and shrinks a pointer token by token (a string
//! allocated per member visited), and clones every value it adds, which the copy, dropped
//! right after, can give up instead.

use std::fmt::Write as _;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::{Map, Value};

/// The operations that turn `left` into `right`, at paths under `prefix` (a JSON pointer,
/// `""` for the root), as `json_patch::diff(left, right)` makes them. The values the
/// operations carry are taken out of `right`, which is left with `null`s in their place.
pub fn diff(left: &Value, right: &mut Value, prefix: &str) -> Patch {
    let mut patch = Patch::default();
    let mut path = prefix.to_owned();
    value(left, right, &mut path, &mut patch);
    patch
}

fn value(left: &Value, right: &mut Value, path: &mut String, patch: &mut Patch) {
    match (left, right) {
        (Value::Object(left), Value::Object(right)) => object(left, right, path, patch),
        (Value::Array(left), Value::Array(right)) => array(left, right, path, patch),
        (left, right) if left == right => {}
        (_, right) => patch.0.push(PatchOperation::Replace(ReplaceOperation {
            path: pointer(path),
            value: std::mem::take(right),
        })),
    }
}

fn object(
    left: &Map<String, Value>,
    right: &mut Map<String, Value>,
    path: &mut String,
    patch: &mut Patch,
) {
    // The copy keeps the original's members in their order (new ones come last): each is
    // found by walking the original alongside, and looked up only when that fails.
    let mut in_order = left.iter();
    let mut found_in_order = 0;
    for (key, right_value) in right.iter_mut() {
        let len = path.len();
        push_key(path, key);
        let left_value = match in_order.clone().next() {
            Some((left_key, left_value)) if left_key == key => {
                in_order.next();
                found_in_order += 1;
                Some(left_value)
            }
            _ => left.get(key),
        };
        match left_value {
            Some(left_value) => value(left_value, right_value, path, patch),
            None => patch.0.push(PatchOperation::Add(AddOperation {
                path: pointer(path),
                value: std::mem::take(right_value),
            })),
        }
        path.truncate(len);
    }
    // Every member of the original was found in order: none is gone.
    if found_in_order == left.len() {
        return;
    }
    for key in left.keys() {
        if !right.contains_key(key) {
            let len = path.len();
            push_key(path, key);
            patch.0.push(PatchOperation::Remove(RemoveOperation {
                path: pointer(path),
            }));
            path.truncate(len);
        }
    }
}

fn array(left: &[Value], right: &mut [Value], path: &mut String, patch: &mut Patch) {
    let mut right = right.iter_mut();
    // As `json_patch::diff`: an element past the copy's end is removed at the index the one
    // before it left.
    let mut shift = 0;
    for index in 0..left.len().max(right.len()) {
        let len = path.len();
        // Writing into a `String` cannot fail.
        let _ = write!(path, "/{}", index - shift);
        match (left.get(index), right.next()) {
            (Some(left), Some(right)) => value(left, right, path, patch),
            (Some(_), None) => {
                shift += 1;
                patch.0.push(PatchOperation::Remove(RemoveOperation {
                    path: pointer(path),
                }));
            }
            (None, Some(right)) => patch.0.push(PatchOperation::Add(AddOperation {
                path: pointer(path),
                value: std::mem::take(right),
            })),
            (None, None) => {}
        }
        path.truncate(len);
    }
}

/// Appends `key` to `path` as a reference token (RFC 6901: `~` as `~0`, `/` as `~1`).
fn push_key(path: &mut String, key: &str) {
    path.push('/');
    if key.contains(['~', '/']) {
        path.push_str(&key.replace('~', "~0").replace('/', "~1"));
    } else {
        path.push_str(key);
    }
}

/// `path` as a pointer: made of encoded tokens only, so it always parses.
fn pointer(path: &str) -> PointerBuf {
    PointerBuf::parse(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Both diffs of `left` and `right`, as JSON.
    fn both(left: Value, right: Value) -> (Value, Value) {
        let library = json_patch::diff(&left, &right);
        let mut copy = right.clone();
        let ours = diff(&left, &mut copy, "");
        (json!(library), json!(ours))
    }

    #[test]
    fn the_operations_are_json_patch_diffs() {
        let cases = [
            (json!({"a": 1}), json!({"a": 1})),
            (
                json!({"a": 1, "b": [1, 2]}),
                json!({"a": 2, "b": [1, 2, 3], "c": {"d": "/~"}}),
            ),
            (json!({"a/b": {"c~d": 1}}), json!({"a/b": {"c~d": 2}})),
            (json!({"a": 1, "b": 2, "c": 3}), json!({"c": 3, "a": 1})),
            (json!({"a": 1, "b": 2}), json!({"b": 3, "a": 1, "e": null})),
            (json!([1, 2, 3, 4]), json!([1])),
            (
                json!([{"n": 1}, {"n": 2}]),
                json!([{"n": 0}, {"n": 1}, {"n": 2}]),
            ),
            (json!({"x": [1]}), json!({"x": {"y": 1}})),
            (json!(null), json!({"x": 1})),
            (json!({"x": null}), json!({"x": []})),
        ];
        for (left, right) in cases {
            let (library, ours) = both(left.clone(), right.clone());
            assert_eq!(ours, library, "{left} -> {right}");
        }
    }

    #[test]
    fn the_prefix_leads_every_path() {
        let mut right = json!({"a": [1, 2]});
        let patch = diff(&json!({"a": [1]}), &mut right, "/spec");
        assert_eq!(
            json!(patch),
            json!([{"op": "add", "path": "/spec/a/1", "value": 2}])
        );
        assert_eq!(right, json!({"a": [1, null]}));
    }
}
