//! `manifests/` rendered as `kubectl kustomize` renders it, shared by `tests/manifests.rs` and
//! `tests/helm.rs` (the chart must render the same objects): from a copy of `manifests/` in which
//! the cli-certs overlay has placeholder `tls/` files (they are generated and git-ignored).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's `manifests/`.
fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests")
}

/// Writes the placeholder `tls.crt`, `tls.key` and `ca.crt` into `dir`: each file's name and path.
pub fn placeholder_tls(dir: &Path) -> [(String, PathBuf); 3] {
    ["tls.crt", "tls.key", "ca.crt"].map(|file| {
        let path = dir.join(file);
        std::fs::write(&path, format!("placeholder {file}\n")).expect("write");
        (file.to_string(), path)
    })
}

/// Copies the folder `from` to `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let target = to.join(path.file_name().expect("file name"));
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// Renders `manifests/<path>` with `kubectl kustomize`.
pub fn kustomize(kubectl: &Path, path: &str) -> Vec<Value> {
    kustomize_with(kubectl, path, &[])
}

/// [`kustomize`] on a copy of `manifests/` with `extra` files (path, content) written into it.
pub fn kustomize_with(kubectl: &Path, path: &str, extra: &[(&str, &str)]) -> Vec<Value> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("manifests");
    copy_dir(&manifests(), &root);
    for (file, content) in extra {
        let file = root.join(file);
        std::fs::create_dir_all(file.parent().expect("a directory")).expect("mkdir");
        std::fs::write(file, content).expect("write");
    }
    placeholder_tls(&root.join("overlays/cli-certs/tls"));
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(root.join(path))
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/{path} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).expect("rendered YAML parses")
}
