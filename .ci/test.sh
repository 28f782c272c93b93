#!/usr/bin/env bash
# Sets up everything the tests need (ONNX Runtime library, Python clients) and runs every test:
# Rust unit + integration tests, then the Python conformance suite against the same debug binary.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

.ci/setup.sh
cargo build --locked
cargo test --locked
KILN_BIN="$ROOT/target/debug/kiln" .venv/bin/python -m pytest conformance "$@"
