#!/usr/bin/env bash
# Batched greedy generation throughput (new tokens/s, KV cache), Cairn vs transformers'
# generate(), on the same random-weight Qwen3 model (the main job's size by default), the same
# prompts and lengths, the same thread count, measured in the same run. A benchmark, not a test.
#
#   scripts/fidelity/bench_generate.sh [ROUNDS [BATCH [PROMPT_LEN [NEW_TOKENS [THREADS [DEVICE]]]]]]
#
# Defaults: 3 rounds, batch 32, prompt 64, 32 new tokens, 2 threads, cpu (or cuda). Each round runs both
# engines back to back (one warm-up call, then 3 timed calls each) and prints the ratio, so a
# noisy shared machine affects both sides of a ratio alike. Set HIDDEN / LAYERS / VOCAB to
# change the model (defaults 128 / 4 / 512, the main job's).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$CAIRN_ROOT"
ROUNDS=${1:-3}
BATCH=${2:-32}
PROMPT=${3:-64}
NEW=${4:-32}
THREADS=${5:-2}
DEVICE=${6:-cpu}
REPS=3

bash scripts/setup.sh
cargo build --release -q -p cairn-torch --example bench_generate
BIN="$CAIRN_ROOT/target/release/examples/bench_generate"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python scripts/fidelity/bench_generate.py make "$WORK" --batch "$BATCH" --prompt-len "$PROMPT" \
    --hidden "${HIDDEN:-128}" --layers "${LAYERS:-4}" --vocab "${VOCAB:-512}"

echo "model: Qwen3 hidden ${HIDDEN:-128}, ${LAYERS:-4} layers, vocab ${VOCAB:-512}; batch $BATCH, prompt $PROMPT, $NEW new tokens, $THREADS threads, $DEVICE, $REPS timed calls per engine per round"
: >"$WORK/ratios"
for round in $(seq "$ROUNDS"); do
    cairn=$(OMP_NUM_THREADS=$THREADS "$BIN" "$WORK/model" "$WORK/prompts.json" "$NEW" "$THREADS" "$REPS" "$WORK/cairn_ids.json" "$DEVICE")
    hf=$(OMP_NUM_THREADS=$THREADS python scripts/fidelity/bench_generate.py run "$WORK/model" "$WORK/prompts.json" "$NEW" "$THREADS" "$REPS" "$WORK/cairn_ids.json" --device "$DEVICE")
    python - "$round" "$cairn" "$hf" "$WORK/ratios" <<'PY'
import json, sys
round, cairn, hf = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ratio = cairn["tokens_per_s"] / hf["tokens_per_s"]
open(sys.argv[4], "a").write(f"{ratio}\n")
print(f"round {round}: cairn {cairn['tokens_per_s']:8.0f} tok/s ({cairn['seconds_per_call']:.3f} s/call)   "
      f"transformers {hf['tokens_per_s']:8.0f} tok/s ({hf['seconds_per_call']:.3f} s/call)   "
      f"ratio cairn/transformers {ratio:.2f}   same tokens: {hf.get('same_tokens_as_cairn')}")
PY
done
python - "$WORK/ratios" <<'PY'
import statistics, sys
ratios = sorted(float(x) for x in open(sys.argv[1]))
print(f"ratio cairn/transformers over {len(ratios)} rounds: median {statistics.median(ratios):.2f}, "
      f"min {ratios[0]:.2f}, max {ratios[-1]:.2f}")
PY
