//! Field ownership as the API server keeps it (`metadata.managedFields`), and server-side apply
//! with its conflicts, for plain JSON objects. Pure functions over `serde_json::Value`.
//!
//! Modelled on kubernetes-sigs/structured-merge-diff as the API server uses it
//! (k8s.io/apimachinery `pkg/util/managedfields`):
//! - a field set holds leaf paths: scalars, atomic lists and empty maps; maps and structs are
//!   granular (each key is its own field); lists named in [`list_keys`] are list-maps whose
//!   items are members too (`k:{"uid":"…"}`), every other list is atomic;
//! - `apiVersion`, `kind` and the identity metadata (name, namespace, uid, resourceVersion, …)
//!   are never owned (the strip-meta manager);
//! - an **apply** by manager M conflicts with another manager N on every field both M's applied
//!   configuration and N's set hold where the applied value differs from the live one; without
//!   `force` that is a 409, with it N loses those fields. Fields M owned before and no longer
//!   applies are removed from the object, unless another manager also owns them. M's set becomes
//!   exactly its applied configuration's fields;
//! - an **update** (create, PUT, merge patch) gives its manager the fields it changed and takes
//!   them away from every other manager;
//! - manager identities are `(manager, Apply)` for appliers and `(manager, Update, apiVersion)`
//!   for updaters (`BuildManagerIdentifier`), printed in conflicts as `"name"` and
//!   `"name" using v1` (`printManager`).
//!
//! Not modelled: schema defaults, `x-kubernetes-map-type: atomic`, set-lists (`v:`), positional
//! list items (`i:`), subresources, status reset.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    /// A map key or struct field.
    Field(String),
    /// A list-map item, by its key fields: `(name, JSON-encoded value)` in key order.
    Key(Vec<(String, String)>),
}

/// A field path from the object's root.
pub type Path = Vec<Element>;
/// A set of field paths.
pub type FieldSet = BTreeSet<Path>;

/// `Apply` or `Update`, as `managedFields[].operation` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Create, update, or a non-apply patch.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// A manager's identity: its name, operation and (for updaters only) apiVersion.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Manager {
    /// The field manager's name.
    pub name: String,
    /// How it wrote.
    pub operation: Operation,
    /// The apiVersion it wrote with; part of the identity of updaters only.
    pub api_version: String,
}

impl Manager {
    /// An applier.
    pub fn apply(name: &str, api_version: &str) -> Self {
        Self {
            name: name.into(),
            operation: Operation::Apply,
            api_version: api_version.into(),
        }
    }

    /// An updater.
    pub fn update(name: &str, api_version: &str) -> Self {
        Self {
            name: name.into(),
            operation: Operation::Update,
            api_version: api_version.into(),
        }
    }

    fn same_identity(&self, other: &Manager) -> bool {
        self.name == other.name
            && self.operation == other.operation
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    /// How the API server names this manager in a conflict (`printManager`).
    pub fn printed(&self) -> String {
        match self.operation {
            Operation::Apply => go_quote(&self.name),
            Operation::Update => format!("{} using {}", go_quote(&self.name), self.api_version),
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Who.
    pub manager: Manager,
    /// The fields it owns.
    pub fields: FieldSet,
    /// When it last changed its set (RFC 3339, seconds).
    pub time: String,
}

/// One field another manager holds with another value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// The other manager.
    pub manager: Manager,
    /// The field.
    pub path: Path,
}

/// List fields merged by key (list-maps), by the list's field name. Enough for ConfigMaps,
/// Secrets, Events and the pod templates of JobSets; extend here for more shapes.
pub fn list_keys(field: &str) -> Option<&'static [&'static str]> {
    match field {
        "ownerReferences" => Some(&["uid"]),
        "containers" | "initContainers" | "env" | "volumes" | "replicatedJobs" => Some(&["name"]),
        "volumeMounts" => Some(&["mountPath"]),
        _ => None,
    }
}

/// Fields nobody owns (the strip-meta manager).
fn stripped(path: &Path) -> bool {
    const META: &[&str] = &[
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "managedFields",
        "selfLink",
    ];
    match path.as_slice() {
        [Element::Field(f), ..] if f == "apiVersion" || f == "kind" => true,
        [Element::Field(m)] if m == "metadata" => true,
        [Element::Field(m), Element::Field(f), ..] if m == "metadata" => META.contains(&f.as_str()),
        _ => false,
    }
}

/// The fields `object` sets.
pub fn field_set(object: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    if let Value::Object(map) = object {
        walk_map(map, &mut Vec::new(), &mut set);
    }
    set.retain(|p| !stripped(p));
    set
}

fn walk_map(map: &Map<String, Value>, path: &mut Path, set: &mut FieldSet) {
    for (name, value) in map {
        path.push(Element::Field(name.clone()));
        match value {
            Value::Object(inner) if !inner.is_empty() => walk_map(inner, path, set),
            Value::Array(items) if list_keys(name).is_some_and(|k| keyed(items, k)) => {
                let keys = list_keys(name).unwrap_or_default();
                for item in items {
                    path.push(Element::Key(item_key(item, keys)));
                    set.insert(path.clone());
                    if let Value::Object(inner) = item {
                        walk_map(inner, path, set);
                    }
                    path.pop();
                }
            }
            _ => {
                set.insert(path.clone());
            }
        }
        path.pop();
    }
}

/// Whether every item is an object carrying every key field (else the list is atomic).
fn keyed(items: &[Value], keys: &[&str]) -> bool {
    items
        .iter()
        .all(|item| keys.iter().all(|k| item.get(*k).is_some()))
}

fn item_key(item: &Value, keys: &[&str]) -> Vec<(String, String)> {
    keys.iter()
        .map(|k| (k.to_string(), item[*k].to_string()))
        .collect()
}

fn matches_key(item: &Value, key: &[(String, String)]) -> bool {
    key.iter().all(|(k, v)| {
        let want = serde_json::from_str::<Value>(v).ok();
        item.get(k)
            .is_some_and(|value| Some(value) == want.as_ref())
    })
}

/// The value at `path`, if present.
pub fn get<'a>(object: &'a Value, path: &[Element]) -> Option<&'a Value> {
    path.iter()
        .try_fold(object, |value, element| match element {
            Element::Field(f) => value.get(f),
            Element::Key(key) => value.as_array()?.iter().find(|item| matches_key(item, key)),
        })
}

/// Sets the value at `path` in `object` to `value`'s at the same path (creating parents and
/// list-map items as needed).
fn set_from(object: &mut Value, path: &[Element], source: &Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut here = object;
    for element in parents {
        here = match element {
            Element::Field(f) => {
                if !here.is_object() {
                    *here = json!({});
                }
                let Value::Object(map) = here else { return };
                map.entry(f.clone()).or_insert_with(|| json!({}))
            }
            Element::Key(key) => match item_mut(here, key) {
                Some(item) => item,
                None => return,
            },
        };
    }
    match last {
        Element::Field(f) => {
            if !here.is_object() {
                *here = json!({});
            }
            if let (Value::Object(map), Some(value)) = (here, get(source, path)) {
                map.insert(f.clone(), value.clone());
            }
        }
        Element::Key(key) => {
            item_mut(here, key);
        }
    }
}

/// The list-map item with `key` in the list `here`, appended (with its key fields) if absent.
fn item_mut<'a>(here: &'a mut Value, key: &[(String, String)]) -> Option<&'a mut Value> {
    if !here.is_array() {
        *here = json!([]);
    }
    let items = here.as_array_mut()?;
    let index = match items.iter().position(|item| matches_key(item, key)) {
        Some(index) => index,
        None => {
            let mut item = Map::new();
            for (k, v) in key {
                item.insert(k.clone(), serde_json::from_str(v).unwrap_or(Value::Null));
            }
            items.push(Value::Object(item));
            items.len() - 1
        }
    };
    items.get_mut(index)
}

/// Removes the field or item at `path`, then every map or list left empty by that on the way up.
fn remove(object: &mut Value, path: &[Element]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(parent) = get_mut(object, parents) else {
        return;
    };
    match (last, parent) {
        (Element::Field(f), Value::Object(map)) => {
            map.remove(f);
        }
        (Element::Key(key), Value::Array(items)) => items.retain(|item| !matches_key(item, key)),
        _ => return,
    }
    let emptied = get(object, parents).is_some_and(|p| match p {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    });
    if emptied && !parents.is_empty() {
        remove(object, parents);
    }
}

fn get_mut<'a>(object: &'a mut Value, path: &[Element]) -> Option<&'a mut Value> {
    path.iter()
        .try_fold(object, |value, element| match element {
            Element::Field(f) => value.get_mut(f),
            Element::Key(key) => value
                .as_array_mut()?
                .iter_mut()
                .find(|item| matches_key(item, key)),
        })
}

fn is_item(path: &Path) -> bool {
    matches!(path.last(), Some(Element::Key(_)))
}

/// Whether `set` holds `path` or a field below it.
fn holds_at_or_below(set: &FieldSet, path: &Path) -> bool {
    set.iter().any(|p| p.starts_with(path))
}

/// Server-side apply of `applied` by `manager` to `live` (with its `entries`); `None` live
/// means the object does not exist yet. Returns the new object (without `managedFields`) and
/// entries, or the conflicts (sorted by manager, then path) when `force` is off.
///
/// # Errors
/// The conflicts, when there are some and `force` is off.
pub fn apply(
    live: Option<(&Value, &[Entry])>,
    applied: &Value,
    manager: &Manager,
    force: bool,
    now: &str,
) -> Result<(Value, Vec<Entry>), Vec<Conflict>> {
    let applied_set = field_set(applied);
    let (mut object, mut entries) = match live {
        Some((object, entries)) => (object.clone(), entries.to_vec()),
        None => (identity_of(applied), Vec::new()),
    };
    let mut conflicts: Vec<Conflict> = entries
        .iter()
        .filter(|e| !e.manager.same_identity(manager))
        .flat_map(|e| {
            e.fields
                .intersection(&applied_set)
                .filter(|p| !is_item(p) && get(&object, p) != get(applied, p))
                .map(|p| Conflict {
                    manager: e.manager.clone(),
                    path: p.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    conflicts.sort();
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for conflict in &conflicts {
        for entry in &mut entries {
            if entry.manager == conflict.manager {
                entry.fields.remove(&conflict.path);
            }
        }
    }
    let previous = entries
        .iter()
        .position(|e| e.manager.same_identity(manager))
        .map(|i| entries.remove(i));
    for path in &applied_set {
        set_from(&mut object, path, applied);
    }
    let others: FieldSet = entries.iter().flat_map(|e| e.fields.clone()).collect();
    let mut dropped: Vec<Path> = previous
        .as_ref()
        .map(|p| p.fields.difference(&applied_set).cloned().collect())
        .unwrap_or_default();
    // Deepest first, so an item's own fields go before the item.
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in dropped {
        if !holds_at_or_below(&others, &path) && !holds_at_or_below(&applied_set, &path) {
            remove(&mut object, &path);
        }
    }
    let time = match previous {
        Some(p) if p.fields == applied_set => p.time,
        _ => now.to_string(),
    };
    entries.push(Entry {
        manager: manager.clone(),
        fields: applied_set,
        time,
    });
    Ok((object.clone(), settle(entries, &object)))
}

/// The ownership after an update by `manager` from `old` (absent for a create) to `new`.
pub fn update(
    old: Option<(&Value, &[Entry])>,
    new: &Value,
    manager: &Manager,
    now: &str,
) -> Vec<Entry> {
    let new_set = field_set(new);
    let changed: FieldSet = match old {
        Some((old, _)) => {
            let old_set = field_set(old);
            new_set
                .iter()
                .filter(|p| !old_set.contains(*p) || (!is_item(p) && get(old, p) != get(new, p)))
                .cloned()
                .collect()
        }
        None => new_set.clone(),
    };
    let mut entries = old.map(|(_, e)| e.to_vec()).unwrap_or_default();
    let mut mine = match entries
        .iter()
        .position(|e| e.manager.same_identity(manager))
    {
        Some(i) => entries.remove(i),
        None => Entry {
            manager: manager.clone(),
            fields: FieldSet::new(),
            time: now.to_string(),
        },
    };
    for entry in &mut entries {
        entry.fields.retain(|p| !changed.contains(p));
    }
    if !changed.is_empty() {
        mine.fields.extend(changed);
        mine.time = now.to_string();
    }
    entries.push(mine);
    settle(entries, new)
}

/// Drops fields the object no longer has and entries left empty (as the API server does).
fn settle(entries: Vec<Entry>, object: &Value) -> Vec<Entry> {
    let present = field_set(object);
    entries
        .into_iter()
        .map(|mut e| {
            e.fields.retain(|p| present.contains(p));
            e
        })
        .filter(|e| !e.fields.is_empty())
        .collect()
}

/// The parts of an applied configuration that exist without being owned: apiVersion, kind,
/// name and namespace.
fn identity_of(applied: &Value) -> Value {
    let mut object = json!({"metadata": {}});
    for key in ["apiVersion", "kind"] {
        if let Some(v) = applied.get(key) {
            object[key] = v.clone();
        }
    }
    for key in ["name", "namespace"] {
        if let Some(v) = applied["metadata"].get(key) {
            object["metadata"][key] = v.clone();
        }
    }
    object
}

/// A path as the API server prints it (`fieldpath.Path.String()`): `.data.hostfile`,
/// `.metadata.ownerReferences[uid="…"]`.
pub fn path_string(path: &[Element]) -> String {
    path.iter()
        .map(|element| match element {
            Element::Field(f) => format!(".{f}"),
            Element::Key(key) => {
                let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", parts.join(","))
            }
        })
        .collect()
}

/// Go's `%q` for the names a manager has (printable text; `"` and `\` escaped).
fn go_quote(text: &str) -> String {
    let mut out = String::from('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The 409 Status the API server answers a refused apply with (`NewConflictError`).
pub fn conflict_status(conflicts: &[Conflict]) -> Value {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict",
                   "message": format!("conflict with {}", c.manager.printed()),
                   "field": path_string(&c.path)})
        })
        .collect();
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": conflict_message(conflicts), "reason": "Conflict",
           "details": {"causes": causes}, "code": 409})
}

/// `getConflictMessage`: one conflict inline; several grouped by manager, managers sorted.
fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            only.manager.printed(),
            path_string(&only.path)
        );
    }
    let mut managers: Vec<&Manager> = conflicts.iter().map(|c| &c.manager).collect();
    managers.sort();
    managers.dedup();
    let mut lines = Vec::new();
    for manager in managers {
        lines.push(format!("conflicts with {}:", manager.printed()));
        for conflict in conflicts.iter().filter(|c| &c.manager == manager) {
            lines.push(format!("- {}", path_string(&conflict.path)));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// `metadata.managedFields` as the API server renders it (FieldsV1: `f:` fields, `k:` items,
/// `.` for a member that also has members below it).
pub fn managed_fields(entries: &[Entry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                json!({"manager": e.manager.name, "operation": e.manager.operation.as_str(),
                       "apiVersion": e.manager.api_version, "time": e.time,
                       "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&e.fields)})
            })
            .collect(),
    )
}

fn fields_v1(set: &FieldSet) -> Value {
    fn insert(node: &mut Map<String, Value>, rest: &[Element], member_with_children: bool) {
        let Some((first, rest)) = rest.split_first() else {
            if member_with_children {
                node.insert(".".into(), json!({}));
            }
            return;
        };
        let name = match first {
            Element::Field(f) => format!("f:{f}"),
            Element::Key(key) => {
                let parts: Vec<String> = key
                    .iter()
                    .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                    .collect();
                format!("k:{{{}}}", parts.join(","))
            }
        };
        if let Value::Object(child) = node.entry(name).or_insert_with(|| json!({})) {
            insert(child, rest, member_with_children);
        }
    }
    let mut root = Map::new();
    for path in set {
        let has_children = set
            .iter()
            .any(|p| p.len() > path.len() && p.starts_with(path));
        insert(&mut root, path, has_children);
    }
    Value::Object(root)
}
