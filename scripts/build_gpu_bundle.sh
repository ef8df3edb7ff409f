#!/bin/bash
# scripts/build_gpu_bundle.sh: builds `edl` here (Debian 12, CUDA 13 toolkit at /usr/local/cuda)
# and packs it as a self-contained directory for a GPU host that has only an NVIDIA driver and a
# PyTorch install (whose wheels carry the CUDA runtime, cuBLAS, cuDNN and NCCL), not our Debian
# packages. Takes ~10-15 min on 2 cores (a full Release build), ~10 s when build/ is current.
# Resume: re-running reuses the build directory and rewrites the bundle.
#
#   scripts/build_gpu_bundle.sh [OUT_DIR]   # default $BUILD_DIR/edl-gpu (ignored by git), plus OUT_DIR.tar.gz
#   BUILD_DIR=build  JOBS=2  BUNDLE_CUDA=0|1  BUNDLE_TAR=1|0
#   BUNDLE_TESTS="target ..."   also build these targets (test binaries, edl_chaos_check) into tests/
#
# Layout of the bundle:
#   edl          wrapper: sources env.sh and execs bin/edl
#   run          `run PROGRAM ARGS...`: sources env.sh and execs PROGRAM (the bundled test binaries)
#   env.sh       the one place that finds the libraries: LD_LIBRARY_PATH = lib/ + the CUDA libraries
#   bin/edl      the binary (rpath-free)
#   tests/       BUNDLE_TESTS' binaries (run them through `run`)
#   tools/jq     jq (scripts/demo.sh needs it; GPU hosts often lack it), with its libraries in lib/
#   lib/         every shared library edl needs except glibc and the CUDA libraries: libedl, the CUDA
#                plugin libedl_cuda.so (found next to libedl.so; only `edl train --device cuda`
#                loads it, and with it the CUDA libraries), glog,
#                gflags, Boost, oneDNN, gloo, libstdc++, ... copied from this machine (Debian 12
#                ships them only as .so for oneDNN/gloo, and libedl is a shared library, so a bundle
#                rather than a static link). The host's glibc must be >= 2.36 (Debian 12).
#   cuda-lib/    only with BUNDLE_CUDA=1: libcudart/cublas/cublasLt/cudnn*/nccl from /usr/local/cuda
#                (large, ~1.5 GB; NVIDIA's redistributables), for hosts without a CUDA 13 PyTorch.
#
# On the GPU host (driver >= 580 for CUDA 13):
#   tar xzf edl-gpu.tar.gz && cd edl-gpu
#   ./edl --bundle-check                      # shows which library comes from where, or what is missing
#   ./edl train --device cuda --precision bf16 --model resnet50 --data synthetic --batch_size 256
# The wrapper finds the CUDA libraries in this order: $EDL_CUDA_LIB_DIRS (colon-separated), then
# cuda-lib/ if bundled, then the PyTorch of $EDL_PYTHON (default python3): torch/lib and every
# site-packages/nvidia/*/lib (pip wheels nvidia-cudnn-cu13, nvidia-nccl-cu13, ...). That PyTorch
# must be a CUDA 13 build (cu130 wheels: libcudart.so.13, libcublas.so.13, libcudnn.so.9,
# libnccl.so.2); with a cu12x PyTorch use BUNDLE_CUDA=1 or point EDL_CUDA_LIB_DIRS at a CUDA 13
# toolkit. The same wrapper runs bench/trainer_gpu.sh: EDL=$PWD/edl-gpu/edl bench/trainer_gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-$BUILD_DIR/edl-gpu}
JOBS=${JOBS:-2}

BUNDLE_TESTS=${BUNDLE_TESTS:-}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DEDL_USE_CUDA=ON -DEDL_USE_NCCL=ON >/dev/null
# shellcheck disable=SC2086  # a list of targets
cmake --build "$BUILD_DIR" -j"$JOBS" --target edl_bin $BUNDLE_TESTS

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/tools"
cp "$BUILD_DIR/edl" "$OUT/bin/edl"
BINARIES=("$BUILD_DIR/edl" "$BUILD_DIR/libedl_cuda.so")
for t in $BUNDLE_TESTS; do
  f=$(find "$BUILD_DIR" -name "$t" -type f -perm -u+x -not -path '*/CMakeFiles/*' | head -1)
  [ -n "$f" ] || { echo "BUNDLE_TESTS: $t was not built in $BUILD_DIR" >&2; exit 1; }
  mkdir -p "$OUT/tests"
  cp "$f" "$OUT/tests/$t"
  BINARIES+=("$f")
done
if command -v jq >/dev/null; then
  cp "$(command -v jq)" "$OUT/bin/jq"
  BINARIES+=("$(command -v jq)")
  printf '#!/bin/bash\nhere="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"\nLD_LIBRARY_PATH="$here/lib" exec "$here/bin/jq" "$@"\n' >"$OUT/tools/jq"
  chmod +x "$OUT/tools/jq"
fi
[ -f "$BUILD_DIR/libedl_cuda.so" ] || { echo "$BUILD_DIR/libedl_cuda.so missing: the build found no CUDA" >&2; exit 1; }
cp "$BUILD_DIR/libedl_cuda.so" "$OUT/lib/libedl_cuda.so"

# glibc and the dynamic loader come from the host; CUDA libraries from the host's PyTorch (or
# cuda-lib/); the driver (libcuda, libnvidia-*) always from the host.
is_host_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*) return 0 ;;
    libcuda.so*|libnvidia*) return 0 ;;
  esac
  return 1
}
is_cuda_lib() {
  case "$1" in
    libcudart*|libcublas*|libcudnn*|libnccl*|libnvrtc*|libnvJitLink*|libcusparse*|libcufft*) return 0 ;;
  esac
  return 1
}

missing=0
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue
  if [ "$path" = "not" ]; then echo "missing here: $name" >&2; missing=1; continue; fi
  is_host_lib "$name" && continue
  is_cuda_lib "$name" && continue
  cp -L "$path" "$OUT/lib/$name"
done < <(for b in "${BINARIES[@]}"; do ldd "$b"; done | sort -u)
[ "$missing" = 0 ] || { echo "some libraries are not found on this machine; fix the build first" >&2; exit 1; }

if [ "${BUNDLE_CUDA:-0}" = 1 ]; then
  mkdir -p "$OUT/cuda-lib"
  cudalib=/usr/local/cuda/lib64
  for pat in 'libcudart.so.13*' 'libcublas.so.13*' 'libcublasLt.so.13*' 'libcudnn*.so.9*' 'libnccl.so.2*'; do
    find "$cudalib" -maxdepth 1 -name "$pat" -exec cp -P {} "$OUT/cuda-lib/" \;
  done
fi

cat > "$OUT/env.sh" <<'ENV'
# Sourced by the bundle's `edl` and `run` (made by scripts/build_gpu_bundle.sh): puts the bundled
# libraries and the CUDA libraries (EDL_CUDA_LIB_DIRS, cuda-lib/, or the PyTorch of EDL_PYTHON) on
# LD_LIBRARY_PATH, and sets `here` (the bundle) and `cuda_dirs`.
here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
cuda_dirs=${EDL_CUDA_LIB_DIRS:-}
if [ -z "$cuda_dirs" ] && [ -d "$here/cuda-lib" ]; then cuda_dirs="$here/cuda-lib"; fi
if [ -z "$cuda_dirs" ]; then
  cuda_dirs=$("${EDL_PYTHON:-python3}" - 2>/dev/null <<'PY'
import glob, os
dirs = []
try:
    import torch
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
try:
    import nvidia
    for base in nvidia.__path__:
        dirs += sorted(glob.glob(os.path.join(base, "*", "lib")))
except Exception:
    pass
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
fi
export LD_LIBRARY_PATH="$here/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ENV

cat > "$OUT/run" <<'RUN'
#!/bin/bash
# run PROGRAM ARGS...: PROGRAM (e.g. tests/nccl_communicator_test) with the bundle's libraries.
# shellcheck source=/dev/null
source "$(dirname "$(readlink -f "$0")")/env.sh"
exec "$@"
RUN
chmod +x "$OUT/run"

cat > "$OUT/edl" <<'WRAPPER'
#!/bin/bash
# edl bundle wrapper (made by scripts/build_gpu_bundle.sh): env.sh, then bin/edl.
# shellcheck source=/dev/null
source "$(dirname "$(readlink -f "$0")")/env.sh"
if [ "${1:-}" = "--bundle-check" ]; then
  echo "CUDA library dirs: ${cuda_dirs:-<none found: set EDL_CUDA_LIB_DIRS or EDL_PYTHON>}"
  ldd "$here/bin/edl" "$here/lib/libedl_cuda.so"
  if ldd "$here/bin/edl" "$here/lib/libedl_cuda.so" | grep -q "not found"; then
    echo "MISSING libraries above: install a CUDA 13 PyTorch (cu130), set EDL_CUDA_LIB_DIRS, or rebuild the bundle with BUNDLE_CUDA=1" >&2
    exit 1
  fi
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: no GPU visible (driver >= 580 needed for CUDA 13)"
  exit 0
fi
exec "$here/bin/edl" "$@"
WRAPPER
chmod +x "$OUT/edl"

[ "${BUNDLE_TAR:-1}" = 1 ] || { echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1))"; exit 0; }
tar czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1)), tarball: $OUT.tar.gz"
echo "on the GPU host: tar xzf $(basename "$OUT").tar.gz && $(basename "$OUT")/edl --bundle-check"
