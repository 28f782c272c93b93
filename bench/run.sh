#!/usr/bin/env bash
# Benchmarks kiln against its peers (../shared/peers: real Triton, furnace, ...) and in-process
# ONNX Runtime, in one compare.py run, and prints the summary table.
#
# usage: bench/run.sh [peers|scheduler] [compare.py options]
#        bench/run.sh ab OLD [compare.py options]
#   peers      (default) issue 8's table: kiln as configured for each model (target `kiln`,
#              Triton's batcher; `kiln-adaptive`: the same with --adaptive-batching;
#              `kiln-dynbatch`: every model batched on 2 instances, as Triton's is) vs
#              Triton with and without dynamic batching and furnace, on add_sub, mlp and
#              matmul_stack, gRPC and REST, concurrency 1 and 8, 3 rounds, + in-process ORT
#   scheduler  issue 4's point: mlp and matmul_stack, gRPC, concurrency 8, dynamic batching
#   ab OLD     did a change slow kiln down: this checkout's build (`kiln`) against another one
#              (`kiln-old`), both as the `kiln` target serves the models, up at once, rounds
#              interleaved; OLD is a kiln binary or a git revision, built in a worktree that shares
#              this checkout's target directory (only kiln itself recompiles). Default: add_sub and
#              mlp, gRPC and REST, concurrency 1 and 8, 5 rounds
#   extra options replace the preset's compare.py options, e.g.
#     bench/run.sh peers --only kiln,furnace --models add_sub --protocols grpc -c 1 -d 3 -w 1 --rounds 1
# HALT_POLL_NS=N sets the KVM guest's halt polling (the haltpoll cpuidle driver's
# guest_halt_poll_ns; root only) for the run and puts the old value back afterwards: on a VM whose
# idle vCPUs halt at once, waking them is most of every server's latency at concurrency 1
# (bench/RESULTS.md). 200000 is the kernel's default; the run prints the setting it ran under.
# Needs: the peers set up once (PEERS_CODE/setup.sh --only triton,furnace), a release build of
# kiln (built here), and an idle machine: only ratios measured in one run mean anything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_CODE=${PEERS_CODE:-$(cd "$ROOT/../shared/peers" && pwd)}
export PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}

"$ROOT/.ci/setup.sh" runtime
cargo build --release --manifest-path "$ROOT/Cargo.toml"
python3 "$ROOT/bench/make_repo.py" "$PEERS_HOME/model_repository" "$PEERS_HOME/kiln/plain"
python3 "$ROOT/bench/make_repo.py" "$PEERS_HOME/model_repository" "$PEERS_HOME/kiln/best" \
  --dynamic-batching mlp,matmul_stack --max-queue-delay-us 500 --instances-for matmul_stack=1 \
  --instances-for mlp=1
python3 "$ROOT/bench/make_repo.py" "$PEERS_HOME/model_repository" "$PEERS_HOME/kiln/dynbatch" \
  --dynamic-batching --max-queue-delay-us 500 --instances-for matmul_stack=1

export OURS_BIN="$ROOT/target/release/kiln"
halt_poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
previous= work=
cleanup() {
  [ -z "$previous" ] || echo "$previous" > "$halt_poll"
  [ -z "$work" ] || { git -C "$ROOT" worktree remove --force "$work/tree" 2>/dev/null || true; rm -rf "$work"; }
}
trap cleanup EXIT
export ORT_DYLIB_PATH="$ROOT/.kiln/onnxruntime/libonnxruntime.so"
preset=peers
case "${1:-}" in peers|scheduler|ab) preset=$1; shift ;; esac
baseline=kiln
targets="$ROOT/bench/targets.json"
if [ "$preset" = ab ]; then
  [ $# -ge 1 ] || { echo "usage: $0 ab OLD_BINARY|GIT_REVISION [compare.py options]" >&2; exit 2; }
  old=$1; shift
  work=$(mktemp -d)
  cp "$OURS_BIN" "$work/kiln"
  if [ -f "$old" ]; then
    cp "$old" "$work/kiln-old"
  else
    git -C "$ROOT" worktree add --detach -q "$work/tree" "$old"
    (cd "$work/tree" && CARGO_TARGET_DIR="$ROOT/target" cargo build --release)
    cp "$ROOT/target/release/kiln" "$work/kiln-old"
    cargo build --release --manifest-path "$ROOT/Cargo.toml"  # this checkout's build back in place
  fi
  targets="$work/targets.json"
  python3 - "$ROOT/bench/targets.json" "$work" > "$targets" <<'PY'
import json, sys
kiln = next(t for t in json.load(open(sys.argv[1])) if t["name"] == "kiln")
pairs = []
for name, port in (("kiln", 8460), ("kiln-old", 8470)):
    t = json.loads(json.dumps(kiln))
    t.update(name=name, http=f"127.0.0.1:{port}", grpc=f"127.0.0.1:{port + 1}",
             start=f"peers/ours/start.sh --name {name}", stop=f"peers/ours/stop.sh --name {name}")
    t["env"].update(OURS_HTTP=port, OURS_GRPC=port + 1, OURS_METRICS=port + 2, OURS_BIN=f"{sys.argv[2]}/{name}")
    pairs.append(t)
json.dump(pairs, sys.stdout, indent=1)
PY
  [ $# -eq 0 ] && set -- --models add_sub,mlp --protocols grpc,http -c 1,8 -d 6 -w 2 --rounds 5
elif [ "$preset" = scheduler ]; then
  baseline=kiln-dynbatch
  [ $# -eq 0 ] && set -- --only kiln-dynbatch,triton-dynbatch,furnace --models mlp,matmul_stack \
    --protocols grpc -c 8 -d 8 -w 2 --rounds 3 --ort-ref
else
  [ $# -eq 0 ] && set -- --only kiln,kiln-adaptive,kiln-dynbatch,triton,triton-dynbatch,furnace \
    --models add_sub,mlp,matmul_stack --protocols grpc,http -c 1,8 -d 6 -w 2 --rounds 3 --ort-ref
fi
if [ -n "${HALT_POLL_NS:-}" ]; then
  previous=$(cat "$halt_poll")
  echo "$HALT_POLL_NS" > "$halt_poll"
fi
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cpuidle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown)," \
  "guest_halt_poll_ns: $(cat "$halt_poll" 2>/dev/null || echo n/a)"
python3 "$PEERS_CODE/scripts/compare.py" --targets "$targets" --baseline "$baseline" "$@"
