"""Cairn at real size: SmolLM2-135M-Instruct against transformers, llama.cpp and plain PyTorch,
side by side in one run. Started by scripts/bench/smollm2.sh (which builds, installs and
converts first); see BENCHMARKS.md, section "SmolLM2-135M (real size)".

    python scripts/bench/smollm2.py [--model DIR] [--gguf F32.gguf] [--threads 1] [--repeats 3]

The machinery is scripts/bench/suite.py's (one inputs file per case, each implementation in
its own process under /usr/bin/time -v, the order alternated round by round, medians and
paired ratios), on the imported Hugging Face directory instead of a random model:

- generate: greedy decoding with the KV cache, no stop ids, at batch 1, 8 and 64, by Cairn
  (`cairn-bench run`: `TorchBackend::generate`), transformers (`generate()`, do_sample False)
  and llama.cpp (scripts/bench/smollm2_llamacpp.py: llama-cpp-python's C API, all B sequences
  in one `llama_decode` per step) on the F32 GGUF of the same weights. The generated ids are
  compared.
- score: the log-probs of a batch of (chat prompt, response) rows: `TorchBackend::score`
  against one no-grad transformers forward (reference.py, kind score / torch).
- train: one GRPO update (score with grad + token-mean clipped surrogate + backward + clip +
  AdamW), micro-batched: `RlLoss` + `TorchBackend::train_step` against the same objective in
  plain PyTorch on transformers' LlamaForCausalLM (reference.py, kind train / torch).
- matmul: torch f32 matrix products at the model's shapes and large squares (the peak).

Every table reports, per round, the other engine's time over Cairn's (above 1: Cairn faster)
in wall and in CPU seconds, and their medians; peak RSS; the model FLOPs per CPU second and
the MFU against the measured matmul peak; and a check that both did the same work (the same
greedy ids, Σ log-probs, the first loss). CPU only. Outputs in --out (default
target/bench/smollm2): results.json (every sample) and results.md (the tables, also printed).
"""

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402
from suite import fmt, med, PY, ROOT  # noqa: E402

LLAMACPP = os.path.join(ROOT, "scripts", "bench", "smollm2_llamacpp.py")
DEFAULT_MODEL = os.path.join(ROOT, ".cache", "models", "smollm2-135m-instruct")
DEFAULT_GGUF = os.path.join(ROOT, "target", "bench", "smollm2", "SmolLM2-135M-Instruct.F32.gguf")

# 64 user questions (16 countries x 4 templates): ChatML prompts of 37-39 tokens with the
# template's default system message, as a chat-tuned policy's rollout would see them. The
# first is the project's greedy check (answer: "The capital of France is Paris.").
COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Egypt",
             "Mexico", "Italy", "Chile", "Vietnam", "Poland", "Ghana", "Spain", "Peru"]
TEMPLATES = ["What is the capital of {}?", "What language do people speak in {}?",
             "Name a famous dish from {}.", "Describe the climate of {} in two sentences."]
# Response text for scoring and training rows (cut to each row's response length).
ANSWER = ("The capital is a large city with a long history. Many people visit it every year to "
          "see its museums, its old streets and its markets, and to try the local food. The "
          "weather changes with the seasons, and the summers can be warm and dry while the "
          "winters are cool and wet. People there speak the national language, and many also "
          "speak English, which helps visitors who travel around the country by train or bus.")

# Sizes fit one full run (3 rounds, 3 engines) in about 15 minutes on 2 shared cores at 1
# thread: a SmolLM2 forward costs 0.27 GFLOP per token; one core does at most ~100 GFLOP/s.
# (name, batch, new tokens, warm-up calls, timed calls): the first `batch` prompts of the 64.
# B = 64 is timed on its first call (one call is 15-30 s; at B = 8, a first call was within
# the spread of the later ones on all three engines); so is scoring.
GENERATE = [
    ("B=1, prompt 37, 64 new", 1, 64, 1, 1),
    ("B=8, prompts 37-39, 32 new", 8, 32, 1, 1),
    ("B=64, prompts 37-39, 16 new", 64, 16, 0, 1),
]
# (name, rows, response length range, chunk rows)
SCORE = [("16 rows: prompt 37-39 + response 16-48, chunks of 8", 16, (16, 48), 8)]
# (name, rows, response length range, micro-batch rows)
TRAIN = [("8 rows: prompt 37-39 + response 16-48, micro-batches of 4", 8, (16, 48), 4)]
OBJECTIVE = suite.OBJECTIVE
OPTIMIZER = dict(suite.OPTIMIZER, lr=1e-6)
SQUARE = [[1024, 1024, 1024], [2048, 2048, 2048]]


def log(msg):
    print(f"[smollm2 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def model_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    heads = c["num_attention_heads"]
    return dict(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
                num_attention_heads=heads, num_key_value_heads=c.get("num_key_value_heads", heads),
                head_dim=c.get("head_dim") or c["hidden_size"] // heads)


# -------------------------------------------------------------------- FLOPs

def forward_flops(m, context, head_positions):
    """Model FLOPs of one forward over the query positions whose context lengths (keys seen,
    itself included) are `context`, with `head_positions` of them through the LM head: the
    matrix products only (q/k/v/o and MLP projections, causal attention scores and values over
    the real keys, LM head), 2 FLOPs per multiply-add; padding not counted."""
    h, i, layers = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"]
    heads, kv, d, v = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"], m["vocab_size"]
    proj = 2 * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i)
    attn = 2 * 2 * heads * d
    return layers * (len(context) * proj + attn * sum(context)) + 2 * h * v * head_positions


def generate_flops(m, prompts, new):
    """Prefill of every prompt (head at its last position) plus `new - 1` one-token forwards
    per row (the last sampled token is not fed back), each through the head."""
    ctx, head = [], 0
    for p in prompts:
        ctx += list(range(1, len(p) + 1))
        head += 1
        ctx += [len(p) + s + 1 for s in range(new - 1)]
        head += new - 1
    return forward_flops(m, ctx, head)


def score_flops(m, seqs):
    ctx, head = [], 0
    for s in seqs:
        ctx += list(range(1, len(s["prompt"]) + len(s["response"]) + 1))
        head += len(s["response"])
    return forward_flops(m, ctx, head)


def parameters(m):
    h, i, layers = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"]
    heads, kv, d, v = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"], m["vocab_size"]
    body = layers * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i + 2 * h) + h
    return body + v * h


# -------------------------------------------------------------------- the suite

class SmolSuite(suite.Suite):
    def __init__(self, args):
        super().__init__(args)
        self.hf = os.path.abspath(args.model)
        self.gguf = os.path.abspath(args.gguf)
        self.cfg = model_config(self.hf)
        suite.MODELS["smollm2"] = self.cfg
        self.results.update({"model": self.hf, "gguf": self.gguf, "config": self.cfg,
                             "parameters": parameters(self.cfg)})
        self._prompts = None

    def model_dir(self, name):
        return self.hf

    def write_case(self, kind, index, model, inputs, reps, warmup):
        case_dir, spec = super().write_case(kind, index, model, inputs, reps, warmup)
        spec["gguf"] = self.gguf
        return case_dir, spec

    def command(self, impl, spec_path):
        if impl == "llamacpp":
            return [PY, LLAMACPP, spec_path]
        return super().command(impl, spec_path)

    def prompts(self):
        """The 64 chat prompts, rendered by the model directory's chat template."""
        if self._prompts is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.hf)
            qs = [t.format(c) for c in COUNTRIES for t in TEMPLATES]
            self._prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                                     add_generation_prompt=True, return_dict=False)
                             for q in qs]
            self._prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in self._prompts]
            self._answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
        return self._prompts

    def rows(self, n, rlen, rng):
        prompts = self.prompts()
        seqs = []
        for k in range(n):
            r = rng.randint(*rlen)
            start = rng.randrange(0, len(self._answer) - r)
            seqs.append({"prompt": prompts[k % len(prompts)], "response": self._answer[start:start + r]})
        return seqs

    def generate(self):
        prompts = self.prompts()
        impls = ["cairn", "transformers"] + ([] if self.args.no_llamacpp else ["llamacpp"])
        for i, (name, b, new, warmup, reps) in enumerate(GENERATE):
            if not self.wanted("generate", i, (0,)):
                continue
            inputs = {"prompts": prompts[:b], "max_new_tokens": new, "temperature": 0.0, "top_p": 1.0,
                      "seed": 0}
            case = self.run_case("generate", i, name, "smollm2", impls, inputs, reps, warmup, "new_tokens")
            case["flops"] = generate_flops(self.cfg, prompts[:b], new)
            self.save()

    def score(self):
        rng = random.Random(21)
        for i, (name, rows, rlen, chunk) in enumerate(SCORE):
            seqs = self.rows(rows, rlen, rng)
            if not self.wanted("score", i, (0,)):
                continue
            inputs = {"sequences": seqs, "batch_size": chunk, "temperature": 1.0}
            # Timed on the first call, like B = 64 generation (one call is ~5-10 s).
            case = self.run_case("score", i, name, "smollm2", ["cairn", "torch"], inputs, 1, 0, "tokens")
            case["flops"] = score_flops(self.cfg, seqs)
            self.save()

    def train(self):
        rng = random.Random(22)
        for i, (name, rows, rlen, micro) in enumerate(TRAIN):
            seqs = self.rows(rows, rlen, rng)
            advantages = [[a] * len(s["response"]) for s, a in
                          zip(seqs, (rng.gauss(0.0, 1.0) for _ in seqs))]
            if not self.wanted("train", i, (0,)):
                continue
            old = self.old_logp(self.hf, seqs, 1.0)
            inputs = {"sequences": seqs, "advantages": advantages, "old_logp": old,
                      "micro_batch_rows": micro, "temperature": 1.0, "objective": OBJECTIVE,
                      "optimizer": OPTIMIZER}
            # One warm-up step (it allocates AdamW's moments), one timed step.
            case = self.run_case("train", i, name, "smollm2", ["cairn", "torch"], inputs, 1, 1, "tokens")
            # Forward + backward: 3 forwards' worth of matrix products (the suite's count is on
            # padded shapes; this one is the model FLOPs of the real tokens).
            case["flops"] = 3 * score_flops(self.cfg, seqs)
            self.save()

    def matmul(self):
        h, i, v = self.cfg["hidden_size"], self.cfg["intermediate_size"], self.cfg["vocab_size"]
        kv = self.cfg["num_key_value_heads"] * self.cfg["head_dim"]
        shapes = list(SQUARE)
        for m in (1, 8, 64, 512):
            shapes += [[m, h, i], [m, i, h], [m, h, h], [m, h, kv], [m, h, v]]
        spec_path = os.path.join(self.out, "cases", "matmul-spec.json")
        os.makedirs(os.path.dirname(spec_path), exist_ok=True)
        inputs_path = os.path.join(self.out, "cases", "matmul-inputs.json")
        with open(inputs_path, "w") as f:
            # Every product as a layer computes it: x @ W.T with W stored [out, in].
            json.dump({"shapes": shapes, "weight_layout": "nk"}, f)
        with open(spec_path, "w") as f:
            json.dump({"kind": "matmul", "impl": "torch", "threads": self.threads,
                       "device": self.args.device, "inputs": inputs_path}, f)
        runs = []
        for r in range(self.args.repeats):
            res = self.launch([PY, suite.REFERENCE, spec_path], "matmul")
            if res:
                runs.append(res["matmul"])
        self.results["matmul"] = {"runs": runs}
        log("matmul peak measured")

    def run(self):
        self.results["facts"] = self.facts()
        self.results["facts"]["llama_cpp_python"] = package_version("llama-cpp-python")
        self.results["facts"]["gguf_package"] = package_version("gguf")
        log(f"threads {self.threads}, repeats {self.args.repeats}, model {self.hf}, out {self.out}")
        parts = self.args.only.split(",") if self.args.only else ["matmul", "generate", "score", "train"]
        for part in parts:
            getattr(self, part)()
            self.save()
        self.results["facts"]["loadavg_end"] = suite.loadavg()
        self.results["facts"]["end"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.save()
        md = render(self.results)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(md)
        print(md)


def package_version(dist):
    """The installed version of the distribution `dist`, or why there is none."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# -------------------------------------------------------------------- analysis

def peak_gflops(results, key="gflops_median"):
    """(peak, {shape: GFLOP/s}) from the matmul runs: per shape the median over rounds of the
    median repetition, by wall time (`gflops_median`) or by CPU time (`gflops_cpu_median`)."""
    runs = results.get("matmul", {}).get("runs", [])
    by_shape = {}
    for run in runs:
        for entry in run:
            if key in entry:
                by_shape.setdefault(tuple(entry["shape"]), []).append(entry[key])
    shapes = {k: med(v) for k, v in by_shape.items()}
    # The peak is the best product measured, model shapes included: at one thread the large
    # squares run below the model's own [64-512 x 576] x [576 x 576-1536] products.
    return (max(shapes.values()) if shapes else None), shapes


def same_ids(a, b):
    """'identical', or where the greedy ids of `b` first part from `a`."""
    if a is None or b is None:
        return "n/a"
    differ = [(r, next(t for t, (x, y) in enumerate(zip(ra, rb)) if x != y))
              for r, (ra, rb) in enumerate(zip(a, b)) if ra != rb]
    if not differ:
        return f"identical ({len(a)} × {len(a[0]) if a else 0})"
    first = min(differ, key=lambda x: x[1])
    return (f"{len(a) - len(differ)}/{len(a)} rows identical; earliest divergence at token "
            f"{first[1] + 1} of row {first[0]}")


def round_ratios(case, impl, key="median_s"):
    return [r[impl][key] / r["cairn"][key] for r in case["rounds"]
            if impl in r and "cairn" in r and r[impl].get(key) and r["cairn"].get(key)]


def shown(path):
    """`path` relative to the repository when it is inside it."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


def render(results):
    f = results["facts"]
    peak, shapes = peak_gflops(results)
    cpu_peak, cpu_shapes = peak_gflops(results, "gflops_cpu_median")
    out = [f"Run {f['date']} to {f.get('end', '?')}, git {f['git']}: {f['cpu']}, {f['cores']} cores, "
           f"**{f['threads']} thread(s) on every side**, OMP_WAIT_POLICY={f['omp_wait_policy']}; "
           f"torch {f['torch']}, transformers {f.get('transformers')}, llama-cpp-python "
           f"{f.get('llama_cpp_python')}, {f['rustc']}; {f['repeats']} rounds, engines alternated; "
           f"load average {f['loadavg_start']:.2f} at start, {f.get('loadavg_end', float('nan')):.2f} at end. "
           f"Model: {shown(results.get('model', ''))} ({results.get('parameters', 0) / 1e6:.1f} M parameters), "
           f"llama.cpp on {os.path.basename(results.get('gguf', ''))}.\n",
           "Ratios are the engine's time over Cairn's, per round then their median: **above 1, Cairn "
           "is faster**. *CPU* columns use the process CPU time of the timed calls (at one thread: "
           "the time the engine ran on a core), which the machine's other tenants disturb much "
           "less than wall time. MFU = model FLOPs / CPU time / the matmul peak by CPU time.\n"]
    labels = {"generate": ("Generation (greedy, KV cache)", "new tok/s"),
              "score": ("Scoring (log-probs of a batch)", "tok/s"),
              "train": ("GRPO training step", "tok/s")}
    for kind in ("generate", "score", "train"):
        cases = [c for c in results["cases"] if c["kind"] == kind]
        if not cases:
            continue
        title, unit = labels[kind]
        out.append(f"### {title}\n")
        out.append(f"| case | engine | wall s | {unit} | CPU s | wall ratio per round | **median** | "
                   f"CPU ratio per round | **median** | peak RSS MiB | GFLOP/CPU-s | MFU | same work |")
        out.append("|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|")
        for case in cases:
            st = suite.case_stats(case)
            gf = case.get("flops", 0) / 1e9
            cairn_check = st.get("cairn", {}).get("check", {})
            for impl in case["impls"]:
                s = st.get(impl)
                if not s:
                    out.append(f"| {case['name']} | {impl} | failed | | | | | | | | | | |")
                    continue
                cpu_s = s.get("median_cpu_s")
                rate = gf / cpu_s if cpu_s else None
                mfu = f"{rate / cpu_peak * 100:.1f}%" if rate and cpu_peak else "n/a"
                if impl == "cairn":
                    cells = "— | 1 | — | 1"
                    work = ""
                else:
                    wall = round_ratios(case, impl)
                    cpu = round_ratios(case, impl, "median_cpu_s")
                    cells = (", ".join(f"{x:.2f}" for x in wall) + f" | **{med(wall):.2f}×** | " +
                             ", ".join(f"{x:.2f}" for x in cpu) + f" | **{med(cpu):.2f}×**") if wall and cpu \
                        else "n/a | n/a | n/a | n/a"
                    o = s.get("check", {})
                    work = same_ids(cairn_check.get("ids"), o.get("ids")) if kind == "generate" \
                        else suite.agreement(st, impl)
                out.append(f"| {case['name']} | {impl} | {fmt(s['median_s'])} | {fmt(s['per_s'])} | {fmt(cpu_s)} | "
                           f"{cells} | {fmt(s['peak_rss_mib'])} | {fmt(rate)} | {mfu} | {work} |")
        out.append("")
    if shapes:
        out.append("### Matmul peak (torch f32, `x @ W.T` with W stored [n, k], same thread count)\n")
        out.append("| m × k × n | GFLOP/s (wall) | GFLOP/CPU-s |")
        out.append("|---|---:|---:|")
        for k, v in shapes.items():
            out.append(f"| {k[0]} × {k[1]} × {k[2]} | {fmt(v)} | {fmt(cpu_shapes.get(k))} |")
        best = max(cpu_shapes, key=cpu_shapes.get) if cpu_shapes else max(shapes, key=shapes.get)
        out.append(f"\nPeak: **{fmt(cpu_peak)} GFLOP/CPU-s** ({fmt(peak)} GFLOP/s wall); best product "
                   f"{best[0]} × {best[1]} × {best[2]}, median of repetitions, median over rounds. Model "
                   f"FLOPs count the matrix products of the real tokens (projections, causal attention, "
                   f"the LM head where logits are needed), × 3 for the training step.\n")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face directory of SmolLM2 (cairn import gguf)")
    p.add_argument("--gguf", default=DEFAULT_GGUF, help="F32 GGUF of the same weights (smollm2_gguf.py)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, help="rounds per case (default 3; 1 with --quick)")
    p.add_argument("--out", default=os.path.join(ROOT, "target", "bench", "smollm2"))
    p.add_argument("--only", help="comma-separated parts: matmul,generate,score,train")
    p.add_argument("--quick", action="store_true", help="the first case of each kind, one round")
    p.add_argument("--cases", help="case indexes per kind, e.g. 'generate=0,2;train=0'")
    p.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out of the generation tables")
    p.add_argument("--render", action="store_true", help="only re-render results.md from results.json")
    args = p.parse_args()
    args.no_trl = True
    args.device = "cpu"
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.render:
        with open(os.path.join(args.out, "results.json")) as fh:
            results = json.load(fh)
        md = render(results)
        with open(os.path.join(args.out, "results.md"), "w") as fh:
            fh.write(md)
        print(md)
        return
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"smollm2: {args.model} has no config.json; import the model first (scripts/smollm2.sh)")
    if not args.no_llamacpp and not os.path.isfile(args.gguf):
        sys.exit(f"smollm2: {args.gguf} does not exist; write it with scripts/bench/smollm2_gguf.py "
                 f"(scripts/bench/smollm2.sh does), or pass --no-llamacpp")
    SmolSuite(args).run()


if __name__ == "__main__":
    main()
