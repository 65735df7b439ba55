//! The kube-apiserver's validation of a Job's pod template, as a pure check of its JSON, for the
//! tests: the rules of `ValidatePodTemplateSpec` (k8s.io/kubernetes pkg/apis/core/validation)
//! and the Job's `restartPolicy` rule that a patch of ours could break. Volumes (names, one
//! source, secret and configMap items and modes), containers and init containers (names unique
//! across both, an image), mounts (of a volume that exists, each mountPath once per container),
//! env (names, value or valueFrom), ports, probes (one handler, a port in range; none on an init
//! container that is not a sidecar), termination message policy, and requests within limits.
//!
//! Each error is one line in the apiserver's own form, `field: Type: detail`, the field named
//! from the pod template (`spec.containers[0].image: Required value`). The schema (types and
//! unknown fields) is checked apart, by `tests/validate_manifests.py`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The volume sources a pod volume may name exactly one of.
const VOLUME_SOURCES: [&str; 27] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "secret",
];

/// The probe handlers a probe names exactly one of.
const PROBE_HANDLERS: [&str; 4] = ["exec", "httpGet", "tcpSocket", "grpc"];

const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
    characters or '-', and must start and end with an alphanumeric character";

fn items(value: &Value) -> impl Iterator<Item = (usize, &Value)> {
    value.as_array().into_iter().flatten().enumerate()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// Lower case letters, digits and '-', and at most `max` of them, neither end a '-': what both
/// a DNS-1123 label and a port name are made of.
fn is_lower_alnum_dash(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_dns1123_label(name: &str) -> bool {
    is_lower_alnum_dash(name, 63)
}

/// `IsValidPortName`: at most 15 characters, at least one letter, no two '-' in a row.
fn is_port_name(name: &str) -> bool {
    is_lower_alnum_dash(name, 15)
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.contains("--")
}

/// `IsEnvVarName` (the strict form, before relaxed validation): `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(name: &str) -> bool {
    let ok = |b: &u8, first: bool| {
        b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_') || (!first && b.is_ascii_digit())
    };
    let mut bytes = name.as_bytes().iter();
    bytes.next().is_some_and(|b| ok(b, true)) && bytes.all(|b| ok(b, false))
}

/// A file mode: 0 to 0777.
fn mode_errors(mode: &Value, at: &str, out: &mut Vec<String>) {
    if !mode.is_null() && mode.as_u64().is_none_or(|m| m > 0o777) {
        out.push(format!(
            "{at}: Invalid value: {mode}: must be a number between 0 and 0777 (octal), both inclusive"
        ));
    }
}

/// The `items` of a secret or configMap volume: a key, a relative path without '..', a mode.
fn key_to_path_errors(source: &Value, at: &str, out: &mut Vec<String>) {
    for (j, item) in items(&source["items"]) {
        let at = format!("{at}.items[{j}]");
        if text(&item["key"]).is_empty() {
            out.push(format!("{at}.key: Required value"));
        }
        let path = text(&item["path"]);
        if path.is_empty() {
            out.push(format!("{at}.path: Required value"));
        } else if path.starts_with('/') {
            out.push(format!(
                "{at}.path: Invalid value: \"{path}\": must be a relative path"
            ));
        } else if path.split('/').any(|segment| segment == "..") {
            out.push(format!(
                "{at}.path: Invalid value: \"{path}\": must not contain '..'"
            ));
        }
        mode_errors(&item["mode"], &format!("{at}.mode"), out);
    }
}

fn volume_errors(spec: &Value, out: &mut Vec<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, volume) in items(&spec["volumes"]) {
        let at = format!("spec.volumes[{i}]");
        let name = text(&volume["name"]);
        if name.is_empty() {
            out.push(format!("{at}.name: Required value"));
        } else if !is_dns1123_label(name) {
            out.push(format!(
                "{at}.name: Invalid value: \"{name}\": {DNS1123_LABEL}"
            ));
        } else if !names.insert(name.to_owned()) {
            out.push(format!("{at}.name: Duplicate value: \"{name}\""));
        }
        let sources: Vec<&str> = VOLUME_SOURCES
            .into_iter()
            .filter(|s| !volume[*s].is_null())
            .collect();
        match sources.len() {
            0 => out.push(format!("{at}: Required value: must specify a volume type")),
            1 => {}
            _ => out.push(format!(
                "{at}: Forbidden: may not specify more than 1 volume type"
            )),
        }
        for (source, required) in [("secret", "secretName"), ("configMap", "name")] {
            let value = &volume[source];
            if value.is_null() {
                continue;
            }
            let at = format!("{at}.{source}");
            if text(&value[required]).is_empty() {
                out.push(format!("{at}.{required}: Required value"));
            }
            mode_errors(&value["defaultMode"], &format!("{at}.defaultMode"), out);
            key_to_path_errors(value, &at, out);
        }
    }
    names
}

/// A resource quantity in base units (cores, bytes), or `None` when it is not one.
fn quantity(value: &Value) -> Option<f64> {
    if let Some(n) = value.as_f64() {
        return Some(n);
    }
    let text = value.as_str()?;
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number * scale)
}

fn resource_errors(resources: &Value, at: &str, out: &mut Vec<String>) {
    for list in ["requests", "limits"] {
        for (name, value) in resources[list].as_object().into_iter().flatten() {
            if quantity(value).is_none() {
                out.push(format!(
                    "{at}.{list}[{name}]: Invalid value: {value}: quantities must match the \
                     regular expression"
                ));
            }
        }
    }
    for (name, request) in resources["requests"].as_object().into_iter().flatten() {
        let limit = &resources["limits"][name.as_str()];
        if let (Some(r), Some(l)) = (quantity(request), quantity(limit))
            && r > l
        {
            out.push(format!(
                "{at}.requests: Invalid value: {request}: must be less than or equal to {name} limit of {}",
                limit.as_str().map_or_else(|| limit.to_string(), str::to_owned)
            ));
        }
    }
}

fn probe_errors(probe: &Value, at: &str, out: &mut Vec<String>) {
    let handlers = PROBE_HANDLERS
        .into_iter()
        .filter(|h| !probe[*h].is_null())
        .count();
    match handlers {
        0 => out.push(format!("{at}: Required value: must specify a handler type")),
        1 => {}
        _ => out.push(format!(
            "{at}: Forbidden: may not specify more than 1 handler type"
        )),
    }
    for handler in ["tcpSocket", "httpGet"] {
        let port = &probe[handler]["port"];
        if probe[handler].is_null() {
            continue;
        }
        let at = format!("{at}.{handler}.port");
        let ok = match port {
            Value::Number(n) => n.as_u64().is_some_and(|p| (1..=65535).contains(&p)),
            Value::String(name) => is_port_name(name),
            _ => false,
        };
        if !ok {
            out.push(format!(
                "{at}: Invalid value: {port}: must contain a valid port number or name"
            ));
        }
    }
}

fn container_errors(
    container: &Value,
    at: &str,
    init: bool,
    volumes: &BTreeSet<String>,
    out: &mut Vec<String>,
) {
    if text(&container["image"]).is_empty() {
        out.push(format!("{at}.image: Required value"));
    }
    let mut paths = BTreeSet::new();
    for (j, mount) in items(&container["volumeMounts"]) {
        let at = format!("{at}.volumeMounts[{j}]");
        let name = text(&mount["name"]);
        if name.is_empty() {
            out.push(format!("{at}.name: Required value"));
        } else if !volumes.contains(name) {
            out.push(format!("{at}.name: Not found: \"{name}\""));
        }
        let path = text(&mount["mountPath"]);
        if path.is_empty() {
            out.push(format!("{at}.mountPath: Required value"));
        } else if !paths.insert(path.to_owned()) {
            out.push(format!(
                "{at}.mountPath: Invalid value: \"{path}\": must be unique"
            ));
        }
    }
    for (j, env) in items(&container["env"]) {
        let at = format!("{at}.env[{j}]");
        let name = text(&env["name"]);
        if name.is_empty() {
            out.push(format!("{at}.name: Required value"));
        } else if !is_env_var_name(name) {
            out.push(format!(
                "{at}.name: Invalid value: \"{name}\": a valid environment variable name must \
                 consist of alphabetic characters, digits, '_', '-', or '.', and must not start \
                 with a digit"
            ));
        }
        if !text(&env["value"]).is_empty() && !env["valueFrom"].is_null() {
            out.push(format!(
                "{at}.valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"
            ));
        }
    }
    let mut port_names = BTreeSet::new();
    for (j, port) in items(&container["ports"]) {
        let at = format!("{at}.ports[{j}]");
        let number = &port["containerPort"];
        if !number.as_u64().is_some_and(|p| (1..=65535).contains(&p)) {
            out.push(format!(
                "{at}.containerPort: Invalid value: {number}: must be between 1 and 65535, inclusive"
            ));
        }
        if let Some(name) = port["name"].as_str() {
            if !is_port_name(name) {
                out.push(format!(
                    "{at}.name: Invalid value: \"{name}\": must be a valid port name"
                ));
            } else if !port_names.insert(name.to_owned()) {
                out.push(format!("{at}.name: Duplicate value: \"{name}\""));
            }
        }
    }
    let sidecar = init && container["restartPolicy"] == "Always";
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let value = &container[probe];
        if value.is_null() {
            continue;
        }
        let at = format!("{at}.{probe}");
        if init && !sidecar {
            out.push(format!(
                "{at}: Forbidden: may not be set for init containers without restartPolicy=Always"
            ));
        } else {
            probe_errors(value, &at, out);
        }
    }
    let policy = &container["terminationMessagePolicy"];
    if !policy.is_null() && policy != "File" && policy != "FallbackToLogsOnError" {
        out.push(format!(
            "{at}.terminationMessagePolicy: Unsupported value: {policy}: supported values: \
             \"File\", \"FallbackToLogsOnError\""
        ));
    }
    resource_errors(&container["resources"], &format!("{at}.resources"), out);
}

/// Every way `template` (a Job's `spec.template`) fails the apiserver's validation; empty when
/// it passes.
pub fn job_template_errors(template: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &template["spec"];
    let volumes = volume_errors(spec, &mut out);
    if items(&spec["containers"]).next().is_none() {
        out.push("spec.containers: Required value".to_owned());
    }
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for (list, init) in [("initContainers", true), ("containers", false)] {
        for (i, container) in items(&spec[list]) {
            let at = format!("spec.{list}[{i}]");
            let name = text(&container["name"]);
            if name.is_empty() {
                out.push(format!("{at}.name: Required value"));
            } else if !is_dns1123_label(name) {
                out.push(format!(
                    "{at}.name: Invalid value: \"{name}\": {DNS1123_LABEL}"
                ));
            } else if names.insert(name.to_owned(), at.clone()).is_some() {
                out.push(format!("{at}.name: Duplicate value: \"{name}\""));
            }
            container_errors(container, &at, init, &volumes, &mut out);
        }
    }
    let restart = &spec["restartPolicy"];
    if restart != "OnFailure" && restart != "Never" {
        out.push(format!(
            "spec.restartPolicy: Unsupported value: {restart}: supported values: \"OnFailure\", \"Never\""
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Job template the apiserver takes: a sidecar with a probe, an init container, a
    /// secret and a configMap volume with items, mounts, env, ports, probes and resources.
    fn valid() -> Value {
        json!({
            "spec": {
                "restartPolicy": "Never",
                "volumes": [
                    {"name": "ssh", "secret": {"secretName": "s", "defaultMode": 420,
                        "items": [{"key": "k", "path": ".ssh/id", "mode": 384}]}},
                    {"name": "hosts", "configMap": {"name": "c",
                        "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]}},
                ],
                "initContainers": [
                    {"name": "wait", "image": "i", "terminationMessagePolicy": "FallbackToLogsOnError",
                     "volumeMounts": [{"name": "hosts", "mountPath": "/etc/mpi", "readOnly": true}],
                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                   "limits": {"cpu": "100m", "memory": "32Mi"}}},
                    {"name": "proxy", "image": "i", "restartPolicy": "Always",
                     "readinessProbe": {"tcpSocket": {"port": 8080}}},
                ],
                "containers": [
                    {"name": "node", "image": "i",
                     "volumeMounts": [{"name": "ssh", "mountPath": "/root/.ssh"},
                                      {"name": "hosts", "mountPath": "/etc/mpi"}],
                     "env": [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                             {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     "ports": [{"containerPort": 2222, "name": "ssh"}],
                     "readinessProbe": {"tcpSocket": {"port": "ssh"}},
                     "resources": {"limits": {"cpu": 2}}},
                ],
            }
        })
    }

    fn broken(edit: impl FnOnce(&mut Value)) -> Vec<String> {
        let mut template = valid();
        edit(&mut template["spec"]);
        job_template_errors(&template)
    }

    #[test]
    fn the_valid_template_passes() {
        assert_eq!(job_template_errors(&valid()), Vec::<String>::new());
    }

    #[test]
    fn each_rule_fails_on_its_own() {
        type Edit = Box<dyn FnOnce(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|s| {
                    let again = json!({"name": "ssh", "emptyDir": {}});
                    s["volumes"].as_array_mut().expect("volumes").push(again);
                }),
                "spec.volumes[2].name: Duplicate value: \"ssh\"",
            ),
            (
                Box::new(|s| s["volumes"][0]["emptyDir"] = json!({})),
                "spec.volumes[0]: Forbidden: may not specify more than 1 volume type",
            ),
            (
                Box::new(|s| {
                    s["volumes"][0]
                        .as_object_mut()
                        .expect("volume")
                        .remove("secret");
                }),
                "spec.volumes[0]: Required value: must specify a volume type",
            ),
            (
                Box::new(|s| s["volumes"][0]["secret"]["defaultMode"] = json!(512)),
                "spec.volumes[0].secret.defaultMode: Invalid value: 512: must be a number \
                 between 0 and 0777 (octal), both inclusive",
            ),
            (
                Box::new(|s| s["volumes"][0]["secret"]["items"][0]["path"] = json!("../id")),
                "spec.volumes[0].secret.items[0].path: Invalid value: \"../id\": must not contain '..'",
            ),
            (
                Box::new(|s| s["volumes"][1]["configMap"]["items"][0]["path"] = json!("/hostfile")),
                "spec.volumes[1].configMap.items[0].path: Invalid value: \"/hostfile\": must be a relative path",
            ),
            (
                Box::new(|s| s["volumes"][1]["configMap"]["name"] = json!("")),
                "spec.volumes[1].configMap.name: Required value",
            ),
            (
                Box::new(|s| s["containers"] = json!([])),
                "spec.containers: Required value",
            ),
            (
                Box::new(|s| s["initContainers"][0]["name"] = json!("node")),
                "spec.containers[0].name: Duplicate value: \"node\"",
            ),
            (
                Box::new(|s| s["containers"][0]["image"] = json!("")),
                "spec.containers[0].image: Required value",
            ),
            (
                Box::new(|s| s["containers"][0]["volumeMounts"][1]["name"] = json!("gone")),
                "spec.containers[0].volumeMounts[1].name: Not found: \"gone\"",
            ),
            (
                Box::new(|s| {
                    s["containers"][0]["volumeMounts"][1]["mountPath"] = json!("/root/.ssh")
                }),
                "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/root/.ssh\": must be unique",
            ),
            (
                Box::new(|s| s["containers"][0]["env"][0]["name"] = json!("1X")),
                "spec.containers[0].env[0].name: Invalid value: \"1X\": a valid environment \
                 variable name must consist of alphabetic characters, digits, '_', '-', or '.', \
                 and must not start with a digit",
            ),
            (
                Box::new(|s| s["containers"][0]["env"][1]["value"] = json!("x")),
                "spec.containers[0].env[1].valueFrom: Invalid value: \"\": may not be specified \
                 when `value` is not empty",
            ),
            (
                Box::new(|s| s["containers"][0]["ports"][0]["containerPort"] = json!(0)),
                "spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 \
                 and 65535, inclusive",
            ),
            (
                Box::new(|s| {
                    s["containers"][0]["readinessProbe"]["exec"] = json!({"command": ["true"]})
                }),
                "spec.containers[0].readinessProbe: Forbidden: may not specify more than 1 handler type",
            ),
            (
                Box::new(|s| {
                    s["containers"][0]["readinessProbe"]["tcpSocket"]["port"] = json!(70000)
                }),
                "spec.containers[0].readinessProbe.tcpSocket.port: Invalid value: 70000: must \
                 contain a valid port number or name",
            ),
            (
                Box::new(|s| {
                    s["initContainers"][0]["readinessProbe"] = json!({"tcpSocket": {"port": 1}})
                }),
                "spec.initContainers[0].readinessProbe: Forbidden: may not be set for init \
                 containers without restartPolicy=Always",
            ),
            (
                Box::new(|s| s["initContainers"][0]["terminationMessagePolicy"] = json!("Logs")),
                "spec.initContainers[0].terminationMessagePolicy: Unsupported value: \"Logs\": \
                 supported values: \"File\", \"FallbackToLogsOnError\"",
            ),
            (
                Box::new(|s| {
                    s["initContainers"][0]["resources"]["requests"]["memory"] = json!("64Mi")
                }),
                "spec.initContainers[0].resources.requests: Invalid value: \"64Mi\": must be less \
                 than or equal to memory limit of 32Mi",
            ),
            (
                Box::new(|s| s["restartPolicy"] = json!("Always")),
                "spec.restartPolicy: Unsupported value: \"Always\": supported values: \
                 \"OnFailure\", \"Never\"",
            ),
        ];
        for (edit, expected) in cases {
            assert_eq!(broken(edit), [expected.to_owned()]);
        }
        assert_eq!(
            broken(|s| s["volumes"][0]["name"] = json!("SSH")),
            [
                format!("spec.volumes[0].name: Invalid value: \"SSH\": {DNS1123_LABEL}"),
                // As the apiserver, a volume with an invalid name is not one a mount can name.
                "spec.containers[0].volumeMounts[0].name: Not found: \"ssh\"".to_owned(),
            ]
        );
    }
}
