#!/usr/bin/env bash
# gpu_bundle.sh — pack what a GPU machine without pstrain's Debian packages needs to run
# make test-gpu's suites and short cuda:0 training runs: the CUDA build's programs and test
# suites, the shared libraries they load from Debian (xz tarball; not glibc, libstdc++,
# libgcc_s or the CUDA libraries, which the GPU machine has), a 10,000-image Fashion-MNIST
# (its test set, also used as the training set) and the KJV text. It ends with the check
# script, scripts/gpu_check.sh, copied in as run.sh.
# usage: scripts/gpu_bundle.sh [OUT_DIR=.gpu-bundle] [BUILD_DIR=build-gpu]
# then, on the GPU machine, in the directory holding OUT_DIR: OUT=<results dir> bash OUT_DIR/run.sh
set -euo pipefail
out=${1:-.gpu-bundle}
build=${2:-build-gpu}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPSTRAIN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-80;90}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target test_ops test_seq_ops test_collectives \
  test_cuda_nogpu test_device test_gemm_bf16 test_exec trainer pserver pslaunch >/dev/null
rm -rf "$out" && mkdir -p "$out/bin" "$out/tests" "$out/data/fashion-mnist"
cp "$build"/bin/trainer "$build"/bin/pserver "$build"/bin/pslaunch "$out/bin/"
for t in test_ops test_seq_ops test_collectives test_cuda_nogpu test_device test_gemm_bf16 test_exec; do
  cp "$build/tests/$t" "$out/tests/"
done
libs=$(mktemp -d)
trap 'rm -rf "$libs"' EXIT
ldd "$out"/bin/* "$out"/tests/* | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|/usr/local/cuda' |
  while read -r f; do cp -L "$f" "$libs/$(basename "$f")"; done
tar cJf "$out/libs.tar.xz" -C "$libs" .
fm=/usr/share/datasets/fashion-mnist
for kind in images-idx3 labels-idx1; do
  cp "$fm/t10k-$kind-ubyte.gz" "$out/data/fashion-mnist/"
  cp "$fm/t10k-$kind-ubyte.gz" "$out/data/fashion-mnist/train-$kind-ubyte.gz"
done
xz -9 -c /usr/local/share/pstrain/kjv.txt >"$out/data/kjv.txt.xz"
cp scripts/gpu_check.sh "$out/run.sh"
du -sh "$out"
