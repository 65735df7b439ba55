//! Reading a server-side apply conflict: which field managers hold which fields. Pure.
//!
//! The API server answers an apply without `force` that would change a field another manager
//! owns with 409 `reason: Conflict` and one `details.causes[]` entry per conflicting field
//! (k8s.io/apimachinery `pkg/util/managedfields/internal/conflict.go`, `NewConflictError`, and
//! `pkg/api/errors` `NewApplyConflict`):
//!
//! ```json
//! {"kind": "Status", "status": "Failure", "code": 409, "reason": "Conflict",
//!  "message": "Apply failed with 1 conflict: conflict with \"trainer\": .data.hostfile",
//!  "details": {"causes": [{"reason": "FieldManagerConflict",
//!                          "message": "conflict with \"trainer\"", "field": ".data.hostfile"}]}}
//! ```
//!
//! The manager is Go-quoted (`%q`). An applier is printed by name alone; a manager that wrote with
//! an update (`kubectl edit`, a controller's PUT) is followed by ` using <apiVersion>`, and one that
//! wrote through a subresource by ` with subresource "<name>"` (`printManager`).

use kube::core::Status;

/// The `details.causes[].reason` of an apply conflict (`metav1.CauseTypeFieldManagerConflict`).
pub const FIELD_MANAGER_CONFLICT: &str = "FieldManagerConflict";

/// One field another manager holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldConflict {
    /// The other field manager's name, unquoted.
    pub manager: String,
    /// The field path as the API server prints it, e.g. `.data.hostfile`.
    pub field: String,
}

/// The fields of a 409 apply conflict, or `None` when `status` is not one (another 409, or a
/// conflict whose causes name no manager we can read).
pub fn apply_conflicts(status: &Status) -> Option<Vec<FieldConflict>> {
    if status.code != 409 || status.reason != "Conflict" {
        return None;
    }
    let conflicts: Vec<FieldConflict> = status
        .details
        .iter()
        .flat_map(|details| &details.causes)
        .filter(|cause| cause.reason == FIELD_MANAGER_CONFLICT)
        .map(|cause| {
            Some(FieldConflict {
                manager: manager_of(&cause.message)?,
                field: cause.field.clone(),
            })
        })
        .collect::<Option<_>>()?;
    (!conflicts.is_empty()).then_some(conflicts)
}

/// The manager named by a cause message `conflict with "<manager>"[ …]`.
fn manager_of(message: &str) -> Option<String> {
    unquote(message.strip_prefix("conflict with ")?)
}

/// The leading Go `%q` string of `text`, unescaped (the escapes `%q` writes for printable ASCII
/// and the common control characters; anything else is refused).
fn unquote(text: &str) -> Option<String> {
    let mut chars = text.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => out.push(match chars.next()? {
                '"' => '"',
                '\\' => '\\',
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                _ => return None,
            }),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    fn status(value: serde_json::Value) -> Status {
        serde_json::from_value(value).expect("Status")
    }

    fn conflict(causes: serde_json::Value) -> Status {
        status(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": "Apply failed", "reason": "Conflict", "code": 409,
                      "details": {"causes": causes}}),
        )
    }

    fn field(manager: &str, field: &str) -> FieldConflict {
        FieldConflict {
            manager: manager.into(),
            field: field.into(),
        }
    }

    #[test]
    fn an_applier_an_updater_and_a_subresource_writer_are_named() {
        let status = conflict(json!([
            {"reason": "FieldManagerConflict", "message": "conflict with \"trainer\"",
             "field": ".data.hostfile"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl-edit\" using v1",
             "field": ".data.hostfile"},
            {"reason": "FieldManagerConflict",
             "message": "conflict with \"a \\\"b\\\"\" with subresource \"status\" using v1 at 2026-12-03T12:00:00Z",
             "field": ".metadata.labels.x"}
        ]));
        assert_eq!(
            apply_conflicts(&status),
            Some(vec![
                field("trainer", ".data.hostfile"),
                field("kubectl-edit", ".data.hostfile"),
                field("a \"b\"", ".metadata.labels.x"),
            ])
        );
    }

    #[test]
    fn other_conflicts_are_not_apply_conflicts() {
        let already_exists = status(json!({"status": "Failure", "message": "x",
                                           "reason": "AlreadyExists", "code": 409}));
        assert_eq!(apply_conflicts(&already_exists), None);
        let optimistic = status(
            json!({"status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on configmaps \"x\": the object has been modified",
            "details": {"name": "x", "kind": "configmaps"}}),
        );
        assert_eq!(apply_conflicts(&optimistic), None);
        let unreadable = conflict(json!([
            {"reason": "FieldManagerConflict", "message": "conflict with trainer", "field": ".data"}
        ]));
        assert_eq!(apply_conflicts(&unreadable), None);
    }
}
