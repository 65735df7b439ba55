//! The reconciler's writes: the Secret created once (a create, never a read), and the ConfigMap and NetworkPolicy
//! server-side applied unless the cache shows them in place, never forced over Kubeflow
//! Trainer's manager (Decision 16). Every write checks leadership right before it is sent.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};

use crate::mpi::ssh_secret::ssh_secret;
use crate::mpi::{HOSTFILE_NAME, MANAGED_BY_LABEL, MANAGER, Owner};

use super::cached::{cached_hostfile, digest};
use super::conflict;
use super::context::{Applied, Context};
use super::error::{Error, HostfileConflict, TRAINER_MANAGER};

/// Creates `owner`'s Secret unless this term already created or found it
/// ([`super::context::EnsuredSecrets`]). Returns whether it was created.
///
/// The create alone is spec D.1's "created only when absent": the reconciler may not read
/// Secrets (Decision 22), so an existing one (ours, Kubeflow Trainer's, a user's, another
/// replica's during a Lease handover) is recognised by the create's AlreadyExists and used as
/// is. Either answer records the owner, so its later reconciles send nothing until its own watch
/// shows it changed. The key pair comes from [`Context::key_pair`]: a pair an AlreadyExists left
/// unused is kept for the next create, so a create answered AlreadyExists costs no key.
pub(super) async fn ensure_secret(owner: &Owner, ctx: &Context) -> Result<bool, Error> {
    if ctx.ensured.contains(&owner.uid) {
        return Ok(false);
    }
    ctx.ensure_leader()?;
    let keys = ctx.key_pair()?;
    let secret = ssh_secret(owner.clone(), &keys);
    let params = PostParams {
        field_manager: Some(MANAGER.to_string()),
        ..PostParams::default()
    };
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace);
    match api.create(&params, &secret).await {
        Ok(_) => {
            ctx.metrics.write("secret");
            ctx.ensured.record(&owner.uid);
            Ok(true)
        }
        // The Secret is there: ours from before, another replica's, or not ours. Nothing was
        // stored, so the key pair is nobody's and is kept for the next create.
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            ctx.keep_spare(keys);
            ctx.metrics.secret_found();
            ctx.ensured.record(&owner.uid);
            Ok(false)
        }
        Err(error) => Err(Error::CreateSecret(error)),
    }
}

/// An object the reconciler server-side applies, and how to tell that it is already in place.
trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + PartialEq
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The `object` label of `writes_total`.
    const OBJECT: &'static str;

    /// Whether applying `desired` would change nothing in `cached`.
    fn in_place(cached: &Self, desired: &Self) -> bool;
}

impl Owned for ConfigMap {
    const OBJECT: &'static str = "configmap";

    fn in_place(cached: &Self, desired: &Self) -> bool {
        applied(cached, desired)
    }
}

impl Owned for NetworkPolicy {
    const OBJECT: &'static str = "networkpolicy";

    /// Our metadata is there and the spec is ours. Its lists (`policyTypes`, `ingress`) are
    /// atomic for server-side apply, so any other value in them is drift.
    fn in_place(cached: &Self, desired: &Self) -> bool {
        metadata_in_place(&cached.metadata, &desired.metadata) && cached.spec == desired.spec
    }
}

/// Why [`apply_owned`] wrote nothing.
enum Refused {
    /// Kubeflow Trainer's manager holds fields with other values: never forced (Decision 16).
    Trainer {
        conflicts: Vec<conflict::FieldConflict>,
        error: kube::Error,
    },
    /// The API server refused the apply.
    Api(kube::Error),
    /// This replica is no longer the leader.
    NotLeader,
}

/// Server-side applies `desired` unless the cached one (in `cache`) already has every field we
/// own, or we applied exactly this one and the watch has not shown it yet ([`Applied`]).
/// Returns whether it applied.
///
/// The apply is sent without `force`. When another manager holds a field with another value the
/// API server refuses it (409): if none of those managers is Kubeflow Trainer's, the apply is
/// sent again with `force`, which takes the fields over (a `kubectl edit` is repaired); if one is,
/// nothing is written ([`Refused::Trainer`]).
async fn apply_owned<K: Owned>(
    desired: &K,
    cache: &Store<K>,
    applied: &Applied<K>,
    ctx: &Context,
) -> Result<bool, Refused> {
    let namespace = desired.meta().namespace.as_deref().unwrap_or_default();
    let name = desired.meta().name.as_deref().unwrap_or_default();
    let key = ObjectRef::new(name).within(namespace);
    if cache
        .get(&key)
        .is_some_and(|cached| K::in_place(&cached, desired))
        || applied.holds(&key, desired)
    {
        return Ok(false);
    }
    ctx.ensure_leader().map_err(|_| Refused::NotLeader)?;
    // Before sending: the watch event of this apply may arrive before its response.
    applied.expect(key.clone(), desired);
    let result = match apply_with(desired, ctx, false).await {
        Err(kube::Error::Api(status)) => match conflict::apply_conflicts(&status) {
            Some(conflicts) if conflicts.iter().any(|c| c.manager == TRAINER_MANAGER) => {
                applied.forget(&key);
                let error = kube::Error::Api(status);
                return Err(Refused::Trainer { conflicts, error });
            }
            Some(conflicts) => {
                tracing::info!(
                    namespace,
                    name,
                    kind = K::OBJECT,
                    ?conflicts,
                    "taking over fields others changed"
                );
                apply_with(desired, ctx, true).await
            }
            None => Err(kube::Error::Api(status)),
        },
        other => other,
    };
    if let Err(error) = result {
        applied.forget(&key);
        return Err(Refused::Api(error));
    }
    ctx.metrics.write(K::OBJECT);
    Ok(true)
}

/// Applies the hostfile ConfigMap ([`apply_owned`]); a conflict with Kubeflow Trainer's manager
/// is [`Error::HostfileConflict`].
pub(super) async fn apply_configmap(desired: &ConfigMap, ctx: &Context) -> Result<bool, Error> {
    match apply_owned(desired, &ctx.configmaps, &ctx.applied, ctx).await {
        Ok(applied) => Ok(applied),
        Err(Refused::Trainer { conflicts, .. }) => {
            Err(trainer_conflict(desired, conflicts, ctx).await)
        }
        Err(Refused::Api(error)) => Err(Error::ApplyConfigMap(error)),
        Err(Refused::NotLeader) => Err(Error::NotLeader),
    }
}

/// Applies the NetworkPolicy ([`apply_owned`]). Kubeflow Trainer makes none; should its manager
/// hold fields of ours anyway, it is not forced over either, and the refusal is the error.
pub(super) async fn apply_network_policy(
    desired: &NetworkPolicy,
    ctx: &Context,
) -> Result<bool, Error> {
    match apply_owned(desired, &ctx.network_policies, &ctx.applied_policies, ctx).await {
        Ok(applied) => Ok(applied),
        Err(Refused::Trainer { error, .. } | Refused::Api(error)) => {
            Err(Error::ApplyNetworkPolicy(error))
        }
        Err(Refused::NotLeader) => Err(Error::NotLeader),
    }
}

async fn apply_with<K: Owned>(desired: &K, ctx: &Context, force: bool) -> Result<(), kube::Error> {
    let namespace = desired.meta().namespace.as_deref().unwrap_or_default();
    let name = desired.meta().name.as_deref().unwrap_or_default();
    let mut params = PatchParams::apply(MANAGER);
    params.force = force;
    Api::<K>::namespaced(ctx.client.clone(), namespace)
        .patch(name, &params, &Patch::Apply(desired))
        .await
        .map(drop)
}

/// Builds the [`Error::HostfileConflict`] for a refused apply: reads the stored hostfile (a GET;
/// Trainer's ConfigMap carries no label of ours, so it is not in the cache) and counts it.
async fn trainer_conflict(
    desired: &ConfigMap,
    conflicts: Vec<conflict::FieldConflict>,
    ctx: &Context,
) -> Error {
    let namespace = desired.metadata.namespace.as_deref().unwrap_or_default();
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    let stored = match Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
    {
        Ok(stored) => stored,
        Err(error) => return Error::GetConfigMap(error),
    };
    let hostfile_len = |configmap: Option<&ConfigMap>| {
        configmap
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(HOSTFILE_NAME))
            .map_or(0, String::len)
    };
    let mut fields: Vec<String> = conflicts
        .into_iter()
        .filter(|c| c.manager == TRAINER_MANAGER)
        .map(|c| c.field)
        .collect();
    fields.dedup();
    ctx.metrics.hostfile_conflict();
    Error::HostfileConflict(HostfileConflict {
        configmap: name.to_string(),
        fields,
        ours: hostfile_len(Some(desired)),
        theirs: hostfile_len(stored.as_ref()),
    })
}

/// Whether applying `desired` would change nothing: every data key, label and owner reference
/// we set is present with our value. Keys others added are not ours to remove (server-side
/// apply keeps them too), so they do not count as drift.
///
/// `cached` is in the cache's form ([`super::cached::configmap_read`]): of its data, only the
/// digest of its hostfile, the one data key we set, to which ours is compared. (Another key we
/// set would never count as in place: applied each time, never left drifted.)
pub(super) fn applied(cached: &ConfigMap, desired: &ConfigMap) -> bool {
    desired.data.iter().flatten().all(|(key, value)| {
        key == HOSTFILE_NAME && cached_hostfile(cached) == Some(digest(value).as_str())
    }) && metadata_in_place(&cached.metadata, &desired.metadata)
}

/// Every label and owner reference we set is present with our value (others' additions are
/// not ours to remove, so they are not drift). The cache keeps no labels (`identity`): its
/// watch selects our objects by the managed-by label, so that one is present on every cached
/// object, and any other we set must be there.
fn metadata_in_place(cached: &ObjectMeta, desired: &ObjectMeta) -> bool {
    let owners = cached.owner_references.as_deref().unwrap_or_default();
    let labels_in_place = desired
        .labels
        .iter()
        .flatten()
        .filter(|(key, _)| key.as_str() != MANAGED_BY_LABEL)
        .all(|(key, value)| cached.labels.as_ref().and_then(|l| l.get(key)) == Some(value));
    labels_in_place
        && desired
            .owner_references
            .iter()
            .flatten()
            .all(|o| owners.contains(o))
}
