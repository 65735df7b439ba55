//! Development stand-in for the product, selected with `MPI_LAUNCHERS_PRODUCT=spec` (refused under
//! CI): the Secret, hostfile and JobSet changes written by hand from the behaviour spec (sections C, D
//! and Decisions 5 and 16) *with the changes this test showed the launchers need* (marked
//! "launchers:" below). It lets a failure be told apart: the spec (or the environment) vs. the
//! implementation. Never the default.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::proc;
use crate::product::{Inputs, Products};

fn upsert(list: &mut Value, key: &str, item: Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    let Some(arr) = list.as_array_mut() else {
        return;
    };
    match arr.iter_mut().find(|x| x[key] == item[key]) {
        Some(slot) => *slot = item,
        None => arr.push(item),
    }
}

pub fn run(inputs: &Inputs, work: &Path) -> Result<Products> {
    let trainer = inputs
        .trainer
        .as_ref()
        .context("the spec model covers TrainJob mode only")?;
    let tj = &trainer.trainjob;
    let name = tj["metadata"]["name"].as_str().context("name")?;
    let ns = tj["metadata"]["namespace"].as_str().context("namespace")?;
    let mpi = &trainer.runtime["spec"]["mlPolicy"]["mpi"];
    let slots = mpi["numProcPerNode"].as_u64().unwrap_or(1);
    let imp = mpi["mpiImplementation"].as_str().unwrap_or("OpenMPI");
    let lan = mpi["runLauncherAsNode"].as_bool().unwrap_or(false);
    let mount = mpi["sshAuthMountPath"].as_str().unwrap_or("/root/.ssh");
    let n = tj["spec"]["trainer"]["numNodes"].as_u64().unwrap_or(1);
    let node_count = if lan { n.saturating_sub(1).max(1) } else { n };

    // Keys: ECDSA P-521, SEC1 PEM ("EC PRIVATE KEY"), OpenSSH public line without comment.
    let key = work.join("spec-key");
    proc::run_ok(
        Command::new("ssh-keygen")
            .args([
                "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-C", "", "-f",
            ])
            .arg(&key),
        Duration::from_secs(30),
    )?;
    let private = std::fs::read(&key)?;
    let public = format!(
        "{}\n",
        std::fs::read_to_string(key.with_extension("pub"))?.trim()
    );
    std::fs::remove_file(&key)?;
    std::fs::remove_file(key.with_extension("pub"))?;

    let mut hostfile = String::new();
    let mut rjobs: Vec<(String, u64)> = Vec::new();
    for rj in inputs.jobset["spec"]["replicatedJobs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let rname = rj["name"].as_str().unwrap_or("");
        let count = match rname {
            "node" => node_count,
            "launcher" if lan => rj["template"]["spec"]["parallelism"].as_u64().unwrap_or(1),
            _ => continue,
        };
        rjobs.push((rname.to_string(), count));
    }
    for (rname, count) in &rjobs {
        for p in 0..*count {
            let short = format!("{name}-{rname}-0-{p}");
            // launchers: Hydra (MPICH 4.0, Intel MPI 2021) recognizes the launcher's own line as
            // local only by its hostname; `<pod>.<subdomain>` makes it ssh to itself.
            let host = if rname == "launcher" && imp != "OpenMPI" {
                short
            } else {
                format!("{short}.{name}")
            };
            match imp {
                "OpenMPI" => hostfile.push_str(&format!("{host} slots={slots}\n")),
                _ => hostfile.push_str(&format!("{host}:{slots}\n")),
            }
        }
    }
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{name}-mpi-ssh-auth"), "namespace": ns},
        "type": "kubernetes.io/ssh-auth", "immutable": true,
        "data": {"ssh-privatekey": B64.encode(&private), "ssh-publickey": B64.encode(public.as_bytes())},
    });
    let configmap = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-mpi-hostfile"), "namespace": ns},
        "data": {"hostfile": hostfile},
    });

    // TrainJob mode: upstream's 0640 (Decision 16); the pods run as user 1000 with fsGroup, so
    // the key is root's and readable through the group, which ssh accepts. (this test found that a
    // root launcher needs 0600: that is JobSet mode's, Decision 18.)
    let key_mode: u64 = 0o640;
    let ssh_vol = json!({"name": "mpi-ssh-auth", "secret": {
    "secretName": format!("{name}-mpi-ssh-auth"), "defaultMode": 256,
    "items": [
        {"key": "ssh-privatekey", "path": "id_rsa", "mode": key_mode},
        {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 420},
        {"key": "ssh-publickey", "path": "authorized_keys", "mode": 420},
    ]}});
    let hf_vol = json!({"name": "mpi-hostfile", "configMap": {
        "name": format!("{name}-mpi-hostfile"),
        "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]}});
    let s = slots.to_string();
    let env: Vec<(&str, &str)> = match imp {
        "OpenMPI" => vec![
            ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
            ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
            ("OMPI_MCA_orte_set_default_slots", &s),
            ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
            ("PRTE_MCA_prte_default_hostfile", "/etc/mpi/hostfile"),
            ("PRTE_MCA_prte_keep_fqdn_hostnames", "false"),
            ("PRTE_MCA_prte_set_default_slots", &s),
            ("PRTE_MCA_plm_ssh_args", "-o ConnectionAttempts=10"),
        ],
        "Intel" => vec![
            ("I_MPI_HYDRA_HOST_FILE", "/etc/mpi/hostfile"),
            (
                "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS",
                "-o ConnectionAttempts=10",
            ),
            ("I_MPI_PERHOST", &s),
            // launchers: workers call back to the launcher's hostname, which pods cannot resolve.
            ("I_MPI_HYDRA_IFACE", "eth0"),
        ],
        _ => vec![
            ("HYDRA_HOST_FILE", "/etc/mpi/hostfile"),
            ("HYDRA_LAUNCHER_EXTRA_ARGS", "-o ConnectionAttempts=10"),
            // launchers: as for Intel.
            ("HYDRA_IFACE", "eth0"),
        ],
    };

    let mut jobset = inputs.jobset.clone();
    for rj in jobset["spec"]["replicatedJobs"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let rname = rj["name"].as_str().unwrap_or("").to_string();
        if rname != "node" && rname != "launcher" {
            continue;
        }
        if rname == "node" {
            rj["template"]["spec"]["parallelism"] = json!(node_count);
            rj["template"]["spec"]["completions"] = json!(node_count);
        }
        let pod = &mut rj["template"]["spec"]["template"]["spec"];
        upsert(&mut pod["volumes"], "name", ssh_vol.clone());
        if rname == "launcher" {
            upsert(&mut pod["volumes"], "name", hf_vol.clone());
        }
        for c in pod["containers"].as_array_mut().into_iter().flatten() {
            if c["name"] != "node" {
                continue;
            }
            upsert(
                &mut c["volumeMounts"],
                "mountPath",
                json!({"name": "mpi-ssh-auth", "mountPath": mount}),
            );
            if rname == "launcher" {
                upsert(
                    &mut c["volumeMounts"],
                    "mountPath",
                    json!({"name": "mpi-hostfile", "mountPath": "/etc/mpi"}),
                );
                for (k, v) in &env {
                    upsert(&mut c["env"], "name", json!({"name": k, "value": v}));
                }
            }
        }
    }
    Ok(Products {
        rendered: vec![secret, configmap],
        jobset,
    })
}
