#!/usr/bin/env bash
# Reproduces docs/comparison.md: grpo, Dr.GRPO, gigpo and efca on the household environment
# at equal step budgets and seeds, several seeds each, from the main job's config.
#
#   scripts/compare.sh [STEPS] [SEEDS...]      (default: 40 RL steps, seeds 1 2 3)
#
# Each run is the default pipeline (examples/household-grpo.toml) with the algorithm section
# (and, for Dr.GRPO, the aggregation) replaced; everything else, including the warm start,
# is identical. Runs go to runs/compare/<algo>-seed<N>; finished runs are skipped on a rerun.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
bash scripts/setup.sh
cargo build --release
steps="${1:-40}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "$#" -gt 0 ]; then seeds=("$@"); else seeds=(1 2 3); fi
base=examples/household-grpo.toml
out=runs/compare
mkdir -p "$out"

# algorithm label -> (algorithm table, extra objective lines)
declare -A algo objective
algo[grpo]='plugin = "grpo"
config = { norm_adv_by_std = true }'
algo[drgrpo]='plugin = "grpo"
config = { norm_adv_by_std = false }'
objective[drgrpo]='aggregation = "seq-mean-token-sum-norm"
norm_constant = 640.0'
algo[gigpo]='plugin = "gigpo"
config = { mode = "mean_norm", omega = 1.0, gamma = 0.95 }'
algo[efca]='plugin = "efca"'

pairs=()
for name in grpo drgrpo gigpo efca; do
    for seed in "${seeds[@]}"; do
        run="$out/$name-seed$seed"
        cfg="$out/$name-seed$seed.toml"
        python3 - "$base" "$cfg" "$run" "$seed" "$steps" "${algo[$name]}" "${objective[$name]:-}" <<'PY'
import re, sys
base, cfg, run, seed, steps, algo, objective = sys.argv[1:]
text = open(base).read()
text = re.sub(r'(?m)^dir = .*$', f'dir = "{run}"', text, count=1)
text = re.sub(r'(?m)^seed = .*$', f'seed = {seed}', text, count=1)
text = re.sub(r'(?m)^steps = .*$', f'steps = {steps}', text, count=1)
text = re.sub(r'(?m)^every = .*$', 'every = 0', text, count=1)
text = re.sub(r'(?ms)^\[algorithm\]\n.*?\n\n', f'[algorithm]\n{algo}\n\n', text, count=1)
text = re.sub(r'(?m)^aggregation = .*\n', objective + ('\n' if objective else ''), text, count=1) if objective else text
open(cfg, 'w').write(text)
PY
        if grep -q '"after_rl"' "$run/eval.jsonl" 2>/dev/null; then
            echo "skip $run (finished)"
        else
            echo "== $name seed $seed"
            target/release/cairn train "$cfg"
        fi
        pairs+=("$name=$run")
    done
done
target/release/cairn compare --force --out docs/comparison.png "${pairs[@]}" | tee "$out/table.md"
