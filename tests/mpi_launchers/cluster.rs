//! A tiny "cluster" of pods on one machine: one network namespace per pod, all wired to a bridge
//! that lives in a namespace of its own (the host's interfaces and addresses are never touched),
//! plus a private mount and UTS namespace per pod process so that each pod sees its own hostname,
//! /etc/hosts, and its volumes at the exact paths the JobSet mounts them.
//!
//! Emulation choices (each documented where it is made):
//! - kubelet: Secret and ConfigMap volumes are materialized from the objects `render` printed,
//!   with the items, paths and modes of the JobSet's volume, owned by root, in kubelet's `..data`
//!   symlink layout, and bind-mounted read-only. With a pod `fsGroup`, kubelet's ownership pass
//!   follows: group fsGroup, group read added to files, setgid and group r-x on directories.
//! - The container runtime: a container with `securityContext.runAsUser` (its own, else the
//!   pod's) runs as that user, with `runAsGroup` (else the image user's group, else its uid) and
//!   the pod's fsGroup as supplementary group; without one, as the UID the platform assigns (see
//!   [`product::Image::platform_user`]: GID 0, no supplementary groups), else root. All
//!   capabilities are dropped when the container drops `ALL` or the platform assigns the UID, and
//!   no_new_privs is set when it disallows privilege escalation or the platform assigns the UID
//!   (`setpriv`, as under the `restricted` Pod Security Standard). Each container (the wired one
//!   and every init container) gets its own mounts, from its own `volumeMounts` (a `subPath`
//!   mounts that file of the volume); they are set up as root first, as a runtime does.
//! - kubelet's emptyDir: a directory per pod, mode 0777, shared by the pod's containers.
//! - JobSet's headless Service: every pod resolves `<pod>.<subdomain>` (and the FQDN) of every
//!   pod through its own /etc/hosts; its own hostname is `<pod>` as in a real pod.
//! - The container image: /etc is the host's /etc under a per-pod overlay that adds the image's
//!   sshd_config, ssh host key and ssh client defaults (the same ones mpi-operator's base image
//!   ships); the MPI launcher's bin dir is on the PATH of ssh sessions.
//!
//! Nothing is written outside the test's temp dir: the overlays' upper dirs live there too, and
//! the mounts vanish with the pod's mount namespace.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::launchers::Launcher;
use crate::proc::{self, Daemon};
use crate::product::{self, Image, ImageUser};

const T: Duration = Duration::from_secs(30);
/// Subnet of the test's private bridge (RFC 2544 benchmarking range); it exists only inside the
/// namespaces this test creates.
const SUBNET: &str = "198.18.0";
/// Prefix of every network namespace this test creates: `mpiw<pid>s<n>-...`.
pub const NS_PREFIX: &str = "mpiw";
/// The cluster domain of the emulated cluster (the kubelet default).
const CLUSTER_DOMAIN: &str = "cluster.local";

/// A pod of the JobSet, as the JobSet controller would create it.
#[derive(Debug, Clone)]
pub struct PodPlan {
    /// `<jobset>-<replicatedJob>-<replicaIdx>-<podIdx>` (the pod's hostname)
    pub hostname: String,
    /// `<hostname>.<subdomain>`: the name the hostfile uses
    pub dns_name: String,
    pub rjob: String,
    /// `template.spec.template.spec` of its replicatedJob, after the webhook's patch
    pub pod_spec: Value,
    /// The name of the container the pod runs (the one the MPI wiring is for); other containers
    /// of the pod (sidecars) are not run.
    pub container: String,
}

impl PodPlan {
    /// The container the pod runs.
    pub fn container(&self) -> Result<&Value> {
        product::container(&self.pod_spec, &self.container)
            .with_context(|| format!("pod {}", self.hostname))
    }
}

/// The pods a JobSet yields: for each replicatedJob in order, `replicas` × `parallelism`, each
/// running the container `mode` wires.
pub fn plan_pods(jobset: &Value, mode: product::Mode) -> Result<Vec<PodPlan>> {
    let name = jobset["metadata"]["name"]
        .as_str()
        .context("JobSet has no name")?;
    let subdomain = jobset["spec"]["network"]["subdomain"]
        .as_str()
        .unwrap_or(name);
    let mut pods = Vec::new();
    for rj in jobset["spec"]["replicatedJobs"]
        .as_array()
        .context("no replicatedJobs")?
    {
        let rname = rj["name"].as_str().context("replicatedJob without name")?;
        let replicas = rj["replicas"].as_u64().unwrap_or(1);
        let parallelism = rj["template"]["spec"]["parallelism"].as_u64().unwrap_or(1);
        ensure!(
            replicas * parallelism <= 16,
            "{rname}: {replicas}x{parallelism} pods is more than this test builds"
        );
        for r in 0..replicas {
            for p in 0..parallelism {
                let hostname = format!("{name}-{rname}-{r}-{p}");
                pods.push(PodPlan {
                    dns_name: format!("{hostname}.{subdomain}"),
                    hostname,
                    rjob: rname.to_string(),
                    pod_spec: rj["template"]["spec"]["template"]["spec"].clone(),
                    container: mode.wired_container(rname).to_string(),
                });
            }
        }
    }
    Ok(pods)
}

pub struct Pod {
    pub plan: PodPlan,
    pub ns: String,
    pub ip: String,
    /// `net:[inode]` of the pod's network namespace, to tell which pod a process ran in.
    pub netns_id: String,
    dir: PathBuf,
}

impl Pod {
    /// The script that sets up container `name`'s mounts and user, then execs its command.
    fn script(&self, name: &str) -> PathBuf {
        self.dir.join(format!("container-{name}.sh"))
    }

    /// The directory behind volume `name` of the pod (an emptyDir's content, for instance).
    pub fn volume_dir(&self, name: &str) -> PathBuf {
        self.dir.join("volumes").join(name)
    }
}

/// Who a container runs as, and what the container runtime takes away from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// The pod's fsGroup, the only supplementary group.
    pub fs_group: Option<u32>,
    /// `HOME`: the user's home in the image's /etc/passwd, else `/`.
    pub home: String,
    /// Every capability dropped (bounding and inheritable sets).
    pub drop_caps: bool,
    /// no_new_privs.
    pub no_new_privs: bool,
}

impl RunAs {
    /// The `setpriv` that switches to it (empty for root with nothing taken away).
    fn setpriv(&self) -> Vec<String> {
        let mut argv = vec!["setpriv".to_string()];
        if self.uid != 0 {
            argv.push(format!("--reuid={}", self.uid));
            argv.push(format!("--regid={}", self.gid));
            argv.push(
                self.fs_group
                    .map_or("--clear-groups".to_string(), |g| format!("--groups={g}")),
            );
        }
        if self.drop_caps {
            argv.push("--inh-caps=-all".to_string());
            argv.push("--bounding-set=-all".to_string());
        }
        if self.no_new_privs {
            argv.push("--no-new-privs".to_string());
        }
        if argv.len() == 1 {
            return Vec::new();
        }
        argv.push("--".to_string());
        argv
    }
}

impl Pod {
    /// Does `name` denote this pod? Its hostname, `<hostname>.<subdomain>`, or a longer form of
    /// the latter up to the FQDN. (Whether the launcher can resolve the name is the launcher's
    /// business; this only ties hostfile lines to pods.)
    pub fn answers_to(&self, name: &str) -> bool {
        let fqdn = format!(
            "{}.{}.svc.{CLUSTER_DOMAIN}",
            self.plan.dns_name,
            product::NAMESPACE
        );
        name == self.plan.hostname
            || name == self.plan.dns_name
            || (fqdn.starts_with(name)
                && name.starts_with(&self.plan.dns_name)
                && fqdn[name.len()..].starts_with('.'))
            || name == fqdn
    }
}

pub struct Cluster {
    tag: String,
    image: Image,
    namespaces: Vec<String>,
    daemons: Vec<Daemon>,
    pub pods: Vec<Pod>,
    /// A pod whose headless-Service record cluster DNS has not published (a negative control):
    /// no other pod resolves its name; the pod itself still has kubelet's line.
    pub unpublished: Option<String>,
    torn_down: bool,
}

fn ip(args: &[&str]) -> Result<String> {
    proc::run_ok(Command::new("ip").args(args), T)
}

fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl Cluster {
    /// Create the namespaces and links. `tag` must be unique on the machine (pid + counter).
    pub fn create(tag: &str, plans: Vec<PodPlan>, dir: &Path, image: Image) -> Result<Cluster> {
        let mut c = Cluster {
            tag: tag.to_string(),
            image,
            namespaces: Vec::new(),
            daemons: Vec::new(),
            pods: Vec::new(),
            unpublished: None,
            torn_down: false,
        };
        ensure!(plans.len() < 200, "too many pods");
        let br = format!("{tag}-br");
        ip(&["netns", "add", &br])?;
        c.namespaces.push(br.clone());
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for (i, plan) in plans.into_iter().enumerate() {
            let ns = format!("{tag}-{i}");
            ip(&["netns", "add", &ns])?;
            c.namespaces.push(ns.clone());
            let veth = format!("v{i}");
            // Both ends are created directly in their namespaces: nothing appears on the host.
            ip(&[
                "-n", &br, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &br, "link", "set", &veth, "master", "br0", "up"])?;
            let addr = format!("{SUBNET}.{}", 10 + i);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let netns_id = proc::run_ok(
                Command::new("ip").args(["netns", "exec", &ns, "readlink", "/proc/self/ns/net"]),
                T,
            )?
            .trim()
            .to_string();
            let pod_dir = dir.join("pods").join(&plan.hostname);
            std::fs::create_dir_all(&pod_dir)?;
            c.pods.push(Pod {
                dir: pod_dir,
                plan,
                ns,
                ip: addr,
                netns_id,
            });
        }
        Ok(c)
    }

    /// Lay out every pod's filesystem view: volumes (kubelet), /etc/hosts (headless Service),
    /// image files (sshd config, host key, ssh client defaults), and the pod's init script.
    pub fn prepare(&self, rendered: &[Value], launcher: &Launcher) -> Result<()> {
        for p in &self.pods {
            self.prepare_pod(p, &self.hosts_file(p), rendered, launcher)?;
        }
        Ok(())
    }

    /// The image's user that pod `p`'s wired container runs as (whose entry the image's
    /// /etc/passwd has), if any.
    fn container_user(&self, p: &Pod) -> Result<Option<ImageUser>> {
        let run_as = self.run_as(p, p.plan.container()?)?;
        Ok(self
            .image
            .user
            .filter(|u| run_as.as_ref().is_some_and(|r| r.uid == u.uid)))
    }

    /// Who `container` of pod `p` runs as (`None`: root with its capabilities), as the
    /// container runtime decides it from the container's and the pod's securityContext, and the
    /// UID the platform assigns when neither names a user.
    pub fn run_as(&self, p: &Pod, container: &Value) -> Result<Option<RunAs>> {
        let own = &container["securityContext"];
        let pod = &p.plan.pod_spec["securityContext"];
        let id = |key: &str| -> Result<Option<u32>> {
            own[key]
                .as_u64()
                .or_else(|| pod[key].as_u64())
                .map(|v| u32::try_from(v).context("id out of range"))
                .transpose()
        };
        let fs_group = pod["fsGroup"]
            .as_u64()
            .map(|g| u32::try_from(g).context("fsGroup out of range"))
            .transpose()?;
        let drops_all = own["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        let no_escalation = own["allowPrivilegeEscalation"] == false;
        let run_as = match (id("runAsUser")?, self.image.platform_user) {
            (Some(uid), _) => {
                let image_user = self.image.user.filter(|u| u.uid == uid);
                RunAs {
                    uid,
                    gid: id("runAsGroup")?
                        .or(image_user.map(|u| u.gid))
                        .unwrap_or(uid),
                    fs_group,
                    home: image_user.map_or("/", |u| u.home).to_string(),
                    drop_caps: drops_all,
                    no_new_privs: no_escalation,
                }
            }
            (None, Some((uid, gid))) => RunAs {
                uid,
                gid: id("runAsGroup")?.unwrap_or(gid),
                fs_group,
                home: "/".to_string(),
                drop_caps: true,
                no_new_privs: true,
            },
            (None, None) => RunAs {
                uid: 0,
                gid: 0,
                fs_group: None,
                home: "/root".to_string(),
                drop_caps: drops_all,
                no_new_privs: no_escalation,
            },
        };
        Ok((run_as.uid != 0 || run_as.drop_caps || run_as.no_new_privs).then_some(run_as))
    }

    /// The names pod `p` can resolve, as an /etc/hosts file. Models Kubernetes: kubelet's line for
    /// the pod itself (FQDN and hostname), and cluster DNS for the JobSet's headless Service
    /// (`<pod>.<subdomain>.<ns>.svc.<cluster domain>`, found by the resolver through the pod's
    /// search list: the ClusterFirst list plus the pod's own `dnsConfig.searches`). A name the
    /// search list cannot complete to a record does not resolve, as in a cluster.
    fn hosts_file(&self, p: &Pod) -> String {
        let ns = product::NAMESPACE;
        let mut searches: Vec<String> = vec![
            format!("{ns}.svc.{CLUSTER_DOMAIN}"),
            format!("svc.{CLUSTER_DOMAIN}"),
            CLUSTER_DOMAIN.to_string(),
        ];
        for s in p.plan.pod_spec["dnsConfig"]["searches"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(s) = s.as_str() {
                searches.push(s.trim_end_matches('.').to_string());
            }
        }
        let mut h =
            String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        let _ = writeln!(
            h,
            "# kubelet-managed\n{}\t{}.{ns}.svc.{CLUSTER_DOMAIN}\t{}",
            p.ip, p.plan.dns_name, p.plan.hostname
        );
        let _ = writeln!(
            h,
            "# cluster DNS: headless Service records, reachable through the search list {searches:?}"
        );
        for q in &self.pods {
            if self.unpublished.as_ref() == Some(&q.plan.hostname) {
                let _ = writeln!(h, "# {}: not published", q.plan.hostname);
                continue;
            }
            let fqdn = format!("{}.{ns}.svc.{CLUSTER_DOMAIN}", q.plan.dns_name);
            let mut names = vec![fqdn.clone()];
            for s in &searches {
                if let Some(short) = fqdn.strip_suffix(&format!(".{s}")) {
                    names.push(short.to_string());
                }
            }
            let _ = writeln!(h, "{}\t{}", q.ip, names.join("\t"));
        }
        h
    }

    fn prepare_pod(
        &self,
        p: &Pod,
        hosts: &str,
        rendered: &[Value],
        launcher: &Launcher,
    ) -> Result<()> {
        let volumes = p.plan.pod_spec["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let user = self.container_user(p)?;
        let fs_group = match p.plan.pod_spec["securityContext"]["fsGroup"].as_u64() {
            Some(g) => Some(u32::try_from(g).context("fsGroup out of range")?),
            None => None,
        };
        let image = self.image;
        // The image's own files that live outside /etc: sshd's configuration and host key.
        let (host_key, home) = match user {
            Some(u) => (format!("{}/.sshd_host_ecdsa_key", u.home), Some(u.home)),
            None => ("/etc/ssh/ssh_host_ecdsa_key".to_string(), None),
        };
        let image_files = [PathBuf::from(image.sshd_config), PathBuf::from(&host_key)];

        // The containers the pod runs: its init containers, then the wired one.
        let mut containers: Vec<Value> = p.plan.pod_spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        containers.push(p.plan.container()?.clone());

        // Mount points that may not exist on the host get an overlay on their nearest existing
        // ancestor, so the directory is created in the pod's upper layer only.
        let mut overlays: BTreeSet<PathBuf> = BTreeSet::new();
        overlays.insert(PathBuf::from("/etc"));
        let mut mkdirs: Vec<PathBuf> = Vec::new();
        let mut materialized: BTreeSet<String> = BTreeSet::new();
        // Per container: (source, mount point, read-only).
        let mut binds: Vec<Vec<(PathBuf, PathBuf, bool)>> = Vec::new();
        for container in &containers {
            let mut own = Vec::new();
            for m in container["volumeMounts"].as_array().into_iter().flatten() {
                let vname = m["name"].as_str().context("volumeMount without name")?;
                let mpath = PathBuf::from(
                    m["mountPath"]
                        .as_str()
                        .context("volumeMount without mountPath")?,
                );
                ensure!(
                    mpath.is_absolute(),
                    "mountPath {} is not absolute",
                    mpath.display()
                );
                let vol = volumes
                    .iter()
                    .find(|v| v["name"] == vname)
                    .with_context(|| {
                        format!(
                            "pod {} mounts volume {vname}, which the pod does not have",
                            p.plan.hostname
                        )
                    })?;
                let src = p.volume_dir(vname);
                if materialized.insert(vname.to_string()) {
                    materialize_volume(vol, rendered, &src, fs_group)
                        .with_context(|| format!("pod {}: volume {vname}", p.plan.hostname))?;
                }
                // Secret and ConfigMap volumes are read-only in a pod.
                let read_only = m["readOnly"] == true || !vol["emptyDir"].is_object();
                match m["subPath"].as_str().filter(|s| !s.is_empty()) {
                    Some(sub) => {
                        ensure!(
                            !sub.contains("..") && !sub.starts_with('/'),
                            "subPath {sub} leaves its volume"
                        );
                        // A file of the volume onto a file of the image (written by an init
                        // container before this container starts).
                        ensure!(
                            mpath.is_file(),
                            "subPath mount {} is over no file of the image",
                            mpath.display()
                        );
                        own.push((src.join(sub), mpath.clone(), read_only));
                    }
                    None => {
                        own.push((src, mpath.clone(), read_only));
                        if !mpath.is_dir() && !mkdirs.contains(&mpath) {
                            mkdirs.push(mpath.clone());
                            overlays.insert(nearest_existing_ancestor(&mpath)?);
                        }
                    }
                }
            }
            binds.push(own);
        }
        // sshd's privilege separation directory and the image's directories (the image would
        // have them).
        let mut image_dirs = vec![PathBuf::from("/run/sshd")];
        image_dirs.extend(home.map(PathBuf::from));
        for f in &image_files {
            image_dirs.extend(f.parent().map(Path::to_path_buf));
        }
        for d in image_dirs {
            if !d.is_dir() && !mkdirs.contains(&d) {
                overlays.insert(nearest_existing_ancestor(&d)?);
                mkdirs.push(d);
            }
        }
        // Overlays must not nest.
        let roots: Vec<PathBuf> = overlays
            .iter()
            .filter(|o| {
                !overlays
                    .iter()
                    .any(|other| other != *o && o.starts_with(other))
            })
            .cloned()
            .collect();
        ensure!(
            roots.iter().all(|r| r != Path::new("/")),
            "refusing to overlay / for {mkdirs:?}"
        );
        let upper_of = |root: &Path| -> PathBuf {
            let flat = root
                .to_string_lossy()
                .trim_start_matches('/')
                .replace('/', "_");
            p.dir.join("overlay").join(flat)
        };
        for r in &roots {
            std::fs::create_dir_all(upper_of(r).join("upper"))?;
            std::fs::create_dir_all(upper_of(r).join("work"))?;
        }
        let in_upper = |path: &Path| -> Result<PathBuf> {
            let root = roots
                .iter()
                .find(|r| path.starts_with(r))
                .with_context(|| format!("{} is under no overlay", path.display()))?;
            Ok(upper_of(root).join("upper").join(path.strip_prefix(root)?))
        };
        for d in &mkdirs {
            std::fs::create_dir_all(in_upper(d)?)?;
        }
        if let (Some(u), Some(home)) = (user, home) {
            // The image's user owns its home directory.
            std::os::unix::fs::chown(in_upper(Path::new(home))?, Some(u.uid), Some(u.gid))?;
            let (passwd, group) = image_user_db(&u)?;
            write_file(
                &in_upper(Path::new("/etc/passwd"))?,
                passwd.as_bytes(),
                0o644,
            )?;
            write_file(&in_upper(Path::new("/etc/group"))?, group.as_bytes(), 0o644)?;
        }
        if let Some((uid, _)) = image.platform_user {
            // The image knows no user of the UID the platform assigns: the host's /etc/passwd,
            // which the test checks has none.
            let passwd = std::fs::read_to_string("/etc/passwd")?;
            ensure!(
                !passwd
                    .lines()
                    .any(|l| l.split(':').nth(2) == Some(uid.to_string().as_str())),
                "the host's /etc/passwd has an entry for uid {uid}, which the emulated image must not"
            );
        }

        // Image files, in the /etc overlay.
        write_file(&in_upper(Path::new("/etc/hosts"))?, hosts.as_bytes(), 0o644)?;
        write_file(
            &in_upper(Path::new("/etc/hostname"))?,
            format!("{}\n", p.plan.hostname).as_bytes(),
            0o644,
        )?;
        // Emulates the runtime image's ssh defaults (mpi-operator's base image sets the same):
        // pods are new hosts every time, so host keys cannot be known in advance.
        // The client's port is the image's sshd's.
        write_file(
            &in_upper(Path::new("/etc/ssh/ssh_config.d/mpi-image.conf"))?,
            format!(
                "Host *\n    Port {}\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n",
                image.sshd_port
            )
            .as_bytes(),
            0o644,
        )?;
        let host_key_file = in_upper(Path::new(&host_key))?;
        if !host_key_file.exists() {
            proc::run_ok(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ecdsa", "-N", "", "-C", "", "-f"])
                    .arg(&host_key_file),
                T,
            )?;
        }
        if let Some(u) = user {
            // A non-root sshd reads its own host key.
            std::os::unix::fs::chown(&host_key_file, Some(u.uid), Some(u.gid))?;
        }
        // The image's sshd: login with keys only, no PAM (no logind here; a non-root sshd cannot
        // use it either). StrictModes is off as in mpi-operator's base image, because the modes of
        // kubelet's volume directories depend on the medium and fsGroup and are not the product's
        // to choose. SetEnv gives ssh sessions the image's PATH (where a real image has the MPI
        // daemons).
        let sshd_config = format!(
            "Port {}\nHostKey {host_key}\nPermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nPidFile none\nLogLevel VERBOSE\nSetEnv PATH={}\n",
            image.sshd_port,
            launcher.path_env()
        );
        write_file(
            &in_upper(Path::new(image.sshd_config))?,
            sshd_config.as_bytes(),
            0o644,
        )?;

        // Each container's start: private mounts, then its command (exec'd, "$@").
        for (container, binds) in containers.iter().zip(&binds) {
            let mut s = String::from("#!/bin/sh\nset -eu\nmount --make-rprivate /\n");
            for r in &roots {
                let u = upper_of(r);
                let _ = writeln!(
                    s,
                    "mount -t overlay mpiw-pod -o lowerdir={r},upperdir={up},workdir={wk} {r}",
                    r = sh_quote(&r.to_string_lossy()),
                    up = sh_quote(&u.join("upper").to_string_lossy()),
                    wk = sh_quote(&u.join("work").to_string_lossy()),
                );
            }
            for (src, dst, read_only) in binds {
                let _ = writeln!(
                    s,
                    "mount --bind {a} {b}",
                    a = sh_quote(&src.to_string_lossy()),
                    b = sh_quote(&dst.to_string_lossy()),
                );
                if *read_only {
                    let _ = writeln!(
                        s,
                        "mount -o remount,bind,ro {}",
                        sh_quote(&dst.to_string_lossy())
                    );
                }
            }
            let _ = writeln!(
                s,
                "echo {} > /proc/sys/kernel/hostname",
                sh_quote(&p.plan.hostname)
            );
            // The container runtime starts the command in the container's workingDir, else the
            // image's (none here): "/". Never the test's own directory: the launchers pass
            // their working directory on to the daemons they start on the workers (Hydra's
            // proxies, PRRTE's prted), and a clone under a 0700 folder is not enterable by uid
            // 1000.
            let _ = writeln!(
                s,
                "cd {}",
                sh_quote(container["workingDir"].as_str().unwrap_or("/"))
            );
            // The container runtime's switch to the container's user, after the mounts.
            let setpriv = self
                .run_as(p, container)?
                .map(|r| r.setpriv())
                .unwrap_or_default();
            let _ = writeln!(s, "exec {} \"$@\"", setpriv.join(" "));
            let name = container["name"]
                .as_str()
                .context("container without name")?;
            write_file(&p.script(name), s.as_bytes(), 0o755)?;
        }
        Ok(())
    }

    /// A command that runs `argv` as pod `p`'s `container` would: in the pod's namespaces, with
    /// its mounts and user, and exactly `env` (plus what a container runtime always sets).
    pub fn pod_command(
        &self,
        p: &Pod,
        container: &Value,
        argv: &[String],
        path: &str,
        env: &[(String, String)],
    ) -> Result<Command> {
        let home = self
            .run_as(p, container)?
            .map_or("/root".to_string(), |r| r.home);
        let name = container["name"]
            .as_str()
            .context("container without name")?;
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &p.ns,
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
        ])
        .arg(p.script(name))
        .args(argv)
        .current_dir("/")
        .env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("HOSTNAME", &p.plan.hostname);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }

    /// Start a pod whose container is a daemon (sshd) and wait until it listens.
    pub fn start_daemon(
        &mut self,
        idx: usize,
        argv: &[String],
        path: &str,
        ready: &str,
    ) -> Result<()> {
        let p = &self.pods[idx];
        let container = p.plan.container()?.clone();
        let mut cmd = self.pod_command(p, &container, argv, path, &[])?;
        let mut d = Daemon::spawn(&p.plan.hostname, &mut cmd)?;
        let res = d.wait_for(ready, T);
        self.daemons.push(d);
        res
    }

    pub fn daemon_logs(&self) -> String {
        self.daemons
            .iter()
            .map(|d| format!("--- {} ---\n{}", d.name, d.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Kill every process in our namespaces, delete the namespaces. Safe to call twice.
    pub fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        for d in &mut self.daemons {
            d.stop();
        }
        self.daemons.clear();
        let mut errors = Vec::new();
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = remove_namespace(ns) {
                errors.push(format!("{ns}: {e:#}"));
            }
        }
        self.namespaces.clear();
        if !errors.is_empty() {
            bail!("cleanup of {} failed: {}", self.tag, errors.join("; "));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("mpi_launchers: {e:#}");
        }
    }
}

fn nearest_existing_ancestor(p: &Path) -> Result<PathBuf> {
    let mut cur = p.parent();
    while let Some(c) = cur {
        if c.is_dir() {
            return Ok(c.to_path_buf());
        }
        cur = c.parent();
    }
    bail!("{} has no existing ancestor", p.display())
}

/// Kill the processes inside one of our namespaces (all of them were started by this test), then
/// delete it.
pub fn remove_namespace(ns: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = proc::run(Command::new("ip").args(["netns", "pids", ns]), T)?;
        let pids: Vec<&str> = pids.stdout.split_whitespace().collect();
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            bail!("processes {pids:?} survive in {ns}");
        }
        for pid in pids {
            if pid.chars().all(|c| c.is_ascii_digit()) {
                let _ = proc::run(Command::new("kill").args(["-KILL", pid]), T);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = proc::run(Command::new("ip").args(["netns", "del", ns]), T)?;
    if !out.success() {
        bail!("ip netns del {ns}: {}", out.stderr.trim());
    }
    Ok(())
}

/// Prefix of the test's temp dirs: `mpiw-launchers-<pid>-<random>`.
pub const TMP_PREFIX: &str = "mpiw-launchers-";

fn pid_is_gone(pid: &str) -> bool {
    !pid.is_empty()
        && pid != std::process::id().to_string()
        && !Path::new("/proc").join(pid).exists()
}

/// Temp dirs that an earlier run of this test left behind when it was killed.
pub fn stale_temp_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(TMP_PREFIX) else {
                return false;
            };
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[pid.len()..].starts_with('-') && pid_is_gone(&pid)
        })
        .map(|e| e.path())
        .collect()
}

/// Namespaces that an earlier run of this test left behind (its process is gone).
pub fn stale_namespaces() -> Vec<String> {
    let Ok(list) = proc::run(Command::new("ip").args(["netns", "list"]), T) else {
        return Vec::new();
    };
    list.stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| {
            let Some(rest) = name.strip_prefix(NS_PREFIX) else {
                return false;
            };
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[pid.len()..].starts_with('s') && pid_is_gone(&pid)
        })
        .map(str::to_string)
        .collect()
}

/// The image's /etc/passwd and /etc/group: the host's, with `u` in place of any entry that
/// has its name or id.
fn image_user_db(u: &ImageUser) -> Result<(String, String)> {
    let keep = |text: String, id: u32| -> String {
        text.lines()
            .filter(|l| {
                let mut f = l.split(':');
                let name = f.next().unwrap_or("");
                let num = f.nth(1).unwrap_or("");
                name != u.name && num != id.to_string()
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let mut passwd = keep(std::fs::read_to_string("/etc/passwd")?, u.uid);
    let _ = writeln!(
        passwd,
        "{}:x:{}:{}::{}:/bin/sh",
        u.name, u.uid, u.gid, u.home
    );
    let mut group = keep(std::fs::read_to_string("/etc/group")?, u.gid);
    let _ = writeln!(group, "{}:x:{}:", u.name, u.gid);
    Ok((passwd, group))
}

/// What kubelet does for an emptyDir (an empty directory, 0777) and for a Secret / ConfigMap
/// volume: the items (or all keys) as files with the
/// given modes, owned by root, in the `..data` layout (`<dir>/<path> -> ..data/<path>`,
/// `..data -> ..<timestamp>`). With `fs_group`, kubelet's ownership pass on the read-only volume
/// (`SetVolumeOwnership`): everything gets group `fs_group` (symlinks too, with lchown), files get
/// group read added to their mode (`|= 0440`), directories setgid and group r-x (`|= 02550`).
fn materialize_volume(
    vol: &Value,
    rendered: &[Value],
    dir: &Path,
    fs_group: Option<u32>,
) -> Result<()> {
    if vol.get("emptyDir").is_some_and(Value::is_object) {
        // kubelet makes an emptyDir world-writable: any UID the pod gets can write it.
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
        return Ok(());
    }
    let (kind, source, obj_name) = if let Some(s) = vol.get("secret").filter(|s| !s.is_null()) {
        ("Secret", s, s["secretName"].as_str())
    } else if let Some(c) = vol.get("configMap").filter(|c| !c.is_null()) {
        ("ConfigMap", c, c["name"].as_str())
    } else {
        bail!("only secret and configMap volumes are emulated, got {vol}");
    };
    let obj_name = obj_name.with_context(|| format!("{kind} volume without a name"))?;
    let obj = product::find(rendered, kind, obj_name)?;
    let default_mode = source["defaultMode"].as_u64().unwrap_or(0o644);
    let items: Vec<(String, String, u64)> = match source["items"].as_array() {
        Some(items) => items
            .iter()
            .map(|it| {
                Ok((
                    it["key"].as_str().context("item without key")?.to_string(),
                    it["path"]
                        .as_str()
                        .context("item without path")?
                        .to_string(),
                    it["mode"].as_u64().unwrap_or(default_mode),
                ))
            })
            .collect::<Result<_>>()?,
        None => obj["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| (k.clone(), k.clone(), default_mode))
            .collect(),
    };
    let ts = dir.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&ts)?;
    for (key, path, mode) in &items {
        ensure!(
            !path.contains("..") && !path.starts_with('/') && !path.contains('/'),
            "item path {path} is not a plain file name"
        );
        let bytes = product::data_bytes(obj, key)?;
        let mode = u32::try_from(*mode).context("mode out of range")?;
        ensure!(
            mode <= 0o777,
            "item {path} has mode {mode:o}, more than 0777"
        );
        write_file(&ts.join(path), &bytes, mode)?;
        std::os::unix::fs::symlink(Path::new("..data").join(path), dir.join(path))?;
    }
    std::os::unix::fs::symlink(ts.file_name().context("ts dir name")?, dir.join("..data"))?;
    std::fs::set_permissions(&ts, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    if let Some(group) = fs_group {
        let mut entries = vec![dir.to_path_buf(), ts.clone(), dir.join("..data")];
        for (_, path, _) in &items {
            entries.push(ts.join(path));
            entries.push(dir.join(path));
        }
        for e in entries {
            std::os::unix::fs::lchown(&e, None, Some(group))?;
            let meta = std::fs::symlink_metadata(&e)?;
            if meta.file_type().is_symlink() {
                continue; // a symlink's mode means nothing; kubelet skips them too
            }
            let add = if meta.is_dir() { 0o2550 } else { 0o440 };
            let mode = meta.permissions().mode() & 0o7777 | add;
            std::fs::set_permissions(&e, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}
