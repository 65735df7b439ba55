//! JobSet mode's `mpi-webhook.io/ssh-setup: generated` (the default): ssh that works under any
//! UID, the `restricted` Pod Security Standard and with host keys verified, with the user's own
//! image. An init container, `mpi-ssh-setup`, runs a POSIX `sh` script in the wired container's
//! image that copies the job's key out of the Secret (mounted only there, world-readable) into
//! an emptyDir with the modes and owner ssh and sshd insist on, and writes the client's and the
//! server's configuration and a `passwd` that knows the running UID. The wired containers mount
//! the emptyDir, and `/etc/passwd` from it.
//!
//! Pure: the entries the mutation writes, as JSON, and the script. No I/O.

use std::borrow::Cow;
use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use crate::mpi::{
    SSH_AUTH_VOLUME, SSH_PRIVATE_KEY, SSH_PRIVATE_KEY_FILE, SSH_PUBLIC_KEY, SSH_PUBLIC_KEY_FILE,
    SSHD, ssh_secret_name,
};

/// The init container that writes the ssh files.
pub const SSH_SETUP_CONTAINER: &str = "mpi-ssh-setup";
/// The emptyDir the init container writes and the wired containers read.
pub const RUNTIME_VOLUME: &str = "mpi-ssh-runtime";
/// Where the emptyDir is mounted, in the init container and the wired containers.
pub const RUNTIME_DIR: &str = "/run/mpi-ssh";
/// Where the Secret is mounted, in the init container only.
pub const SECRET_DIR: &str = "/run/mpi-ssh-secret";
/// The image's user database, replaced in the wired containers by the script's copy.
pub const PASSWD_PATH: &str = "/etc/passwd";
/// The file of the emptyDir mounted at [`PASSWD_PATH`].
pub const PASSWD_FILE: &str = "passwd";
/// The ssh client configuration the launcher's ssh reads (`-F`).
pub const SSH_CONFIG_PATH: &str = "/run/mpi-ssh/ssh_config";
/// The sshd configuration the workers' sshd reads (`-f`).
pub const SSHD_CONFIG_PATH: &str = "/run/mpi-ssh/sshd_config";
/// The Secret volume's mode for every file: 0444, readable by whatever UID the pod gets (only
/// the init container mounts it).
pub const SECRET_DEFAULT_MODE: i32 = 0o444;
/// The sshd port of `generated` when `mpi-webhook.io/ssh-port` is unset: above 1023, so any UID
/// may bind it without a capability.
pub const GENERATED_SSH_PORT: u16 = 2222;

/// What `generated` appends to the implementation's ssh-args variable, instead of ` -p <port>`:
/// the client configuration holds the port, the key and the pinned host key.
pub fn ssh_args_suffix() -> String {
    format!(" -F {SSH_CONFIG_PATH}")
}

/// The `mpi-ssh-auth` Secret volume of `generated`: the key pair as `id_rsa` and `id_rsa.pub`,
/// every file 0444, no per-item modes (the script makes the private copies 0600).
pub fn secret_volume(jobset_name: &str) -> Value {
    json!({
        "name": SSH_AUTH_VOLUME,
        "secret": {
            "secretName": ssh_secret_name(jobset_name),
            "defaultMode": SECRET_DEFAULT_MODE,
            "items": [
                {"key": SSH_PRIVATE_KEY, "path": SSH_PRIVATE_KEY_FILE},
                {"key": SSH_PUBLIC_KEY, "path": SSH_PUBLIC_KEY_FILE},
            ]
        }
    })
}

/// The `mpi-ssh-runtime` emptyDir volume.
pub fn runtime_volume() -> Value {
    json!({"name": RUNTIME_VOLUME, "emptyDir": {}})
}

/// The wired containers' mounts: the emptyDir, and `/etc/passwd` from it (upserted by
/// mountPath, like every mount the policy writes).
pub fn container_mounts() -> [Value; 2] {
    [
        json!({"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR}),
        json!({"name": RUNTIME_VOLUME, "mountPath": PASSWD_PATH, "subPath": PASSWD_FILE}),
    ]
}

/// The workers' sshd when they set neither command nor args: the script's configuration.
pub fn sshd_command() -> Value {
    worker_command(&[SSHD, "-De", "-f", SSHD_CONFIG_PATH])
}

/// The POSIX `sh` script a worker's default command runs its sshd under (Decision 21): sshd in
/// the background, and the container's end a failure whatever ends it. SIGTERM or SIGINT (a
/// deleted, evicted or preempted Pod, a drained node) stops sshd and exits 143; sshd ending on
/// its own exits with its code, 1 for 0. OpenSSH's sshd exits 0 on SIGTERM, which made a lost
/// worker's Pod `Succeeded` and its index a completed one; a worker never finishes on its own
/// (the JobSet completes with its launcher, then JobSet deletes the workers), so no end of one
/// is a success.
pub const WORKER_SCRIPT: &str = concat!(
    r#"trap 'kill -TERM "$sshd" 2>/dev/null; exit 143' TERM INT; "#,
    r#""$@" & sshd=$!; wait "$sshd"; code=$?; [ "$code" -ne 0 ] || code=1; exit "$code""#,
);

/// The name the worker script runs under (its `$0`, what `ps` shows).
pub const WORKER_SCRIPT_NAME: &str = "mpi-worker";

/// JobSet mode: a worker's default command, `sshd` (its words) under [`WORKER_SCRIPT`].
pub fn worker_command(sshd: &[&str]) -> Value {
    let mut command = vec!["/bin/sh", "-c", WORKER_SCRIPT, WORKER_SCRIPT_NAME];
    command.extend_from_slice(sshd);
    json!(command)
}

/// The members of a container's `securityContext` the init container copies: it must run as the
/// same user as the wired container, so that the files it writes are that user's.
const COPIED_SECURITY: [&str; 3] = ["runAsUser", "runAsGroup", "runAsNonRoot"];

/// The `mpi-ssh-setup` init container for a pod whose wired container is `wired` (its JSON, as
/// the user wrote it): that container's image, user and group, the script for sshd on `port`,
/// and what the `restricted` Pod Security Standard asks of a container.
pub fn init_container(wired: &Value, port: u16) -> Value {
    InitContainer::for_port(port).for_wired(wired)
}

/// What every `mpi-ssh-setup` init container for sshd on one port has, whatever the pod: made
/// once (once per process for [`GENERATED_SSH_PORT`]), then copied into each pod with what its
/// wired container gives it.
#[derive(Debug, Clone)]
pub struct InitContainer {
    /// Its members but `image` and `securityContext`: `name`, then `command` (with the
    /// script), `volumeMounts`, `terminationMessagePolicy` and `resources`, in that order.
    members: Map<String, Value>,
    /// The members of `securityContext` after those copied from the wired container.
    restricted: Map<String, Value>,
}

/// The init container for sshd on [`GENERATED_SSH_PORT`], the default.
static DEFAULT_PORT_INIT_CONTAINER: LazyLock<InitContainer> =
    LazyLock::new(|| InitContainer::new(GENERATED_SSH_PORT));

impl InitContainer {
    /// The init container for sshd on `port`.
    pub fn new(port: u16) -> Self {
        let mut members = Map::new();
        members.insert("name".into(), json!(SSH_SETUP_CONTAINER));
        members.insert("command".into(), json!(["sh", "-c", script(port)]));
        members.insert(
            "volumeMounts".into(),
            json!([
                {"name": SSH_AUTH_VOLUME, "mountPath": SECRET_DIR, "readOnly": true},
                {"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR},
            ]),
        );
        members.insert(
            "terminationMessagePolicy".into(),
            json!("FallbackToLogsOnError"),
        );
        members.insert(
            "resources".into(),
            json!({
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "100m", "memory": "32Mi"}
            }),
        );
        let mut restricted = Map::new();
        restricted.insert("allowPrivilegeEscalation".into(), json!(false));
        restricted.insert("capabilities".into(), json!({"drop": ["ALL"]}));
        restricted.insert("seccompProfile".into(), json!({"type": "RuntimeDefault"}));
        Self {
            members,
            restricted,
        }
    }

    /// The init container for sshd on `port`: the one made at start for the default port, else
    /// a new one.
    pub fn for_port(port: u16) -> Cow<'static, Self> {
        if port == GENERATED_SSH_PORT {
            Cow::Borrowed(&DEFAULT_PORT_INIT_CONTAINER)
        } else {
            Cow::Owned(Self::new(port))
        }
    }

    /// The init container for a pod whose wired container is `wired` (its JSON, as the user
    /// wrote it): that container's image, user and group.
    pub fn for_wired(&self, wired: &Value) -> Value {
        let copied: Vec<(&str, &Value)> = COPIED_SECURITY
            .iter()
            .filter_map(|key| {
                let value = wired.get("securityContext")?.get(key)?;
                (!value.is_null()).then_some((*key, value))
            })
            .collect();
        let security = if copied.is_empty() {
            self.restricted.clone()
        } else {
            let mut security = Map::new();
            for (key, value) in copied {
                security.insert(key.to_owned(), value.clone());
            }
            for (key, value) in &self.restricted {
                security.insert(key.clone(), value.clone());
            }
            security
        };
        let mut container = self.members.clone();
        // After `name`.
        if let Some(image) = wired.get("image").filter(|v| !v.is_null()) {
            container.shift_insert(1, "image".into(), image.clone());
        }
        container.insert("securityContext".into(), Value::Object(security));
        Value::Object(container)
    }
}

/// The init container's script, for sshd on `port`. POSIX `sh` and only `cat`, `cp`, `chmod`,
/// `mkdir`, `id` and `printf`, so that any image with a shell runs it; it fails on the first
/// missing tool or file with one line naming it.
///
/// It writes into the emptyDir: `id` and `host_key`, copies of the job's private key owned by
/// the running UID with mode 0600 (the job's key is every pod's host key, so `known_hosts` pins
/// exactly the hosts holding it); `authorized_keys`; `known_hosts` (`* <public key>`);
/// `ssh_config` with host-key checking on; `sshd_config` for an sshd that runs unprivileged; and
/// `passwd`, the image's plus an entry for the running UID when the image has none (ssh and sshd
/// refuse a user they cannot look up). The ssh sessions get the image's `PATH` (`SetEnv`), where
/// the launchers' daemons are.
pub fn script(port: u16) -> String {
    format!(
        r#"set -eu
umask 077
fail() {{ printf 'mpi-ssh-setup: %s\n' "$1" >&2; exit 1; }}
for tool in cat cp chmod mkdir id; do
  command -v "$tool" >/dev/null 2>&1 || fail "the image has no $tool, needed to set up ssh (or set mpi-webhook.io/ssh-setup: image)"
done
s={SECRET_DIR}
d={RUNTIME_DIR}
for f in "$s/{SSH_PRIVATE_KEY_FILE}" "$s/{SSH_PUBLIC_KEY_FILE}" {PASSWD_PATH}; do
  [ -r "$f" ] || fail "$f is missing or unreadable"
done
uid=$(id -u)
gid=$(id -g)
mkdir -p "$d/home"
cp "$s/{SSH_PRIVATE_KEY_FILE}" "$d/id"
cp "$s/{SSH_PRIVATE_KEY_FILE}" "$d/host_key"
cp "$s/{SSH_PUBLIC_KEY_FILE}" "$d/authorized_keys"
chmod 600 "$d/id" "$d/host_key" "$d/authorized_keys"
printf '* %s\n' "$(cat "$s/{SSH_PUBLIC_KEY_FILE}")" > "$d/known_hosts"
printf '%s\n' 'Host *' '  Port {port}' "  IdentityFile $d/id" '  IdentitiesOnly yes' \
  "  UserKnownHostsFile $d/known_hosts" '  GlobalKnownHostsFile /dev/null' \
  '  StrictHostKeyChecking yes' '  BatchMode yes' > "$d/ssh_config"
printf '%s\n' 'Port {port}' "HostKey $d/host_key" "PidFile $d/sshd.pid" \
  "AuthorizedKeysFile $d/authorized_keys" 'StrictModes no' 'UsePAM no' \
  'PasswordAuthentication no' 'KbdInteractiveAuthentication no' \
  'PermitRootLogin prohibit-password' "SetEnv \"PATH=$PATH\"" > "$d/sshd_config"
cp {PASSWD_PATH} "$d/{PASSWD_FILE}"
id -un >/dev/null 2>&1 || printf 'mpi:x:%s:%s::%s:/bin/sh\n' "$uid" "$gid" "$d/home" >> "$d/{PASSWD_FILE}"
chmod 644 "$d/{PASSWD_FILE}"
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_container_runs_as_the_wired_container_and_is_restricted() {
        let wired = json!({
            "name": "node", "image": "img:1",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 0, "privileged": false,
                                "runAsNonRoot": null}
        });
        let init = init_container(&wired, 2222);
        assert_eq!(init["name"], "mpi-ssh-setup");
        assert_eq!(init["image"], "img:1");
        assert_eq!(init["command"][0], "sh");
        assert_eq!(init["command"][1], "-c");
        assert_eq!(init["command"][2], json!(script(2222)));
        assert_eq!(
            init["securityContext"],
            json!({
                "runAsUser": 1000, "runAsGroup": 0,
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}
            })
        );
        assert_eq!(
            init["volumeMounts"],
            json!([
                {"name": "mpi-ssh-auth", "mountPath": "/run/mpi-ssh-secret", "readOnly": true},
                {"name": "mpi-ssh-runtime", "mountPath": "/run/mpi-ssh"}
            ])
        );
        // No user in the template: the pod's (or the one the platform assigns) applies.
        let bare = init_container(&json!({"name": "node"}), 22);
        assert!(bare.get("image").is_none());
        assert_eq!(
            bare["securityContext"],
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                   "seccompProfile": {"type": "RuntimeDefault"}})
        );
    }

    #[test]
    fn the_secret_is_world_readable_without_item_modes() {
        assert_eq!(
            secret_volume("pi"),
            json!({"name": "mpi-ssh-auth", "secret": {
                "secretName": "pi-mpi-ssh-auth", "defaultMode": 292,
                "items": [{"key": "ssh-privatekey", "path": "id_rsa"},
                          {"key": "ssh-publickey", "path": "id_rsa.pub"}]}})
        );
    }

    #[test]
    fn the_script_uses_only_the_tools_it_names_and_the_port() {
        let text = script(2022);
        assert!(text.contains("'  Port 2022'") && text.contains("'Port 2022'"));
        assert!(text.contains("'  StrictHostKeyChecking yes'"));
        // Every command word is a shell builtin or one of the five tools.
        let allowed = [
            "set",
            "umask",
            "fail()",
            "for",
            "do",
            "done",
            "command",
            "[",
            "uid=$(id",
            "gid=$(id",
            "mkdir",
            "cp",
            "chmod",
            "printf",
            "id",
            "s=/run/mpi-ssh-secret",
            "d=/run/mpi-ssh",
            "'",
            "\"",
            "\"$(cat",
            "|| fail",
            "'PermitRootLogin",
        ];
        for line in text.lines().map(str::trim_start) {
            assert!(
                allowed.iter().any(|w| line.starts_with(w)),
                "unexpected command in: {line}"
            );
        }
    }
}
