#!/usr/bin/env bash
# Cairn at real size, one command: SmolLM2-135M-Instruct generation against transformers and
# llama.cpp, scoring and a GRPO training step against plain PyTorch, and MFU against the
# measured matmul peak, side by side in one run. See BENCHMARKS.md, "SmolLM2-135M (real size)".
#
#   scripts/bench/smollm2.sh                          # everything, 3 rounds, 1 thread (~15 min here)
#   scripts/bench/smollm2.sh --quick                  # the first case of each kind, one round
#   scripts/bench/smollm2.sh --only generate --threads 2 --repeats 5
#   scripts/bench/smollm2.sh --model DIR              # another imported directory of the model
#
# Set-up (idempotent): scripts/setup.sh (torch, transformers, the Q4_1 GGUF), the bench
# requirements (scripts/bench/requirements.txt: llama-cpp-python builds llama.cpp from source on
# first install, several minutes), GNU time, the release cairn-bench, the Hugging Face
# directory (scripts/smollm2.sh: `cairn import gguf`, into .cache/models/smollm2-135m-instruct)
# and the F32 GGUF for llama.cpp (scripts/bench/smollm2_gguf.py, into target/bench/smollm2/).
# Arguments go to scripts/bench/smollm2.py (--help lists them). Results:
# target/bench/smollm2/results.md (the tables, also printed) and results.json (every sample).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$CAIRN_ROOT"

bash scripts/setup.sh
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
cargo build --release -p cairn-bench

MODEL="$CAIRN_ROOT/.cache/models/smollm2-135m-instruct"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[$i]}" = "--model" ] && MODEL="${args[$((i + 1))]}"
done
if [ ! -f "$MODEL/config.json" ]; then
    bash scripts/smollm2.sh
fi
OUT="$CAIRN_ROOT/target/bench/smollm2"
GGUF="$OUT/SmolLM2-135M-Instruct.F32.gguf"
if [ ! -f "$GGUF" ]; then
    mkdir -p "$OUT"
    python scripts/bench/smollm2_gguf.py "$CAIRN_ROOT/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF" --dtype f32
fi
exec python scripts/bench/smollm2.py --model "$MODEL" --gguf "$GGUF" "$@"
