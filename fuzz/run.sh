#!/usr/bin/env bash
# Runs every fuzz target (or those named) for a bounded time each and prints, per target, the
# executions run and the crashes found.
#
#   fuzz/run.sh                     # every target, 60 s each
#   FUZZ_SECONDS=300 fuzz/run.sh grpc_infer_request rest_json
#
# Needs `cargo install cargo-fuzz`. cargo-fuzz uses nightly-only flags (-Zsanitizer); on a stable
# toolchain RUSTC_BOOTSTRAP=1 unlocks them (set here unless already set). The committed seeds in
# fuzz/corpus/<target>/ are only read; inputs libFuzzer finds go to $FUZZ_WORK/corpus/<target>/
# and crashing inputs to $FUZZ_WORK/artifacts/<target>/ (default fuzz/work/, which git ignores).
# Turn each crash into a regression test in the module it hit, then fix it.
set -euo pipefail

cd "$(dirname "$0")"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
WORK="${FUZZ_WORK:-$PWD/work}"
export RUSTC_BOOTSTRAP="${RUSTC_BOOTSTRAP:-1}"
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    mapfile -t TARGETS < <(cargo fuzz list)
fi

cargo fuzz build --release
summary=()
status=0
for target in "${TARGETS[@]}"; do
    mkdir -p "$WORK/corpus/$target" "$WORK/artifacts/$target" "$WORK/logs"
    log="$WORK/logs/$target.log"
    echo "== $target: ${SECONDS_EACH} s"
    set +e
    cargo fuzz run --release "$target" "$WORK/corpus/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
        -artifact_prefix="$WORK/artifacts/$target/" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
    # cargo-fuzz passes its own -artifact_prefix (fuzz/artifacts/) too: look in both places.
    crashes=$(find "$WORK/artifacts/$target" "artifacts/$target" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) 2>/dev/null | wc -l)
    [ "$rc" -ne 0 ] && status=1 && tail -n 30 "$log"
    summary+=("$(printf '%-20s %12s %8s %6s' "$target" "${runs:-?}" "$crashes" "$rc")")
done
echo
printf '%-20s %12s %8s %6s\n' target executions crashes exit
printf '%s\n' "${summary[@]}"
exit "$status"
