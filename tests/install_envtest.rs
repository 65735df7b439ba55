//! `scripts/install-envtest.sh` finds the control plane in its documented order, and downloads the
//! envtest release only when every checksum matches: against a `file://` mirror of the index,
//! the archive and dl.k8s.io's layout, so no network is needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256, Sha512};

const NODE: [&str; 3] = ["kube-controller-manager", "kube-scheduler", "kubelet"];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A mirror holding envtest v1.36.9 (the newest 1.36 with a linux-amd64 archive: v1.36.10 has only
/// darwin), v1.35.0, and the node binaries of v1.36.9; `tamper` corrupts the kubelet.
fn mirror(root: &Path, tamper: bool) {
    let plane = root.join("archive/controlplane");
    std::fs::create_dir_all(&plane).unwrap();
    for b in ["etcd", "kube-apiserver", "kubectl"] {
        let path = plane.join(b);
        std::fs::write(&path, format!("#!/bin/sh\necho {b}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let archive = root.join("envtest-v1.36.9-linux-amd64.tar.gz");
    let tar = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(root.join("archive"))
        .arg("controlplane")
        .status()
        .unwrap();
    assert!(tar.success());
    let hash = hex(&Sha512::digest(std::fs::read(&archive).unwrap()));
    let url = |p: &Path| format!("file://{}", p.display());
    std::fs::write(
        root.join("index.yaml"),
        format!(
            "releases:\n  v1.35.0:\n    envtest-v1.35.0-linux-amd64.tar.gz: \
             {{hash: x, selfLink: file:///nonexistent}}\n  v1.36.9:\n    \
             envtest-v1.36.9-linux-amd64.tar.gz: {{hash: {hash}, selfLink: {}}}\n  \
             v1.36.10:\n    envtest-v1.36.10-darwin-amd64.tar.gz: \
             {{hash: x, selfLink: file:///nonexistent}}\n",
            url(&archive)
        ),
    )
    .unwrap();
    let bin = root.join("release/v1.36.9/bin/linux/amd64");
    std::fs::create_dir_all(&bin).unwrap();
    for b in NODE {
        let body = format!("#!/bin/sh\necho {b}\n");
        std::fs::write(bin.join(b), &body).unwrap();
        let published = if tamper && b == "kubelet" {
            hex(&Sha256::digest(b"something else"))
        } else {
            hex(&Sha256::digest(body.as_bytes()))
        };
        std::fs::write(bin.join(format!("{b}.sha256")), published).unwrap();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-envtest.sh")
}

/// Runs the script with no team copy, the mirror, and `dest`.
fn run(root: &Path, dest: &Path, assets: Option<&Path>) -> Output {
    let mut command = Command::new("bash");
    command
        .arg(script())
        .env_remove("KUBEBUILDER_ASSETS")
        .env("TEAM_ENVTEST", root.join("no-team-copy"))
        .env("ENVTEST_DIR", dest)
        .env(
            "ENVTEST_INDEX_URL",
            format!("file://{}", root.join("index.yaml").display()),
        )
        .env(
            "KUBERNETES_RELEASE_URL",
            format!("file://{}", root.join("release").display()),
        );
    if let Some(assets) = assets {
        command.env("KUBEBUILDER_ASSETS", assets);
    }
    command.output().unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn without_assets_or_a_team_copy_it_downloads_the_pinned_release_checked() {
    let root = tempfile::tempdir().unwrap();
    mirror(root.path(), false);
    let dest = root.path().join("envtest");
    let out = run(root.path(), &dest, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("envtest v1.36.9 in"), "{stdout}");
    assert_eq!(
        names(&dest),
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "kubelet"
        ]
    );
    // A second run finds them and downloads nothing.
    std::fs::remove_file(root.path().join("index.yaml")).unwrap();
    let again = run(root.path(), &dest, None);
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout), "");
}

#[test]
fn a_checksum_that_does_not_match_leaves_nothing_and_says_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    mirror(root.path(), true);
    let dest = root.path().join("envtest");
    let out = run(root.path(), &dest, None);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(said.contains("kubelet: FAILED"), "{said}");
    assert!(said.contains("setup-envtest use 1.36.x -p path"), "{said}");
    assert!(said.contains("SKIP_TEST_SUITES=envtest,cluster"), "{said}");
    assert_eq!(names(&dest), Vec::<String>::new());
}

#[test]
fn kubebuilder_assets_comes_first_and_must_hold_the_control_plane() {
    let root = tempfile::tempdir().unwrap();
    mirror(root.path(), false);
    let dest = root.path().join("envtest");
    let assets = root.path().join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    let out = run(root.path(), &dest, Some(&assets));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no etcd and kube-apiserver"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for b in ["etcd", "kube-apiserver"] {
        let path = assets.join(b);
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = run(root.path(), &dest, Some(&assets));
    assert!(out.status.success());
    // Used as it is: nothing downloaded.
    assert_eq!(names(&dest), Vec::<String>::new());
}
