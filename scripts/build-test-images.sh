#!/usr/bin/env bash
# Builds the container images of the single-node Kubernetes test cluster (containerd 1.6 from Debian,
# CRI namespace k8s.io) as OCI-layout tar archives, without any container registry: nothing is pulled.
# Root file systems come from our own C code (pause), from the Debian archive through mmdebstrap and
# from PyPI (mpi), or from the binary under test and the host's libraries (webhook); umoci turns each
# into an OCI image.
#
# Usage: scripts/build-test-images.sh [pause] [mpi] [webhook BINARY]     (no argument: pause mpi)
# Needs root (mmdebstrap's root mode, chroot, unshare); installs umoci and mmdebstrap with apt-get
# when missing. Idempotent: an image whose inputs (this script's hash, plus the package list and the
# Intel wheel for mpi, or the binary's hash for webhook) are unchanged since the archive was written is
# not rebuilt, so a second run takes seconds.
#
# Output, in <repository>/target/cluster-images/ (never commit it):
#   short        image reference (= base-name:tag)   archive          what
#   pause        registry.k8s.io/pause:3.10          pause.tar        containerd's sandbox_image, exactly
#   mpi-openmpi  localhost/mpi-openmpi:test          mpi-openmpi.tar  mpirun = Open MPI 4.1 (Debian)
#   mpi-mpich    localhost/mpi-mpich:test            mpi-mpich.tar    mpirun = MPICH 4.0 Hydra (Debian)
#   mpi-intel    localhost/mpi-intel:test            mpi-intel.tar    mpirun = Intel MPI 2021.19 (PyPI)
#   mpi-trainer  localhost/mpi-trainer:test          mpi-trainer.tar  mpi-openmpi as Trainer's runtimes use it
#   webhook      localhost/mpi-webhook:test          webhook.tar      the given mpi-webhook binary
# and images.txt, one line per archive built so far, sorted, space-separated, no comments:
#   <short> <base-name> <tag> <absolute path of the tar>
# Import one with: ctr -n k8s.io images import --base-name <base-name> <tar>  -> <base-name>:<tag>
# (each archive's index holds exactly one manifest, annotated org.opencontainers.image.ref.name=<tag>).
#
# The three mpi images are ONE root file system (one identical layer: containerd stores it once)
# with three configs that differ only in PATH, i.e. in which `mpirun` comes first:
#   mpi-openmpi  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
#   mpi-mpich    PATH=/opt/mpich/bin:<the above>  (symlinks to Debian's mpich: mpirun, mpiexec, hydra_*)
#   mpi-intel    PATH=/opt/intel/bin:<the above>  (Intel MPI's launcher files from the impi-rt wheel)
# Every binary of every flavour is in every image (/usr/bin/mpirun.openmpi, /usr/bin/mpirun.mpich,
# /usr/bin/mpiexec.hydra = MPICH's, /opt/intel/bin/mpiexec.hydra = Intel's). Hydra (MPICH and Intel)
# starts its proxies on the other hosts from the directory it was started from (not resolving
# symlinks): /opt/mpich/bin holds hydra_* links for that reason, and Intel's `mpirun` is a sh script
# that runs `mpiexec.hydra` from PATH, so /opt/intel/bin must stay first on PATH (a pod that sets its
# own PATH must keep it). Intel MPI needs no other variable (not I_MPI_ROOT) and no Python. Only its
# launcher is shipped (mpirun, mpiexec[.hydra], hydra_bstrap_proxy, hydra_pmi_proxy,
# hydra_nameserver, cpuinfo): its libmpi needs a libfabric >= 2 that neither PyPI nor Debian 12
# provides, so MPI programs linked against Intel MPI do not run in this image; the launcher, its
# proxies and non-MPI ranks do.
# All mpi images: user 0:0 (pods choose their own UID), no entrypoint or cmd (pods give commands),
# Debian 12 variant `apt`, no recommends, no man pages, docs (copyright files kept) or locales.
# sshd: /usr/sbin/sshd -De -f FILE runs as any UID that /etc/passwd knows; its privilege separation
# directory /run/sshd (root, 0755) is in the image (pods see the image's /run: containerd's CRI mounts
# no tmpfs there; `ctr run` does, hiding it); no host keys (/etc/ssh/ssh_host_* removed: the product's
# init container makes its own). Present: sh, bash, cat, cp, chmod, mkdir, id, printf, hostname, whoami,
# ssh, ssh-keygen, ssh-keyscan, setpriv. Absent: /etc/hostname, /etc/hosts, /etc/resolv.conf (the
# kubelet mounts them), anything under /dev.
# mpi-trainer: mpi-openmpi plus one layer with what Kubeflow Trainer's MPI runtime images (and the
# mpioperator images they come from) bring, so TrainJob mode's JobSet runs with Trainer's own
# commands: the client side of ssh, /etc/ssh/ssh_config.d/trainer.conf (port 2222, host keys neither
# checked nor recorded). The user `mpiuser` (1000:1000, home /home/mpiuser, where the TrainJob's
# Secret is mounted as .ssh) and its sshd config /home/mpiuser/.sshd_config (port 2222, the job's
# key as host key, StrictModes off) are in the shared root file system, inert for the others.
# pause: /pause, static, from the C code below; entrypoint /pause, user 65535:65535 like upstream's.
# webhook: /usr/local/bin/mpi-webhook, exactly the libraries `ldd` lists and the dynamic loader, an
# empty /tmp (1777), no /etc/passwd; user 65532:65532, entrypoint /usr/local/bin/mpi-webhook.
set -euo pipefail
umask 022

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="$repo/scripts/build-test-images.sh"
out="$repo/target/cluster-images"
stamps="$out/.stamps"  # one file per image group: the hash of the inputs its archives were built from
cache="$out/.cache"    # downloads kept between runs (the Intel wheel)
work="$out/.work"      # scratch, removed at the start of a build and at its end

# Inputs of the mpi images. Changing any of them (or this script) rebuilds them.
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
MPI_PACKAGES=openmpi-bin,mpich,openssh-server,openssh-client
IMPI_VERSION=2021.19.0
IMPI_WHEEL_SHA256=708b4336c9d303a3d807b58054c502ed4f716dfb074dfa48904180b46d14bb40
# Intel MPI launcher files copied from the wheel's bin/ (mpiexec and impi_cpuinfo, identical copies of
# mpiexec.hydra and cpuinfo in the wheel, become symlinks).
IMPI_BIN_FILES=(mpirun mpiexec.hydra hydra_bstrap_proxy hydra_pmi_proxy hydra_nameserver cpuinfo)

BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "build-test-images: $*" >&2; }
die() { log "error: $*"; exit 1; }
# Every host-side `rm -rf` says --one-file-system: if a build was killed while something was mounted
# in its scratch tree, the next run's clean-up must not walk into the mounted file system.

usage() {
  echo "usage: scripts/build-test-images.sh [pause] [mpi] [webhook BINARY]  (default: pause mpi)" >&2
  exit "${1:-2}"
}

# ensure_debs COMMAND[:PACKAGE]...: apt-get installs the Debian package (default: named like the
# command) of each command that is missing.
ensure_debs() {
  local missing=() c
  for c in "$@"; do
    command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c#*:}")
  done
  ((${#missing[@]})) || return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

sha() { sha256sum "$@" | cut -d' ' -f1; }

# stamp_ok NAME HASH ARCHIVE...: true when NAME was last built from HASH and its archives all exist.
stamp_ok() {
  local name="$1" hash="$2" f
  shift 2
  [[ -f "$stamps/$name" && "$(cat "$stamps/$name")" == "$hash" ]] || return 1
  for f in "$@"; do [[ -f "$out/$f" ]] || return 1; done
}

# record SHORT BASE TAG: puts SHORT's line into images.txt (replacing an older one), sorted.
record() {
  local list="$out/images.txt"
  {
    if [[ -f "$list" ]]; then grep -v "^$1 " "$list" || true; fi
    echo "$1 $2 $3 $out/$1.tar"
  } | sort >"$list.partial"
  mv "$list.partial" "$list"
}

# new_image LAYOUT TAG BUNDLE: an empty OCI layout holding one empty image TAG, unpacked into BUNDLE;
# the caller fills BUNDLE/rootfs and calls repack.
new_image() {
  rm -rf --one-file-system "$1" "$3"
  umoci init --layout "$1"
  umoci new --image "$1:$2"
  umoci unpack --image "$1:$2" "$3"
}

# repack LAYOUT TAG BUNDLE: BUNDLE/rootfs becomes TAG's (single) layer.
repack() {
  umoci repack --history.created_by "scripts/build-test-images.sh" --image "$1:$2" "$3"
}

# export_archive LAYOUT TAG SHORT BASE: writes $out/SHORT.tar, an OCI layout holding only LAYOUT's
# image TAG (other tags and their blobs left out), after checking what `ctr images import --base-name
# BASE` relies on: exactly one manifest, annotated org.opencontainers.image.ref.name=TAG.
export_archive() {
  local src="$1" tag="$2" short="$3" base="$4" dst="$work/export-$3" t
  rm -rf --one-file-system "$dst"
  mkdir -p "$dst"
  # Blobs are content-addressed and never written in place by umoci: hard links are safe and cheap.
  # index.json is rewritten by umoci, so it is a real copy.
  cp "$src/oci-layout" "$src/index.json" "$dst/"
  cp -al "$src/blobs" "$dst/blobs"
  while read -r t; do
    [[ "$t" == "$tag" ]] || umoci rm --image "$dst:$t"
  done < <(umoci ls --layout "$dst")
  umoci gc --layout "$dst"
  [[ "$(umoci ls --layout "$dst")" == "$tag" ]] || die "$short: layout does not hold exactly tag $tag"
  grep -q "\"org.opencontainers.image.ref.name\":\"$tag\"" "$dst/index.json" ||
    die "$short: index.json lacks org.opencontainers.image.ref.name=$tag"
  local manifests
  manifests="$(grep -o '"mediaType":"application/vnd.oci.image.manifest.v1+json"' "$dst/index.json" | wc -l)"
  [[ "$manifests" == 1 ]] || die "$short: index.json lists $manifests manifests, not 1"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -C "$dst" -cf "$out/$short.tar.partial" oci-layout index.json blobs
  mv "$out/$short.tar.partial" "$out/$short.tar"
  rm -rf --one-file-system "$dst"
  record "$short" "$base" "$tag"
  log "$short: $out/$short.tar ($(du -h "$out/$short.tar" | cut -f1)) -> $base:$tag"
}

# in_rootfs ROOT CMD...: runs CMD chrooted into ROOT, in private mount, PID and network namespaces
# (proc and sysfs mounted there, loopback up): nothing it mounts or starts outlives it, and what it
# listens on cannot clash with the host's ports.
in_rootfs() {
  # shellcheck disable=SC2016 # expanded by the inner sh
  unshare --mount --pid --net --fork --kill-child -- sh -c '
    root=$1
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    ip link set lo up
    exec chroot "$@"' sh "$@"
}

# ---------------------------------------------------------------------------------------------------
# pause: registry.k8s.io/pause:3.10
build_pause() {
  local tag=3.10 base=registry.k8s.io/pause hash
  hash="$(sha "$script")"
  if stamp_ok pause "$hash" pause.tar; then
    record pause "$base" "$tag"
    log "pause: up to date"
    return 0
  fi
  ensure_debs umoci gcc
  local w="$work/pause"
  rm -rf --one-file-system "$w"
  mkdir -p "$w"
  # Our own pause: the sandbox's PID 1 exits 0 on SIGTERM/SIGINT, reaps orphans, sleeps otherwise.
  cat >"$w/pause.c" <<'EOF'
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = quit;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}
EOF
  gcc -Os -static -s -Wall -Wextra -Werror -o "$w/pause" "$w/pause.c"
  # Check: it runs, and SIGTERM ends it with status 0.
  local pid rc=0
  "$w/pause" &
  pid=$!
  sleep 0.2
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || die "pause: exit status $rc on SIGTERM, want 0"

  new_image "$w/layout" "$tag" "$w/bundle"
  install -m 0755 "$w/pause" "$w/bundle/rootfs/pause"
  repack "$w/layout" "$tag" "$w/bundle"
  umoci config --no-history --image "$w/layout:$tag" \
    --config.entrypoint /pause --config.user 65535:65535 --config.env "PATH=$BASE_PATH"
  export_archive "$w/layout" "$tag" pause "$base"
  echo "$hash" >"$stamps/pause"
  rm -rf --one-file-system "$w"
}

# ---------------------------------------------------------------------------------------------------
# mpi: localhost/mpi-{openmpi,mpich,intel}:test from one Debian root file system.

# fetch_impi DIR: the impi-rt wheel's data/ folder (bin/, lib/, ...) unpacked into DIR. The wheel is
# downloaded once into the cache (pip download, no install: the image needs neither pip nor Python)
# and checked against its pinned SHA256.
fetch_impi() {
  local whl
  whl="$(find "$cache" -maxdepth 1 -name "impi_rt-$IMPI_VERSION-*.whl" -print -quit 2>/dev/null || true)"
  if [[ -z "$whl" ]] || [[ "$(sha "$whl")" != "$IMPI_WHEEL_SHA256" ]]; then
    rm -f "$cache"/impi_rt-*.whl
    log "mpi: pip download impi-rt==$IMPI_VERSION"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --dest "$cache" "impi-rt==$IMPI_VERSION"
    whl="$(find "$cache" -maxdepth 1 -name "impi_rt-$IMPI_VERSION-*.whl" -print -quit)"
    [[ -n "$whl" ]] || die "mpi: pip download left no impi_rt-$IMPI_VERSION wheel in $cache"
    [[ "$(sha "$whl")" == "$IMPI_WHEEL_SHA256" ]] || die "mpi: $whl: SHA256 is not $IMPI_WHEEL_SHA256"
  fi
  rm -rf --one-file-system "$1"
  mkdir -p "$1"
  # A wheel is a zip; python3's zipfile avoids needing unzip (modes are set when copying).
  python3 -m zipfile -e "$whl" "$1/whl"
  mv "$1/whl/impi_rt-$IMPI_VERSION.data/data" "$1/data"
  mv "$1/whl/impi_rt-$IMPI_VERSION.dist-info/LICENSE.txt" "$1/data/LICENSE.txt"
  rm -rf --one-file-system "$1/whl"
}

# customize_mpi ROOT IMPI: everything the images need beyond Debian's packages.
customize_mpi() {
  local r="$1" impi="$2" f
  # Open MPI is `mpirun` in /usr/bin (Debian's default already: priority 50 over MPICH's 40; say so).
  chroot "$r" update-alternatives --quiet --set mpirun /usr/bin/mpirun.openmpi
  # MPICH first on PATH: its launcher names, and its proxies next to them (Hydra looks for
  # hydra_pmi_proxy in the directory mpirun was found in).
  mkdir -p "$r/opt/mpich/bin"
  ln -s /usr/bin/mpirun.mpich "$r/opt/mpich/bin/mpirun"
  ln -s /usr/bin/mpiexec.mpich "$r/opt/mpich/bin/mpiexec"
  ln -s /usr/bin/mpiexec.hydra "$r/opt/mpich/bin/mpiexec.hydra"
  for f in "$r"/usr/bin/hydra_*; do
    ln -s "/usr/bin/${f##*/}" "$r/opt/mpich/bin/${f##*/}"
  done
  # Intel MPI's launcher, as `pip install --prefix /opt/intel` lays it out (bin/), plus its licences.
  mkdir -p "$r/opt/intel/bin" "$r/opt/intel/share/doc/impi-rt"
  for f in "${IMPI_BIN_FILES[@]}"; do
    install -m 0755 "$impi/data/bin/$f" "$r/opt/intel/bin/$f"
  done
  ln -s mpiexec.hydra "$r/opt/intel/bin/mpiexec"
  ln -s cpuinfo "$r/opt/intel/bin/impi_cpuinfo"
  install -m 0644 "$impi/data/LICENSE.txt" "$impi"/data/share/doc/mpi/licensing/*.txt \
    "$r/opt/intel/share/doc/impi-rt/"
  # Trainer's runtime user and its sshd config (see mpi-trainer above).
  echo 'mpiuser:x:1000:1000::/home/mpiuser:/bin/bash' >>"$r/etc/passwd"
  echo 'mpiuser:x:1000:' >>"$r/etc/group"
  install -d -m 0755 -o 1000 -g 1000 "$r/home/mpiuser"
  printf '%s\n' 'PidFile /home/mpiuser/sshd.pid' 'HostKey /home/mpiuser/.ssh/id_rsa' \
    'StrictModes no' 'Port 2222' >"$r/home/mpiuser/.sshd_config"
  chown 1000:1000 "$r/home/mpiuser/.sshd_config"
  # sshd's privilege separation directory (sshd refuses to start as root without it; Kubernetes does
  # not mount a tmpfs on /run, so the image's own directory is what sshd sees).
  install -d -m 0755 "$r/run/sshd"
  # No private keys in an image: the host keys openssh-server's postinst generated go.
  rm -f "$r"/etc/ssh/ssh_host_*
  # The build host's identity and resolver (mmdebstrap copies them in; the kubelet mounts its own).
  rm -f "$r/etc/hostname" "$r/etc/resolv.conf" "$r/etc/hosts"
  # Package caches, lists and logs.
  rm -rf --one-file-system "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
    "$r"/var/lib/dpkg/*-old "$r"/var/log/* "$r"/tmp/* "$r"/var/tmp/*
}

# Runs inside the mpi root file system (see in_rootfs), as root: the launchers, each through a fake
# ssh that runs the remote command locally (so the remote-side paths: proxies, orted, are exercised),
# and sshd as root and as an unprivileged UID.
read -r -d '' MPI_CHECK <<'EOF' || true
set -eu
base=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
t=$(mktemp -d)
chmod 0755 "$t"
trap 'rm -rf "$t"' EXIT
for c in sh bash cat cp chmod mkdir id printf hostname whoami ssh ssh-keygen ssh-keyscan sshd setpriv; do
  PATH=$base command -v "$c" >/dev/null || { echo "missing: $c"; exit 1; }
done
# ssh stand-in: drops the options and the host name, runs the command here.
cat >"$t/fakessh" <<'SSH'
#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
shift
exec sh -c "$*"
SSH
chmod 0755 "$t/fakessh"
want='rank 0
rank 1'
launch() { # name PATH-prefix version-regex version-flag host-options launcher-env...
  name=$1 p=$2 re=$3 flag=$4 hosts=$5; shift 5
  if ! PATH=$p$base mpirun "$flag" 2>&1 | grep -Eq "$re"; then
    echo "$name: mpirun $flag does not match $re:"
    PATH=$p$base mpirun "$flag" 2>&1 | head -3
    exit 1
  fi
  # shellcheck disable=SC2086,SC2016 # $hosts: several words; the rank's shell expands its variables
  got=$(env -i PATH="$p$base" "$@" timeout 60 mpirun $hosts -n 2 \
    sh -c 'echo rank ${PMI_RANK:-$OMPI_COMM_WORLD_RANK}' | sort)
  [ "$got" = "$want" ] || { echo "$name: 2-rank launch through ssh printed: $got"; exit 1; }
  echo "ok: $name: $(PATH=$p$base mpirun "$flag" 2>&1 | grep -Em1 "$re")"
}
launch openmpi '' '^mpirun \(Open MPI\) 4\.1' --version '-H fakehost:2' OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent="$t/fakessh" OMPI_MCA_oob_tcp_if_include=lo
launch mpich /opt/mpich/bin: 'HYDRA build details' --version '-hosts fakehost' \
  HYDRA_LAUNCHER_EXEC="$t/fakessh" HYDRA_IFACE=lo
launch intel /opt/intel/bin: 'Intel\(R\) MPI Library' -V '-hosts fakehost' \
  I_MPI_HYDRA_BOOTSTRAP_EXEC="$t/fakessh" I_MPI_HYDRA_IFACE=lo
mpirun.mpich --version | grep -q 'Version: *4\.' || { echo "mpirun.mpich is not MPICH 4"; exit 1; }
# sshd: config check as root (needs /run/sshd), then as nobody: start it, read its host key back.
ssh-keygen -q -t ed25519 -N '' -C '' -f "$t/root_key"
printf 'Port 2222\nListenAddress 127.0.0.1\nHostKey %s/root_key\nUsePAM no\n' "$t" >"$t/root_config"
/usr/sbin/sshd -t -f "$t/root_config"
install -d -o 65534 -g 65534 "$t/u"
# shellcheck disable=SC2016 # expanded by the inner sh
setpriv --reuid=65534 --regid=65534 --clear-groups sh -eu -c '
  t=$1
  ssh-keygen -q -t ed25519 -N "" -C "" -f "$t/u/host_key"
  printf "Port 2222\nListenAddress 127.0.0.1\nHostKey %s\nPidFile %s\nUsePAM no\nStrictModes no\n" \
    "$t/u/host_key" "$t/u/sshd.pid" >"$t/u/sshd_config"
  /usr/sbin/sshd -De -f "$t/u/sshd_config" 2>"$t/u/sshd.log" &
  i=0
  key=$(cut -d" " -f2 "$t/u/host_key.pub")
  until ssh-keyscan -t ed25519 -p 2222 127.0.0.1 2>/dev/null | grep -qF "$key"; do
    i=$((i + 1))
    [ $i -lt 50 ] || { echo "sshd as nobody did not serve its host key:"; cat "$t/u/sshd.log"; exit 1; }
    sleep 0.1
  done
  kill $!
  echo "ok: sshd -De -f FILE as uid $(id -u)"
' sh "$t"
EOF

build_mpi() {
  local short tag=test hash
  hash="$( (sha "$script"; echo "$SUITE $MIRROR $MPI_PACKAGES impi-rt==$IMPI_VERSION $IMPI_WHEEL_SHA256") |
    sha256sum | cut -d' ' -f1)"
  if stamp_ok mpi "$hash" mpi-openmpi.tar mpi-mpich.tar mpi-intel.tar mpi-trainer.tar; then
    for short in mpi-openmpi mpi-mpich mpi-intel mpi-trainer; do record "$short" "localhost/$short" "$tag"; done
    log "mpi: up to date"
    return 0
  fi
  ensure_debs umoci mmdebstrap ip:iproute2
  command -v python3 >/dev/null || die "mpi: python3 (with pip) is needed to download impi-rt"
  local w="$work/mpi"
  rm -rf --one-file-system "$w"
  mkdir -p "$w" "$cache"
  fetch_impi "$w/impi"

  new_image "$w/layout" base "$w/bundle"
  rmdir "$w/bundle/rootfs"
  log "mpi: mmdebstrap $SUITE ($MPI_PACKAGES)"
  # In a private mount namespace: the /proc, /sys and /dev/pts mmdebstrap mounts in the target die
  # with it, even when it is killed.
  unshare --mount --propagation private -- mmdebstrap --quiet --mode=root --variant=apt \
    --format=directory --include="$MPI_PACKAGES" \
    --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$w/bundle/rootfs" "$MIRROR"
  chmod 0755 "$w/bundle/rootfs"
  customize_mpi "$w/bundle/rootfs" "$w/impi"
  log "mpi: checking the launchers and sshd inside the root file system"
  in_rootfs "$w/bundle/rootfs" /bin/sh -c "$MPI_CHECK" >&2
  # Left clean by the check; the runtime provides /dev (mmdebstrap made device nodes for the build).
  rm -rf --one-file-system "${w:?}"/bundle/rootfs/tmp/* "${w:?}"/bundle/rootfs/dev/*
  log "mpi: $(du -sh "$w/bundle/rootfs" | cut -f1) root file system; packing the layer"
  repack "$w/layout" base "$w/bundle"
  rm -rf --one-file-system "$w/bundle"

  umoci config --no-history --image "$w/layout:base" --tag openmpi \
    --config.user 0:0 --config.env "PATH=$BASE_PATH"
  umoci config --no-history --image "$w/layout:base" --tag mpich \
    --config.user 0:0 --config.env "PATH=/opt/mpich/bin:$BASE_PATH"
  umoci config --no-history --image "$w/layout:base" --tag intel \
    --config.user 0:0 --config.env "PATH=/opt/intel/bin:$BASE_PATH"
  # trainer: openmpi plus a layer with Trainer's ssh client settings.
  umoci config --no-history --image "$w/layout:openmpi" --tag trainer
  umoci unpack --image "$w/layout:trainer" "$w/trainer"
  printf '%s\n' 'Host *' '    Port 2222' '    StrictHostKeyChecking no' '    UserKnownHostsFile /dev/null' \
    >"$w/trainer/rootfs/etc/ssh/ssh_config.d/trainer.conf"
  repack "$w/layout" trainer "$w/trainer"
  rm -rf --one-file-system "$w/trainer"
  for short in openmpi mpich intel trainer; do
    # Each archive: only its own image, tagged `test`.
    umoci tag --image "$w/layout:$short" "$tag"
    export_archive "$w/layout" "$tag" "mpi-$short" "localhost/mpi-$short"
    umoci rm --image "$w/layout:$tag"
  done
  echo "$hash" >"$stamps/mpi"
  rm -rf --one-file-system "$w"
}

# ---------------------------------------------------------------------------------------------------
# webhook BINARY: localhost/mpi-webhook:test. Fast (no package manager): called by the test harness on
# every run; rebuilt only when the binary's content (or this script) changed.
build_webhook() {
  local bin="$1" tag=test base=localhost/mpi-webhook hash lib
  [[ -f "$bin" && -x "$bin" ]] || die "webhook: $bin is not an executable file"
  hash="$( (sha "$script"; sha "$bin") | sha256sum | cut -d' ' -f1)"
  if stamp_ok webhook "$hash" webhook.tar; then
    record webhook "$base" "$tag"
    log "webhook: up to date"
    return 0
  fi
  ensure_debs umoci
  local w="$work/webhook"
  rm -rf --one-file-system "$w"
  mkdir -p "$w"
  new_image "$w/layout" "$tag" "$w/bundle"
  local r="$w/bundle/rootfs"
  install -D -m 0755 "$bin" "$r/usr/local/bin/mpi-webhook"
  # The libraries the loader resolves (`=> /path`) and the loader itself (an absolute path alone),
  # each at the path the binary asks for; none for a static binary.
  local libs
  libs="$(ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' || true)"
  for lib in $libs; do
    install -D -m 0755 "$(readlink -f "$lib")" "$r$lib"
  done
  install -d -m 1777 "$r/tmp"
  chroot --userspec=65532:65532 "$r" /usr/local/bin/mpi-webhook --help >/dev/null ||
    die "webhook: /usr/local/bin/mpi-webhook --help fails inside the image's root file system"
  repack "$w/layout" "$tag" "$w/bundle"
  umoci config --no-history --image "$w/layout:$tag" --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/mpi-webhook --config.env "PATH=$BASE_PATH"
  export_archive "$w/layout" "$tag" webhook "$base"
  echo "$hash" >"$stamps/webhook"
  rm -rf --one-file-system "$w"
}

# ---------------------------------------------------------------------------------------------------
targets=()
webhook_bin=
while (($#)); do
  case "$1" in
    pause | mpi) targets+=("$1") ;;
    webhook)
      (($# >= 2)) || usage
      webhook_bin="$(realpath "$2")"
      targets+=(webhook)
      shift
      ;;
    -h | --help) usage 0 ;;
    *) usage ;;
  esac
  shift
done
((${#targets[@]})) || targets=(pause mpi)

[[ "$(id -u)" == 0 ]] || die "needs root (mmdebstrap, chroot, unshare)"
mkdir -p "$out" "$stamps" "$work"
# One build at a time per output folder (the harness may call `webhook` while another build runs).
exec 9>"$out/.lock"
flock 9
trap 'rm -rf --one-file-system "$work"' EXIT

for t in "${targets[@]}"; do
  start=$SECONDS
  case "$t" in
    pause) build_pause ;;
    mpi) build_mpi ;;
    webhook) build_webhook "$webhook_bin" ;;
  esac
  log "$t: $((SECONDS - start)) s"
done
