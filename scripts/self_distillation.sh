#!/usr/bin/env bash
# Reproduces docs/self-distillation.md: GRPO, naive OPSD, SDAR, ICSD, OPID, GiGPO and UCOB on
# household, and GRPO (full and truncated history) against ECHO on search-qa, at equal steps,
# seeds and warm start, then the tables and the figures.
#
#   scripts/self_distillation.sh [STEPS] [SEEDS...]   (default: 20 RL steps, seeds 1 2 3)
#   ONLY=household scripts/self_distillation.sh       # one part (or ONLY=search-qa, ONLY=prompt-length)
#   METHODS="grpo sdar" scripts/self_distillation.sh  # some methods only
#
# Configs come from scripts/self_distillation.py (the example configs with the algorithm
# section replaced). Runs go to runs/self-distillation/<env>/<method>-seed<N>; a finished run
# (an `after_rl` evaluation) is skipped on a rerun, so an interrupted sweep goes on where it
# stopped. The figures: docs/self-distillation-household.png, docs/self-distillation-search-qa.png.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
# Two sweeps may share the cores (docs/self-distillation.md): sleeping libgomp waiters, or every
# parallel region waits for a descheduled spinner (BENCHMARKS.md, "Threads and libgomp").
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
bash scripts/setup.sh
cargo build --release --workspace
steps="${1:-20}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "$#" -gt 0 ]; then seeds=("$@"); else seeds=(1 2 3); fi
out=runs/self-distillation
# train LABEL CFG RUN: trains CFG into RUN unless RUN is finished (has an `after_rl` evaluation).
train() {
    if grep -q '"after_rl"' "$3/eval.jsonl" 2>/dev/null; then
        echo "skip $3 (finished)"
        return
    fi
    echo "== $1"
    rm -rf "$3"
    target/release/cairn train "$2" < /dev/null > "$3.log" 2>&1 \
        || { echo "failed: see $3.log" >&2; exit 1; }
}
declare -A pairs
while read -r env method seed cfg run; do
    if [ -n "${ONLY:-}" ] && [ "$env" != "$ONLY" ]; then continue; fi
    if [ -n "${METHODS:-}" ] && ! [[ " $METHODS " == *" $method "* ]]; then continue; fi
    train "$env $method seed $seed" "$cfg" "$run"
    pairs[$env]+=" $method=$run"
done < <(python3 scripts/self_distillation.py configs --only "${ONLY:-}" "$out" "$steps" "${seeds[@]}")
# ECHO's prompt length against full history over 6 turns (one seed, a short warm start).
if [ -z "${ONLY:-}" ] || [ "$ONLY" = prompt-length ]; then
    while read -r _ name _ cfg run; do
        train "prompt length: $name" "$cfg" "$run"
    done < <(python3 scripts/self_distillation.py prompt-length "$out" 4)
fi
for env in "${!pairs[@]}"; do
    # shellcheck disable=SC2086
    target/release/cairn compare --force --out "docs/self-distillation-$env.png" ${pairs[$env]} > /dev/null
done
python3 scripts/self_distillation.py report "$out" --cairn target/release/cairn | tee "$out/tables.md"
