#!/usr/bin/env bash
# Two kiln builds side by side on the same Python models: the peers' Triton repository (every
# model a model.py running onnxruntime, ../shared/peers/peers/triton), both servers up at once,
# 2 instances each, v2bench over gRPC (batch-1 add_sub requests) in interleaved rounds; prints
# each round and the medians. For "did this change slow the Python backend down?".
#
#   bench/python_ab.sh OLD_KILN NEW_KILN [--rounds 3] [--duration 5] [--repo DIR]
#
# `--repo model_repository` compares them on the bundled ONNX add_sub instead (any repository
# whose add_sub takes INPUT0/INPUT1 FP32 [16]).
#
# Build the old one from another checkout sharing the target directory, e.g.
#   git worktree add /tmp/old <commit> && (cd /tmp/old && CARGO_TARGET_DIR=$PWD/target cargo build --release)
# copying each binary aside before the next build. Needs the peers set up
# (`../shared/peers/setup.sh --only triton`, which also writes the repository). Ports 9500-9502
# and 9600-9602.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_KILN NEW_KILN [--rounds N] [--duration S] [--repo DIR]" >&2; exit 2; }
OLD=$1; NEW=$2; shift 2
ROUNDS=3; DURATION=5
while [ $# -gt 0 ]; do case $1 in
  --rounds) ROUNDS=$2; shift 2;; --duration) DURATION=$2; shift 2;; --repo) REPO_ARG=$2; shift 2;;
  *) echo "bad argument $1" >&2; exit 2;; esac; done
export PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}
VENV=$PEERS_HOME/venvs/triton; V2BENCH=$PEERS_HOME/target/release/v2bench
REPO=${REPO_ARG:-$PEERS_HOME/triton/repo-triton}
for need in "$OLD" "$NEW" "$V2BENCH" "$VENV/bin/python" "$REPO/add_sub/config.pbtxt"; do
  [ -e "$need" ] || { echo "missing $need (see the usage above)" >&2; exit 1; }
done
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OUT=$(mktemp -d); export ORT_INTRA_OP_THREADS=1
pids=()
trap 'for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done' EXIT
start() { # label binary http-port
  PEER_SITE_PACKAGES=$SITE KILN_PYTHON=$VENV/bin/python setsid "$2" --model-repository "$REPO" \
    --http-address 127.0.0.1 --grpc-address 127.0.0.1 --http-port "$3" --grpc-port $(($3 + 1)) \
    --metrics-port $(($3 + 2)) >"$OUT/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 150); do curl -sf "localhost:$3/v2/health/ready" >/dev/null && return; sleep 0.2; done
  tail "$OUT/$1.log"; exit 1
}
start old "$OLD" 9500
start new "$NEW" 9600
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  # Alternate who goes first, so that neither always meets a cold or a warm machine.
  targets=(old:9501 new:9601); (( round % 2 == 0 )) && targets=(new:9601 old:9501)
  for target in "${targets[@]}"; do
    "$V2BENCH" -u "127.0.0.1:${target##*:}" -i grpc -m add_sub --input INPUT0:FP32:1,16 \
      --input INPUT1:FP32:1,16 -c 1,8 -d "$DURATION" -w 1 --label "${target%%:*}" \
      --json "$OUT/results.jsonl" >/dev/null
  done
done
"$VENV/bin/python" - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| concurrency | old infer/s (rounds) | new infer/s (rounds) | new / old | old p99 us | new p99 us |")
print("|---:|---|---|---:|---:|---:|")
for conc in sorted({r["concurrency"] for r in rows}):
    got = {label: [r for r in rows if r["concurrency"] == conc and r["label"] == label] for label in ("old", "new")}
    med = {label: statistics.median(r["throughput"] for r in got[label]) for label in got}
    p99 = {label: statistics.median(r["p99_us"] for r in got[label]) for label in got}
    rounds = {label: ", ".join(str(round(r["throughput"])) for r in got[label]) for label in got}
    print(f"| {conc} | {med['old']:.0f} ({rounds['old']}) | {med['new']:.0f} ({rounds['new']}) | "
          f"{med['new'] / med['old']:.2f} | {p99['old']:.0f} | {p99['new']:.0f} |")
PY
