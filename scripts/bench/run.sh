#!/usr/bin/env bash
# Cairn's benchmark suite, one command: Cairn against its Python references (transformers,
# plain PyTorch, TRL) on identical work, in one run, reported as ratios. See BENCHMARKS.md.
#
#   scripts/bench/run.sh                  # the whole suite (about 20-30 min on 2 busy cores)
#   scripts/bench/run.sh --quick          # one case per kind, one round (a smoke run)
#   scripts/bench/run.sh --only train,pipeline --repeats 5 --threads 1
#
# Arguments go to scripts/bench/suite.py (--help lists them). Results: target/bench/results.md
# (the tables BENCHMARKS.md quotes) and target/bench/results.json (raw samples).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$CAIRN_ROOT"

bash scripts/setup.sh
# The references: transformers for generate() and the model, TRL for GRPOTrainer's loss.
REQS=scripts/bench/requirements.txt
STAMP="$VIRTUAL_ENV/.cairn-bench-$(sha256sum "$REQS" | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    echo "bench: installing the Python references ($REQS) from PyPI"
    "$VIRTUAL_ENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
    touch "$STAMP"
fi
if [ ! -x /usr/bin/time ]; then
    echo "bench: installing GNU time (peak RSS)"
    apt-get install -y -qq time >/dev/null || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
fi
# The harness and the two plugins the main job loads (the pipeline benchmark dlopens them).
cargo build --release -p cairn-bench -p cairn-grpo -p cairn-household
exec "$VIRTUAL_ENV/bin/python" scripts/bench/suite.py "$@"
