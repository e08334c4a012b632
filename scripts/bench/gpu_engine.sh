#!/usr/bin/env bash
# The GPU leg of the gateway and rollout-engine benchmarks (BENCHMARKS.md, "On a GPU: the
# gateway under a burst and `cairn serve` as the rollout engine"), for a CUDA machine whose
# python3 has torch and transformers but which has no Rust toolchain, no network and no vLLM:
#
#  1. a model of SmolLM2-135M-Instruct's shape with random weights (transformers, seed 0) and
#     SmolLM2's own tokenizer;
#  2. `cairn serve` on CUDA under bursts (`burst.py --device cuda`, bf16, 4 rounds), and the
#     batch-invariance check (16 seeded requests in one burst, then each alone) in bf16 and f32;
#  3. RL steps of examples/smollm2-gpu.toml with Cairn's own backend against `cairn serve` as
#     the rollout engine (`engine.sh`, 2 alternated rounds of 3 steps, 64 held-out tasks).
#
# Random weights make the throughput and the step time real and the success rates
# meaningless. Build the prebuilt directory where cargo is:
#
#   cargo build --release -p cairn -p cairn-arith -p cairn-grpo
#   mkdir -p target/gpu-carry/model && strip -o target/gpu-carry/cairn target/release/cairn
#   for p in arith grpo; do strip -o target/gpu-carry/libcairn_$p.so target/release/libcairn_$p.so; done
#   cp .cache/models/smollm2-135m-instruct/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
#       target/gpu-carry/model/
#
# then, on the GPU machine, from the repository root:
#
#   scripts/bench/gpu_engine.sh [PREBUILT_DIR] [OUT_DIR]   # defaults: target/gpu-carry, target/bench-gpu-engine
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$(cd "${1:-$ROOT/target/gpu-carry}" && pwd)"
OUT="${2:-$ROOT/target/bench-gpu-engine}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
TL=$(python3 -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'lib'))")
export LD_LIBRARY_PATH="$TL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
MODEL="${TMPDIR:-/tmp}/cairn-smollm2-random"
nvidia-smi -L || true

python3 - "$HERE/model" "$MODEL" <<'EOF'
import shutil, sys, torch, transformers
src, dst = sys.argv[1:]
config = transformers.AutoConfig.from_pretrained(src)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
model.save_pretrained(dst)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(f"{src}/{name}", dst)
print(f"random SmolLM2-shaped model in {dst}: {sum(p.numel() for p in model.parameters())} parameters")
EOF

python3 scripts/bench/burst.py --model "$MODEL" --build cairn="$HERE/cairn" --device cuda \
    --dtype bf16 --rounds 4 --invariance 16x32 --out "$OUT/burst-bf16" 2>&1 | tee "$OUT/burst-bf16.log"
python3 scripts/bench/burst.py --model "$MODEL" --build cairn="$HERE/cairn" --device cuda \
    --dtype f32 --rounds 1 --batch 8x64 --invariance 16x32 --out "$OUT/burst-f32" 2>&1 \
    | tee "$OUT/burst-f32.log"

sed -e "s#^path = .*#path = \"$MODEL\"#" examples/smollm2-gpu.toml > "$OUT/smollm2-gpu.toml"
CAIRN_PLUGIN_DIR="$HERE" bash scripts/bench/engine.sh --cairn "$HERE/cairn" \
    --config "$OUT/smollm2-gpu.toml" --steps 3 --rounds 2 --eval-tasks 64 --out "$OUT/engine"
