#!/usr/bin/env bash
# Builds the controllers the cluster scenarios run beside mpi-webhook ("neighbours") from their
# published Go modules, each pinned by a module of ours under tests/neighbours/<name>/ (its go.mod
# names the version, its go.sum the checksums; `go build` refuses a module that does not match):
#
#   name          module                          package
#   trainer-v2.3  github.com/kubeflow/trainer/v2  cmd/trainer-controller-manager
#   jobset        sigs.k8s.io/jobset              the module's root (its main.go is the manager)
#   kueue         sigs.k8s.io/kueue               cmd/kueue
#   helm          helm.sh/helm/v4                 cmd/helm (the CLI the chart's tests run)
#
# Each goes to target/neighbours/<name>/: the binary, plus the YAML its release ships that the
# tests apply (CRDs, RBAC, webhook configurations, runtimes), copied from the module's directory
# in the Go module cache. A stamp (the module's version, the SHA-256 of our go.mod and go.sum, the
# Go version) makes a second run build nothing. Static builds: CGO_ENABLED=0, -trimpath, -s -w.
#
# Without Go it builds nothing and says so (the cluster suite then fails naming the missing
# binaries; the JobSet controller falls back to the team's copy that scripts/install-envtest.sh
# unpacks). NEIGHBOURS_DIR (default target/neighbours) and NEIGHBOURS (names, comma-separated;
# default all) are for running it by hand.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dest_root="${NEIGHBOURS_DIR:-target/neighbours}"
# Absolute: each build runs in its module's folder.
mkdir -p "$dest_root"
dest_root="$(cd "$dest_root" && pwd)"
only="${NEIGHBOURS:-}"

if ! command -v go >/dev/null 2>&1; then
  echo "install-neighbours: no go on PATH: Kubeflow Trainer, the JobSet controller and helm not" \
    "built (the cluster scenarios and the chart's tests need them; install Go 1.26 or later)" >&2
  exit 0
fi

export CGO_ENABLED=0
# Two compile jobs at most: CI's machines have 2 cores.
export GOFLAGS="-p=2 -trimpath -buildvcs=false -mod=readonly"

# build NAME PACKAGE BINARY YAML... : the module in tests/neighbours/NAME, its PACKAGE built as
# target/neighbours/NAME/BINARY, and each YAML path (a file or folder of the upstream module)
# copied under target/neighbours/NAME/ at the same relative path. EXTRA_LDFLAGS, when set for
# one call, is added to -ldflags with @VERSION@ replaced by the pinned version (and to the stamp,
# so that changing it builds again).
build() {
  local name="$1" pkg="$2" binary="$3"
  shift 3
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
    return
  fi
  local src="tests/neighbours/$name" dest="$dest_root/$name"
  local module version dir stamp started
  # The module that provides the package (the longest required path that prefixes it), at the
  # version our go.mod pins; read from go.mod alone, so a current build needs no module cache.
  read -r module version < <(cd "$src" && go mod edit -json | python3 -c '
import json, sys
pkg = sys.argv[1]
mods = [r for r in json.load(sys.stdin)["Require"] if pkg == r["Path"] or pkg.startswith(r["Path"] + "/")]
m = max(mods, key=lambda r: len(r["Path"]))
print(m["Path"], m["Version"])' "$pkg")
  stamp="$module $version $(cd "$src" && cat go.mod go.sum | sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
  local extra="${EXTRA_LDFLAGS:-}"
  extra="${extra//@VERSION@/$version}"
  if [ -n "$extra" ]; then
    stamp="$stamp $extra"
  fi
  if [ -x "$dest/$binary" ] && [ -f "$dest/.stamp" ] && [ "$(cat "$dest/.stamp")" = "$stamp" ]; then
    return
  fi
  started=$SECONDS
  echo "install-neighbours: building $name ($module $version)"
  rm -rf "$dest"
  mkdir -p "$dest"
  (cd "$src" && go build -ldflags="-s -w${extra:+ $extra}" -o "$dest/$binary.partial" "$pkg")
  dir="$(cd "$src" && go mod download -json "$module@$version" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  local path
  for path in "$@"; do
    mkdir -p "$dest/$(dirname "$path")"
    cp -R "$dir/$path" "$dest/$path"
  done
  # The module cache is read-only; the copies need not be.
  chmod -R u+w "$dest"
  mv "$dest/$binary.partial" "$dest/$binary"
  echo "$stamp" > "$dest/.stamp"
  echo "install-neighbours: $name built in $((SECONDS - started)) s"
}

build trainer-v2.3 github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager \
  trainer-controller-manager \
  manifests/base/crds manifests/base/rbac manifests/base/webhook manifests/base/runtimes \
  manifests/base/manager
build jobset sigs.k8s.io/jobset jobset-controller \
  config/components/crd config/components/rbac config/components/webhook
build kueue sigs.k8s.io/kueue/cmd/kueue kueue \
  config/components/crd config/components/rbac config/components/webhook \
  config/components/manager
# Helm's Makefile sets its version this way; without it `helm version` says v4.3 (the
# Capabilities' Kubernetes version it reads from the module's client-go, needing no flag).
EXTRA_LDFLAGS="-X helm.sh/helm/v4/internal/version.version=@VERSION@" \
  build helm helm.sh/helm/v4/cmd/helm helm
