//! Who may do what: RBAC grants read from the shipped manifests, and the
//! OwnerReferencesPermissionEnforcement admission plugin. Pure.

use serde_json::{Value, json};

use super::ApiError;

/// The ServiceAccount every HTTP request to the fake is taken to come from (the reconciler's).
pub const SERVICE_ACCOUNT: (&str, &str) = ("mpi-webhook", "mpi-webhook");

/// One RBAC rule, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// API group (`""` core).
    pub group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// One verb.
    pub verb: String,
    /// `Some` for a Role (only its namespace).
    pub namespace: Option<String>,
    /// `resourceNames`, empty for any.
    pub names: Vec<String>,
}

/// What the caller asks to do.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// RBAC verb.
    pub verb: &'a str,
    /// API group.
    pub group: &'a str,
    /// Resource (plural).
    pub resource: &'a str,
    /// Subresource, `""` for none.
    pub subresource: &'a str,
    /// Namespace, `None` for a cluster-scoped request.
    pub namespace: Option<&'a str>,
    /// Object name, `None` for collections.
    pub name: Option<&'a str>,
}

/// RBAC for the ServiceAccount [`SERVICE_ACCOUNT`].
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    grants: Vec<Grant>,
}

impl Authorizer {
    /// The grants of the shipped RBAC, `manifests/base/rbac.yaml`.
    pub fn shipped() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base/rbac.yaml");
        let text = std::fs::read_to_string(path).expect("rbac.yaml");
        let objects =
            mpi_webhook::objects::dir::parse_documents(&text, false).expect("rbac.yaml parses");
        Self::from_rbac(&objects)
    }

    /// The grants that `objects` (ClusterRoles, Roles and their bindings, as parsed from RBAC
    /// YAML) give [`SERVICE_ACCOUNT`].
    pub fn from_rbac(objects: &[Value]) -> Self {
        let (sa_namespace, sa_name) = SERVICE_ACCOUNT;
        let binds_us = |binding: &Value| {
            binding["subjects"].as_array().is_some_and(|subjects| {
                subjects.iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == sa_name
                        && s["namespace"] == sa_namespace
                })
            })
        };
        let mut grants = Vec::new();
        for binding in objects {
            let namespaced = match binding["kind"].as_str() {
                Some("ClusterRoleBinding") => false,
                Some("RoleBinding") => true,
                _ => continue,
            };
            if !binds_us(binding) {
                continue;
            }
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = &binding["roleRef"]["name"];
            let namespace = namespaced
                .then(|| binding["metadata"]["namespace"].as_str().map(String::from))
                .flatten();
            let Some(role) = objects.iter().find(|o| {
                o["kind"] == role_kind
                    && &o["metadata"]["name"] == role_name
                    && (!namespaced
                        || o["metadata"]["namespace"] == binding["metadata"]["namespace"])
            }) else {
                continue;
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                let strings = |v: &Value| -> Vec<String> {
                    v.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                };
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            grants.push(Grant {
                                group: group.clone(),
                                resource: resource.clone(),
                                verb,
                                namespace: namespace.clone(),
                                names: strings(&rule["resourceNames"]),
                            });
                        }
                    }
                }
            }
        }
        Self { grants }
    }

    /// The same grants without those for which `drop` is true (to show what a missing grant does).
    pub fn without(mut self, drop: impl Fn(&Grant) -> bool) -> Self {
        self.grants.retain(|g| !drop(g));
        self
    }

    /// Whether a grant allows `attributes` (no wildcards: the manifests have none).
    pub fn allows(&self, a: &Attributes<'_>) -> bool {
        let resource = if a.subresource.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.grants.iter().any(|g| {
            g.group == a.group
                && g.resource == resource
                && g.verb == a.verb
                && g.namespace
                    .as_deref()
                    .is_none_or(|ns| a.namespace == Some(ns))
                && (g.names.is_empty() || a.name.is_some_and(|n| g.names.iter().any(|g| g == n)))
        })
    }

    /// The 403 the API server's authorization filter answers a refused request with.
    pub fn forbidden(a: &Attributes<'_>) -> ApiError {
        let (sa_namespace, sa_name) = SERVICE_ACCOUNT;
        let user = format!("system:serviceaccount:{sa_namespace}:{sa_name}");
        let resource = if a.subresource.is_empty() {
            format!("resource {:?}", a.resource)
        } else {
            format!("resource \"{}/{}\"", a.resource, a.subresource)
        };
        let scope = match a.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        let reason = format!(
            "User {user:?} cannot {} {resource} in API group {:?} {scope}",
            a.verb, a.group
        );
        forbidden(a.group, a.resource, a.name.unwrap_or_default(), &reason)
    }
}

/// `apierrors.NewForbidden(qualifiedResource, name, err)`.
pub fn forbidden(group: &str, resource: &str, name: &str, reason: &str) -> ApiError {
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let message = if name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} {name:?} is forbidden: {reason}")
    };
    ApiError::new(hyper::StatusCode::FORBIDDEN, "Forbidden", message)
        .with_details(json!({"name": name, "group": group, "kind": resource}))
}

/// An owner kind the plugin can map to its resource: `(apiVersion group, kind) → plural`.
pub type OwnerResource<'a> = &'a dyn Fn(&str, &str) -> Option<&'static str>;

/// OwnerReferencesPermissionEnforcement (`plugin/pkg/admission/gc`): an update that changes
/// `ownerReferences` needs `delete` on the object; any write that adds an ownerReference with
/// `blockOwnerDeletion: true` (or turns it on) needs `update` on the owner's `finalizers`.
///
/// # Errors
/// The 403 the plugin answers with.
pub fn owner_references_permission(
    authorizer: &Authorizer,
    target: &Attributes<'_>,
    new: &Value,
    old: Option<&Value>,
    owner_resource: OwnerResource<'_>,
) -> Result<(), ApiError> {
    let refs = |o: &Value| {
        o["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let new_refs = refs(new);
    let changing = match old {
        None => !new_refs.is_empty(),
        Some(old) => refs(old) != new_refs,
    };
    if !changing {
        return Ok(());
    }
    let name = target.name.unwrap_or_default();
    if let Some(_old) = old {
        let delete = Attributes {
            verb: "delete",
            ..target.clone()
        };
        if !authorizer.allows(&delete) {
            return Err(forbidden(
                target.group,
                target.resource,
                name,
                "cannot set an ownerRef on a resource you can't delete: , <nil>",
            ));
        }
    }
    let blocking_before = |uid: &Value| {
        old.is_some_and(|old| {
            refs(old)
                .iter()
                .any(|r| &r["uid"] == uid && r["blockOwnerDeletion"] == true)
        })
    };
    for owner in new_refs
        .iter()
        .filter(|r| r["blockOwnerDeletion"] == true && !blocking_before(&r["uid"]))
    {
        let api_version = owner["apiVersion"].as_str().unwrap_or_default();
        let kind = owner["kind"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let Some(resource) = owner_resource(group, kind) else {
            return Err(forbidden(
                target.group,
                target.resource,
                name,
                &format!(
                    "cannot set blockOwnerDeletion in this case because cannot find RESTMapping \
                     for APIVersion {api_version} Kind {kind}: no matches for kind {kind:?} in \
                     group {group:?}"
                ),
            ));
        };
        let finalizers = Attributes {
            verb: "update",
            group,
            resource,
            subresource: "finalizers",
            namespace: target.namespace,
            name: owner["name"].as_str(),
        };
        if !authorizer.allows(&finalizers) {
            return Err(forbidden(
                target.group,
                target.resource,
                name,
                "cannot set blockOwnerDeletion if an ownerReference refers to a resource you \
                 can't set finalizers on: , <nil>",
            ));
        }
    }
    Ok(())
}
