#!/usr/bin/env bash
# Benchmarks kiln against its peers (../shared/peers: real Triton, furnace, ...) and in-process
# ONNX Runtime, in one compare.py run, and prints the summary table.
#
# usage: bench/run.sh [compare.py options]      (default: the scheduler point of issue 4)
#   e.g. bench/run.sh --only kiln-dynbatch,triton-dynbatch,furnace --models mlp,matmul_stack \
#                     --protocols grpc -c 8 -d 8 -w 2 --rounds 3 --ort-ref
# Needs: the peers set up once (PEERS_CODE/setup.sh --only triton,furnace), a release build of
# kiln (built here), and an idle machine: only ratios measured in one run mean anything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_CODE=${PEERS_CODE:-$(cd "$ROOT/../shared/peers" && pwd)}
export PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}

"$ROOT/.ci/setup.sh" runtime
cargo build --release --manifest-path "$ROOT/Cargo.toml"
python3 "$ROOT/bench/make_repo.py" "$PEERS_HOME/model_repository" "$PEERS_HOME/kiln/plain"
python3 "$ROOT/bench/make_repo.py" "$PEERS_HOME/model_repository" "$PEERS_HOME/kiln/dynbatch" \
  --dynamic-batching --max-queue-delay-us 500 --instances-for matmul_stack=1

export OURS_BIN="$ROOT/target/release/kiln"
export ORT_DYLIB_PATH="$ROOT/.kiln/onnxruntime/libonnxruntime.so"
if [ $# -eq 0 ]; then
  set -- --only kiln-dynbatch,triton-dynbatch,furnace --models mlp,matmul_stack --protocols grpc \
    -c 8 -d 8 -w 2 --rounds 3 --ort-ref
fi
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$PEERS_CODE/scripts/compare.py" --targets "$ROOT/bench/targets.json" --baseline kiln-dynbatch "$@"
