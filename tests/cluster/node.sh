#!/usr/bin/env bash
# One Kubernetes node on this machine, for tests/cluster: a CNI bridge, containerd (with its own
# root, state and socket), the kubelet, and cluster DNS for pod host names (dnsmasq, fed from the
# API's Pods). It runs in the foreground until its standard input reaches end-of-file (the test
# binary that started it holds the other end: when that process exits for any reason, a panic or
# SIGKILL included, the kernel closes the pipe), or until SIGTERM/SIGINT; then it tears down, in
# order, everything it created and nothing else:
#   the kubelet; every container and sandbox of its containerd (tasks killed through containerd,
#   since stopping containerd leaves shims and containers running); containerd and its shims;
#   every mount under its folder; the pod network namespaces and the CNI IP allocations it made;
#   the bridge; the kubelet's cgroups; the host sysctls it changed (restored to what they were);
#   the propagation of `/` (made shared for the kubelet, restored); iptables rules added since
#   start; its folder.
# It refuses to start (exit 2, saying why) when something it would create already exists: the
# bridge, the bridge's subnet on another link, a kubelet cgroup hierarchy.
#
# The recipe, and why each setting is what it is: shared/envtest/NODE.md (the team's notes),
# summed up in docs/development.md "The single-node cluster".
#
# Environment (all required unless a default is given):
#   NODE_DIR        a new folder for everything this node writes (logs stay there until teardown;
#                   NODE_KEEP_LOGS=DIR copies the logs to DIR first)
#   KUBECONFIG      an admin kubeconfig of the API server
#   CLIENT_CA       the CA file the kubelet trusts for client certificates (the API server's
#                   --kubelet-client-certificate is signed by it)
#   KUBELET         the kubelet binary
#   KUBECTL         kubectl, for the DNS feed (default: kubectl on PATH)
#   IMAGES          a file of lines `<short> <base-name> <tag> <archive>` (scripts/build-test-images.sh's
#                   images.txt) and any extra `<short> <base-name> <tag> <archive>` lines; each
#                   archive is imported into containerd's k8s.io namespace
#   BRIDGE          the bridge's name (default mpiwh0)
#   NODE_NAME       the node's name (default mpi-webhook-e2e)
# Ready: the file $NODE_DIR/ready appears once the node is Ready in the API (a failed start
# writes $NODE_DIR/failed with the reason and exits non-zero).
set -euo pipefail

: "${NODE_DIR:?}" "${KUBECONFIG:?}" "${CLIENT_CA:?}" "${KUBELET:?}" "${IMAGES:?}"
KUBECTL="${KUBECTL:-kubectl}"
BRIDGE="${BRIDGE:-mpiwh0}"
NODE_NAME="${NODE_NAME:-mpi-webhook-e2e}"
# The bridge's address is the node's IP (the API server reaches the kubelet there for logs) and
# the pods' DNS server.
GATEWAY=10.88.0.1
SUBNET=10.88.0.0/16
CNI_NETWORK=mpi-webhook-e2e
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)

log() { printf '%s node.sh: %s\n' "$(date +%T)" "$*" >&2; }
fail() {
  log "$*"
  printf '%s\n' "$*" >"$NODE_DIR/failed"
  exit 2
}

mkdir -p "$NODE_DIR"
NODE_DIR="$(cd "$NODE_DIR" && pwd)"
state="$NODE_DIR/teardown"
mkdir -p "$state"
sock="$NODE_DIR/containerd/containerd.sock"
ctr_() { ctr --address "$sock" -n k8s.io "$@"; }

# ---------------------------------------------------------------------------------------------
# Teardown: every step is safe to run when its part never started.
torn_down=0
# shellcheck disable=SC2317 # called by the EXIT trap
teardown() {
  if ((torn_down)); then return; fi
  torn_down=1
  set +e
  log "teardown"
  if [[ -n "${NODE_KEEP_LOGS:-}" ]]; then
    mkdir -p "$NODE_KEEP_LOGS"
    cp "$NODE_DIR"/*.log "$NODE_KEEP_LOGS"/ 2>/dev/null
    # The containers' logs, as the kubelet wrote them (pod folders by namespace_name_uid).
    cp -r "$NODE_DIR/pod-logs" "$NODE_KEEP_LOGS"/ 2>/dev/null
  fi
  # The feed (a subshell) and its kubectl watch.
  [[ -n "${dns_pid:-}" ]] && pkill -P "$dns_pid" 2>/dev/null
  [[ -n "${dns_pid:-}" ]] && kill "$dns_pid" 2>/dev/null
  [[ -n "${dnsmasq_pid:-}" ]] && kill "$dnsmasq_pid" 2>/dev/null
  if [[ -n "${kubelet_pid:-}" ]]; then
    kill "$kubelet_pid" 2>/dev/null
    wait "$kubelet_pid" 2>/dev/null
  fi
  if [[ -n "${containerd_pid:-}" ]]; then
    # Kill every container through containerd: its shims outlive it otherwise.
    local ids
    ids="$(ctr_ tasks ls -q 2>/dev/null)"
    for id in $ids; do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
    for _ in $(seq 50); do
      [[ "$(ctr_ tasks ls 2>/dev/null)" == *RUNNING* ]] || break
      sleep 0.2
    done
    for id in $ids; do ctr_ tasks delete "$id" >/dev/null 2>&1; done
    containers="$(ctr_ containers ls -q 2>/dev/null)"
    for id in $containers; do ctr_ containers delete "$id" >/dev/null 2>&1; done
    kill "$containerd_pid" 2>/dev/null
    wait "$containerd_pid" 2>/dev/null
  fi
  # Shims started for this containerd (they name its socket on their command line).
  pkill -KILL -f "containerd-shim.*-address $sock" 2>/dev/null
  # Mounts under the folder, deepest first (secret tmpfs, overlay snapshots, shm, netns binds).
  for _ in 1 2 3; do
    awk -v d="$NODE_DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
      while read -r m; do umount -l "$m" 2>/dev/null; done
  done
  # Pod network namespaces containerd made (the ones that did not exist at start).
  if [[ -f "$state/netns" ]]; then
    for ns in /var/run/netns/cni-*; do
      [[ -e "$ns" ]] || continue
      grep -qxF "$ns" "$state/netns" || { umount -l "$ns" 2>/dev/null; rm -f "$ns"; }
    done
  fi
  rm -rf "/var/lib/cni/networks/$CNI_NETWORK"
  # containerd 1.6 keeps the shims' state under /run/containerd whatever its own state says.
  if [[ -f "$state/run-containerd-absent" ]]; then
    rm -rf /run/containerd
  else
    for id in ${containers:-}; do rm -rf "/run/containerd/runc/k8s.io/$id"; done
  fi
  if [[ -f "$state/bridge-created" ]]; then ip link delete "$BRIDGE" 2>/dev/null; fi
  # The kubelet's cgroups (kubepods and its QoS children), deepest first.
  if [[ -f "$state/cgroups-created" ]]; then
    for _ in 1 2 3; do
      find /sys/fs/cgroup/*/kubepods* -depth -type d -exec rmdir {} + 2>/dev/null
      find /sys/fs/cgroup/*/kubepods.slice -depth -type d -exec rmdir {} + 2>/dev/null
      sleep 0.2
    done
  fi
  if [[ -f "$state/sysctls" ]]; then
    while read -r key value; do sysctl -qw "$key=$value" 2>/dev/null; done <"$state/sysctls"
  fi
  if [[ -f "$state/root-was-private" ]]; then mount --make-private / 2>/dev/null; fi
  # Firewall tables and chains the kubelet (its canary chains) or the bridge plugin added: tables
  # that did not exist go, the others get back the rules they had.
  if [[ -f "$state/nft-tables" ]] && command -v nft >/dev/null 2>&1; then
    nft list tables 2>/dev/null | while read -r _ family name; do
      grep -qxF "table $family $name" "$state/nft-tables" || nft delete table "$family" "$name" 2>/dev/null
    done
  fi
  for family in iptables ip6tables; do
    [[ -s "$state/$family" ]] || continue
    if ! cmp -s <("$family-save" 2>/dev/null | grep -v '^#') <(grep -v '^#' "$state/$family"); then
      "$family-restore" <"$state/$family" 2>/dev/null
    fi
  done
  log "teardown done"
  rm -rf "$NODE_DIR"
}
trap teardown EXIT
trap 'exit 0' TERM INT

# ---------------------------------------------------------------------------------------------
# Preconditions: nothing of ours may exist already.
for cmd in containerd ctr runc ip iptables-save dnsmasq umount "$KUBECTL"; do
  command -v "$cmd" >/dev/null 2>&1 || fail "missing $cmd (scripts/install-test-deps.sh installs it)"
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ||
  fail "missing the CNI plugins in /usr/lib/cni (Debian package containernetworking-plugins)"
[[ -x "$KUBELET" ]] || fail "no kubelet at $KUBELET"
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  fail "a link named $BRIDGE exists already (a node left over? \`ip link delete $BRIDGE\` if it is)"
fi
addresses="$(ip -o addr show)"
if grep -q " inet 10\.88\." <<<"$addresses"; then
  fail "the subnet $SUBNET is in use on this machine: $(grep ' inet 10\.88\.' <<<"$addresses")"
fi
if ls -d /sys/fs/cgroup/*/kubepods* >/dev/null 2>&1; then
  fail "a kubelet's cgroups exist already (/sys/fs/cgroup/*/kubepods*): another node runs here"
fi

# What teardown restores.
ls -d /var/run/netns/cni-* 2>/dev/null >"$state/netns" || true
[[ -e /run/containerd ]] || touch "$state/run-containerd-absent"
for key in "${SYSCTLS[@]}"; do
  printf '%s %s\n' "$key" "$(sysctl -n "$key")" >>"$state/sysctls"
done
iptables-save >"$state/iptables" 2>/dev/null || true
ip6tables-save >"$state/ip6tables" 2>/dev/null || true
nft list tables >"$state/nft-tables" 2>/dev/null || true
if [[ "$(awk '$5 == "/"' /proc/self/mountinfo)" != *shared:* ]]; then
  touch "$state/root-was-private"
fi
touch "$state/cgroups-created"

# ---------------------------------------------------------------------------------------------
# The bridge first: the kubelet binds to its address.
mount --make-shared /
ip link add "$BRIDGE" type bridge
touch "$state/bridge-created"
ip addr add "$GATEWAY/16" dev "$BRIDGE"
ip link set "$BRIDGE" up

# containerd, with its own root, state and socket.
mkdir -p "$NODE_DIR/cni" "$NODE_DIR/containerd" "$NODE_DIR/pod-logs"
cat >"$NODE_DIR/cni/10-bridge.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "$CNI_NETWORK", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$SUBNET", "gateway": "$GATEWAY"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
cat >"$NODE_DIR/containerd.toml" <<EOF
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # This machine's root may not lower oom_score_adj (no CAP_SYS_RESOURCE): runc fails every
  # sandbox ("can't get final child's PID from pipe") unless containerd clamps it.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni"
EOF
containerd --config "$NODE_DIR/containerd.toml" >"$NODE_DIR/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 100); do
  ctr_ version >/dev/null 2>&1 && break
  kill -0 "$containerd_pid" 2>/dev/null || fail "containerd exited: $(tail -5 "$NODE_DIR/containerd.log")"
  sleep 0.1
done
ctr_ version >/dev/null 2>&1 || fail "containerd did not answer on $sock"

# Images: nothing can be pulled, every image is imported.
while read -r _short base tag archive; do
  [[ -n "${archive:-}" ]] || continue
  [[ -f "$archive" ]] || fail "no image archive $archive (scripts/build-test-images.sh makes it)"
  ctr_ images import --base-name "$base" "$archive" >/dev/null ||
    fail "ctr images import $archive failed"
  # Listed first, then searched: `grep -q` quitting early would fail the pipe under pipefail.
  listed="$(ctr_ images ls -q)"
  grep -qxF "$base:$tag" <<<"$listed" || fail "importing $archive gave no $base:$tag"
done <"$IMAGES"

# Cluster DNS: dnsmasq on the bridge answers <hostname>.<subdomain>.<namespace>.svc.cluster.local
# for every Pod that has both and an IP (what CoreDNS answers for a headless Service's pods, with
# JobSet's publishNotReadyAddresses), from a hosts file kept from a watch of the API's Pods.
mkdir -p "$NODE_DIR/dns"
: >"$NODE_DIR/dns/pods"
dnsmasq --keep-in-foreground --no-resolv --no-hosts --no-dhcp-interface="$BRIDGE" \
  --bind-interfaces --listen-address="$GATEWAY" --except-interface=lo --port=53 \
  --local=/cluster.local/ --domain-needed --addn-hosts="$NODE_DIR/dns/pods" \
  --pid-file= --user=root --log-facility="$NODE_DIR/dnsmasq.log" &
dnsmasq_pid=$!
# feed_dns: reads watch events `TYPE|NAMESPACE|NAME|IP|HOSTNAME|SUBDOMAIN|PHASE` and rewrites the
# hosts file (then SIGHUP: dnsmasq clears its cache and reads it again) whenever a record changes.
# A record goes only with its Pod (deleted, or Succeeded or Failed): an update that lacks the IP
# for a moment keeps it, as CoreDNS keeps a headless Service's endpoint, so a running job's host
# names never flicker out of DNS. Every event is logged to dns-events.log.
feed_dns() {
  local type ns name ip host sub phase key
  local -A records=()
  while IFS='|' read -r type ns name ip host sub phase; do
    printf '%s %s %s/%s ip=%s %s.%s %s\n' "$(date +%T.%N)" "$type" "$ns" "$name" "$ip" "$host" \
      "$sub" "$phase" >>"$NODE_DIR/dns-events.log"
    key="$ns/$name"
    if [[ "$type" == DELETED || "$phase" == Succeeded || "$phase" == Failed ]]; then
      [[ -n "${records[$key]:-}" ]] || continue
      unset "records[$key]"
    elif [[ -n "$ip" && -n "$host" && -n "$sub" ]]; then
      [[ "${records[$key]:-}" == "$ip $host.$sub.$ns.svc.cluster.local" ]] && continue
      records[$key]="$ip $host.$sub.$ns.svc.cluster.local"
    else
      continue
    fi
    printf '%s\n' "${records[@]}" | sort >"$NODE_DIR/dns/pods.next"
    mv "$NODE_DIR/dns/pods.next" "$NODE_DIR/dns/pods"
    kill -HUP "$dnsmasq_pid" 2>/dev/null
  done
}
(
  template='{.type}|{.object.metadata.namespace}|{.object.metadata.name}|{.object.status.podIP}|{.object.spec.hostname}|{.object.spec.subdomain}|{.object.status.phase}{"\n"}'
  # A watch ends now and then (the API server's timeout): start again from a fresh list.
  while kill -0 "$dnsmasq_pid" 2>/dev/null; do
    "$KUBECTL" get pods -A --watch --output-watch-events -o jsonpath="$template" 2>>"$NODE_DIR/dns-feed.log" |
      feed_dns
    sleep 0.5
  done
) &
dns_pid=$!

# The kubelet.
mkdir -p "$NODE_DIR/kubelet" "$NODE_DIR/kubelet-certs"
: >"$NODE_DIR/resolv.conf"
cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroup v1 and no systemd as PID 1.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$sock
address: $GATEWAY
port: 20250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 20248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CLIENT_CA}
authorization: {mode: AlwaysAllow}
clusterDNS: [$GATEWAY]
clusterDomain: cluster.local
# No search domains or servers of the host's: pods resolve through the cluster DNS only.
resolvConf: $NODE_DIR/resolv.conf
podLogsDir: $NODE_DIR/pod-logs
failSwapOn: false
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {nodefs.available: "1%", imagefs.available: "1%", memory.available: "100Mi"}
EOF
"$KUBELET" --config="$NODE_DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG" \
  --root-dir="$NODE_DIR/kubelet" --cert-dir="$NODE_DIR/kubelet-certs" \
  --hostname-override="$NODE_NAME" --node-ip="$GATEWAY" --v=1 >"$NODE_DIR/kubelet.log" 2>&1 &
kubelet_pid=$!

for _ in $(seq 600); do
  kill -0 "$kubelet_pid" 2>/dev/null || fail "kubelet exited: $(tail -5 "$NODE_DIR/kubelet.log")"
  ready="$("$KUBECTL" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)"
  if [[ "$ready" == True ]]; then
    touch "$NODE_DIR/ready"
    log "node $NODE_NAME Ready"
    break
  fi
  sleep 0.2
done
[[ -f "$NODE_DIR/ready" ]] || fail "node $NODE_NAME not Ready within 120 s: $(tail -5 "$NODE_DIR/kubelet.log")"

# Until the test binary goes away (stdin closes) or a signal arrives.
while read -r _; do :; done
exit 0
