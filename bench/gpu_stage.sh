#!/usr/bin/env bash
# bench/gpu_stage.sh - packs what bench/gpu_check.sh needs on a GPU machine that cannot download, in pieces small enough
# to travel one per device call (a call carries at most 64 MiB, working tree included).
#
# usage: bench/gpu_stage.sh [--part-mib N]      (default 56: a piece plus the ~1.2 MB working tree stays under 64 MiB)
#
# 1. builds kiln here: cargo build --release --features cuda (glibc of this machine: 2.36; the GPU machine needs >= it)
# 2. takes libonnxruntime.so.<v>, libonnxruntime_providers_cuda.so and libonnxruntime_providers_shared.so from the
#    onnxruntime-gpu wheel: from .kiln/onnxruntime-gpu when `.ci/setup.sh gpu` has run, else from a download of that one
#    wheel (255 MB, sha256-checked, in a temporary folder that is removed)
# 3. tar | xz -9 into bench/gpu_parts/kiln-gpu.tar.xz, split into bench/gpu_parts/<i>/kiln-gpu.tar.xz.<i>, each
#    folder with a MANIFEST (piece count, sha256 of the piece and of the whole archive). bench/gpu_parts/ is ignored.
#
# Then, on the GPU machine, one device call per piece, consecutively while it stays warm:
#   carry ["bench/gpu_parts/<i>"]   command: bench/gpu_check.sh receive
# and a last call (the last piece may go with it):   command: bench/gpu_check.sh run
# The NVIDIA runtime libraries (cudart, cuBLAS, cuDNN, ...) are not packed: that machine's Python has the
# nvidia-*-cu13 wheels, and gpu_check.sh finds them there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PART_MIB=56
while [ $# -gt 0 ]; do
  case $1 in
    --part-mib) PART_MIB=$2; shift 2;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
PYTHON=${PYTHON:-python3}
# Same pins as .ci/setup.sh gpu.
ORT_GPU_VERSION=$(sed -n 's/^ORT_GPU_VERSION=//p' "$ROOT/.ci/setup.sh")
ORT_GPU_WHEEL_SHA256=$(sed -n 's/^ORT_GPU_WHEEL_SHA256=//p' "$ROOT/.ci/setup.sh")
PARTS=$ROOT/bench/gpu_parts
t0=$SECONDS

echo "gpu_stage: cargo build --release --features cuda"
cargo build --release --locked --features cuda --manifest-path "$ROOT/Cargo.toml"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/dist/lib"
cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/kiln" "$tmp/dist/kiln"
capi=${KILN_ONNXRUNTIME_GPU_DIR:-$ROOT/.kiln/onnxruntime-gpu}/onnxruntime/capi
if [ -f "$capi/libonnxruntime_providers_cuda.so" ] && [ -f "$capi/libonnxruntime.so.$ORT_GPU_VERSION" ]; then
  echo "gpu_stage: ONNX Runtime GPU libraries from $capi"
  for f in "libonnxruntime.so.$ORT_GPU_VERSION" libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
    cp "$capi/$f" "$tmp/dist/lib/$f"
  done
else
  echo "gpu_stage: downloading the onnxruntime-gpu==$ORT_GPU_VERSION wheel alone (255 MB)"
  "$PYTHON" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 "onnxruntime-gpu==$ORT_GPU_VERSION" -d "$tmp/dl" >/dev/null
  wheel=$(ls "$tmp"/dl/onnxruntime_gpu-*.whl)
  echo "$ORT_GPU_WHEEL_SHA256  $wheel" | sha256sum -c --quiet -
  "$PYTHON" - "$wheel" "$tmp/dist/lib" "$ORT_GPU_VERSION" <<'EOF'
import os, shutil, sys, zipfile
wheel, out, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in (f"libonnxruntime.so.{version}", "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so"):
        with z.open(f"onnxruntime/capi/{name}") as src, open(os.path.join(out, name), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
  rm -rf "$tmp/dl"
fi
chmod 755 "$tmp/dist/lib/"*.so* "$tmp/dist/kiln"
ln -s "libonnxruntime.so.$ORT_GPU_VERSION" "$tmp/dist/lib/libonnxruntime.so"
ls -l "$tmp/dist" "$tmp/dist/lib"

rm -rf "$PARTS"
mkdir -p "$PARTS"
echo "gpu_stage: compressing (xz -9, both cores; several minutes)"
t1=$SECONDS
tar -C "$tmp" -cf - dist | xz -9 -T2 -c > "$PARTS/kiln-gpu.tar.xz"
echo "gpu_stage: compressed in $((SECONDS - t1)) s"
(cd "$PARTS" && split -b "${PART_MIB}M" -d -a 2 kiln-gpu.tar.xz kiln-gpu.tar.xz.)
total_sha=$(sha256sum "$PARTS/kiln-gpu.tar.xz" | cut -d' ' -f1)
pieces=("$PARTS"/kiln-gpu.tar.xz.[0-9][0-9])
count=${#pieces[@]}
i=0
for piece in "${pieces[@]}"; do
  i=$((i + 1))
  mkdir -p "$PARTS/$i"
  mv "$piece" "$PARTS/$i/"
  name=$(basename "$piece")
  {
    echo "pieces $count"
    echo "archive $total_sha"
    echo "piece $name $(sha256sum "$PARTS/$i/$name" | cut -d' ' -f1)"
  } > "$PARTS/$i/MANIFEST"
done
rm "$PARTS/kiln-gpu.tar.xz"
echo
echo "gpu_stage: done in $((SECONDS - t0)) s: $count pieces of at most $PART_MIB MiB:"
du -b "$PARTS"/*/kiln-gpu.tar.xz.* | awk '{ printf "  %s  %.1f MiB\n", $2, $1 / 1048576 }'
echo
echo "On the GPU machine, one device call per piece while it stays warm:"
for i in $(seq 1 "$count"); do
  echo "  carry [\"bench/gpu_parts/$i\"]  command: bench/gpu_check.sh receive"
done
echo "then:  command: bench/gpu_check.sh run   (timeout_s 600)"
