#!/usr/bin/env bash
# The GPU leg of the benchmark suite (BENCHMARKS.md, "On a GPU"), for a CUDA machine whose
# python3 has torch 2.11 and transformers but which has no Rust toolchain: Cairn runs from a
# prebuilt directory holding `cairn-bench`, the `grpo` and `household` plugins and the main
# job's config. Build that directory where cargo is (the binary finds libtorch through
# LD_LIBRARY_PATH, set here from the machine's own torch):
#
#   cargo build --release -p cairn-bench -p cairn-grpo -p cairn-household
#   mkdir -p target/gpu-carry && strip -o target/gpu-carry/cairn-bench target/release/cairn-bench
#   cp target/release/libcairn_{grpo,household}.so examples/household-grpo.toml target/gpu-carry/
#
# then, on the GPU machine, from the repository root:
#
#   scripts/bench/gpu.sh [PREBUILT_DIR] [OUT_DIR]     # defaults: target/gpu-carry, target/bench-gpu
#
# One round per case (the GPU is not shared), no TRL (not installed there), then the real
# pipeline step on the CPU at 2 threads under both libgomp wait policies.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$(cd "${1:-$ROOT/target/gpu-carry}" && pwd)"
OUT="${2:-$ROOT/target/bench-gpu}"
mkdir -p "$OUT"
cd "$ROOT"
TL=$(python3 -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'lib'))")
export LD_LIBRARY_PATH="$TL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CAIRN_BENCH_BIN="$HERE/cairn-bench" CAIRN_PLUGIN_DIR="$HERE" \
    CAIRN_BENCH_CONFIG="$HERE/household-grpo.toml" PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 scripts/bench/suite.py --device cuda --threads 2 --repeats 1 --no-trl \
    --only matmul,pipeline,generate,train,score --cases 'generate=0,2,4;score=0;train=0,2' \
    --out "$OUT/cuda" 2>"$OUT/cuda.log"
for policy in ACTIVE PASSIVE; do
    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=$policy "$HERE/cairn-bench" pipeline --backend torch \
        --steps 2 --threads 2 --eval-tasks 2 --run-dir "$OUT/pipeline-$policy" \
        --config "$HERE/household-grpo.toml" >"$OUT/cpu-pipeline-$policy.json"
done
