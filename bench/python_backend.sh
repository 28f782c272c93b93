#!/usr/bin/env bash
# kiln's Python backend against Triton 2.51's on the same Python models: the peers' Triton
# repository, where every model is a model.py running onnxruntime (../shared/peers/peers/triton),
# served by both servers at once with 2 instances, measured with v2bench (gRPC, batch-1 requests)
# in interleaved rounds; prints the medians and kiln's ratio to Triton.
#
#   bench/python_backend.sh [--dynamic-batching] [--rounds 3] [--duration 5]
#
# HALT_POLL_NS=N sets the guest's halt polling for the run, as bench/run.sh does (root only).
# Needs the peers set up (`../shared/peers/setup.sh --only triton`) and a release build of kiln
# (`cargo build --release`, or KILN_BIN). Triton's ports come from the peers' ports.env; kiln takes
# 9400-9402.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_CODE:-$ROOT/../shared/peers}
export PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}
KILN=${KILN_BIN:-$ROOT/target/release/kiln}
V2BENCH=$PEERS_HOME/target/release/v2bench
VENV=$PEERS_HOME/venvs/triton
DYNAMIC=(); ROUNDS=3; DURATION=5
while [ $# -gt 0 ]; do case $1 in
  --dynamic-batching) DYNAMIC=(--dynamic-batching); shift;;
  --rounds) ROUNDS=$2; shift 2;; --duration) DURATION=$2; shift 2;;
  *) echo "usage: $0 [--dynamic-batching] [--rounds N] [--duration S]" >&2; exit 2;; esac; done
for need in "$KILN" "$V2BENCH" "$VENV/bin/python"; do
  [ -e "$need" ] || { echo "missing $need (build kiln --release; ../shared/peers/setup.sh --only triton)" >&2; exit 1; }
done
source "$PEERS/ports.env"
OUT=$(mktemp -d)
KILN_PID=
stop() {
  [ -n "$KILN_PID" ] && kill -- -"$KILN_PID" 2>/dev/null || true
  "$PEERS/peers/triton/stop.sh" >/dev/null 2>&1 || true
}
trap stop EXIT

halt_poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ -n "${HALT_POLL_NS:-}" ]; then
  previous=$(cat "$halt_poll")
  echo "$HALT_POLL_NS" > "$halt_poll"
  trap 'stop; echo "$previous" > "$halt_poll"' EXIT
fi
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg); guest_halt_poll_ns: $(cat "$halt_poll" 2>/dev/null || echo n/a)"
export ORT_INTRA_OP_THREADS=1
"$PEERS/peers/triton/start.sh" --instances 2 --models add_sub,mlp "${DYNAMIC[@]}" >/dev/null
# The same repository (Triton's start.sh writes it), under kiln, with the same interpreter.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PEER_SITE_PACKAGES=$SITE KILN_PYTHON=$VENV/bin/python setsid "$KILN" \
  --model-repository "$PEERS_HOME/triton/repo-triton" --http-address 127.0.0.1 --grpc-address 127.0.0.1 \
  --http-port 9400 --grpc-port 9401 --metrics-port 9402 >"$OUT/kiln.log" 2>&1 &
KILN_PID=$!
for _ in $(seq 150); do curl -sf localhost:9400/v2/health/ready >/dev/null && break; sleep 0.2; done
curl -sf localhost:9400/v2/health/ready >/dev/null || { tail -20 "$OUT/kiln.log"; exit 1; }

for round in $(seq "$ROUNDS"); do
  for target in "triton:$TRITON_GRPC" "kiln:9401"; do
    name=${target%%:*}; port=${target##*:}
    "$V2BENCH" -u "127.0.0.1:$port" -i grpc -m add_sub --input INPUT0:FP32:1,16 --input INPUT1:FP32:1,16 \
      -c 1,8 -d "$DURATION" -w 1 --label "$name" --json "$OUT/results.jsonl" >/dev/null
    "$V2BENCH" -u "127.0.0.1:$port" -i grpc -m mlp --input INPUT0:FP32:1,784 \
      -c 1,8 -d "$DURATION" -w 1 --label "$name" --json "$OUT/results.jsonl" >/dev/null
  done
done
"$VENV/bin/python" - "$OUT/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
key = lambda r: (r.get("model"), r.get("concurrency"))
print("| model | concurrency | Triton infer/s | kiln infer/s | kiln / Triton | Triton p99 us | kiln p99 us |")
print("|---|---:|---:|---:|---:|---:|---:|")
for model, conc in sorted({key(r) for r in rows}):
    def med(label, field):
        values = [r[field] for r in rows if key(r) == (model, conc) and r.get("label") == label]
        return statistics.median(values) if values else float("nan")
    t, k = med("triton", "throughput"), med("kiln", "throughput")
    print(f"| {model} | {conc} | {t:.0f} | {k:.0f} | {k / t:.2f} | {med('triton', 'p99_us'):.0f} | {med('kiln', 'p99_us'):.0f} |")
EOF
