//! What the reconciler's caches keep of each object they are filled with, and how a cached
//! JobSet is read back: the trims the watches of a leadership term apply
//! ([`super::run`]'s `term`, the one place they are built), each saying who reads what it keeps.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::JobSet;
use crate::mpi::HOSTFILE_NAME;
use crate::mpi::jobset_mode::IMPLEMENTATION_LABEL;
use crate::objects::cluster::identity;

/// What the reconciler reads of a hostfile ConfigMap of ours: whether it is in place
/// (`writes::applied`: each of our data values, compared by its digest; our labels, which the
/// watch selects by; and our owner references) and, in the watch's events, its owners and its
/// name (the `Applied` records). Its identity ([`identity`]) without its UID, which nobody
/// reads, and its hostfile's digest ([`cached_data`]), not the hostfile itself.
pub(super) fn configmap_read(configmap: &mut ConfigMap) {
    identity(configmap);
    configmap.metadata.uid = None;
    cached_data(configmap);
}

/// The labels and annotations JobSet mode reads all start with this.
const OURS: &str = "mpi-webhook.io/";

/// What the JobSet controller and the launcher-Pod watch read of a JobSet-mode JobSet, the rest
/// dropped before it is cached: its identity (name, namespace, UID, owner references, deletion
/// timestamp), our label and our annotations (its settings), and of its spec the counts,
/// containers and subdomain the hostfile is made of (not `dependsOn` nor the Job templates'
/// labels, which only admission reads).
///
/// Our label and our annotations are kept in **one** map, the annotations' (a map costs a
/// B-tree node of about 540 bytes however few its entries, which at ten thousand JobSets is
/// megabytes for the second one; docs/operations.md has the measured figures): the label under its own key, [`IMPLEMENTATION_LABEL`], and no labels. Safe
/// because no annotation of that key is read by anybody (the settings read the key as a label
/// only), so the one a JobSet may carry is dropped, and because every reader of this cache
/// reads it through [`jobset_as_read`], which puts the label back where the settings read it:
/// the JobSet controller ([`super::owners`]) and the launcher-Pod watch. The cached form has no
/// labels, while every cached JobSet has the label (the watch selects by it).
pub(super) fn jobset_read(jobset: &mut JobSet) {
    let ours = |map: Option<BTreeMap<String, String>>| {
        map.into_iter()
            .flatten()
            .filter(|(key, _)| key.starts_with(OURS) && key != IMPLEMENTATION_LABEL)
    };
    let meta = &mut jobset.metadata;
    let label = meta
        .labels
        .take()
        .and_then(|mut labels| labels.remove_entry(IMPLEMENTATION_LABEL));
    let kept: BTreeMap<String, String> = ours(meta.annotations.take()).chain(label).collect();
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        owner_references: meta.owner_references.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        annotations: (!kept.is_empty()).then_some(kept),
        ..ObjectMeta::default()
    };
    for rjob in &mut jobset.spec.replicated_jobs {
        rjob.depends_on = None;
        rjob.template.metadata.labels = None;
    }
}

/// A JobSet of the JobSet cache as the settings read it: [`jobset_read`]'s one map split back
/// into our label and our annotations (a copy, for as long as one reconcile or one launcher
/// Pod needs it). A JobSet that has labels is not in the cached form and is used as is.
pub(super) fn jobset_as_read(cached: &JobSet) -> std::borrow::Cow<'_, JobSet> {
    let meta = &cached.metadata;
    let label = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(IMPLEMENTATION_LABEL));
    if meta.labels.is_some() || label.is_none() {
        return std::borrow::Cow::Borrowed(cached);
    }
    let mut jobset = cached.clone();
    let meta = &mut jobset.metadata;
    let mut annotations = meta.annotations.take().unwrap_or_default();
    meta.labels = annotations
        .remove_entry(IMPLEMENTATION_LABEL)
        .map(|label| BTreeMap::from([label]));
    meta.annotations = (!annotations.is_empty()).then_some(annotations);
    std::borrow::Cow::Owned(jobset)
}

/// What the ConfigMap cache keeps of a ConfigMap's `data`: the [`digest`] of the value of the
/// one key we set (`hostfile`, the only one [`crate::mpi::hostfile::hostfile_configmap`]
/// writes), and no data. The digest is kept in `metadata.selfLink`, a field the API server has
/// not set since Kubernetes 1.20 and that nothing of ours reads, because a one-entry map costs
/// a B-tree node of 544 bytes for a 43-byte digest; read it with
/// [`cached_hostfile`], never the field. The keys others added are dropped (`writes::applied`
/// compares only the keys we set).
pub(super) fn cached_data(configmap: &mut ConfigMap) {
    let hostfile = configmap
        .data
        .take()
        .and_then(|mut data| data.remove(HOSTFILE_NAME));
    configmap.binary_data = None;
    configmap.metadata.self_link = hostfile.map(|value| digest(&value));
}

/// The [`digest`] of the hostfile of a ConfigMap of the cache ([`cached_data`]), or `None` when
/// it has none.
pub(super) fn cached_hostfile(cached: &ConfigMap) -> Option<&str> {
    cached.metadata.self_link.as_deref()
}

/// SHA-256 of `value`, in unpadded base64: equal exactly when the values are (nobody can make
/// another hostfile with our digest and have its drift pass for ours).
pub(super) fn digest(value: &str) -> String {
    use base64::Engine as _;
    let sum = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, value.as_bytes());
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(sum.as_ref())
}
