//! An in-process fake Kubernetes API server (plain HTTP/1.1 on 127.0.0.1, objects in memory), for
//! the reconciler's process tests (`tests/reconcile_process.rs`) and its benchmark
//! (`benches/reconciler.rs`, which includes this module by `#[path]`).
//!
//! It serves the resources of [`KINDS`] by their REST paths (adding one, e.g. JobSets, is one
//! [`Kind`] constant) and implements the calls the reconciler makes (`src/api_calls.rs`):
//! - LIST (pages of `limit`, `continue`) and WATCH (from a resourceVersion, one JSON event per
//!   line, for every change), both with equality label selectors and the metadata-only
//!   `as=PartialObjectMetadata[List]` Accept header; GET; POST (409 AlreadyExists); PATCH as a
//!   merge patch (strategic merge taken as JSON merge), and as server-side apply;
//! - **server-side apply with field ownership** ([`ssa`]): `metadata.managedFields` per manager,
//!   409 Conflict without `force` worded and structured as the API server's `NewConflictError`,
//!   `force=true` taking the fields over, fields the applier no longer sets removed unless
//!   another manager owns them, and updates (create, merge patch) owning what they changed;
//! - **resourceVersion** that changes only when the object (or its ownership) really changes: a
//!   no-op apply or patch keeps it and sends no watch event; a patch or apply whose body carries
//!   `metadata.resourceVersion` is a precondition: another version is a 409 Conflict worded as
//!   the API server's optimistic-lock error;
//! - an apply body without `metadata.name` (kube-lease-manager's Lease patches) is the object the
//!   URL names, as the API server takes it; a different name is a 400;
//! - optionally **RBAC** ([`authz::Authorizer`], e.g. from `manifests/base/rbac.yaml`): every HTTP
//!   request is taken to come from the ServiceAccount `mpi-webhook/mpi-webhook` and is refused
//!   403 as the API server words it unless granted; in-process calls (`FakeApi::apply`, …) play
//!   other controllers (Kubeflow Trainer, `kubectl edit`) and are not checked;
//! - optionally the **OwnerReferencesPermissionEnforcement** admission plugin on HTTP writes
//!   ([`authz::owner_references_permission`]);
//! - **garbage collection** ([`FakeApi::delete`], in process only: a `kubectl delete` with the
//!   default background propagation): dependents whose owners are all gone are deleted, in
//!   cascade; a dependent with an owner left loses only its dangling references, as the
//!   garbage collector of kube-controller-manager does.
//!
//! Not modelled: validation, defaulting, other admission, generateName, HTTP DELETE, PUT, JSON patch,
//! subresources, bookmarks, watch cache expiry (410). A request it does not implement is
//! answered 404, 405 or 501 and recorded in [`Stats::unexpected`].
//!
//! The files: [`kinds`] (the resources served), [`store`] (objects, ownership, change logs and
//! every write, with the errors the API server answers), [`ssa`] (field sets and managed
//! fields), [`authz`] (RBAC and the admission plugin), and [`rest`] (REST paths, queries,
//! watches, and the HTTP server), which depends on the others and nothing depends on.
//!
//! Its own tests are `tests/fake_apiserver/tests.rs`, run by `tests/reconcile_process.rs`.

#![allow(dead_code)]

pub mod authz;
pub mod kinds;
pub mod rest;
pub mod ssa;
pub mod store;

pub use kinds::*;
pub use store::*;
