#!/usr/bin/env bash
# EAPO's tool-free slots against GRPO on search-qa (docs/search-qa.md, "EAPO on search-qa"):
# examples/search-qa-grpo.toml and examples/search-qa-eapo.toml at equal steps, seeds and warm
# start, then the report (tool calls and accuracy, mean ± std over seeds).
#
#   bash plugins/search-qa/scripts/eapo_vs_grpo.sh            # seeds 1 2 3, 20 steps
#   STEPS=40 bash plugins/search-qa/scripts/eapo_vs_grpo.sh 1 2
#
# Runs go to runs/search-qa-compare/{grpo,eapo}-s{seed}; an existing run resumes (or is left
# as it is when finished). Uses the release build when there is one, else the debug build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/env.sh"
cd "$CAIRN_ROOT"
STEPS="${STEPS:-20}"
SEEDS=("${@:-1 2 3}")
read -r -a SEEDS <<< "${SEEDS[*]}"
CAIRN=target/release/cairn
[ -x "$CAIRN" ] || CAIRN=target/debug/cairn
OUT=runs/search-qa-compare
mkdir -p "$OUT"
runs=()
for seed in "${SEEDS[@]}"; do
  for method in grpo eapo; do
    dir="$OUT/$method-s$seed"
    cfg="$OUT/$method-s$seed.toml"
    sed -e "s|^dir = .*|dir = \"$dir\"|" -e "s|^seed = .*|seed = $seed|" \
        -e "s|^steps = .*|steps = $STEPS|" "examples/search-qa-$method.toml" > "$cfg"
    echo "== $method, seed $seed: $dir"
    "$CAIRN" train "$cfg" > "$dir.log" 2>&1 || { echo "failed: see $dir.log"; exit 1; }
    runs+=("$dir")
  done
done
python3 plugins/search-qa/scripts/report.py --cairn "$CAIRN" "${runs[@]}"
