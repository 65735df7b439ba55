//! A pure model of server-side apply (SSA), as the kube-apiserver runs it for a JobSet: enough to
//! replay what Kubeflow Trainer's controller does to a JobSet next to mpi-webhook's mutating
//! webhook (Decision 16). Test support only; the product never applies JobSets.
//!
//! What is modelled, after sigs.k8s.io/structured-merge-diff (the library behind the apiserver's
//! field manager):
//! - the schema is the JobSet CRD's own `openAPIV3Schema` (vendored under
//!   `tests/fixtures/upstream/`): a list is a map keyed by its `x-kubernetes-list-map-keys` when
//!   its `x-kubernetes-list-type` is `map` (replicatedJobs, containers, env, volumes by `name`,
//!   volumeMounts by `mountPath`, ...), a set when `set`, and atomic otherwise (a CRD list without
//!   a list type is atomic: `secret.items`, `command`, ...); an object is granular unless its
//!   `x-kubernetes-map-type` is `atomic`. Paths the schema does not describe (most of `metadata`)
//!   are read as granular objects and atomic lists;
//! - the field set an applied configuration owns (`ToFieldSet`): its scalars, atomic lists and
//!   maps, and the items of associative lists;
//! - the merge of a configuration into the live object (`Merge`): the configuration wins on
//!   scalars and atomic values, objects merge per member, associative lists per key, and the
//!   order of a merged list keeps the live object's items that the configuration does not name
//!   where they were, around the shared items in the configuration's order;
//! - the prune of an apply: fields the manager applied last time and no longer applies, and
//!   that no other manager owns, are removed;
//! - what a mutating admission webhook's changes during an apply become (see [`Stored::admit`]).
//!
//! Not modelled: conflicts between managers (every apply here is forced and there is one
//! manager), `managedFields` encoding, defaulting, and version conversion; none of them touches
//! the paths in question.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// One step of a field path: an object member, the item of an associative list with these key
/// values, or the member of a set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Field(String),
    /// `(key field, compact JSON of its value)` in the schema's key order.
    Key(Vec<(String, String)>),
    Member(String),
}

pub type FieldPath = Vec<Step>;
pub type FieldSet = BTreeSet<FieldPath>;

/// A field path as `spec.replicatedJobs[name=launcher].template...`.
pub fn dotted(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(f) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(f);
            }
            Step::Key(keys) => {
                let keys: Vec<String> = keys
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.trim_matches('"')))
                    .collect();
                out.push_str(&format!("[{}]", keys.join(",")));
            }
            Step::Member(m) => out.push_str(&format!("[{m}]")),
        }
    }
    out
}

/// A node of the CRD's structural schema (`Value::Null` where the schema says nothing).
#[derive(Debug, Clone, Copy)]
pub struct Schema<'s>(&'s Value);

/// How a list merges.
#[derive(Debug, PartialEq, Eq)]
pub enum ListType<'s> {
    Atomic,
    Set,
    Map(Vec<&'s str>),
}

const NO_SCHEMA: Value = Value::Null;

impl<'s> Schema<'s> {
    pub fn new(open_api_v3_schema: &'s Value) -> Self {
        Schema(open_api_v3_schema)
    }

    /// The schema of member `name` of an object.
    pub fn member(self, name: &str) -> Schema<'s> {
        let node = self.0;
        match node["properties"].get(name) {
            Some(s) => Schema(s),
            None if node["additionalProperties"].is_object() => {
                Schema(&node["additionalProperties"])
            }
            None => Schema(&NO_SCHEMA),
        }
    }

    /// The schema of a list's items.
    pub fn items(self) -> Schema<'s> {
        Schema(self.0.get("items").unwrap_or(&NO_SCHEMA))
    }

    pub fn list_type(self) -> ListType<'s> {
        match self.0["x-kubernetes-list-type"].as_str() {
            Some("map") => ListType::Map(
                self.0["x-kubernetes-list-map-keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect(),
            ),
            Some("set") => ListType::Set,
            _ => ListType::Atomic,
        }
    }

    pub fn atomic_object(self) -> bool {
        self.0["x-kubernetes-map-type"] == "atomic"
    }
}

/// The path step that names `item` in a list of `list_type` (`None` for atomic lists).
pub fn item_step(list_type: &ListType<'_>, item: &Value) -> Option<Step> {
    match list_type {
        ListType::Atomic => None,
        ListType::Set => Some(Step::Member(item.to_string())),
        ListType::Map(keys) => Some(Step::Key(
            keys.iter()
                .map(|k| (k.to_string(), item[*k].to_string()))
                .collect(),
        )),
    }
}

/// The fields a configuration sets, as structured-merge-diff's `ToFieldSet` records them.
pub fn field_set(schema: Schema<'_>, value: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    collect(schema, value, &mut Vec::new(), &mut set);
    set
}

fn collect(schema: Schema<'_>, value: &Value, path: &mut FieldPath, set: &mut FieldSet) {
    match value {
        Value::Object(map) if !schema.atomic_object() => {
            for (k, v) in map {
                path.push(Step::Field(k.clone()));
                collect(schema.member(k), v, path, set);
                path.pop();
            }
        }
        Value::Array(items) => {
            let list_type = schema.list_type();
            if list_type == ListType::Atomic {
                set.insert(path.clone());
                return;
            }
            for item in items {
                let Some(step) = item_step(&list_type, item) else {
                    continue;
                };
                path.push(step);
                set.insert(path.clone());
                collect(schema.items(), item, path, set);
                path.pop();
            }
        }
        _ => {
            set.insert(path.clone());
        }
    }
}

/// `config` merged into `live` (structured-merge-diff's `Merge`, the configuration on the right).
pub fn merge(schema: Schema<'_>, live: Option<&Value>, config: &Value) -> Value {
    match (live, config) {
        (Some(Value::Object(l)), Value::Object(c)) if !schema.atomic_object() => {
            let mut out: Map<String, Value> = l.clone();
            for (k, cv) in c {
                let merged = merge(schema.member(k), l.get(k), cv);
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Some(Value::Array(l)), Value::Array(c)) => {
            let list_type = schema.list_type();
            if list_type == ListType::Atomic {
                return config.clone();
            }
            Value::Array(merge_list(schema.items(), &list_type, l, c))
        }
        _ => config.clone(),
    }
}

/// The order rule of structured-merge-diff's associative list merge: walk both lists; items of
/// the live list the configuration does not name stay where they are, shared items come in the
/// configuration's order, the configuration's new items come where the configuration has them.
fn merge_list(
    items: Schema<'_>,
    list_type: &ListType<'_>,
    lhs: &[Value],
    rhs: &[Value],
) -> Vec<Value> {
    let step = |v: &Value| item_step(list_type, v);
    let lhs_steps: Vec<Option<Step>> = lhs.iter().map(step).collect();
    let rhs_steps: Vec<Option<Step>> = rhs.iter().map(step).collect();
    let in_rhs = |s: &Option<Step>| rhs_steps.contains(s);
    let lhs_item = |s: &Option<Step>| lhs_steps.iter().position(|x| x == s).map(|i| &lhs[i]);
    let mut shared: std::collections::VecDeque<&Option<Step>> =
        rhs_steps.iter().filter(|s| lhs_steps.contains(s)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged_rhs: Vec<&Option<Step>> = Vec::new();
    let mut out = Vec::new();
    let (mut li, mut ri) = (0, 0);
    while li < lhs.len() || ri < rhs.len() {
        if li < lhs.len() && ri < rhs.len() {
            let s = &lhs_steps[li];
            if *s == rhs_steps[ri] {
                merged_rhs.push(s);
                out.push(merge(items, Some(&lhs[li]), &rhs[ri]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if in_rhs(s) && next_shared.is_some_and(|n| n != s) {
                li += 1;
                continue;
            }
        }
        if li < lhs.len() {
            let s = &lhs_steps[li];
            if !in_rhs(s) {
                out.push(lhs[li].clone());
                li += 1;
                continue;
            } else if merged_rhs.contains(&s) {
                li += 1;
                continue;
            }
        }
        if ri < rhs.len() {
            let s = &rhs_steps[ri];
            merged_rhs.push(s);
            out.push(merge(items, lhs_item(s), &rhs[ri]));
            ri += 1;
            if next_shared == Some(s) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

/// `value` without the fields in `remove` (structured-merge-diff's `RemoveItems`).
pub fn remove(schema: Schema<'_>, value: &Value, remove_set: &FieldSet) -> Value {
    strip(schema, value, &mut Vec::new(), remove_set)
}

fn strip(schema: Schema<'_>, value: &Value, path: &mut FieldPath, remove_set: &FieldSet) -> Value {
    match value {
        Value::Object(map) if !schema.atomic_object() => {
            let mut out = Map::new();
            for (k, v) in map {
                path.push(Step::Field(k.clone()));
                if !remove_set.contains(path) {
                    out.insert(k.clone(), strip(schema.member(k), v, path, remove_set));
                }
                path.pop();
            }
            Value::Object(out)
        }
        Value::Array(items) if schema.list_type() != ListType::Atomic => {
            let list_type = schema.list_type();
            let mut out = Vec::new();
            for item in items {
                match item_step(&list_type, item) {
                    Some(step) => {
                        path.push(step);
                        if !remove_set.contains(path) {
                            out.push(strip(schema.items(), item, path, remove_set));
                        }
                        path.pop();
                    }
                    None => out.push(item.clone()),
                }
            }
            Value::Array(out)
        }
        _ => value.clone(),
    }
}

/// The stored object and its managers' field sets (`metadata.managedFields`, decoded).
#[derive(Debug, Clone)]
pub struct Stored {
    pub object: Value,
    pub managers: BTreeMap<String, FieldSet>,
}

/// A forced server-side apply of `config` by `manager` onto `stored` (`None`: the object does not
/// exist yet, and the apply creates it).
pub fn force_apply(
    schema: Schema<'_>,
    stored: Option<&Stored>,
    config: &Value,
    manager: &str,
) -> Stored {
    let (live, mut managers) = match stored {
        Some(s) => (Some(&s.object), s.managers.clone()),
        None => (None, BTreeMap::new()),
    };
    let merged = merge(schema, live, config);
    let applied = field_set(schema, config);
    let last = managers.remove(manager).unwrap_or_default();
    let others: FieldSet = managers.values().flatten().cloned().collect();
    // Force: the applier takes over what it applies from everyone else.
    for set in managers.values_mut() {
        set.retain(|p| !applied.contains(p));
    }
    managers.retain(|_, set| !set.is_empty());
    let prune: FieldSet = last
        .difference(&applied)
        .filter(|p| !others.contains(*p))
        .cloned()
        .collect();
    let object = remove(schema, &merged, &prune);
    managers.insert(manager.to_string(), applied);
    Stored { object, managers }
}

/// Who the apiserver records as the owner of what a mutating admission webhook changes during a
/// server-side apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFields {
    /// What the kube-apiserver does: nobody. In `staging/src/k8s.io/apiserver/pkg/endpoints/
    /// handlers/patch.go` an apply request runs its transformers in the order `applyPatch` (the
    /// field manager's `Apply`, which computes the applier's managed fields from the applied
    /// configuration alone), then `applyAdmission` (the mutating admission chain, webhooks
    /// included), then the ownerReference dedup; no field-manager update follows admission.
    /// The admission chain is wrapped by `fieldmanager.NewManagedFieldsValidatingAdmissionController`,
    /// which only resets `managedFields` a webhook made invalid; it attributes nothing. (The
    /// create and update handlers also update managed fields before mutating admission; a change
    /// to track webhooks' changes was proposed upstream and closed unmerged.)
    Unowned,
    /// A counterfactual: the changes are recorded as the applier's, as if the apply
    /// configuration had contained them.
    ToApplier,
}

impl Stored {
    /// The object after a mutating webhook's RFC 6902 `patch`, admitted during the apply that
    /// produced `self` by `applier`.
    pub fn admit(
        &self,
        schema: Schema<'_>,
        patch: &[json_patch::PatchOperation],
        applier: &str,
        attribution: WebhookFields,
    ) -> Stored {
        let mut object = self.object.clone();
        json_patch::patch(&mut object, patch).expect("the webhook's patch applies");
        let mut managers = self.managers.clone();
        if attribution == WebhookFields::ToApplier {
            let added = field_set(schema, &object);
            managers
                .entry(applier.to_string())
                .or_default()
                .extend(added);
        }
        Stored { object, managers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env_schema() -> Value {
        json!({"type": "object", "properties": {"env": {
            "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object"}
        }, "command": {"type": "array", "items": {"type": "string"}}}})
    }

    #[test]
    fn live_only_items_keep_their_place_around_shared_items() {
        let s = env_schema();
        let live = json!({"env": [{"name": "A"}, {"name": "X"}, {"name": "B"}, {"name": "Y"}]});
        let config = json!({"env": [{"name": "A"}, {"name": "B", "value": "2"}, {"name": "C"}]});
        assert_eq!(
            merge(Schema::new(&s), Some(&live), &config),
            json!({"env": [{"name": "A"}, {"name": "X"}, {"name": "B", "value": "2"}, {"name": "Y"}, {"name": "C"}]})
        );
    }

    #[test]
    fn atomic_lists_are_replaced_and_pruned_fields_go() {
        let s = env_schema();
        let schema = Schema::new(&s);
        let first = force_apply(
            schema,
            None,
            &json!({"command": ["a"], "env": [{"name": "A"}, {"name": "B"}]}),
            "m",
        );
        let second = force_apply(
            schema,
            Some(&first),
            &json!({"command": ["b"], "env": [{"name": "A"}]}),
            "m",
        );
        assert_eq!(
            second.object,
            json!({"command": ["b"], "env": [{"name": "A"}]})
        );
    }
}
