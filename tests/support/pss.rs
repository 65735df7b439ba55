//! The `restricted` Pod Security Standard as a pure check of a pod spec (JSON), for the tests:
//! <https://kubernetes.io/docs/concepts/security/pod-security-standards/>, the rules of the
//! restricted profile (which include the baseline's) that a pod spec can break on its own:
//! host namespaces, privileged containers, host ports, volume types (hostPath among the
//! forbidden), privilege escalation, running as non-root (and not as uid 0), seccomp
//! (RuntimeDefault or Localhost) and capabilities (drop ALL, add at most NET_BIND_SERVICE).
//!
//! Each violation is one line naming the field, as the admission plugin's message does.

use serde_json::Value;

/// The volume types the restricted profile allows.
const VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The container lists of a pod spec.
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

fn array(value: &Value) -> impl Iterator<Item = (usize, &Value)> {
    value.as_array().into_iter().flatten().enumerate()
}

/// Every way `pod` (a pod spec) breaks the restricted profile; empty when it meets it.
pub fn restricted_violations(pod: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for namespace in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[namespace] == true {
            out.push(format!("spec.{namespace}: host namespaces are forbidden"));
        }
    }
    for (i, volume) in array(&pod["volumes"]) {
        let types = volume.as_object().into_iter().flatten();
        for (key, _) in types.filter(|(key, _)| *key != "name") {
            if !VOLUME_TYPES.contains(&key.as_str()) {
                out.push(format!(
                    "spec.volumes[{i}].{key}: volume type {key} is forbidden"
                ));
            }
        }
    }
    let pod_context = &pod["securityContext"];
    if pod_context["runAsUser"] == 0 {
        out.push("spec.securityContext.runAsUser: must not be 0".to_string());
    }
    let pod_seccomp = &pod_context["seccompProfile"]["type"];
    if !pod_seccomp.is_null() && !allowed_seccomp(pod_seccomp) {
        out.push(format!(
            "spec.securityContext.seccompProfile.type: {pod_seccomp} is forbidden"
        ));
    }
    for list in CONTAINER_LISTS {
        for (i, container) in array(&pod[list]) {
            container_violations(
                pod_context,
                container,
                &format!("spec.{list}[{i}]"),
                &mut out,
            );
        }
    }
    out
}

fn allowed_seccomp(kind: &Value) -> bool {
    kind == "RuntimeDefault" || kind == "Localhost"
}

/// The container-level value of `key` when set, else the pod's.
fn effective<'a>(container: &'a Value, pod: &'a Value, key: &str) -> &'a Value {
    match &container[key] {
        Value::Null => &pod[key],
        value => value,
    }
}

fn container_violations(pod_context: &Value, container: &Value, at: &str, out: &mut Vec<String>) {
    let context = &container["securityContext"];
    let field = |name: &str| format!("{at}.securityContext.{name}");
    if context["privileged"] == true {
        out.push(format!("{}: must not be true", field("privileged")));
    }
    if context["allowPrivilegeEscalation"] != false {
        out.push(format!(
            "{}: must be false",
            field("allowPrivilegeEscalation")
        ));
    }
    if effective(context, pod_context, "runAsNonRoot") != true {
        out.push(format!(
            "{}: must be true (here or in the pod's securityContext)",
            field("runAsNonRoot")
        ));
    }
    if context["runAsUser"] == 0 {
        out.push(format!("{}: must not be 0", field("runAsUser")));
    }
    let seccomp = match &context["seccompProfile"]["type"] {
        Value::Null => &pod_context["seccompProfile"]["type"],
        kind => kind,
    };
    if !allowed_seccomp(seccomp) {
        out.push(format!(
            "{}: must be RuntimeDefault or Localhost (here or in the pod's securityContext), not {seccomp}",
            field("seccompProfile.type")
        ));
    }
    let capabilities = &context["capabilities"];
    if !array(&capabilities["drop"]).any(|(_, c)| c == "ALL") {
        out.push(format!("{}: must include ALL", field("capabilities.drop")));
    }
    for (_, added) in array(&capabilities["add"]).filter(|(_, c)| *c != "NET_BIND_SERVICE") {
        out.push(format!(
            "{}: {added} is forbidden (only NET_BIND_SERVICE)",
            field("capabilities.add")
        ));
    }
    for (p, port) in array(&container["ports"]) {
        if port["hostPort"].as_i64().is_some_and(|n| n != 0) {
            out.push(format!(
                "{at}.ports[{p}].hostPort: host ports are forbidden"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::restricted_violations;
    use serde_json::{Value, json};

    /// A pod spec meeting the profile: one container and one volume of each allowed kind.
    fn compliant() -> Value {
        json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "c", "configMap": {"name": "x"}}, {"name": "s", "secret": {"secretName": "y"}}],
            "containers": [{
                "name": "c",
                "image": "i",
                "ports": [{"containerPort": 80}],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
                }
            }]
        })
    }

    /// The violations of the compliant pod with `edit` applied.
    fn broken(edit: impl FnOnce(&mut Value)) -> Vec<String> {
        let mut pod = compliant();
        edit(&mut pod);
        restricted_violations(&pod)
    }

    #[test]
    fn the_compliant_pod_meets_it() {
        assert_eq!(restricted_violations(&compliant()), Vec::<String>::new());
    }

    /// The container's securityContext.
    fn c(pod: &mut Value) -> &mut Value {
        &mut pod["containers"][0]["securityContext"]
    }

    /// An edit of the compliant pod that breaks one rule.
    type Edit = Box<dyn FnOnce(&mut Value)>;

    #[test]
    fn each_rule_fails_on_its_own() {
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|p| p["hostNetwork"] = json!(true)),
                "spec.hostNetwork: host namespaces are forbidden",
            ),
            (
                Box::new(|p| p["hostPID"] = json!(true)),
                "spec.hostPID: host namespaces are forbidden",
            ),
            (
                Box::new(|p| p["hostIPC"] = json!(true)),
                "spec.hostIPC: host namespaces are forbidden",
            ),
            (
                Box::new(|p| p["volumes"][1] = json!({"name": "h", "hostPath": {"path": "/"}})),
                "spec.volumes[1].hostPath: volume type hostPath is forbidden",
            ),
            (
                Box::new(|p| {
                    p["volumes"][0] = json!({"name": "n", "nfs": {"server": "s", "path": "/"}})
                }),
                "spec.volumes[0].nfs: volume type nfs is forbidden",
            ),
            (
                Box::new(|p| c(p)["privileged"] = json!(true)),
                "spec.containers[0].securityContext.privileged: must not be true",
            ),
            (
                Box::new(|p| c(p)["allowPrivilegeEscalation"] = json!(null)),
                "spec.containers[0].securityContext.allowPrivilegeEscalation: must be false",
            ),
            (
                Box::new(|p| p["securityContext"]["runAsNonRoot"] = json!(null)),
                "spec.containers[0].securityContext.runAsNonRoot: must be true (here or in the pod's securityContext)",
            ),
            (
                Box::new(|p| c(p)["runAsNonRoot"] = json!(false)),
                "spec.containers[0].securityContext.runAsNonRoot: must be true (here or in the pod's securityContext)",
            ),
            (
                Box::new(|p| c(p)["runAsUser"] = json!(0)),
                "spec.containers[0].securityContext.runAsUser: must not be 0",
            ),
            (
                Box::new(|p| p["securityContext"]["runAsUser"] = json!(0)),
                "spec.securityContext.runAsUser: must not be 0",
            ),
            (
                Box::new(|p| p["securityContext"]["seccompProfile"] = json!(null)),
                "spec.containers[0].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost (here or in the pod's securityContext), not null",
            ),
            (
                Box::new(|p| c(p)["seccompProfile"] = json!({"type": "Unconfined"})),
                "spec.containers[0].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost (here or in the pod's securityContext), not \"Unconfined\"",
            ),
            (
                Box::new(|p| c(p)["capabilities"]["drop"] = json!(["NET_RAW"])),
                "spec.containers[0].securityContext.capabilities.drop: must include ALL",
            ),
            (
                Box::new(|p| {
                    c(p)["capabilities"]["add"] = json!(["NET_BIND_SERVICE", "SYS_ADMIN"])
                }),
                "spec.containers[0].securityContext.capabilities.add: \"SYS_ADMIN\" is forbidden (only NET_BIND_SERVICE)",
            ),
            (
                Box::new(|p| p["containers"][0]["ports"][0]["hostPort"] = json!(8080)),
                "spec.containers[0].ports[0].hostPort: host ports are forbidden",
            ),
        ];
        for (edit, expected) in cases {
            assert_eq!(broken(edit), [expected]);
        }
    }

    #[test]
    fn init_containers_are_checked_too() {
        let violations = broken(|p| p["initContainers"] = json!([{"name": "i", "image": "i"}]));
        assert_eq!(
            violations,
            [
                "spec.initContainers[0].securityContext.allowPrivilegeEscalation: must be false",
                "spec.initContainers[0].securityContext.capabilities.drop: must include ALL",
            ]
        );
    }
}
