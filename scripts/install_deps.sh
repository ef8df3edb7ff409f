#!/usr/bin/env bash
# Installs every Debian package that building, testing, benchmarking and the demo need.
# Idempotent: does nothing (and no network access) when everything is already installed;
# otherwise runs `apt-get update` once and installs only what is missing. Needs root (or sudo).
# Takes ~1-5 minutes on a fresh Debian 12 machine.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  ccache   # the Makefile compiles through it when present: a rebuild of an unchanged file is a cache hit
  clang libclang-rt-14-dev llvm   # make test's ASan/UBSan/TSan trees, libFuzzer, llvm-symbolizer
  clang-format-14   # scripts/check_format.sh (make test, ScriptsLintTest)
  libboost-dev libboost-program-options-dev libboost-filesystem-dev libboost-system-dev
  libgoogle-glog-dev libgflags-dev
  libgtest-dev libgmock-dev
  librocksdb-dev
  libgloo-dev
  libdnnl-dev ocl-icd-opencl-dev   # oneDNN, and the OpenCL headers its CMake package needs
  nlohmann-json3-dev
  libssl-dev
  libjpeg62-turbo-dev libpng-dev   # --data imagefolder: JPEG (libjpeg-turbo) and PNG decoding
  zlib1g-dev
  dataset-fashion-mnist
  gnuplot-nox
  iproute2 procps psmisc shellcheck
  python3-torch python3-torchvision python3-numpy
  python3-dev pybind11-dev   # the Python package edl (edl.torch): a pybind11 module over libedl
  python3-pil   # tests and bench only: scripts/make_imagefolder.sh, the PIL reference decoder
  jq
  slurm-wlm munge   # tests only: tests/integration/slurm_test starts a one-node Slurm of its own
  nfs-kernel-server nfs-common   # tests only: the checkpoint store on an NFS mount over loopback
  etcd-server etcd-client   # tests only: standby_test runs its own etcd (edl server --state_store etcd://...)
  prometheus chromium   # tests only: dashboard_test scrapes `edl server --http_addr` and renders its dashboard
  openssh-server openssh-client   # tests only: ssh_cluster_test runs scripts/ssh_cluster.sh against real sshd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_deps: missing packages (${missing[*]}) and not root; rerun as root or install them" >&2
    exit 1
  fi
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
