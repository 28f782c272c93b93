#!/usr/bin/env bash
# CPU per request of each kiln binary given: the server's task-clock and context switches (perf
# stat -p) over 5 s of v2bench, add_sub, REST (binary tensors) and gRPC, concurrency 1 and 8; the
# binaries take turns, ROUNDS rounds (default 3). The figure a hot-path change moves, steadier than
# throughput on a small, shared VM (bench/RESULTS.md, "The inference pipeline").
#
#   bench/cpu_per_request.sh target/release/kiln /tmp/kiln-old [...]
#
# Needs the peers (../shared/peers/setup.sh: v2bench and the model repository, which bench/run.sh
# makes as $PEERS_HOME/kiln/best), perf, and port 8650-8652 free. Run as root with
# HALT_POLL_NS=200000 to set the guest's halt polling for the run (see bench/run.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}
V2=$PEERS_HOME/target/release/v2bench
REPO=${REPO:-$PEERS_HOME/kiln/best}
export ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$ROOT/.kiln/onnxruntime/libonnxruntime.so} ORT_INTRA_OP_THREADS=1
halt_poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns previous= pid=
out=$(mktemp -d)
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  [ -z "$previous" ] || echo "$previous" > "$halt_poll"
  rm -rf "$out"
}
trap cleanup EXIT
if [ -n "${HALT_POLL_NS:-}" ]; then previous=$(cat "$halt_poll"); echo "$HALT_POLL_NS" > "$halt_poll"; fi
load() {  # load PROTO PORT C SECONDS [--label x]
  local extra=(); [ "$1" = http ] && extra=(--http-binary)
  "$V2" -u "127.0.0.1:$2" -i "$1" -m add_sub --input INPUT0:FP32:1,16 --input INPUT1:FP32:1,16 \
    -c "$3" -d "$4" "${extra[@]}" "${@:5}" 2>&1
}
for round in $(seq "${ROUNDS:-3}"); do
  for bin in "$@"; do
    "$bin" --model-repository "$REPO" --http-port 8650 --grpc-port 8651 --metrics-port 8652 \
      > "$out/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do curl -sf localhost:8650/v2/models/add_sub/ready >/dev/null && break; sleep 0.2; done
    for proto in http grpc; do
      port=8650; [ "$proto" = grpc ] && port=8651
      for c in 1 8; do
        load "$proto" "$port" "$c" 1 > /dev/null
        perf stat -x, -e task-clock,context-switches -p "$pid" -o "$out/perf" -- sleep 5 > /dev/null 2>&1 &
        stat=$!
        rate=$(load "$proto" "$port" "$c" 5 --label x | awk '$1 == "x" {print $5}' | tail -1)
        wait "$stat"
        ms=$(grep task-clock "$out/perf" | cut -d, -f1)
        cs=$(grep context-switches "$out/perf" | cut -d, -f1)
        awk -v r="$rate" -v ms="$ms" -v cs="$cs" -v n="$(basename "$bin")" -v p="$proto" -v c="$c" -v k="$round" \
          'BEGIN {printf "round %s %-16s %-4s c=%s %9.0f infer/s %6.1f us cpu/request %5.2f switches/request\n",
                  k, n, p, c, r, ms * 1000 / (r * 5), cs / (r * 5)}'
      done
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  done
done
