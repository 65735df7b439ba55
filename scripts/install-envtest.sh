#!/usr/bin/env bash
# Puts the control plane and node binaries the tests need (tests/envtest, tests/cluster) in place.
# From the first of:
# 1. KUBEBUILDER_ASSETS, when set: used as it is (it must hold etcd and kube-apiserver);
# 2. the team's copy beside the repository (envtest_src below): unpacked into target/envtest and
#    checked against its SHA256SUMS (skipped when present and matching), etcd from Debian: the
#    system's when it is 3.5.13 or later, else etcd-server from Debian 13 (apt checks its
#    signature; nothing is installed on the system). Kubernetes 1.36's watch cache needs 3.5.13
#    for its consistent and streamed lists (RequestWatchProgress); Debian 12 has 3.4.23;
# 3. target/envtest as an earlier run of this script left it;
# 4. the envtest release archive of the pinned version, what `setup-envtest use 1.36.x` downloads
#    (etcd, kube-apiserver, kubectl; checked against the sha512 of controller-tools' index), and
#    kube-controller-manager, kube-scheduler and kubelet of the same version from dl.k8s.io (each
#    checked against its published .sha256). The JobSet controller has no binary release:
#    scripts/install-neighbours.sh builds it from its Go module (the team's copy, unpacked in 2.,
#    is the fallback);
# else it stops with what to do. Mirrors: ENVTEST_INDEX_URL, KUBERNETES_RELEASE_URL. ENVTEST_DIR
# (default target/envtest) and TEAM_ENVTEST (the team's copy) are for its own test
# (tests/install_envtest.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ENVTEST_VERSION=1.36
dest="${ENVTEST_DIR:-target/envtest}"
ENVTEST_INDEX_URL="${ENVTEST_INDEX_URL:-https://raw.githubusercontent.com/kubernetes-sigs/controller-tools/HEAD/envtest-releases.yaml}"
KUBERNETES_RELEASE_URL="${KUBERNETES_RELEASE_URL:-https://dl.k8s.io/release}"
has_control_plane() { [ -x "$1/etcd" ] && [ -x "$1/kube-apiserver" ]; }
ETCD_MIN=3.5.13
etcd_new_enough() { # the etcd binary $1 is $ETCD_MIN or later
  local version
  version="$("$1" --version 2>/dev/null | awk '/^etcd Version:/ { print $3 }')"
  [ -n "$version" ] && [ "$(printf '%s\n' "$ETCD_MIN" "$version" | sort -V | head -n 1)" = "$ETCD_MIN" ]
}
debian_etcd() { # etcd from Debian 13's etcd-server into $dest, through apt with a list of its own
  # Called as a condition, where `set -e` does not apply: every step says `|| return`.
  local tmp opts
  tmp="$(mktemp -d)" || return
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts" || return
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    > "$tmp/sources.list" || return
  opts=(-o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts="$tmp/parts"
    -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1
    -o APT::Sandbox::User=root)
  echo "install-envtest: etcd $ETCD_MIN or later from Debian 13's etcd-server"
  apt-get "${opts[@]}" -qq update >/dev/null || return
  (cd "$tmp" && apt-get "${opts[@]}" -qq download etcd-server >/dev/null) || return
  dpkg-deb -x "$tmp"/etcd-server_*.deb "$tmp/x" || return
  etcd_new_enough "$tmp/x/usr/bin/etcd" || return
  rm -f "$dest/etcd" && install -m 0755 "$tmp/x/usr/bin/etcd" "$dest/etcd" || return
}
unpack() { # SHA256SUMS file, then the binaries it lists, each from <name>.xz beside it
  local sums="$1"
  if ! (cd "$dest" && sha256sum --quiet -c "$sums" >/dev/null 2>&1); then
    for b in $(awk '{ print $2 }' "$sums"); do
      xz -dc "$envtest_src/$b.xz" > "$dest/$b.partial"
      chmod +x "$dest/$b.partial"
      mv "$dest/$b.partial" "$dest/$b"
    done
    (cd "$dest" && sha256sum --quiet -c "$sums")
  fi
}
download_envtest() { # the newest v$ENVTEST_VERSION.x release into $dest
  # Called as a condition, where `set -e` does not apply: every step says `|| return`.
  local arch os=linux tmp version url hash b
  arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
  case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
  tmp="$(mktemp -d)" || return
  trap 'rm -rf "$tmp"' RETURN
  echo "install-envtest: downloading the envtest $ENVTEST_VERSION.x release ($ENVTEST_INDEX_URL)"
  curl -fsSL --retry 3 -o "$tmp/index.yaml" "$ENVTEST_INDEX_URL" || return
  # The newest matching release with an archive for this platform: version, URL, sha512.
  python3 - "$tmp/index.yaml" "$ENVTEST_VERSION" "$os-$arch" > "$tmp/release" <<'PY' || return
import sys, yaml
index, minor, platform = sys.argv[1], sys.argv[2], sys.argv[3]
releases = yaml.safe_load(open(index))["releases"]
def key(v): return tuple(int(p) for p in v.lstrip("v").split("."))
matching = sorted((v for v in releases if v.lstrip("v").startswith(minor + ".")), key=key)
if not matching:
    sys.exit(f"no v{minor}.x release in the envtest index")
for version in reversed(matching):
    for name, archive in releases[version].items():
        if name.endswith(f"-{platform}.tar.gz"):
            print(version, archive["selfLink"], archive["hash"])
            sys.exit(0)
sys.exit(f"no {platform} archive for envtest v{minor}.x")
PY
  read -r version url hash < "$tmp/release" || return
  curl -fsSL --retry 3 -o "$tmp/envtest.tar.gz" "$url" || return
  echo "$hash  $tmp/envtest.tar.gz" | sha512sum --quiet -c - || return
  # controlplane/{etcd,kube-apiserver,kubectl}; $dest gets them only when all checked out.
  mkdir -p "$tmp/out" || return
  tar -xzf "$tmp/envtest.tar.gz" -C "$tmp/out" --strip-components=1 || return
  for b in kube-controller-manager kube-scheduler kubelet; do
    curl -fsSL --retry 3 -o "$tmp/$b" "$KUBERNETES_RELEASE_URL/$version/bin/$os/$arch/$b" || return
    curl -fsSL --retry 3 -o "$tmp/$b.sha256" \
      "$KUBERNETES_RELEASE_URL/$version/bin/$os/$arch/$b.sha256" || return
    echo "$(cat "$tmp/$b.sha256")  $tmp/$b" | sha256sum --quiet -c - || return
    install -m 0755 "$tmp/$b" "$tmp/out/$b" || return
  done
  mkdir -p "$dest" && mv -f "$tmp"/out/* "$dest"/ || return
  echo "install-envtest: envtest $version in $dest"
}
envtest_src="${TEAM_ENVTEST:-../shared/envtest}"
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  if ! has_control_plane "$KUBEBUILDER_ASSETS"; then
    echo "install-envtest: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no etcd and kube-apiserver" >&2
    exit 1
  fi
elif [ -d "$envtest_src" ]; then
  mkdir -p "$dest"
  src="$(cd "$envtest_src" && pwd)"
  unpack "$src/SHA256SUMS"
  # The node (tests/cluster): kubelet, kube-scheduler and the JobSet controller.
  if [ -f "$src/SHA256SUMS.node" ]; then
    unpack "$src/SHA256SUMS.node"
  fi
  etcd_bin="$(command -v etcd)"
  if etcd_new_enough "$etcd_bin"; then
    ln -sf "$etcd_bin" "$dest"/etcd
  elif [ -L "$dest/etcd" ] || ! etcd_new_enough "$dest/etcd"; then
    if ! debian_etcd; then
      # The watches then list in pages (src/objects/cluster.rs `events`): slower, as correct.
      echo "install-envtest: warning: no etcd $ETCD_MIN or later; using $etcd_bin" >&2
      ln -sf "$etcd_bin" "$dest"/etcd
    fi
  fi
elif ! has_control_plane "$dest"; then
  if ! download_envtest; then
    echo "install-envtest: no control plane for tests/envtest: set KUBEBUILDER_ASSETS to a" \
      "directory holding etcd and kube-apiserver (\`setup-envtest use $ENVTEST_VERSION.x -p path\`)," \
      "or let this script reach $ENVTEST_INDEX_URL (or skip those tests with SKIP_TEST_SUITES=envtest,cluster)" >&2
    exit 1
  fi
fi

