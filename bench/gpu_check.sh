#!/usr/bin/env bash
# bench/gpu_check.sh - the GPU path end to end on a machine with an NVIDIA GPU, unattended: serves the bundled models
# with KIND_GPU beside the same models on CPU, compares their outputs and measures throughput (bench/gpu_check.py).
#
# usage: bench/gpu_check.sh receive     keep the pieces carried in this call (bench/gpu_parts/<i>/) in bench/gpu_stage/
#        bench/gpu_check.sh run         [gpu_check.py options, e.g. --seconds 10]
#        bench/gpu_check.sh status      what is staged
#
# Where kiln and ONNX Runtime's GPU build come from, in order:
#   1. pieces made by bench/gpu_stage.sh (a prebuilt `kiln --features cuda` and the three libraries of the
#      onnxruntime-gpu wheel): `run` first keeps any pieces carried in its own call, then, once all are there (MANIFEST),
#      checks their sha256, unpacks them into bench/gpu_stage/dist/ and uses them;
#   2. otherwise (a machine that can download): `.ci/setup.sh gpu` and `cargo build --release --features cuda`.
# The NVIDIA runtime (cudart, cuBLAS, cuFFT, cuRAND, NVRTC, cuDNN): $KILN_CUDA_LIB_DIR / $KILN_CUDNN_LIB_DIR if set
# (`:`-separated folders), else .kiln/onnxruntime-gpu (setup), else the nvidia-*-cu13 wheels of the machine's python3,
# else a search of /usr/local, /usr/lib/x86_64-linux-gnu and /opt. libcuda.so.1 comes from the driver.
# Results: the markdown table on stdout and in $OUT/gpu_results.md (bench/gpu_results.md without $OUT), with kiln's
# log beside it. Exit status 0 only if every model loaded on the GPU, ran there, and matched the CPU outputs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PARTS=$ROOT/bench/gpu_parts
STAGE=$ROOT/bench/gpu_stage
PYTHON=${PYTHON:-python3}
log() { echo "gpu_check: $*"; }
die() { echo "gpu_check: ERROR: $*" >&2; exit 1; }
# manifest KEY: the distinct values of KEY in the staged MANIFEST copies (nothing when none is staged).
manifest() { cat "$STAGE"/MANIFEST.* 2>/dev/null | awk -v key="$1" '$1 == key { print $2 }' | sort -u; }
staged_pieces() { find "$STAGE/pieces" -name 'kiln-gpu.tar.xz.*' 2>/dev/null | wc -l; }

# receive: move carried pieces (bench/gpu_parts/<i>/{MANIFEST,kiln-gpu.tar.xz.NN}) into the stage, checking each one.
receive() {
  mkdir -p "$STAGE/pieces"
  local dir name want got
  for dir in "$PARTS"/*/; do
    [ -f "$dir/MANIFEST" ] || continue
    read -r _ name want < <(grep '^piece ' "$dir/MANIFEST")
    got=$(sha256sum "$dir/$name" | cut -d' ' -f1)
    [ "$got" = "$want" ] || die "piece $name is damaged (sha256 $got, expected $want); carry it again"
    cp "$dir/MANIFEST" "$STAGE/MANIFEST.$name"
    mv "$dir/$name" "$STAGE/pieces/$name"
    rm -rf "$dir"
    log "received $name"
  done
  status
}

status() {
  local count have
  have=$(staged_pieces)
  count=$(manifest pieces)
  if [ -x "$STAGE/dist/kiln" ]; then
    log "staged: kiln and ONNX Runtime unpacked in $STAGE/dist"
  else
    log "staged: $have of ${count:-?} pieces"
  fi
}

# unpack: once every piece is there, check the whole archive and unpack it (python's lzma if there is no xz).
unpack() {
  [ -x "$STAGE/dist/kiln" ] && return 0
  local count have archive_sha
  count=$(manifest pieces)
  [ -n "$count" ] || return 1
  archive_sha=$(manifest archive)
  [ "$(echo "$count" | wc -l)" -eq 1 ] && [ "$(echo "$archive_sha" | wc -l)" -eq 1 ] \
    || die "the staged pieces come from different bench/gpu_stage.sh runs: clear $STAGE and carry them again"
  have=$(staged_pieces)
  [ "$have" -eq "$count" ] || die "$have of $count pieces staged; carry the others (bench/gpu_parts/<i>) with 'receive'"
  log "checking and unpacking $count pieces"
  local got
  got=$(cat "$STAGE"/pieces/kiln-gpu.tar.xz.* | sha256sum | cut -d' ' -f1)
  [ "$got" = "$archive_sha" ] || die "reassembled archive sha256 $got, expected $archive_sha"
  rm -rf "$STAGE/dist.tmp" && mkdir -p "$STAGE/dist.tmp"
  if command -v xz >/dev/null 2>&1; then
    cat "$STAGE"/pieces/kiln-gpu.tar.xz.* | xz -dc | tar -C "$STAGE/dist.tmp" -xf -
  else
    cat "$STAGE"/pieces/kiln-gpu.tar.xz.* | "$PYTHON" -c \
      'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1])' "$STAGE/dist.tmp"
  fi
  mv "$STAGE/dist.tmp/dist" "$STAGE/dist"
  rm -rf "$STAGE/dist.tmp" "$STAGE/pieces"
  log "unpacked into $STAGE/dist"
}

# nvidia_libs: sets KILN_CUDA_LIB_DIR and KILN_CUDNN_LIB_DIR (`:`-separated folders) unless they are set already: the
# folders of .kiln/onnxruntime-gpu when set up, else wherever the libraries kiln preloads are under the nvidia/ packages
# of python3's site folders, then under /usr/local, /usr/lib/x86_64-linux-gnu and /opt.
nvidia_libs() {
  local gpu_dir=${KILN_ONNXRUNTIME_GPU_DIR:-$ROOT/.kiln/onnxruntime-gpu} found cuda cudnn
  if [ -n "${KILN_CUDA_LIB_DIR:-}" ] && [ -n "${KILN_CUDNN_LIB_DIR:-}" ]; then
    :
  elif [ -f "$gpu_dir/nvidia/cu13/lib/libcudart.so.13" ]; then
    export KILN_CUDA_LIB_DIR=$gpu_dir/nvidia/cu13/lib KILN_CUDNN_LIB_DIR=$gpu_dir/nvidia/cudnn/lib
  else
    found=$("$PYTHON" - <<'EOF'
import os, site, sys, sysconfig
cuda = ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13", "libcurand.so.10", "libcufft.so.12"]
cudnn = ["libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_heuristic.so.9", "libcudnn_adv.so.9",
         "libcudnn_cnn.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9"]
sites = [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")] + site.getsitepackages() + sys.path
roots = [os.path.join(p, "nvidia") for p in sites if p and os.path.isdir(os.path.join(p, "nvidia"))]
roots = list(dict.fromkeys(roots)) + ["/usr/local", "/usr/lib/x86_64-linux-gnu", "/opt"]
where = {}
def search():
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x != "stubs"]
            for name in cuda + cudnn:
                if name in files and name not in where:
                    where[name] = d
            if len(where) == len(cuda) + len(cudnn):
                return
search()
def folders(names):
    missing = [n for n in names if n not in where]
    if missing:
        sys.exit("not found: " + ", ".join(missing))
    return ":".join(dict.fromkeys(where[n] for n in names))
print(folders(cuda), folders(cudnn))
EOF
) || die "no complete CUDA 13 runtime found (${found:-see above}): set KILN_CUDA_LIB_DIR and KILN_CUDNN_LIB_DIR"
    read -r cuda cudnn <<<"$found"
    export KILN_CUDA_LIB_DIR=${KILN_CUDA_LIB_DIR:-$cuda} KILN_CUDNN_LIB_DIR=${KILN_CUDNN_LIB_DIR:-$cudnn}
  fi
  log "CUDA runtime: $KILN_CUDA_LIB_DIR; cuDNN: $KILN_CUDNN_LIB_DIR"
}

run() {
  local kiln runtime
  receive >/dev/null
  if unpack; then
    kiln=$STAGE/dist/kiln
    runtime=$STAGE/dist/lib/libonnxruntime.so
  else
    log "nothing staged: setting up the wheels and building kiln here (needs network)"
    "$ROOT/.ci/setup.sh" gpu
    cargo build --release --locked --features cuda --manifest-path "$ROOT/Cargo.toml"
    kiln=$ROOT/target/release/kiln
    runtime=${KILN_ONNXRUNTIME_GPU_DIR:-$ROOT/.kiln/onnxruntime-gpu}/onnxruntime/capi/libonnxruntime.so
  fi
  nvidia_libs
  export ORT_DYLIB_PATH=$runtime
  log "kiln: $kiln; ONNX Runtime: $runtime"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv || true
  ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1' || log "WARNING: ldconfig does not list libcuda.so.1 (NVIDIA driver)"
  # Libraries the CUDA provider links that this machine cannot resolve (the preload fills most of them in).
  LD_LIBRARY_PATH="$KILN_CUDA_LIB_DIR:$KILN_CUDNN_LIB_DIR:${LD_LIBRARY_PATH:-}" \
    ldd "$(dirname "$runtime")/libonnxruntime_providers_cuda.so" | grep 'not found' || true
  local out=${OUT:-$ROOT/bench}
  mkdir -p "$out"
  local work
  work=$(mktemp -d)
  local rc=0
  "$PYTHON" "$ROOT/bench/gpu_check.py" --kiln "$kiln" --work "$work" --out "$out/gpu_results.md" "$@" || rc=$?
  cp "$work/kiln.log" "$out/gpu_check_kiln.log" 2>/dev/null || true
  rm -rf "$work"
  log "results in $out/gpu_results.md (kiln's log: $out/gpu_check_kiln.log); exit $rc"
  return $rc
}

case ${1:-run} in
  receive) receive;;
  status) status;;
  run) shift || true; run "$@";;
  -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0";;
  *) die "unknown command '$1' (receive | run | status)";;
esac
