//! Counts of any size or sign (numNodes, numProcPerNode, parallelism, replicas, GPUs) through the
//! plan of both modes (a TrainJob on its runtime, and a JobSet-mode JobSet) and the hostfile: the
//! hostfile is built only when it fits a ConfigMap, its size is the one computed beforehand, and
//! nothing allocates in proportion to an unchecked number (a counting allocator measures the
//! peak while the hostfile is built).
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mpi_webhook::api::{JobSet, TrainJob, TrainingRuntime};
use mpi_webhook::mpi::HOSTFILE_MAX_BYTES;
use mpi_webhook::mpi::hostfile::{hostfile, hostfile_len};
use mpi_webhook::mpi::implementation::IMPLEMENTATIONS;
use mpi_webhook::mpi::plan::MpiPlan;
use serde_json::json;

/// The system allocator, counting the bytes live and the peak since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Arbitrary, Debug)]
struct Counts {
    implementation: u8,
    num_nodes: Option<i32>,
    num_proc_per_node: Option<i32>,
    runtime_num_proc_per_node: Option<i32>,
    ml_policy_num_nodes: Option<i32>,
    node_parallelism: Option<i32>,
    node_replicas: Option<i32>,
    launcher_parallelism: Option<i32>,
    launcher_replicas: Option<i32>,
    launcher_is_trainer: bool,
    run_launcher_as_node: bool,
    gpus: Option<i64>,
    name_len: u8,
    subdomain_len: u8,
    /// JobSet mode: a second worker group `gpu` (replicas, parallelism), the
    /// `worker-groups` annotation and the `slots-per-group` one (indices into the lists below).
    gpu_group: Option<(Option<i32>, Option<i32>)>,
    worker_groups: Option<u8>,
    slots_per_group: Option<u8>,
}

/// `mpi-webhook.io/worker-groups` values worth trying.
const WORKER_GROUPS: &[&str] = &[
    "node",
    "node,gpu",
    "gpu,node",
    "gpu",
    "node,node",
    "launcher,node",
    "",
];
/// `mpi-webhook.io/slots-per-group` values worth trying.
const SLOTS_PER_GROUP: &[&str] = &[
    "gpu=2",
    "node=1,gpu=4",
    "gpu=0",
    "gpu=99999999999",
    "gpu",
    "x=1",
];

fuzz_target!(|c: Counts| {
    let implementation =
        IMPLEMENTATIONS[usize::from(c.implementation) % IMPLEMENTATIONS.len()].name;
    let name: String = "j".repeat(usize::from(c.name_len % 64).max(1));
    let subdomain: String = "s".repeat(usize::from(c.subdomain_len % 64));
    let trainer_label = json!({"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"});
    // The JobSet spec: the runtime's template in TrainJob mode, the JobSet's own spec in JobSet
    // mode.
    let runtime_template = json!({
        "network": {"subdomain": subdomain},
        "replicatedJobs": [
            {"name": "node", "replicas": c.node_replicas, "template": {"spec": {
                "parallelism": c.node_parallelism,
                "template": {"spec": {"containers": [{"name": "node"}]}}}}},
            {"name": "launcher", "replicas": c.launcher_replicas, "template": {
                "metadata": {"labels": if c.launcher_is_trainer { trainer_label } else { json!({}) }},
                "spec": {
                    "parallelism": c.launcher_parallelism,
                    "template": {"spec": {"containers": [{"name": "node"}]}}}}}
        ]
    });
    let runtime = json!({
        "metadata": {"name": "rt"},
        "spec": {
            "mlPolicy": {
                "numNodes": c.ml_policy_num_nodes,
                "mpi": {
                    "numProcPerNode": c.runtime_num_proc_per_node,
                    "mpiImplementation": implementation,
                    "runLauncherAsNode": c.run_launcher_as_node,
                }
            },
            "template": {"spec": runtime_template.clone()}
        }
    });
    let train_job = json!({
        "metadata": {"name": name, "namespace": "default", "uid": "u"},
        "spec": {
            "runtimeRef": {"name": "rt"},
            "trainer": {
                "numNodes": c.num_nodes,
                "numProcPerNode": c.num_proc_per_node,
                "resourcesPerNode": c.gpus.map(|g| json!({"limits": {"nvidia.com/gpu": g}})),
            }
        }
    });
    let (Ok(runtime), Ok(train_job)) = (
        serde_json::from_value::<TrainingRuntime>(runtime),
        serde_json::from_value::<TrainJob>(train_job),
    ) else {
        return;
    };
    if let Ok(Some(plan)) = MpiPlan::new(&train_job, &runtime) {
        check_hostfile(&plan);
    }
    // JobSet mode: the same counts as the JobSet's own, slots from the annotation.
    let mut annotations = serde_json::Map::new();
    annotations.insert(
        "mpi-webhook.io/run-launcher-as-node".into(),
        json!(c.run_launcher_as_node.to_string()),
    );
    if let Some(slots) = c.num_proc_per_node {
        annotations.insert(
            "mpi-webhook.io/slots-per-node".into(),
            json!(slots.to_string()),
        );
    }
    if let Some(i) = c.worker_groups {
        let groups = WORKER_GROUPS[usize::from(i) % WORKER_GROUPS.len()];
        annotations.insert("mpi-webhook.io/worker-groups".into(), json!(groups));
    }
    if let Some(i) = c.slots_per_group {
        let slots = SLOTS_PER_GROUP[usize::from(i) % SLOTS_PER_GROUP.len()];
        annotations.insert("mpi-webhook.io/slots-per-group".into(), json!(slots));
    }
    let mut spec = runtime_template;
    if let (Some((replicas, parallelism)), Some(jobs)) =
        (c.gpu_group, spec["replicatedJobs"].as_array_mut())
    {
        jobs.push(
            json!({"name": "gpu", "replicas": replicas, "template": {"spec": {
            "parallelism": parallelism,
            "template": {"spec": {"containers": [{"name": "node"}]}}}}}),
        );
    }
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default", "uid": "u",
                     "labels": {"mpi-webhook.io/implementation": implementation},
                     "annotations": annotations},
        "spec": spec,
    });
    if let Ok(jobset) = serde_json::from_value::<JobSet>(jobset)
        && let Ok(plan) = MpiPlan::for_jobset(&jobset, &Default::default())
    {
        check_hostfile(&plan);
    }
});

/// The hostfile of `plan` is built only when it fits, with the size predicted beforehand, and
/// building it allocates no more than twice the limit.
fn check_hostfile(plan: &MpiPlan) {
    let expected = hostfile_len(plan);
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let built = hostfile(plan);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    // The text, grown by doubling, and the line being formatted.
    let max_bytes = usize::try_from(HOSTFILE_MAX_BYTES).unwrap_or(usize::MAX);
    assert!(
        peak <= 2 * max_bytes + 64 * 1024,
        "building a hostfile allocated {peak} bytes (plan: {plan:?})"
    );
    match built {
        Ok(text) => {
            assert_eq!(
                text.len() as u128,
                expected,
                "hostfile_len predicts the size"
            );
            assert!(expected <= u128::from(HOSTFILE_MAX_BYTES));
        }
        Err(too_large) => {
            assert!(expected > u128::from(HOSTFILE_MAX_BYTES));
            assert_eq!(too_large.size, expected);
        }
    }
}
