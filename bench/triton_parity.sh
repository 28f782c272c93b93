#!/usr/bin/env bash
# kiln's Python backend tests against the real Triton 2.51 (see bench/triton_parity.py):
#
#   bench/triton_parity.sh [TEST_NAME ...]
#   bench/triton_parity.sh --json     # also starts kiln (target/release, else target/debug) on the
#                                     # same repository and compares the REST JSON both write
#   bench/triton_parity.sh --otel     # both in OpenTelemetry trace mode, each exporting to a
#                                     # collector of the script's (ports 9850, 9851): their spans
#
# Exits 1 when kiln and Triton disagree where no KNOWN list of triton_parity.py says why (--json,
# --otel), or when a test fails on Triton that is not listed as failing there (plain), or when
# Triton does not start: CI runs it (.ci/test.sh).
#
# Needs Triton 2.51 (`.ci/setup.sh triton`: .kiln/triton, or $KILN_TRITON_DIR; else the peers'
# `../shared/peers/setup.sh --only triton` in $PEERS_HOME) and the conformance venv
# (`.ci/setup.sh python`). Triton takes ports 9800-9802, kiln 9810-9812; the logs go to a
# temporary folder the script names at its end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRITON_HOME=${KILN_TRITON_DIR:-$ROOT/.kiln/triton}
if [ -x "$TRITON_HOME/venv/bin/python" ]; then
  VENV=$TRITON_HOME/venv BACKENDS=$TRITON_HOME/backends
else
  export PEERS_HOME=${PEERS_HOME:-$HOME/.cache/kiln-peers}
  VENV=$PEERS_HOME/venvs/triton BACKENDS=$PEERS_HOME/triton/backends
fi
[ -x "$VENV/bin/python" ] || { echo "missing $VENV/bin/python (.ci/setup.sh triton)" >&2; exit 1; }
SP=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
TS=$SP/pytriton/tritonserver
for need in "$TS/bin/tritonserver" "$BACKENDS/python/triton_python_backend_stub" "$ROOT/.venv/bin/python"; do
  [ -e "$need" ] || { echo "missing $need (.ci/setup.sh triton python)" >&2; exit 1; }
done
# A Triton still stopping (up to 30 s) holds the port: wait for it a while.
for _ in $(seq 60); do curl -s -o /dev/null localhost:9800/v2/health/live || break; sleep 1; done
if curl -s -o /dev/null localhost:9800/v2/health/live; then
  echo "port 9800 is taken: try again when it is free" >&2; exit 1
fi
OUT=$(mktemp -d)
REPO=$("$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" make "$OUT/fixture")
# Both servers load every model but py_warm_fail, whose warmup fails: Triton 2.51 dies (a
# segmentation fault as that failed instance goes) in about half of its loads here, at start-up with
# the other models or alone through the repository API. Its failed warmup goes uncompared.
LOADS=$(ls "$REPO" | grep -vx py_warm_fail | sed 's/^/--load-model=/' | tr '\n' ' ')
PYLIB=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_config_var("LIBDIR"))')
export LD_LIBRARY_PATH=$SP/nvidia_pytriton.libs:$PYLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEER_SITE_PACKAGES=$SP PYTHONDONTWRITEBYTECODE=1
# Every series both servers can write: the latency summaries and the first-response histogram too.
METRICS_CONFIG="--metrics-config=summary_latencies=true --metrics-config=histogram_latencies=true"
# Each server traces to trace.json in a working directory of its own (the same setting for both),
# or with --otel to a collector of its own.
mkdir -p "$OUT/triton-run" "$OUT/kiln-run"
export PARITY_TRACES=$OUT/triton-run,$OUT/kiln-run
trace_config() {
  if [ "${MODE:-}" = --otel ]; then
    echo "--trace-config=mode=opentelemetry --trace-config=level=TIMESTAMPS --trace-config=rate=0" \
      "--trace-config=opentelemetry,url=127.0.0.1:$1/v1/traces --trace-config=opentelemetry,bsp_schedule_delay=100"
  elif [ "${MODE:-}" = --json ]; then
    echo "--trace-config=triton,file=trace.json"
  else
    # Where the tests read them: beside the fixture's repository, as its kiln writes them.
    echo "--trace-config=triton,file=$(dirname "$REPO")/trace.json"
  fi
}
MODE=${1:-}
PID= KPID=
# stop GROUP...: each process group ended, waiting until it is gone, so that the next run finds
# the ports free. SIGTERM first (30 s), then SIGKILL: the Python backend stubs of a Triton that
# died stay in its group and do not end on SIGTERM, and would outlive the run.
stop() {
  local group signal
  for signal in TERM KILL; do
    for group in "$@"; do [ -z "$group" ] || kill -"$signal" -- -"$group" 2>/dev/null || true; done
    for group in "$@"; do
      for _ in $(seq 60); do [ -n "$group" ] && kill -0 -- -"$group" 2>/dev/null || break; sleep 0.5; done
    done
  done
}
trap 'stop "$PID" "$KPID"' EXIT
# start_triton: Triton on the fixture, until the last model it loads answers ready. Should Triton
# die while it loads: up to PARITY_TRIES (5) tries; fails when every one died.
start_triton() {
  local attempt
  for attempt in $(seq "${PARITY_TRIES:-5}"); do
    while curl -s -o /dev/null localhost:9800/v2/health/live; do sleep 1; done
    (cd "$OUT/triton-run" && exec setsid "$TS/bin/tritonserver" --model-repository="$REPO" --backend-directory="$BACKENDS" \
      --http-port=9800 --grpc-port=9801 --metrics-port=9802 --allow-gpu-metrics=false --log-verbose=0 \
      --cache-directory="$TS/caches" --cache-config=local,size=1048576 $METRICS_CONFIG \
      --model-control-mode=explicit $LOADS --exit-on-error=false --strict-readiness=false \
      $(trace_config 9850) >>"$OUT/triton.log" 2>&1) &
    PID=$!
    for _ in $(seq 240); do
      kill -0 "$PID" 2>/dev/null || break
      curl -sf localhost:9800/v2/models/py_add_sub/ready >/dev/null && break
      sleep 0.5
    done
    # Every model it loads has ended its load (ready, or unavailable with the reason).
    for _ in $(seq 240); do
      kill -0 "$PID" 2>/dev/null || break
      "$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" loaded localhost:9800 "$REPO" && break
      sleep 0.5
    done
    kill -0 "$PID" 2>/dev/null && return 0
    echo "Triton died while loading (try $attempt): $(tail -1 "$OUT/triton.log")" >&2
    stop "$PID"  # its stubs
  done
  echo "Triton died while loading on every try: see $OUT/triton.log" >&2
  return 1
}
status=0
start_triton || status=1
if [ $status = 0 ] && { [ "$MODE" = --json ] || [ "$MODE" = --otel ]; }; then
  KILN=${KILN_BIN:-$ROOT/target/release/kiln}
  [ -x "$KILN" ] || KILN=$ROOT/target/debug/kiln
  # Python stubs start with a scrubbed environment: the fixture's model.py files read PEER_SITE_PACKAGES.
  # The comparison loads model.py files through the load API, as Triton allows by default.
  PEER_SITE_PACKAGES=$("$ROOT/.venv/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])') \
    KILN_PYTHON=$ROOT/.venv/bin/python bash -c 'cd "$1" && shift && exec setsid "$@"' _ "$OUT/kiln-run" \
    "$KILN" --model-repository="$REPO" --http-port=9810 --allow-client-shm=true \
    --grpc-port=9811 --metrics-port=9812 --python-env-passthrough=PEER_SITE_PACKAGES --model-control-mode=explicit \
    --allow-code-in-load-overrides $LOADS --strict-readiness=false --cache-config=local,size=1048576 $METRICS_CONFIG $(trace_config 9851) \
    >"$OUT/kiln.log" 2>&1 &
  KPID=$!
  for _ in $(seq 120); do curl -sf localhost:9810/v2/health/ready >/dev/null && break; sleep 0.5; done
  if [ "$MODE" = --otel ]; then
    "$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" otel 127.0.0.1:9800 127.0.0.1:9810 9850,9851 || status=$?
  else
    "$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" json 127.0.0.1:9800 127.0.0.1:9810 || status=$?
  fi
  echo "kiln's log: $OUT/kiln.log"
elif [ $status = 0 ]; then
  # The tests, in order; when Triton dies during one (rc 3: its bugs, see triton_parity.py), it is
  # started again (at most twice) for the tests after it. The verdict reads every test's outcome.
  export PARITY_RESULTS=$OUT/results.jsonl
  restarts=0
  while true; do
    rc=0
    "$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" run "$REPO" 9800,9801,9802 "$@" || rc=$?
    [ $rc = 3 ] && [ $restarts -lt 2 ] || break
    restarts=$((restarts + 1))
    stop "$PID"
    start_triton || { rc=1; break; }
  done
  [ $rc = 0 ] || [ $rc = 3 ] || status=$rc
  "$ROOT/.venv/bin/python" "$ROOT/bench/triton_parity.py" verdict "$@" || status=$?
fi
echo "Triton's log: $OUT/triton.log"
exit $status
