#!/usr/bin/env bash
# scripts/build_gpu_check.sh (`make gpu-check`): builds $BUILD_DIR/gpu-check.tar.gz (at most 40 MiB),
# everything scripts/gpu_check.sh needs on a GPU host that has only a driver and a CUDA 13 PyTorch:
#
#   gpu-check/gpu_check.sh         the checks (scripts/gpu_check.sh)
#   gpu-check/edl-gpu/             the edl bundle (scripts/build_gpu_bundle.sh) with the GPU test
#                                  binaries and edl_chaos_check in tests/, jq in tools/
#   gpu-check/data/fashion-mnist/  the first $TRAIN_SAMPLES training images and all 10000 test
#                                  images of Fashion-MNIST (idx, gzip), from this machine's copy
#   gpu-check/data/imagefolder/    JPEGs for check 6 (scripts/make_imagefolder.sh)
#   gpu-check/scripts, config, bench   scripts/demo.sh and its configs, bench/trainer_gpu.sh
#
# On the GPU host: tar xzf gpu-check.tar.gz && gpu-check/gpu_check.sh OUT_DIR
# Knobs: BUILD_DIR=build JOBS=2 TRAIN_SAMPLES=12000 FASHION_DIR=/usr/share/datasets/fashion-mnist
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-12000}
FASHION_DIR=${FASHION_DIR:-/usr/share/datasets/fashion-mnist}
MAX_MIB=40
OUT="$BUILD_DIR/gpu-check"
# What check 1 runs (scripts/gpu_check.sh) and check 3's verifier.
TESTS="nccl_communicator_test resnet50_cuda_parity_test resnet50_ops_test jobclient_test edl_chaos_check"

rm -rf "$OUT" "$BUILD_DIR/gpu-check.tar.gz"
BUNDLE_TESTS="$TESTS" BUNDLE_TAR=0 BUILD_DIR="$BUILD_DIR" bash scripts/build_gpu_bundle.sh "$OUT/edl-gpu"

mkdir -p "$OUT/scripts" "$OUT/config" "$OUT/bench"
cp scripts/gpu_check.sh "$OUT/gpu_check.sh"
cp scripts/demo.sh scripts/edl_common.sh scripts/plot_events.sh scripts/fashion_subset.py "$OUT/scripts/"
cp config/demo_server.ini config/demo_client.ini config/demo_short.script "$OUT/config/"
cp bench/trainer_gpu.sh "$OUT/bench/"

python3 scripts/fashion_subset.py "$FASHION_DIR" "$OUT/data/fashion-mnist" "$TRAIN_SAMPLES"

FASHION_DIR="$FASHION_DIR" bash scripts/make_imagefolder.sh "$OUT/data/imagefolder" \
  --train_per_class 40 --val_per_class 2 --size 256x256 --quality 85 --broken no >/dev/null

tar czf "$BUILD_DIR/gpu-check.tar.gz" -C "$BUILD_DIR" gpu-check
size=$(stat -c %s "$BUILD_DIR/gpu-check.tar.gz")
echo "gpu-check: $BUILD_DIR/gpu-check.tar.gz ($((size / 1024 / 1024)) MiB; unpacked $(du -sh "$OUT" | cut -f1))"
if [ "$size" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "gpu-check.tar.gz is larger than $MAX_MIB MiB: lower TRAIN_SAMPLES or drop a test binary" >&2
  exit 1
fi
echo "on the GPU host: tar xzf gpu-check.tar.gz && gpu-check/gpu_check.sh OUT_DIR"
