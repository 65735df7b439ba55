//! TrainJob and runtime validation: upstream TestValidate (E.2), the runtime webhook rules and
//! the Decisions, each asserting the exact message.

use mpi_webhook::api::RuntimeKind;
use mpi_webhook::field_error::aggregate;
use mpi_webhook::mpi::validate::{validate_runtime, validate_train_job};
use mpi_webhook::raw_json::RawJson;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::*;

fn check(rt: &Value, tj: &Value) -> Option<String> {
    let errors = validate_train_job(
        &typed_train_job(tj),
        &RawJson::from(tj),
        &typed_runtime(rt),
        RuntimeKind::TrainingRuntime,
    );
    aggregate(&errors)
}

fn check_runtime(rt: &Value, kind: RuntimeKind, update: bool) -> Option<String> {
    aggregate(&validate_runtime(
        &typed_runtime(rt),
        &RawJson::from(rt),
        kind,
        update,
    ))
}

const TOPOLOGY: &str = "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either launcher and node";

#[test]
fn e2_1_to_3_no_errors_without_mpi_policy() {
    let tj =
        train_job(json!({"numNodes": 5, "env": [{"name": "OMPI_MCA_plm_rsh_args", "value": "x"}]}));
    for spec in [
        json!({}),
        json!({"mlPolicy": {}}),
        json!({"mlPolicy": {"numNodes": 2}}),
    ] {
        assert_eq!(check(&json!({"spec": spec}), &tj), None);
    }
}

#[test]
fn e2_4_num_proc_per_node_int_is_valid() {
    let rt = runtime(
        json!({"numProcPerNode": 1, "mpiImplementation": "OpenMPI"}),
        vec![rjob("node", true, &["node"])],
    );
    assert_eq!(check(&rt, &train_job(json!({"numProcPerNode": 8}))), None);
}

#[test]
fn e2_5_launcher_missing_but_one_node_is_valid() {
    let rt = runtime(
        json!({"runLauncherAsNode": true}),
        vec![rjob("node", true, &["node"])],
    );
    assert_eq!(check(&rt, &train_job(json!({"numNodes": 1}))), None);
}

#[test]
fn e2_6_to_8_run_launcher_as_node_needs_launcher_and_node() {
    for rjobs in [
        vec![rjob("node", true, &["node"])],
        vec![rjob("launcher", true, &["node"])],
        vec![],
    ] {
        let rt = runtime(
            json!({"numProcPerNode": 1, "runLauncherAsNode": true}),
            rjobs,
        );
        assert_eq!(
            check(&rt, &train_job(json!({"numNodes": 2}))),
            Some(format!(
                "spec.trainer.numNodes: Invalid value: 2: {TOPOLOGY}"
            ))
        );
    }
}

#[test]
fn e2_9_reserved_env_is_denied_with_the_raw_env_list() {
    let rt = runtime(
        json!({"numProcPerNode": 1, "mpiImplementation": "OpenMPI"}),
        vec![rjob("node", true, &["node"])],
    );
    let tj = train_job(
        json!({"env": [{"name": "OMPI_MCA_orte_default_hostfile", "value": "/custom/hostfile"}]}),
    );
    assert_eq!(
        check(&rt, &tj).as_deref(),
        Some(
            r#"spec.trainer.env: Invalid value: [{"name":"OMPI_MCA_orte_default_hostfile","value":"/custom/hostfile"}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile]"#
        )
    );
}

#[test]
fn e2_10_several_reserved_envs_make_one_error_sorted_and_deduplicated() {
    let rt = runtime(json!({}), vec![rjob("node", true, &["node"])]);
    let tj = train_job(json!({"env": [
        {"name": "OMPI_MCA_plm_rsh_args", "value": "custom-args"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/custom/hostfile"},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "again"}
    ]}));
    assert_eq!(
        check(&rt, &tj).as_deref(),
        Some(
            r#"spec.trainer.env: Invalid value: [{"name":"OMPI_MCA_plm_rsh_args","value":"custom-args"},{"name":"OMPI_MCA_orte_default_hostfile","value":"/custom/hostfile"},{"name":"OMPI_MCA_plm_rsh_args","value":"again"}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile OMPI_MCA_plm_rsh_args]"#
        )
    );
}

#[test]
fn e2_11_non_reserved_env_is_valid() {
    let rt = runtime(json!({}), vec![rjob("node", true, &["node"])]);
    assert_eq!(
        check(
            &rt,
            &train_job(json!({"env": [{"name": "CUSTOM_ENV", "value": "custom-value"}]}))
        ),
        None
    );
}

#[test]
fn decision_6_reserved_names_follow_the_runtime_implementation() {
    let tj = |name: &str| train_job(json!({"env": [{"name": name, "value": "x"}]}));
    let open_mpi = runtime(
        json!({"mpiImplementation": "OpenMPI"}),
        vec![rjob("node", true, &["node"])],
    );
    let intel = runtime(
        json!({"mpiImplementation": "Intel"}),
        vec![rjob("node", true, &["node"])],
    );
    let mpich = runtime(
        json!({"mpiImplementation": "MPICH"}),
        vec![rjob("node", true, &["node"])],
    );
    assert_eq!(check(&open_mpi, &tj("I_MPI_PERHOST")), None);
    assert_eq!(check(&intel, &tj("OMPI_MCA_plm_rsh_args")), None);
    assert!(
        check(&open_mpi, &tj("PRTE_MCA_prte_set_default_slots"))
            .is_some_and(|m| m.ends_with("[PRTE_MCA_prte_set_default_slots]"))
    );
    assert!(check(&intel, &tj("I_MPI_PERHOST")).is_some_and(|m| m.ends_with("[I_MPI_PERHOST]")));
    assert!(
        check(&mpich, &tj("HYDRA_HOST_FILE")).is_some_and(|m| m.ends_with("[HYDRA_HOST_FILE]"))
    );
}

#[test]
fn decision_9_env_value_keeps_key_order_and_go_escaping() {
    let rt = runtime(json!({}), vec![rjob("node", true, &["node"])]);
    let tj = train_job(json!({"env": [{"value": "<a&b>", "name": "OMPI_MCA_plm_rsh_args"}]}));
    assert_eq!(
        check(&rt, &tj).as_deref(),
        Some(
            r#"spec.trainer.env: Invalid value: [{"value":"\u003ca\u0026b\u003e","name":"OMPI_MCA_plm_rsh_args"}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_plm_rsh_args]"#
        )
    );
}

#[test]
fn several_errors_are_bracketed_in_rule_order() {
    let rt = runtime(
        json!({"runLauncherAsNode": true}),
        vec![rjob("node", true, &["node"])],
    );
    let tj = train_job(
        json!({"numNodes": 3, "env": [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "x"}]}),
    );
    assert_eq!(
        check(&rt, &tj).as_deref(),
        Some(
            format!(
                r#"[spec.trainer.numNodes: Invalid value: 3: {TOPOLOGY}, spec.trainer.env: Invalid value: [{{"name":"OMPI_MCA_orte_keep_fqdn_hostnames","value":"x"}}]: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_keep_fqdn_hostnames]]"#
            )
            .as_str()
        )
    );
}

#[test]
fn trainjob_without_trainer_is_valid() {
    let rt = runtime(json!({"runLauncherAsNode": true}), vec![]);
    assert_eq!(check(&rt, &train_job(Value::Null)), None);
}

#[test]
fn decision_8_negative_num_nodes_is_denied() {
    let rt = runtime(
        json!({}),
        vec![
            rjob("launcher", false, &["node"]),
            rjob("node", true, &["node"]),
        ],
    );
    assert_eq!(
        check(&rt, &train_job(json!({"numNodes": -1}))).as_deref(),
        Some("spec.trainer.numNodes: Invalid value: -1: must be greater than or equal to 0")
    );
}

#[test]
fn decision_8_hostfile_larger_than_a_configmap_is_denied() {
    let rt = runtime(
        json!({}),
        vec![
            rjob("launcher", false, &["node"]),
            rjob("node", true, &["node"]),
        ],
    );
    let fits = train_job(json!({"numNodes": 20000}));
    assert_eq!(check(&rt, &fits), None);
    let huge = train_job(json!({"numNodes": 2147483647}));
    let message = check(&rt, &huge).expect("denied");
    assert!(
        message.starts_with(
            "spec.trainer.numNodes: Invalid value: 2147483647: the MPI hostfile would be "
        ),
        "{message}"
    );
    assert!(
        message.ends_with(" bytes, over the 1048576-byte limit of a ConfigMap"),
        "{message}"
    );
}

#[test]
fn decisions_4_and_7_unsupported_implementation_names_runtime_and_value() {
    for value in ["", "LAM/MPI"] {
        let rt = runtime(
            json!({"mpiImplementation": value}),
            vec![rjob("node", true, &["node"])],
        );
        assert_eq!(
            check(&rt, &train_job(json!({"numNodes": 2}))),
            Some(format!(
                r#"spec.runtimeRef: Invalid value: {{"name":"test-runtime","apiGroup":"trainer.kubeflow.org","kind":"TrainingRuntime"}}: TrainingRuntime "test-runtime" has an unsupported spec.mlPolicy.mpi.mpiImplementation "{value}": supported values: "OpenMPI", "Intel", "MPICH""#
            ))
        );
        assert_eq!(
            check_runtime(&rt, RuntimeKind::TrainingRuntime, false),
            Some(format!(
                r#"spec.mlPolicy.mpi.mpiImplementation: Unsupported value: "{value}": supported values: "OpenMPI", "Intel", "MPICH""#
            ))
        );
    }
}

#[test]
fn decision_10_crd_rules_as_webhook_messages() {
    let mut rt = runtime(
        json!({"numProcPerNode": 0}),
        vec![rjob("node", true, &["node"])],
    );
    assert_eq!(
        check_runtime(&rt, RuntimeKind::ClusterTrainingRuntime, true).as_deref(),
        Some(
            "spec.mlPolicy.mpi.numProcPerNode: Invalid value: 0: NumProcPerNode in mpiPolicy must be >= 1"
        )
    );
    rt["spec"]["mlPolicy"] = json!({"mpi": {}, "torch": {"numProcPerNode": "auto"}});
    assert_eq!(
        check_runtime(&rt, RuntimeKind::TrainingRuntime, false).as_deref(),
        Some(r#"spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured"#)
    );
}

/// Found by the `mutation` fuzz target: the SSH Secret mounted where the hostfile is would have
/// the two mounts (upserted by mountPath) replace each other on every pass.
#[test]
fn ssh_auth_mount_path_on_the_hostfile_is_denied() {
    let rt = runtime(
        json!({"sshAuthMountPath": "/etc/mpi"}),
        vec![rjob("node", true, &["node"])],
    );
    assert_eq!(
        check_runtime(&rt, RuntimeKind::ClusterTrainingRuntime, false).as_deref(),
        Some(
            r#"spec.mlPolicy.mpi.sshAuthMountPath: Invalid value: "/etc/mpi": must not be /etc/mpi, where the hostfile is mounted"#
        )
    );
}

#[test]
fn runtime_ancestor_rules() {
    let mut launcher = rjob("launcher", true, &["launcher"]);
    launcher["replicas"] = json!(2);
    let mut init = rjob("model-initializer", false, &["node"]);
    init["template"]["metadata"] = json!({"labels": {TRAINER_LABEL: "model-initializer"}});
    let rt = runtime(
        json!({}),
        vec![rjob("node", false, &["node"]), launcher, init],
    );
    let expected = r#"[spec.template.spec.replicatedJobs[1].replicas: Invalid value: 2: always must be 1, spec.template.spec.replicatedJobs[1].template.spec.template.spec.containers: Invalid value: [{"name":"launcher","image":"test:runtime"}]: must contain the required container for the ancestor: trainer, spec.template.spec.replicatedJobs[2].template.spec.template.spec.containers: Invalid value: [{"name":"node","image":"test:runtime"}]: must contain the required container for the ancestor: model-initializer]"#;
    assert_eq!(
        check_runtime(&rt, RuntimeKind::TrainingRuntime, false).as_deref(),
        Some(expected)
    );
    assert_eq!(
        check_runtime(&rt, RuntimeKind::ClusterTrainingRuntime, true).as_deref(),
        Some(expected)
    );
    // Upstream's TrainingRuntime UPDATE does not re-check the ancestor rules.
    assert_eq!(check_runtime(&rt, RuntimeKind::TrainingRuntime, true), None);
}

#[test]
fn upstream_runtimes_are_valid() {
    for file in ["deepspeed_distributed.yaml", "mlx_distributed.yaml"] {
        let rt = upstream_runtime(file);
        assert_eq!(
            check_runtime(&rt, RuntimeKind::ClusterTrainingRuntime, false),
            None,
            "{file}"
        );
    }
}
