#!/usr/bin/env bash
# Sets up everything the tests need (ONNX Runtime library, Python clients) and runs every test:
# rustfmt and clippy (warnings are errors), Rust unit + integration tests, then the Python
# conformance suite against the same debug binary.
# Also compiles the `cuda` feature (GPU instances) and runs its unit tests that need no GPU,
# compiles the fuzz targets and replays their committed seeds, builds the container image
# from a release binary for conformance/test_image.py, and compares kiln with a live Triton 2.51.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# One clean build on a fresh machine: incremental state would only cost disk (gigabytes) and time.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

.ci/setup.sh
# Formatting and lints first: they are cheap and fail fast. Clippy checks every target (library,
# binary, tests, benches), so code that only a bench or a test compiles cannot rot unseen.
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo build --locked
# The GPU code must keep compiling: kiln-backend with its `cuda` feature (no GPU, no CUDA library
# needed to build; `.ci/setup.sh gpu` is not run here). Only ort-sys, ort, kiln-core,
# kiln-telemetry and kiln-backend are built again with it (the crates from ort up to the backend);
# other crates are shared with the build above. Its unit tests that need no
# GPU run on CPU sessions (the GPU instance's binding, its input staging, CUDA options).
cargo test --locked -p kiln-backend --lib --features cuda backend::cuda
# The fuzz targets (fuzz/, a workspace of its own, run by fuzz/run.sh) must keep compiling against
# the library: built as plain binaries (no sanitizer, nothing fuzzed), sharing this target folder.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" cargo build --locked --manifest-path fuzz/Cargo.toml --bins
# Every committed seed is replayed once through its target (libFuzzer's -runs=0: read the corpus,
# run each input, fuzz nothing): a seed that panics fails CI, so the corpora stay regression tests.
# A crashing input is written under target/, not into the checkout.
for target in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^kiln-fuzz$'); do
    "${CARGO_TARGET_DIR:-$ROOT/target}/debug/$target" "fuzz/corpus/$target" -runs=0 \
        -artifact_prefix="${CARGO_TARGET_DIR:-$ROOT/target}/fuzz-replay-$target-"
done
cargo test --locked
# The container image (deploy/image/build.sh) with a release binary: conformance/test_image.py runs
# it. Where podman could not be installed (no root), the image is not built and that test skips.
if command -v podman >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  cargo build --locked --release --bin kiln
  deploy/image/build.sh
fi
# The live comparison with Triton 2.51 (`.ci/setup.sh triton`; it has no ONNX Runtime backend, so
# Python models): kiln's Python backend tests against Triton, then both servers given the same
# requests (REST and gRPC answers, JSON bodies, metrics, statistics, traces, OpenTelemetry spans).
# A difference that no KNOWN list of bench/triton_parity.py explains fails CI. kiln: the release
# binary when built above, else the debug one.
bench/triton_parity.sh
bench/triton_parity.sh --json
bench/triton_parity.sh --otel
KILN_BIN="$ROOT/target/debug/kiln" .venv/bin/python -m pytest conformance "$@"
