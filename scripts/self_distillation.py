#!/usr/bin/env python3
"""Configs and report of the self-distillation demonstration (docs/self-distillation.md).

    python3 scripts/self_distillation.py configs OUT STEPS SEED...   # writes OUT/<env>/<method>-seed<N>.toml
    python3 scripts/self_distillation.py report OUT [--cairn BIN]    # Markdown tables on stdout

Every run of one environment is the same base config (examples/household-grpo.toml or
examples/search-qa-grpo.toml) with `run.dir`, `run.seed`, `run.steps` and the algorithm
section replaced, and nothing else, except the ECHO rows, which also set search-qa's
`context_budget` / `history` (that is the comparison). Same seed: same tokenizer, initial
weights and warm start, so every method of a seed starts from the identical policy.
"""

import argparse
import json
import subprocess
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# label -> (what it is compared with, [algorithm] tables, extra config lines)
HOUSEHOLD = {
    "grpo": ("—", 'plugin = "grpo"\nconfig = { norm_adv_by_std = true }', ""),
    "opsd": (
        "—",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }\n\n[[algorithm.stack]]\n'
        'plugin = "sdar"\nconfig = { coef = 0.1, form = "reverse_kl", gate = false, skills = { scope = "general" } }',
        "",
    ),
    "sdar": (
        "opsd",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }\n\n[[algorithm.stack]]\n'
        'plugin = "sdar"\nconfig = { coef = 0.1, beta = 5.0, form = "reverse_kl", skills = { scope = "general" } }',
        "",
    ),
    "icsd": (
        "sdar",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }\n\n[[algorithm.stack]]\n'
        'plugin = "icsd"\nconfig = { coef = 0.1, w_min = 0.25, w_max = 2.0, skills = { scope = "general" } }',
        "",
    ),
    "opid": (
        "grpo",
        'plugin = "gigpo"\nconfig = { omega = 0.0 }\n\n[[algorithm.stack]]\n'
        'plugin = "opid"\nconfig = { w_ep = 0.001, w_st = 0.001, scope = "general" }',
        '[skills]\nreflector = "policy"\n',
    ),
    "gigpo": ("—", 'plugin = "gigpo"\nconfig = { gamma = 0.95 }', ""),
    "ucob": (
        "gigpo",
        'plugin = "gigpo"\nconfig = { gamma = 0.95 }\n\n[[algorithm.stack]]\n'
        'plugin = "ucob"\nconfig = { coef = 0.1, skill_scope = "general" }',
        "",
    ),
}

# search-qa: the example config's questions and turns; only the budget and history change.
SEARCH_QA_ENV = (
    'kinds = ["atomic_number", "symbol"], split_by = "question", max_turns = 3, top_k = 1, '
    'passage_words = 4, reward = "exact_match"'
)
BUDGET_WORDS = 48  # the environment's smallest budget: instructions, question, latest results
ECHO_TOKENS = 48  # ECHO's record budget B, in policy tokens (about 31 words at 1.55 tokens/word)
SEARCH_QA = {
    "grpo-full": ("—", 'plugin = "grpo"\nconfig = { norm_adv_by_std = true }', SEARCH_QA_ENV),
    "grpo-trunc": (
        "—",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }',
        SEARCH_QA_ENV + f", context_budget = {BUDGET_WORDS}",
    ),
    "echo": (
        "grpo-trunc",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }\n\n[[algorithm.stack]]\n'
        'plugin = "echo"\nconfig = { eta = 0.5, record_tokens = 32, '
        f"context_budget = {ECHO_TOKENS}, task_block = false }}",
        SEARCH_QA_ENV + f", context_budget = {BUDGET_WORDS}, history = false",
    ),
}

ENVS = {
    "household": ("examples/household-grpo.toml", HOUSEHOLD),
    "search-qa": ("examples/search-qa-grpo.toml", SEARCH_QA),
}

# A stack that keeps bank entries or reflects trains its word-level tokenizer on the knowledge
# text too (`cairn::setup::keeps_knowledge`), so its vocabulary, and with it the initial weights
# and the warm start, differ from a plain run's. The plain runs therefore use the tokenizer of
# this run of their seed (which runs first), and every method of a seed starts from the same
# tokenizer; on household the warm start is then identical.
TOKENIZER_FROM = {"household": "opsd", "search-qa": "echo"}
PLAIN = {"grpo", "gigpo", "grpo-full", "grpo-trunc"}


def config(base, run, seed, steps, algo, extra, env_config, tokenizer=None):
    text = (ROOT / base).read_text()
    if tokenizer is not None:
        text = re.sub(
            r"(?m)^tokenizer_episodes = .*$", f'tokenizer = "{tokenizer}"', text, count=1
        )
    text = re.sub(r"(?m)^dir = .*$", f'dir = "{run}"', text, count=1)
    text = re.sub(r"(?m)^seed = .*$", f"seed = {seed}", text, count=1)
    text = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", text, count=1)
    text = re.sub(r"(?m)^every = .*$", "every = 0", text, count=1)
    text = re.sub(r"(?m)^checkpoint_every = .*$", f"checkpoint_every = {steps}", text, count=1)
    text = re.sub(
        r"(?ms)^\[algorithm\]\n.*?\n\n", f"[algorithm]\n{algo}\n\n", text, count=1
    )
    if env_config is not None and base.endswith("search-qa-grpo.toml"):
        # One libtorch thread: the search-qa runs share the two cores with the household runs
        # (see docs/self-distillation.md, "Reproduce").
        text = re.sub(r'(?m)^dtype = "f32"$', 'dtype = "f32"\nthreads = 1', text, count=1)
        text = re.sub(r"(?m)^config = \{ kinds = .*$", f"config = {{ {env_config} }}", text, count=1)
    # household's base turn limit is 16; its prompts then have room for every skill.
    return text + ("\n" + extra if extra else "")


def configs(out, steps, seeds, own_tokenizer=False, only=None):
    out = pathlib.Path(out)
    for env, (base, methods) in ENVS.items():
        if only and env != only:
            continue  # another part's configs (and their step count) stay as they are
        (out / env).mkdir(parents=True, exist_ok=True)
        first = TOKENIZER_FROM[env]
        order = [first] + [m for m in methods if m != first]
        for name in order:
            _, algo, extra = methods[name]
            env_config = extra if env == "search-qa" else None
            extra_lines = extra if env == "household" else ""
            for seed in seeds:
                run = out / env / f"{name}-seed{seed}"
                cfg = out / env / f"{name}-seed{seed}.toml"
                tokenizer = (
                    str(out / env / f"{first}-seed{seed}" / "tokenizer")
                    if name in PLAIN and not own_tokenizer
                    else None
                )
                cfg.write_text(
                    config(base, str(run), seed, steps, algo, extra_lines, env_config, tokenizer)
                )
                print(f"{env} {name} {seed} {cfg} {run}")


# ECHO's prompt length against full history over a longer horizon: two-hop questions, up to 6
# turns, the environment's default 3 passages of up to 40 words per search. Success is near 0
# for both at this model size (equal), so only the prompt lengths are compared.
LONG_ENV = 'kinds = ["discoverer_by_number", "symbol_by_discoverer"], split_by = "question", max_turns = 6'
PROMPT_LENGTH = {
    "full": (LONG_ENV, 'plugin = "grpo"\nconfig = { norm_adv_by_std = true }'),
    "echo": (
        LONG_ENV + ", history = false",
        'plugin = "grpo"\nconfig = { norm_adv_by_std = true }\n\n[[algorithm.stack]]\n'
        'plugin = "echo"\nconfig = { eta = 0.5, record_tokens = 64, context_budget = 256, '
        "task_block = false }",
    ),
}


def prompt_length_configs(out, steps):
    out = pathlib.Path(out) / "prompt-length"
    out.mkdir(parents=True, exist_ok=True)
    base = (ROOT / "examples/search-qa-grpo.toml").read_text()
    for name, (env_config, algo) in PROMPT_LENGTH.items():
        run = out / name
        text = base
        for pattern, repl in [
            (r"(?m)^dir = .*$", f'dir = "{run}"'),
            (r"(?m)^seed = .*$", "seed = 1"),
            (r"(?m)^steps = .*$", f"steps = {steps}"),
            (r"(?m)^checkpoint_every = .*$", "checkpoint_every = 0"),
            (r"(?m)^config = \{ kinds = .*$", f"config = {{ {env_config} }}"),
            (r"(?ms)^\[algorithm\]\n.*?\n\n", f"[algorithm]\n{algo}\n\n"),
            (r"(?m)^max_turns = 3$", "max_turns = 6"),
            (r'(?m)^dtype = "f32"$', 'dtype = "f32"\nthreads = 1'),
            (r"(?m)^every = .*$", "every = 0"),
            (r"(?m)^tasks = .*$", "tasks = 8"),
            (r"(?m)^demonstrations = .*$", "demonstrations = 60"),
            (r"(?m)^epochs = .*$", "epochs = 4"),
        ]:
            text = re.sub(pattern, repl, text, count=1)
        (out / f"{name}.toml").write_text(text)
        print(f"prompt-length {name} 1 {out / name}.toml {run}")


def prompt_length_report(out, cairn):
    out = pathlib.Path(out) / "prompt-length"
    runs = {n: out / n for n in PROMPT_LENGTH if (out / n / "metrics.jsonl").exists()}
    if not runs:
        return
    print("\n### search-qa, 6 turns: prompt tokens per turn\n")
    print("| run | turn rows | prompt tokens / turn (mean) | by turn 0, 1, 2, ... | training success |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        args = [cairn, "pool", "export", str(run), "--format", "batch", "--source", "train"]
        text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        rows = json.loads(text)["rows"] if text.strip() else []
        by_turn = {}
        for r in rows:
            by_turn.setdefault(r["turn"], []).append(len(r["prompt_ids"]))
        turns = ", ".join(f"{statistics.fmean(v):.0f}" for _, v in sorted(by_turn.items()))
        rl = [m for m in jsonl(run / "metrics.jsonl") if m.get("phase") == "rl"]
        success = statistics.fmean(m["success_rate"] for m in rl) if rl else float("nan")
        mean = statistics.fmean(len(r["prompt_ids"]) for r in rows) if rows else float("nan")
        print(f"| {name} | {len(rows)} | {mean:.1f} | {turns} | {success * 100:.1f}% |")


def jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(ms, scale=1.0, digits=1, unit=""):
    m, s = ms
    if m is None:
        return "—"
    return f"{m * scale:.{digits}f}{unit} ± {s * scale:.{digits}f}"


def run_summary(run):
    evals = {e["label"]: e for e in jsonl(run / "eval.jsonl")}
    rl = [m for m in jsonl(run / "metrics.jsonl") if m.get("phase") == "rl"]
    half = rl[len(rl) // 2 :]

    def avg(key, rows=rl):
        vals = [m[key] for m in rows if isinstance(m.get(key), (int, float))]
        return statistics.fmean(vals) if vals else None

    return {
        "before": evals.get("after_warm_start", {}).get("success_rate"),
        "after": evals.get("after_rl", {}).get("success_rate"),
        "train_late": avg("success_rate", half),
        "step_s": avg("step_time_s"),
        "late_step": len(rl) // 2,
    }


def prompt_tokens(cairn, run, step_min):
    """Mean prompt tokens per training turn row from `step_min` on, from the data pool."""
    args = [cairn, "pool", "export", str(run), "--format", "batch", "--source", "train",
            "--step-min", str(step_min)]
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rows = json.loads(text)["rows"] if text.strip() else []
    return statistics.fmean(len(r["prompt_ids"]) for r in rows) if rows else None


def report(out, cairn):
    out = pathlib.Path(out)
    for env, (_, methods) in ENVS.items():
        print(f"\n### {env}\n")
        tokens = env == "search-qa"
        print(
            "| method | compared with | seeds | held-out success after warm start | "
            "held-out success after RL | gain (points, paired) | training success, last half of RL "
            "| RL step (s) |" + (" prompt tokens / turn, last half |" if tokens else "")
        )
        print("|---|---|---|---|---|---|---|---|" + ("---|" if tokens else ""))
        per_seed = {}
        for name, (versus, _, _) in methods.items():
            runs = sorted((out / env).glob(f"{name}-seed*/eval.jsonl"))
            sums = []
            for e in runs:
                s = run_summary(e.parent)
                if s["after"] is None:
                    continue
                sums.append((int(e.parent.name.rsplit("seed", 1)[1]), s))
            if not sums:
                continue
            per_seed[name] = sums
            gains = [s["after"] - s["before"] for _, s in sums if s["before"] is not None]
            print(
                f"| {name} | {versus} | {len(sums)} | "
                f"{fmt(mean_std([s['before'] for _, s in sums]), 100, 1, '%')} | "
                f"{fmt(mean_std([s['after'] for _, s in sums]), 100, 1, '%')} | "
                f"{fmt(mean_std(gains), 100, 1)} | "
                f"{fmt(mean_std([s['train_late'] for _, s in sums]), 100, 1, '%')} | "
                f"{fmt(mean_std([s['step_s'] for _, s in sums]), 1, 2)} |"
                + (
                    f" {fmt(mean_std([prompt_tokens(cairn, out / env / f'{name}-seed{seed}', s['late_step']) for seed, s in sums]), 1, 1)} |"
                    if tokens
                    else ""
                )
            )
        print("\nPer seed, held-out success after warm start → after RL (%):\n")
        seeds = sorted({seed for sums in per_seed.values() for seed, _ in sums})
        print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
        print("|---|" + "---|" * len(seeds))
        for name, sums in per_seed.items():
            by = dict(sums)
            cells = [
                f"{by[s]['before'] * 100:.1f} → {by[s]['after'] * 100:.1f}" if s in by else "—"
                for s in seeds
            ]
            print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("configs", help="write every run's config; prints `env method seed cfg run`")
    c.add_argument("out")
    c.add_argument("steps", type=int)
    c.add_argument("seeds", type=int, nargs="+")
    c.add_argument("--only", help="one environment (household, search-qa); default: both")
    c.add_argument(
        "--own-tokenizer",
        action="store_true",
        help="every run trains its own tokenizer (for benchmarks, which run the plain ones alone)",
    )
    p = sub.add_parser("prompt-length", help="the two configs of the prompt-length measurement")
    p.add_argument("out")
    p.add_argument("steps", type=int)
    r = sub.add_parser("report", help="Markdown tables of the finished runs under OUT")
    r.add_argument("out")
    r.add_argument("--cairn", default="target/release/cairn", help="for `cairn pool export`")
    args = parser.parse_args()
    if args.command == "configs":
        configs(args.out, args.steps, args.seeds, args.own_tokenizer, args.only)
    elif args.command == "prompt-length":
        prompt_length_configs(args.out, args.steps)
    else:
        report(args.out, args.cairn)
        prompt_length_report(args.out, args.cairn)


if __name__ == "__main__":
    main()
