//! `mpi-webhook reconcile`, as a process running as the shipped ServiceAccount under the shipped
//! ClusterRole, against the real apiserver (OwnerReferencesPermissionEnforcement on), with
//! Kubeflow Trainer's server-side applies played by the test, and kube-controller-manager's
//! garbage collector for deletions. The reconciler watches the whole cluster, so these tests take
//! turns ([`RECONCILER_TURN`]).

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::control_plane::{self, ControlPlane, RESTRICTED};
use crate::support::{
    FINISHED, RECONCILER_TURN, Reconciler, api_for, apply, create, documents, events, get, install,
    managers, resource_of,
};

/// The ClusterTrainingRuntime the TrainJobs here name.
const RUNTIME: &str = "envtest-mpi";
/// Our hostfile for [`train_job`] on [`runtime`] (73 bytes).
const HOSTFILE: &str =
    "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\npi-launcher-0-0.pi slots=1\n";
/// The reconciler's count of PreflightFailed Events it recorded.
const PREFLIGHT_FAILURES: &str = "mpi_webhook_preflight_failures_total";
/// The reconciler's count of LauncherFailed Events it recorded.
const LAUNCHER_FAILURES: &str = "mpi_webhook_launcher_failures_total";
/// A hostfile Trainer might word differently (23 bytes).
const TRAINERS_OTHER_HOSTFILE: &str = "pi-node-0-0.pi slots=1\n";

fn runtime() -> Value {
    let job = |name: &str| {
        json!({"name": name, "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "node", "image": "mpi"}]}}}}})
    };
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": RUNTIME},
           "spec": {"mlPolicy": {"numNodes": 1,
                                 "mpi": {"numProcPerNode": 1, "runLauncherAsNode": true}},
                    "template": {"spec": {"replicatedJobs": [job("node"), job("launcher")]}}}})
}

fn train_job(namespace: &str) -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "pi", "namespace": namespace},
           "spec": {"runtimeRef": {"name": RUNTIME, "apiGroup": "trainer.kubeflow.org",
                                   "kind": "ClusterTrainingRuntime"},
                    "trainer": {"numNodes": 3}}})
}

/// The owner reference the reconciler's objects must carry.
fn owner_of(object: &Value) -> Value {
    json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
           "name": object["metadata"]["name"], "uid": object["metadata"]["uid"],
           "controller": true, "blockOwnerDeletion": true})
}

/// A namespace with the runtime, the shipped RBAC and the TrainJob `pi`; the stored TrainJob.
async fn with_train_job(plane: &ControlPlane, prefix: &str) -> (String, Value) {
    install(plane).await;
    apply(&plane.admin(), &runtime(), "envtest").await;
    let ns = plane.namespace(prefix).await;
    let job = create(&plane.admin(), &train_job(&ns))
        .await
        .expect("TrainJob");
    (ns, job)
}

/// A namespace with the shipped RBAC and the shipped OpenMPI JobSet-mode sample, with
/// `annotations` added; the stored JobSet.
async fn with_jobset(
    plane: &ControlPlane,
    prefix: &str,
    annotations: &[(&str, &str)],
) -> (String, Value) {
    install(plane).await;
    let ns = plane.namespace(prefix).await;
    let mut jobset = documents("manifests/samples/jobset-pi-openmpi.yaml").remove(0);
    jobset["metadata"]["namespace"] = json!(ns);
    for (key, value) in annotations {
        jobset["metadata"]["annotations"][*key] = json!(value);
    }
    let created = create(&plane.admin(), &jobset).await.expect("JobSet");
    (ns, created)
}

/// The hostfile ConfigMap as Trainer's controller applies it (no labels), with force as it does.
async fn trainer_applies_hostfile(admin: &Client, job: &Value, hostfile: &str) -> Value {
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "pi-mpi-hostfile", "namespace": job["metadata"]["namespace"],
                     "ownerReferences": [owner_of(job)]},
        "data": {"hostfile": hostfile}});
    apply(admin, &configmap, "trainer").await
}

async fn configmap(admin: &Client, ns: &str, name: &str) -> Option<Value> {
    get(admin, "v1", "ConfigMap", ns, name).await
}

async fn secret(admin: &Client, ns: &str, name: &str) -> Option<Value> {
    get(admin, "v1", "Secret", ns, name).await
}

async fn network_policy(admin: &Client, ns: &str, name: &str) -> Option<Value> {
    get(admin, "networking.k8s.io/v1", "NetworkPolicy", ns, name).await
}

/// Our ConfigMap apply has happened (our field manager is on it).
async fn ours_applied(admin: &Client, ns: &str) -> Option<Value> {
    configmap(admin, ns, "pi-mpi-hostfile")
        .await
        .filter(|c| managers(c).iter().any(|m| m == "mpi-webhook"))
}

/// Touches the TrainJob (an annotation, spec unchanged) and waits for the reconcile it causes.
async fn resync(admin: &Client, job: &Value, reconciler: &mut Reconciler, round: usize) {
    let before = reconciler.metric(FINISHED).await;
    let ns = job["metadata"]["namespace"].as_str().expect("namespace");
    api_for(admin, job, Some(ns))
        .patch(
            "pi",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/resync": round.to_string()}}})),
        )
        .await
        .expect("annotate");
    reconciler.reconciled_past(before).await;
}

fn rv(object: &Value) -> &Value {
    &object["metadata"]["resourceVersion"]
}

/// The spec of the NetworkPolicy of the job whose JobSet is named `jobset`.
fn policy_spec(jobset: &str) -> Value {
    json!({"podSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": jobset}},
           "policyTypes": ["Ingress"],
           "ingress": [{"from": [{"podSelector": {
               "matchLabels": {"jobset.sigs.k8s.io/jobset-name": jobset}}}]}]})
}

/// Deletes the owner so later reconcilers (which watch every namespace) leave this test's objects
/// alone.
async fn forget(admin: &Client, owner: &Value) {
    let name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let _ = api_for(admin, owner, None)
        .delete(name, &DeleteParams::background())
        .await;
}

#[tokio::test]
async fn the_shipped_service_account_creates_the_secret_hostfile_and_policy_owned_by_the_trainjob()
{
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "owned").await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &["--network-policy-default"]);
    let (secret, hostfile, policy) = reconciler
        .wait_for(
            "the Secret, the ConfigMap and the NetworkPolicy",
            || async {
                Some((
                    secret(&admin, &ns, "pi-mpi-ssh-auth").await?,
                    ours_applied(&admin, &ns).await?,
                    network_policy(&admin, &ns, "pi-mpi").await?,
                ))
            },
        )
        .await;
    for object in [&secret, &hostfile, &policy] {
        assert_eq!(
            object["metadata"]["ownerReferences"],
            json!([owner_of(&job)])
        );
    }
    assert_eq!(hostfile["data"], json!({"hostfile": HOSTFILE}));
    assert_eq!(secret["type"], "kubernetes.io/ssh-auth");
    assert_eq!(policy["spec"], policy_spec("pi"));
    assert_eq!(
        policy["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "mpi-webhook"})
    );
    assert_eq!(managers(&policy), ["mpi-webhook"]);
    forget(&admin, &job).await;
}

#[tokio::test]
async fn trainer_first_with_the_same_text_means_no_fight_and_a_stable_resource_version() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "same-text").await;
    let admin = plane.admin();
    trainer_applies_hostfile(&admin, &job, HOSTFILE).await;
    let mut reconciler = Reconciler::start(plane, &[]);
    let settled = reconciler
        .wait_for("our apply next to Trainer's", || async {
            secret(&admin, &ns, "pi-mpi-ssh-auth").await?;
            ours_applied(&admin, &ns).await
        })
        .await;
    // The apiserver lists both Apply managers in its own order (by name when applied in the
    // same second).
    let mut both = managers(&settled);
    both.sort();
    assert_eq!(both, ["mpi-webhook", "trainer"]);
    assert_eq!(settled["data"], json!({"hostfile": HOSTFILE}));
    for round in 0..3 {
        // Trainer re-applies on its every reconcile: nothing changes.
        let again = trainer_applies_hostfile(&admin, &job, HOSTFILE).await;
        assert_eq!(rv(&again), rv(&settled), "round {round}");
        resync(&admin, &job, &mut reconciler, round).await;
    }
    let last = configmap(&admin, &ns, "pi-mpi-hostfile")
        .await
        .expect("ConfigMap");
    assert_eq!(rv(&last), rv(&settled));
    assert_eq!(
        events(&admin, &ns, "HostfileConflict").await,
        Vec::<Value>::new()
    );
    forget(&admin, &job).await;
}

/// Decision 16: Trainer's field manager holds the hostfile with other text; we never apply with
/// force over it, and say so in one Warning Event.
#[tokio::test]
async fn trainer_first_with_other_text_keeps_trainers_and_one_warning_event() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "other-text").await;
    let admin = plane.admin();
    let seeded = trainer_applies_hostfile(&admin, &job, TRAINERS_OTHER_HOSTFILE).await;
    let mut reconciler = Reconciler::start(plane, &[]);
    reconciler
        .wait_for("a HostfileConflict Event", || async {
            let found = events(&admin, &ns, "HostfileConflict").await;
            (!found.is_empty()).then_some(())
        })
        .await;
    for round in 0..2 {
        let again = trainer_applies_hostfile(&admin, &job, TRAINERS_OTHER_HOSTFILE).await;
        assert_eq!(rv(&again), rv(&seeded), "round {round}");
        resync(&admin, &job, &mut reconciler, round).await;
    }
    let stored = configmap(&admin, &ns, "pi-mpi-hostfile")
        .await
        .expect("ConfigMap");
    assert_eq!(rv(&stored), rv(&seeded));
    assert_eq!(stored["data"], json!({"hostfile": TRAINERS_OTHER_HOSTFILE}));
    assert_eq!(managers(&stored), ["trainer"]);
    let warnings = events(&admin, &ns, "HostfileConflict").await;
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(
        (
            &warnings[0]["type"],
            &warnings[0]["note"],
            &warnings[0]["regarding"]["name"]
        ),
        (
            &json!("Warning"),
            &json!(
                "ConfigMap pi-mpi-hostfile: Kubeflow Trainer's field manager \"trainer\" holds \
                 .data.hostfile with other values, left as is: our hostfile is 73 bytes, \
                 Trainer's is 23 bytes"
            ),
            &json!("pi")
        )
    );
    forget(&admin, &job).await;
}

#[tokio::test]
async fn a_secret_trainer_made_first_is_used_as_is() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "trainers-secret").await;
    let admin = plane.admin();
    let trainers = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
        "immutable": true,
        "metadata": {"name": "pi-mpi-ssh-auth", "namespace": ns,
                     "ownerReferences": [owner_of(&job)]},
        "data": {"ssh-privatekey": "VFJBSU5FUg==", "ssh-publickey": "VFJBSU5FUg=="}});
    let seeded = apply(&admin, &trainers, "trainer").await;
    let mut reconciler = Reconciler::start(plane, &[]);
    reconciler
        .wait_for("the ConfigMap", || ours_applied(&admin, &ns))
        .await;
    resync(&admin, &job, &mut reconciler, 0).await;
    let after = secret(&admin, &ns, "pi-mpi-ssh-auth")
        .await
        .expect("Secret");
    assert_eq!(after, seeded, "not recreated, not touched");
    forget(&admin, &job).await;
}

/// The reconciler reads no Secret (Decision 22): one deleted under it is not seen, and is made
/// again, with a new key, at its owner's next change (here an annotation).
#[tokio::test]
async fn a_deleted_secret_is_made_again_at_its_owners_next_change() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "deleted-secret").await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &[]);
    let first = reconciler
        .wait_for("the Secret", || secret(&admin, &ns, "pi-mpi-ssh-auth"))
        .await;
    reconciler
        .wait_for("the ConfigMap", || ours_applied(&admin, &ns))
        .await;
    let secret_api = api_for(&admin, &first, Some(&ns));
    secret_api
        .delete("pi-mpi-ssh-auth", &DeleteParams::default())
        .await
        .expect("delete the Secret");
    resync(&admin, &job, &mut reconciler, 0).await;
    let again = reconciler
        .wait_for("the Secret made again", || {
            secret(&admin, &ns, "pi-mpi-ssh-auth")
        })
        .await;
    assert_ne!(
        again["metadata"]["uid"], first["metadata"]["uid"],
        "a new Secret"
    );
    assert_ne!(again["data"], first["data"], "with a new key pair");
    assert_eq!(
        again["metadata"]["ownerReferences"],
        json!([owner_of(&job)])
    );
    // No count of key pairs here: the reconciler watches every namespace of the shared control
    // plane, so other tests' owners make theirs too (the unit tests count them).
    forget(&admin, &job).await;
}

#[tokio::test]
async fn a_kubectl_edit_is_repaired_with_force() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "edited").await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &[]);
    reconciler
        .wait_for("the ConfigMap", || ours_applied(&admin, &ns))
        .await;
    let configmaps: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &ns, &resource_of("v1", "ConfigMap"));
    configmaps
        .patch(
            "pi-mpi-hostfile",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"hostfile": "edited\n"}})),
        )
        .await
        .expect("edit");
    let repaired = reconciler
        .wait_for("the edit repaired", || async {
            configmap(&admin, &ns, "pi-mpi-hostfile")
                .await
                .filter(|c| c["data"]["hostfile"] == HOSTFILE)
        })
        .await;
    assert_eq!(managers(&repaired), ["mpi-webhook"]);
    assert_eq!(
        events(&admin, &ns, "HostfileConflict").await,
        Vec::<Value>::new()
    );
    forget(&admin, &job).await;
}

/// The shipped ClusterRole minus `trainjobs/finalizers`: OwnerReferencesPermissionEnforcement
/// refuses every object with `blockOwnerDeletion`, and the reconciler says so in an Event.
#[tokio::test]
async fn without_the_finalizers_grant_the_plugin_refuses_every_object() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "no-finalizers").await;
    let admin = plane.admin();
    let mut role = documents("manifests/base/rbac.yaml")
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "mpi-webhook-reconcile")
        .expect("the shipped reconcile ClusterRole");
    role["metadata"] = json!({"name": "envtest-reconcile-without-finalizers"});
    role["rules"]
        .as_array_mut()
        .expect("rules")
        .retain(|r| r["resources"] != json!(["trainjobs/finalizers"]));
    apply(&admin, &role, "envtest").await;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "envtest-reconcile-without-finalizers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "envtest-reconcile-without-finalizers"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": RESTRICTED.name}]});
    apply(&admin, &binding, "envtest").await;
    let mut reconciler = Reconciler::start_as(plane, RESTRICTED, &[]);
    let failed = reconciler
        .wait_for("a TrainJobResourcesCreationFailed Event", || async {
            events(&admin, &ns, "TrainJobResourcesCreationFailed")
                .await
                .into_iter()
                .next()
        })
        .await;
    let note = failed["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("failed to create the SSH auth Secret: ")
            && note.contains(
                "secrets \"pi-mpi-ssh-auth\" is forbidden: cannot set blockOwnerDeletion if an \
                 ownerReference refers to a resource you can't set finalizers on"
            ),
        "{note}"
    );
    assert_eq!(secret(&admin, &ns, "pi-mpi-ssh-auth").await, None);
    assert_eq!(configmap(&admin, &ns, "pi-mpi-hostfile").await, None);
    forget(&admin, &job).await;
}

/// JobSet mode: the shipped OpenMPI sample, asking for a NetworkPolicy by annotation, gets its
/// Secret, hostfile and policy owned by the JobSet.
#[tokio::test]
async fn a_jobset_mode_jobset_gets_its_objects_owned_by_the_jobset() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, created) = with_jobset(
        plane,
        "jobset-owned",
        &[("mpi-webhook.io/network-policy", "true")],
    )
    .await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &[]);
    let (secret, hostfile, policy) = reconciler
        .wait_for(
            "the JobSet's Secret, ConfigMap and NetworkPolicy",
            || async {
                Some((
                    secret(&admin, &ns, "pi-jobset-openmpi-mpi-ssh-auth").await?,
                    configmap(&admin, &ns, "pi-jobset-openmpi-mpi-hostfile").await?,
                    network_policy(&admin, &ns, "pi-jobset-openmpi-mpi").await?,
                ))
            },
        )
        .await;
    for object in [&secret, &hostfile, &policy] {
        assert_eq!(
            object["metadata"]["ownerReferences"],
            json!([owner_of(&created)])
        );
    }
    assert_eq!(
        hostfile["data"]["hostfile"],
        "pi-jobset-openmpi-node-0-0.pi-jobset-openmpi slots=1\n\
         pi-jobset-openmpi-node-0-1.pi-jobset-openmpi slots=1\n"
    );
    assert_eq!(policy["spec"], policy_spec("pi-jobset-openmpi"));
    forget(&admin, &created).await;
}

#[tokio::test]
async fn with_the_default_off_no_network_policy_is_made() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "no-policy").await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &[]);
    reconciler
        .wait_for("the Secret and the ConfigMap", || async {
            secret(&admin, &ns, "pi-mpi-ssh-auth").await?;
            ours_applied(&admin, &ns).await
        })
        .await;
    resync(&admin, &job, &mut reconciler, 1).await;
    assert_eq!(network_policy(&admin, &ns, "pi-mpi").await, None);
    forget(&admin, &job).await;
}

/// Deleting the TrainJob with `propagation` takes the Secret, the ConfigMap and the
/// NetworkPolicy with it through kube-controller-manager's garbage collector.
async fn deleting_the_owner_removes_all_three(propagation: DeleteParams, prefix: &str) {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    if !plane.garbage_collector_or_skip().await {
        return;
    }
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, prefix).await;
    let admin = plane.admin();
    let mut reconciler = Reconciler::start(plane, &["--network-policy-default"]);
    reconciler
        .wait_for(
            "the Secret, the ConfigMap and the NetworkPolicy",
            || async {
                secret(&admin, &ns, "pi-mpi-ssh-auth").await?;
                network_policy(&admin, &ns, "pi-mpi").await?;
                ours_applied(&admin, &ns).await
            },
        )
        .await;
    api_for(&admin, &job, None)
        .delete("pi", &propagation)
        .await
        .expect("delete the TrainJob");
    reconciler
        .wait_for(
            "the garbage collector to remove the TrainJob and its objects",
            || async {
                let left = [
                    get(
                        &admin,
                        "trainer.kubeflow.org/v1alpha1",
                        "TrainJob",
                        &ns,
                        "pi",
                    )
                    .await,
                    secret(&admin, &ns, "pi-mpi-ssh-auth").await,
                    configmap(&admin, &ns, "pi-mpi-hostfile").await,
                    network_policy(&admin, &ns, "pi-mpi").await,
                ];
                left.iter().all(Option::is_none).then_some(())
            },
        )
        .await;
}

#[tokio::test]
async fn a_background_delete_of_the_trainjob_removes_its_objects() {
    deleting_the_owner_removes_all_three(DeleteParams::background(), "gc-background").await;
}

#[tokio::test]
async fn a_foreground_delete_of_the_trainjob_removes_its_objects_first() {
    deleting_the_owner_removes_all_three(DeleteParams::foreground(), "gc-foreground").await;
}

/// The Lease `--leader-elect` replicas share (`--lease-namespace`, the shipped namespace).
const LEASE_NAMESPACE: &str = "mpi-webhook";
const LEASE: &str = "mpi-webhook-reconciler";
/// A `--leader-elect` replica holding `holder` as its identity.
fn start_replica(plane: &ControlPlane, holder: &str) -> Reconciler {
    Reconciler::start(
        plane,
        &[
            "--leader-elect",
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--lease-holder",
            holder,
        ],
    )
}

async fn lease(admin: &Client) -> Option<Value> {
    get(
        admin,
        "coordination.k8s.io/v1",
        "Lease",
        LEASE_NAMESPACE,
        LEASE,
    )
    .await
}

fn holder(lease: &Value) -> Option<&str> {
    lease["spec"]["holderIdentity"].as_str()
}

/// On SIGTERM the leading replica stops its controller, releases the Lease (holderIdentity
/// cleared, as client-go's ReleaseOnCancel does) and exits 0; the standby takes the Lease at its
/// next recheck and writes (here: repairs an edit made while nobody led). All of it as the
/// shipped ServiceAccount under the shipped Role.
#[tokio::test]
async fn a_leader_that_gets_sigterm_releases_the_lease_and_the_standby_takes_over() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "leader").await;
    let admin = plane.admin();
    let mut leader = start_replica(plane, "replica-a");
    leader
        .wait_for(
            "replica-a to hold the Lease and apply the ConfigMap",
            || async {
                let lease = lease(&admin).await?;
                (holder(&lease) == Some("replica-a")).then_some(())?;
                ours_applied(&admin, &ns).await
            },
        )
        .await;
    let mut standby = start_replica(plane, "replica-b");
    let standby_log = standby.process.log().to_owned();
    standby
        .wait_for("replica-b to run as a standby", || {
            let started = std::fs::read_to_string(&standby_log)
                .is_ok_and(|log| log.contains("leader election on"));
            async move { started.then_some(()) }
        })
        .await;
    assert_eq!(
        lease(&admin).await.as_ref().and_then(holder),
        Some("replica-a")
    );

    let status = leader.process.terminate().expect("replica-a exits");
    let log = std::fs::read_to_string(leader.process.log()).unwrap_or_default();
    assert!(status.success(), "exit status {status}\n{log}");
    let released = log
        .find("released the Lease")
        .unwrap_or_else(|| panic!("released, in the log\n{log}"));
    assert!(
        log.find("shutting down").is_some_and(|at| at < released),
        "the controller stopped before the release\n{log}"
    );
    let after = lease(&admin).await.expect("the Lease");
    assert_ne!(holder(&after), Some("replica-a"), "released before exiting");
    // Something to write for whoever leads next.
    api_for(
        &admin,
        &json!({"apiVersion": "v1", "kind": "ConfigMap"}),
        Some(&ns),
    )
    .patch(
        "pi-mpi-hostfile",
        &PatchParams {
            field_manager: Some("kubectl-edit".into()),
            ..Default::default()
        },
        &Patch::Merge(json!({"data": {"hostfile": "edited\n"}})),
    )
    .await
    .expect("edit");

    // A released Lease is taken at the standby's next recheck; an expired one only after the
    // term, which the wait's bound still covers: what tells them apart is the release above.
    standby
        .wait_for(
            "replica-b to take the Lease and repair the edit",
            || async {
                let lease = lease(&admin).await?;
                (holder(&lease) == Some("replica-b")).then_some(())?;
                configmap(&admin, &ns, "pi-mpi-hostfile")
                    .await
                    .filter(|c| c["data"]["hostfile"] == HOSTFILE)
            },
        )
        .await;
    forget(&admin, &job).await;
}

/// The termination message `mpi-webhook preflight` leaves when a worker never resolves.
const PREFLIGHT_LINE: &str =
    "pi-jobset-openmpi-node-0-1.pi-jobset-openmpi: no DNS answer after 300 s";
/// The JobSet-mode sample's launcher Pod.
const JOBSET_LAUNCHER: &str = "pi-jobset-openmpi-launcher-0-0-abcde";

/// A launcher Pod `name` of JobSet `jobset` whose launcher container is `container`, as
/// JobSet's controller would make it (labels included); nothing runs it here, so its status is
/// written as kubelet would, through the status subresource ([`write_status`]).
fn launcher_pod(ns: &str, jobset: &str, name: &str, container: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"jobset.sigs.k8s.io/jobset-name": jobset,
                       "jobset.sigs.k8s.io/replicatedjob-name": "launcher"}},
        "spec": {"restartPolicy": "OnFailure",
                 "initContainers": [{"name": "mpi-preflight", "image": "mpi-webhook"}],
                 "containers": [{"name": container, "image": "mpi"}]}})
}

/// How a container of a launcher Pod ended, as kubelet reports it.
struct Exit<'a> {
    /// `initContainerStatuses` or `containerStatuses`.
    list: &'a str,
    container: &'a str,
    /// Restarts so far: with more than 0, the run before failed the same way (`lastState`).
    restarts: i32,
    code: i32,
    /// `Error`, `OOMKilled`, ...
    reason: &'a str,
    /// The termination message.
    message: &'a str,
}

/// Writes `exit` as the status of `pod`'s container, through the status subresource.
async fn write_status(admin: &Client, ns: &str, pod: &str, exit: Exit<'_>) {
    let terminated = json!({"terminated": {"exitCode": exit.code, "reason": exit.reason,
        "message": exit.message, "startedAt": "2026-12-06T10:00:00Z",
        "finishedAt": "2026-12-06T10:05:00Z"}});
    let last = if exit.restarts > 0 {
        terminated.clone()
    } else {
        json!({})
    };
    let phase = if exit.list == "initContainerStatuses" {
        "Pending"
    } else {
        "Running"
    };
    let status = json!({"status": {"phase": phase, exit.list: [{
        "name": exit.container, "image": "mpi", "imageID": "", "ready": false,
        "restartCount": exit.restarts, "state": terminated, "lastState": last}]}});
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), ns);
    pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("Pod status");
}

/// The pre-flight's failed run: `restarts` before it, exit 1 with [`PREFLIGHT_LINE`].
fn preflight_failed(restarts: i32) -> Exit<'static> {
    Exit {
        list: "initContainerStatuses",
        container: "mpi-preflight",
        restarts,
        code: 1,
        reason: "Error",
        message: PREFLIGHT_LINE,
    }
}

/// `kubectl describe OBJECT` lists a Warning Event `reason` whose note starts with `note`, as a
/// user sees it. Skipped, with a line on stderr, where kubectl is not installed.
fn describe_shows(plane: &ControlPlane, ns: &str, object: &str, reason: &str, note: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = plane
        .write_kubeconfig(&dir.path().join("kubeconfig"), control_plane::ADMIN)
        .expect("kubeconfig");
    let output = match std::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["describe", "-n", ns, object])
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            eprintln!("kubectl describe skipped: kubectl not runnable ({e})");
            return;
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kubectl describe: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains(reason))
        .unwrap_or_else(|| panic!("no {reason} in kubectl describe {object}:\n{text}"));
    assert!(line.trim_start().starts_with("Warning"), "{line}");
    assert!(
        line.ends_with(note.lines().next().unwrap_or_default()),
        "{line}"
    );
}

/// Waits until `reconciler` has counted `count` Events of its own in `metric`.
async fn recorded_by(reconciler: &mut Reconciler, metric: &'static str, count: u64) {
    let metrics = reconciler.metrics;
    reconciler
        .wait_for(&format!("{metric} {count}"), || async move {
            let text = crate::support::get_plain(metrics, "/metrics").await?;
            (crate::prometheus::sum(&text, metric) == count).then_some(())
        })
        .await;
}

/// The UID of Pod `name`.
async fn pod_uid(admin: &Client, ns: &str, name: &str) -> String {
    get(admin, "v1", "Pod", ns, name).await.expect("the Pod")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string()
}

/// Waits for the first Event `reason` in `ns`, and returns it.
async fn first_event(reconciler: &mut Reconciler, admin: &Client, ns: &str, reason: &str) -> Value {
    reconciler
        .wait_for(&format!("a {reason} Event"), || async {
            events(admin, ns, reason).await.into_iter().next()
        })
        .await
}

/// Waits for the second Event `reason` in `ns` and returns the names of all of them, sorted.
async fn two_events(
    reconciler: &mut Reconciler,
    admin: &Client,
    ns: &str,
    reason: &str,
) -> Vec<String> {
    let all = reconciler
        .wait_for(&format!("a second {reason} Event"), || async {
            let all = events(admin, ns, reason).await;
            (all.len() >= 2).then_some(all)
        })
        .await;
    let mut names: Vec<String> = all
        .iter()
        .filter_map(|e| e["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort_unstable();
    names
}

/// A failed run of one container of the JobSet-mode sample's launcher Pod, as each test below
/// sees it.
struct Scenario<'a> {
    /// The namespace's prefix.
    prefix: &'a str,
    /// The Event's reason, and the metric counting it.
    reason: &'a str,
    metric: &'static str,
    /// The Event names' part between the Pod's UID and the run.
    infix: &'a str,
    /// The container's failed run after `restarts` restarts.
    exit: &'a dyn Fn(i32) -> Exit<'a>,
    /// Checks the first Event's note.
    note: &'a dyn Fn(&str),
    /// What `kubectl describe` shows on the Event's row.
    row: &'a str,
    /// The Event's `related.fieldPath`.
    field_path: &'a str,
}

/// The container's failed run becomes one Warning Event on the JobSet; a restarted reconciler
/// records nothing twice, and each failed restart of the container adds one.
async fn one_event_per_failed_run_on_the_jobset(plane: &ControlPlane, case: Scenario<'_>) {
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, created) = with_jobset(plane, case.prefix, &[]).await;
    let admin = plane.admin();
    let pod = launcher_pod(&ns, "pi-jobset-openmpi", JOBSET_LAUNCHER, "launcher");
    create(&admin, &pod).await.expect("Pod");

    let mut reconciler = Reconciler::start(plane, &[]);
    write_status(&admin, &ns, JOBSET_LAUNCHER, (case.exit)(0)).await;
    let recorded = first_event(&mut reconciler, &admin, &ns, case.reason).await;
    assert_eq!(recorded["type"], "Warning");
    (case.note)(recorded["note"].as_str().expect("a note"));
    assert_eq!(
        recorded["regarding"],
        json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
               "name": "pi-jobset-openmpi", "namespace": ns,
               "uid": created["metadata"]["uid"]})
    );
    assert_eq!(recorded["related"]["name"], JOBSET_LAUNCHER);
    assert_eq!(recorded["related"]["fieldPath"], case.field_path);
    recorded_by(&mut reconciler, case.metric, 1).await;
    let jobset = "jobset/pi-jobset-openmpi";
    describe_shows(plane, &ns, jobset, case.reason, case.row);
    drop(reconciler);

    // A new reconciler lists the same failure: it is recorded already. The container's restart,
    // failed again, is one more.
    let mut reconciler = Reconciler::start(plane, &[]);
    write_status(&admin, &ns, JOBSET_LAUNCHER, (case.exit)(1)).await;
    let names = two_events(&mut reconciler, &admin, &ns, case.reason).await;
    let uid = pod_uid(&admin, &ns, JOBSET_LAUNCHER).await;
    let infix = case.infix;
    assert_eq!(
        names,
        [format!("{uid}.{infix}-0"), format!("{uid}.{infix}-1")]
    );
    // Only the restart's is this reconciler's: the first one it found recorded.
    recorded_by(&mut reconciler, case.metric, 1).await;
    forget(&admin, &created).await;
}

/// A failed `mpi-preflight`: `PreflightFailed`, whose note is the termination message.
#[tokio::test]
async fn a_failed_preflight_is_one_warning_event_on_the_jobset_per_failed_run() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let scenario = Scenario {
        prefix: "preflight",
        reason: "PreflightFailed",
        metric: PREFLIGHT_FAILURES,
        infix: "preflight",
        exit: &preflight_failed,
        note: &|note| assert_eq!(note, PREFLIGHT_LINE),
        row: PREFLIGHT_LINE,
        field_path: "spec.initContainers{mpi-preflight}",
    };
    one_event_per_failed_run_on_the_jobset(plane, scenario).await;
}

/// What the JobSet's launcher printed last before `mpirun` gave up (more than a note holds).
fn launcher_output() -> String {
    let noise = "rank 0: step 99 loss 0.1\n".repeat(60);
    format!(
        "{noise}MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD with errorcode 3"
    )
}

/// A launcher container that exits 3: `LauncherFailed`, the exit code and the end of its
/// output, from a whole line, in 1 kB.
#[tokio::test]
async fn a_failed_launcher_is_one_warning_event_on_the_jobset_per_failed_run() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let output = launcher_output();
    let head =
        format!("launcher in Pod {JOBSET_LAUNCHER} exited with code 3 (Error); its last output:");
    let note = |note: &str| {
        // The tail starts at a whole line: the `rank 0: ...` lines are 25 bytes.
        assert!(
            note.starts_with(&format!("{head}\n…rank 0: step 99")),
            "{note}"
        );
        assert!(note.ends_with("with errorcode 3"), "{note}");
        assert!(
            note.len() <= 1024 && note.len() > 1024 - 25,
            "{} bytes",
            note.len()
        );
    };
    let scenario = Scenario {
        prefix: "launcher",
        reason: "LauncherFailed",
        metric: LAUNCHER_FAILURES,
        infix: "launcher",
        exit: &|restarts| Exit {
            list: "containerStatuses",
            container: "launcher",
            restarts,
            code: 3,
            reason: "Error",
            message: &output,
        },
        note: &note,
        row: &head,
        field_path: "spec.containers{launcher}",
    };
    one_event_per_failed_run_on_the_jobset(plane, scenario).await;
}

/// In TrainJob mode the launcher container of Trainer's JobSet (`node`) killed for memory is a
/// `LauncherFailed` Event on the TrainJob that says so.
#[tokio::test]
async fn an_oom_killed_trainjob_launcher_is_a_warning_event_on_the_trainjob() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let _turn = RECONCILER_TURN.lock().await;
    let (ns, job) = with_train_job(plane, "launcher-oom").await;
    let admin = plane.admin();
    let name = "pi-launcher-0-0-abcde";
    create(&admin, &launcher_pod(&ns, "pi", name, "node"))
        .await
        .expect("Pod");
    let mut reconciler = Reconciler::start(plane, &[]);
    let oom = Exit {
        list: "containerStatuses",
        container: "node",
        restarts: 0,
        code: 137,
        reason: "OOMKilled",
        message: "",
    };
    write_status(&admin, &ns, name, oom).await;
    let recorded = first_event(&mut reconciler, &admin, &ns, "LauncherFailed").await;
    let note = format!(
        "node in Pod {name} exited with code 137: OOMKilled, out of memory (killed for going over its memory limit)"
    );
    assert_eq!(recorded["note"], note.as_str());
    assert_eq!(
        recorded["regarding"],
        json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "name": "pi", "namespace": ns, "uid": job["metadata"]["uid"]})
    );
    recorded_by(&mut reconciler, LAUNCHER_FAILURES, 1).await;
    describe_shows(plane, &ns, "trainjob/pi", "LauncherFailed", &note);
    forget(&admin, &job).await;
}
