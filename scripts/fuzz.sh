#!/usr/bin/env bash
# The long fuzz run: the property tests of kernel/tests/it/fuzz/ (pipeline configs, gateway
# request bodies, `cairn signals` / `cairn loss` batch files, damaged plugin files) with many
# more cases than the test suite runs, in rounds with fresh random seeds until a time budget
# is spent.
#
#   scripts/fuzz.sh [SECONDS [CASES_PER_ROUND]]     defaults: 600 seconds, 5000 cases
#
# Prints the inputs each target tried, summed over the rounds. Stops at the first failing
# round and prints it: proptest shows the minimal failing input and saves its seed under
# kernel/tests/proptest-regressions/, where every later run (the test suite's too) replays it
# first; commit that file with the fix.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"

seconds="${1:-600}"
cases="${2:-5000}"
if ! [[ "$seconds" =~ ^[0-9]+$ && "$cases" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS [CASES_PER_ROUND]] (whole numbers; got '$*')" >&2
    exit 2
fi

# The algorithm plugins the signals target loads (ALGORITHMS in kernel/tests/it/fuzz/batch.rs;
# grpo is also the plugin the plugin-file target cuts short), and the test binary.
cargo build -p cairn-grpo -p cairn-gigpo -p cairn-efca -p cairn-eapo -p cairn-hint \
    -p cairn-edge -p cairn-reskill -p cairn-pats -p cairn-sdar -p cairn-icsd -p cairn-opid \
    -p cairn-ucob -p cairn-echo
cargo test -p cairn-kernel --test it --no-run

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
declare -A total=()
rounds=0
status=0
start=$SECONDS
while (( rounds == 0 || SECONDS - start < seconds )); do
    rounds=$((rounds + 1))
    if ! PROPTEST_CASES="$cases" cargo test -q -p cairn-kernel --test it -- fuzz:: \
        --nocapture >"$log" 2>&1; then
        cat "$log"
        echo "fuzz: round $rounds failed (its output is above)" >&2
        status=1
    fi
    while read -r _ name count; do
        total[$name]=$(( ${total[$name]:-0} + count ))
    done < <(grep -o 'fuzz-inputs [a-z-]* [0-9]*' "$log")
    (( status == 0 )) || break
done

echo "fuzz: $rounds round(s) of up to $cases cases per target in $((SECONDS - start)) s"
for name in $(printf '%s\n' "${!total[@]}" | sort); do
    printf '  %-14s %d inputs\n' "$name" "${total[$name]}"
done
exit "$status"
