#!/usr/bin/env bash
# Reproduces docs/scaffolds.md: GRPO against EDGE (task-specific and general experiences),
# ReSkill and Pats stacked on GRPO, on the
# household's knowledge regime (examples/household-knowledge.toml), at equal RL steps, seeds
# and warm start, several seeds each.
#
#   scripts/scaffolds.sh [STEPS] [SEEDS...]      (default: 25 RL steps, seeds 1 2 3)
#
# Every run is the base config with `run.seed`, `run.steps` and the stack changed, nothing
# else; the tokenizer, the initial weights and the warm start depend only on the seed, so the
# four methods of a seed start from the same policy. Two runs go at a time, each on one
# libtorch thread. Runs go to runs/scaffolds/<method>-seed<N>; finished runs are skipped.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
bash scripts/setup.sh
cargo build --release
steps="${1:-25}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "$#" -gt 0 ]; then seeds=("$@"); else seeds=(1 2 3); fi
base=examples/household-knowledge.toml
out=runs/scaffolds
mkdir -p "$out"

# method -> the [[algorithm.stack]] entries added to the base's `[algorithm]` (grpo).
declare -A stack
stack[grpo]=''
stack[edge]='[[algorithm.stack]]
plugin = "edge"
config = { warmup_steps = 1000, header = "", top_k = 0, task_specific_top_k = 1, update_frequency = 1 }'
stack[reskill]='[[algorithm.stack]]
plugin = "reskill"'
stack[pats]='[[algorithm.stack]]
plugin = "pats"
config = { coef = 1.0 }'
# EDGE with general experiences: any task retrieves them by BM25 on its description.
stack[edge_general]='[[algorithm.stack]]
plugin = "edge"
config = { warmup_steps = 1000, header = "", top_k = 1, task_specific_top_k = 0, update_frequency = 1, scope = "general" }'
methods=(grpo edge reskill pats edge_general)

jobs=()
pairs=()
for method in "${methods[@]}"; do
    for seed in "${seeds[@]}"; do
        run="$out/$method-seed$seed"
        cfg="$out/$method-seed$seed.toml"
        python3 - "$base" "$cfg" "$run" "$seed" "$steps" "${stack[$method]}" <<'PY'
import re, sys
base, cfg, run, seed, steps, stack = sys.argv[1:]
text = open(base).read()
text = re.sub(r'(?m)^dir = .*$', f'dir = "{run}"', text, count=1)
text = re.sub(r'(?m)^seed = .*$', f'seed = {seed}', text, count=1)
text = re.sub(r'(?m)^steps = .*$', f'steps = {steps}', text, count=1)
text = text.replace('dtype = "f32"\n', 'dtype = "f32"\nthreads = 1\n', 1)
text = re.sub(r'(?ms)^(\[algorithm\]\n.*?\n)\n', lambda m: m.group(1) + (stack + '\n' if stack else '') + '\n', text, count=1)
open(cfg, 'w').write(text)
PY
        if grep -q '"after_rl"' "$run/eval.jsonl" 2>/dev/null; then
            echo "skip $run (finished)"
        else
            jobs+=("$cfg")
        fi
        pairs+=("$method=$run")
    done
done
if [ "${#jobs[@]}" -gt 0 ]; then
    printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} sh -c \
        'target/release/cairn train "$1" > "${1%.toml}.log" 2>&1 || { echo "failed: $1 (see ${1%.toml}.log)"; exit 255; }' _ {}
fi
target/release/cairn compare --force --out docs/scaffolds.png "${pairs[@]}" | tee "$out/table.md"
# EDGE's E/N curves and its bank, over the seeds.
edge=() general=()
for seed in "${seeds[@]}"; do
    edge+=("edge=$out/edge-seed$seed")
    general+=("edge_general=$out/edge_general-seed$seed")
done
target/release/cairn compare --force --out docs/scaffolds-edge-en.png \
    --metric edge/success_e --metric edge/success_n "${edge[@]}" "${general[@]}" >/dev/null
target/release/cairn compare --force --out docs/scaffolds-edge-bank.png \
    --metric edge/bank_size "${edge[@]}" "${general[@]}" >/dev/null
target/release/cairn compare --force --out docs/scaffolds-edge-utility.png \
    --metric edge/bank_utility_mean "${edge[@]}" "${general[@]}" >/dev/null
runs=()
for method in "${methods[@]}"; do
    for seed in "${seeds[@]}"; do runs+=("$out/$method-seed$seed"); done
done
python3 scripts/scaffolds_report.py "${runs[@]}" | tee "$out/usage.md"
