"""Cairn's benchmark suite: Cairn and its Python references on identical work, side by side,
in one run. Started by scripts/bench/run.sh (which builds and installs first); see
BENCHMARKS.md for what is measured and how to read the tables.

For every case the suite writes one inputs file (prompts or sequences, old log-probs,
advantages, settings) next to a Hugging Face model directory that both sides load, then runs
each implementation in its own process under `/usr/bin/time -v`, alternating the order
round by round. Each process warms up, times its repetitions and prints one JSON line
(`cairn-bench run SPEC` or `reference.py SPEC`). The suite reports per case the median over
rounds of each side's median time, the median of the per-round ratios (reference time /
Cairn time: above 1 means Cairn is faster), peak RSS, and a check that both computed the
same numbers.

Outputs (in --out, default target/bench): results.json (everything, raw samples included)
and results.md (the tables BENCHMARKS.md quotes).
"""

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
# CAIRN_BENCH_BIN: a cairn-bench built elsewhere (a machine without the Rust toolchain).
CAIRN_BENCH = os.environ.get("CAIRN_BENCH_BIN", os.path.join(ROOT, "target", "release", "cairn-bench"))
GNU_TIME = "/usr/bin/time"
REFERENCE = os.path.join(ROOT, "scripts", "bench", "reference.py")

# The main job's model (examples/household-grpo.toml, [model.scratch]) with a 512-word vocab,
# and a larger one where matrix work starts to dominate.
MODELS = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "small": dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32),
}

# The default config's RL batch: 8 tasks x 8 episodes, ~12 turns each, prompts ~50 tokens,
# responses ~6 tokens; micro-batches of 128 rows; old/ref scoring in chunks of 64.
HOUSEHOLD = dict(rows=768, prompt=(35, 65), response=(3, 9))

# (name, model, batch, prompt length (fixed or (lo, hi) ragged), new tokens)
GENERATE = [
    ("turn: 64 episodes, ~50-token prompts, 8 new", "tiny", 64, (35, 65), 8),
    ("B=8, prompt 64, 32 new", "tiny", 8, 64, 32),
    ("B=32, prompt 64, 32 new", "tiny", 32, 64, 32),
    ("B=64, prompt 128, 64 new", "tiny", 64, 128, 64),
    ("small model, B=32, prompt 64, 32 new", "small", 32, 64, 32),
]
# (name, model, rows, prompt, response, chunk rows)
SCORE = [
    ("household batch: 768 rows, chunks of 64", "tiny", 768, HOUSEHOLD["prompt"], HOUSEHOLD["response"], 64),
    ("32 x (64 + 32)", "tiny", 32, 64, 32, 32),
    ("small model, 32 x (64 + 32)", "small", 32, 64, 32, 32),
]
# (name, model, rows, prompt, response, micro-batch rows)
TRAIN = [
    ("household step: 768 rows, micro-batches of 128", "tiny", 768, HOUSEHOLD["prompt"], HOUSEHOLD["response"], 128),
    ("32 x (64 + 32), one micro-batch", "tiny", 32, 64, 32, 32),
    ("small model, 32 x (64 + 32)", "small", 32, 64, 32, 32),
]
# The default objective ([objective] of the main job plus ObjectiveConfig's defaults) and the
# optimizer of a default RL step.
OBJECTIVE = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0, "log_ratio_clamp": 20.0,
             "aggregation": "token-mean", "kl_coef": 0.0}
OPTIMIZER = {"lr": 2e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
MATMUL_SQUARE = [[512, 512, 512], [1024, 1024, 1024], [2048, 2048, 2048]]


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:
        return ""


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def lengths(spec, n, rng):
    if isinstance(spec, int):
        return [spec] * n
    lo, hi = spec
    return [rng.randint(lo, hi) for _ in range(n)]


def ids(n, vocab, rng):
    # Ids 3.. so that no special id of any tokenizer is drawn.
    return [rng.randrange(3, vocab) for _ in range(n)]


class Suite:
    def __init__(self, args):
        self.args = args
        self.selected = {}
        for part in (args.cases or "").split(";"):
            if "=" in part:
                kind, idx = part.split("=", 1)
                self.selected[kind.strip()] = {int(i) for i in idx.split(",") if i.strip()}
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.threads = args.threads
        self.results = {"cases": [], "pipeline": {}, "matmul": {}}
        self.env = dict(os.environ)
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            self.env[key] = str(self.threads)
        self.env.update({"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                         "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                         "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
                         "TQDM_DISABLE": "1", "RUST_LOG": "warn"})
        self.env.setdefault("CAIRN_PLUGIN_DIR", os.path.join(ROOT, "target", "release"))
        # libgomp's default spin-waiting turns every parallel region into a fight for the
        # cores as soon as anything else runs (5-50x slower at 2 threads on a busy 2-core
        # machine, see BENCHMARKS.md); sleeping waiters keep both sides' numbers stable.
        self.env.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    # ---------------------------------------------------------------- set-up

    def model_dir(self, name):
        path = os.path.join(self.out, "models", name)
        if os.path.isfile(os.path.join(path, "model.safetensors")):
            return path
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(**MODELS[name], tie_word_embeddings=True, max_position_embeddings=1024)
        torch.manual_seed(1234)
        Qwen3ForCausalLM(cfg).save_pretrained(path)
        return path

    def old_logp(self, model_dir, seqs, temperature):
        """The current policy's log-probs of the responses: the importance ratios of the
        benchmarked step start at 1, as in a real on-policy step."""
        import torch

        sys.path.insert(0, os.path.dirname(REFERENCE))
        import reference

        torch.set_num_threads(self.threads)
        model = reference.load_model({"model": model_dir}, torch).eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(seqs), 64):
                chunk = seqs[i:i + 64]
                logp, _ = reference.response_logp(model, chunk, temperature, torch, "cpu")
                out.extend(reference.unpad(logp, chunk))
        return out

    def write_case(self, kind, index, model, inputs, reps, warmup):
        case_dir = os.path.join(self.out, "cases", f"{kind}-{index}")
        os.makedirs(case_dir, exist_ok=True)
        inputs_path = os.path.join(case_dir, "inputs.json")
        with open(inputs_path, "w") as f:
            json.dump(inputs, f)
        spec = {"kind": kind, "model": self.model_dir(model), "inputs": inputs_path,
                "threads": self.threads, "warmup": warmup, "reps": reps, "device": self.args.device}
        return case_dir, spec

    # ---------------------------------------------------------------- running

    def launch(self, cmd, label):
        """Runs `cmd` under /usr/bin/time -v; returns its JSON result with peak RSS added."""
        load_before = loadavg()
        wrapper = [GNU_TIME, "-v"] if os.access(GNU_TIME, os.X_OK) else []
        proc = subprocess.run(wrapper + cmd, capture_output=True, text=True, env=self.env, cwd=ROOT)
        if proc.returncode != 0:
            log(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            return None
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if not lines:
            log(f"{label} printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            return None
        result = json.loads(lines[-1])
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        # Without GNU time, the process's own high-water mark (the same number).
        result["peak_rss_kb"] = int(m.group(1)) if m else result.get("hwm_kb")
        m = re.search(r"Elapsed \(wall clock\) time.*: (.+)", proc.stderr)
        result["process_wall"] = m.group(1).strip() if m else None
        result["loadavg_before"] = load_before
        return result

    def command(self, impl, spec_path):
        if impl == "cairn":
            return [CAIRN_BENCH, "run", spec_path]
        return [PY, REFERENCE, spec_path]

    def run_case(self, kind, index, name, model, impls, inputs, reps, warmup, work_key):
        case_dir, spec = self.write_case(kind, index, model, inputs, reps, warmup)
        rounds = []
        for r in range(self.args.repeats):
            order = impls if r % 2 == 0 else list(reversed(impls))
            got = {}
            for impl in order:
                path = os.path.join(case_dir, f"spec-{impl}.json")
                with open(path, "w") as f:
                    json.dump(dict(spec, impl=impl), f)
                res = self.launch(self.command(impl, path), f"{kind} {name} [{impl}]")
                if res is not None:
                    got[impl] = res
                    log(f"{kind} {name} [{impl}] round {r + 1}: median {res['median_s']:.4f} s, "
                        f"peak RSS {res['peak_rss_kb'] / 1024:.0f} MiB")
            rounds.append(got)
        case = {"kind": kind, "name": name, "model": model, "impls": impls, "rounds": rounds,
                "work_key": work_key, "inputs_summary": summarise_inputs(kind, inputs)}
        if kind == "train":
            case["flops"] = train_flops(MODELS[model], inputs)
        self.results["cases"].append(case)
        return case

    # ---------------------------------------------------------------- benchmarks

    def wanted(self, kind, index, quick):
        if kind in self.selected:
            return index in self.selected[kind]
        return not self.args.quick or index in quick

    def generate(self):
        rng = random.Random(11)
        for i, (name, model, b, plen, new) in enumerate(GENERATE):
            vocab = MODELS[model]["vocab_size"]
            prompts = [ids(n, vocab, rng) for n in lengths(plen, b, rng)]
            if not self.wanted("generate", i, (0, 2)):
                continue
            inputs = {"prompts": prompts, "max_new_tokens": new, "temperature": 1.0, "top_p": 1.0,
                      "seed": 5}
            reps = 5 if new * b <= 2048 else 3
            self.run_case("generate", i, name, model, ["cairn", "transformers"], inputs, reps, 1,
                          "new_tokens")

    def score(self):
        rng = random.Random(12)
        for i, (name, model, rows, plen, rlen, chunk) in enumerate(SCORE):
            vocab = MODELS[model]["vocab_size"]
            seqs = [{"prompt": ids(p, vocab, rng), "response": ids(r, vocab, rng)}
                    for p, r in zip(lengths(plen, rows, rng), lengths(rlen, rows, rng))]
            if not self.wanted("score", i, (0,)):
                continue
            inputs = {"sequences": seqs, "batch_size": chunk, "temperature": 1.0}
            self.run_case("score", i, name, model, ["cairn", "torch"], inputs, 5, 1, "tokens")

    def train(self):
        rng = random.Random(13)
        impls = ["cairn", "torch"] + ([] if self.args.no_trl else ["trl"])
        for i, (name, model, rows, plen, rlen, micro) in enumerate(TRAIN):
            vocab = MODELS[model]["vocab_size"]
            seqs = [{"prompt": ids(p, vocab, rng), "response": ids(r, vocab, rng)}
                    for p, r in zip(lengths(plen, rows, rng), lengths(rlen, rows, rng))]
            # GRPO: one advantage per sequence (group-normalised returns), on every token.
            advantages = [[a] * len(s["response"]) for s, a in
                          zip(seqs, (rng.gauss(0.0, 1.0) for _ in seqs))]
            if not self.wanted("train", i, (0,)):
                continue
            old = self.old_logp(self.model_dir(model), seqs, 1.0)
            inputs = {"sequences": seqs, "advantages": advantages, "old_logp": old,
                      "micro_batch_rows": micro, "temperature": 1.0, "objective": OBJECTIVE,
                      "optimizer": OPTIMIZER}
            self.run_case("train", i, name, model, impls, inputs, 3, 1, "tokens")

    def matmul(self):
        shapes = MATMUL_SQUARE + model_shapes()
        spec_path = os.path.join(self.out, "cases", "matmul-spec.json")
        os.makedirs(os.path.dirname(spec_path), exist_ok=True)
        inputs_path = os.path.join(self.out, "cases", "matmul-inputs.json")
        with open(inputs_path, "w") as f:
            json.dump({"shapes": shapes}, f)
        with open(spec_path, "w") as f:
            json.dump({"kind": "matmul", "impl": "torch", "threads": self.threads,
                       "device": self.args.device, "inputs": inputs_path}, f)
        runs = []
        for r in range(self.args.repeats):
            res = self.launch([PY, REFERENCE, spec_path], "matmul")
            if res:
                runs.append(res["matmul"])
        self.results["matmul"] = {"runs": runs}
        log("matmul peak measured")

    def pipeline(self):
        out = {}
        for backend, steps, repeats in (("null", 5, self.args.repeats), ("torch", 4, 1)):
            runs = []
            for r in range(repeats):
                run_dir = os.path.join(self.out, "pipeline", f"{backend}-{r}")
                cmd = [CAIRN_BENCH, "pipeline", "--backend", backend, "--steps", str(steps),
                       "--threads", str(self.threads), "--run-dir", run_dir, "--device", self.args.device,
                       "--config", os.environ.get("CAIRN_BENCH_CONFIG",
                                                  os.path.join(ROOT, "examples", "household-grpo.toml"))]
                res = self.launch(cmd, f"pipeline {backend}")
                if res:
                    runs.append(res)
                    med = res["median"]
                    log(f"pipeline {backend} run {r + 1}: step {med['wall_s']:.3f} s, "
                        f"backend {med['backend_s']:.3f} s, rows {med['rows']:.0f}")
            out[backend] = runs
        self.results["pipeline"] = out

    # ---------------------------------------------------------------- facts

    def facts(self):
        import torch

        versions = {}
        for mod in ("transformers", "trl", "accelerate"):
            try:
                versions[mod] = __import__(mod).__version__
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                versions[mod] = f"unavailable ({type(e).__name__})"
        return {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cpu": sh("lscpu | sed -n 's/^Model name:[ ]*//p'"),
            "cores": os.cpu_count(),
            "threads": self.threads,
            "omp_wait_policy": self.env["OMP_WAIT_POLICY"],
            "device": self.args.device,
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "torch": torch.__version__,
            "torch_parallel": torch.__config__.parallel_info().splitlines()[:6],
            "python": platform.python_version(),
            "rustc": sh("rustc --version"),
            "git": sh(f"git -C {ROOT} rev-parse --short HEAD") + (" (dirty)" if sh(f"git -C {ROOT} status --porcelain") else ""),
            "repeats": self.args.repeats,
            "loadavg_start": loadavg(),
            **versions,
        }

    def save(self):
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.results, f, indent=1)

    def run(self):
        self.results["facts"] = self.facts()
        log(f"threads {self.threads}, repeats {self.args.repeats}, out {self.out}")
        wanted = self.args.only.split(",") if self.args.only else \
            ["matmul", "generate", "score", "train", "pipeline"]
        for part in wanted:
            getattr(self, part)()
            self.save()  # a run stopped later keeps what it measured
        self.results["facts"]["loadavg_end"] = loadavg()
        self.save()
        md = render(self.results)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(md)
        print(md)


# -------------------------------------------------------------------- analysis

def summarise_inputs(kind, inputs):
    if kind == "generate":
        p = [len(x) for x in inputs["prompts"]]
        return {"batch": len(p), "prompt_min": min(p), "prompt_max": max(p),
                "new": inputs["max_new_tokens"]}
    seqs = inputs["sequences"]
    return {"rows": len(seqs),
            "prompt_mean": statistics.mean(len(s["prompt"]) for s in seqs),
            "response_mean": statistics.mean(len(s["response"]) for s in seqs)}


def train_flops(model, inputs):
    """Matrix-multiply FLOPs of one training step as computed (padded shapes): forward of every
    micro-batch (projections, attention scores and values, LM head on the R response columns)
    times 3 for forward + backward."""
    h, i, layers = model["hidden_size"], model["intermediate_size"], model["num_hidden_layers"]
    heads, kv, d, v = model["num_attention_heads"], model["num_key_value_heads"], model["head_dim"], model["vocab_size"]
    seqs, micro = inputs["sequences"], inputs["micro_batch_rows"]
    per_token = 2 * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i)
    fwd = 0
    for s in range(0, len(seqs), micro):
        chunk = seqs[s:s + micro]
        b = len(chunk)
        w = max(len(x["prompt"]) + len(x["response"]) for x in chunk)
        r = max(len(x["response"]) for x in chunk)
        fwd += layers * (b * w * per_token + 2 * 2 * b * heads * w * w * d) + 2 * b * r * h * v
    return 3 * fwd


def model_shapes():
    """Matrix products at the main job model's training shapes ([rows x width, in] x [in, out])."""
    m = MODELS["tiny"]
    rows = 128 * 65
    return [[rows, m["hidden_size"], m["intermediate_size"]],
            [rows, m["intermediate_size"], m["hidden_size"]],
            [rows, m["hidden_size"], m["hidden_size"]]]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=3):
    if x is None:
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def case_stats(case):
    """Per implementation: median time, throughput, peak RSS; per reference: paired ratio."""
    stats = {}
    for impl in case["impls"]:
        res = [r[impl] for r in case["rounds"] if impl in r]
        if not res:
            continue
        work = res[0]["work"].get(case["work_key"], 0)
        t = med([x["median_s"] for x in res])
        stats[impl] = {
            "median_s": t,
            "median_cpu_s": med([x.get("median_cpu_s") for x in res]),
            "per_s": work / t if t else None,
            "peak_rss_mib": med([x["peak_rss_kb"] / 1024 for x in res if x.get("peak_rss_kb")]),
            "setup_rss_mib": med([x["rss_setup_kb"] / 1024 for x in res]),
            "check": res[0].get("check", {}),
            "samples": [x["median_s"] for x in res],
        }
    for impl in case["impls"][1:]:
        ratios = [r[impl]["median_s"] / r["cairn"]["median_s"] for r in case["rounds"]
                  if impl in r and "cairn" in r]
        if impl in stats and ratios:
            stats[impl]["ratio"] = med(ratios)
            stats[impl]["ratio_range"] = (min(ratios), max(ratios))
            cpu = [r[impl]["median_cpu_s"] / r["cairn"]["median_cpu_s"] for r in case["rounds"]
                   if impl in r and "cairn" in r and r[impl].get("median_cpu_s") and r["cairn"].get("median_cpu_s")]
            stats[impl]["cpu_ratio"] = med(cpu)
            mem = [r[impl]["peak_rss_kb"] / r["cairn"]["peak_rss_kb"] for r in case["rounds"]
                   if impl in r and "cairn" in r and r[impl].get("peak_rss_kb") and r["cairn"].get("peak_rss_kb")]
            stats[impl]["rss_ratio"] = med(mem)
    return stats


def agreement(stats, impl):
    """A short note that Cairn and `impl` computed the same numbers (first step's loss, or the
    sum of every scored log-prob); sampling draws differ, so generation has none."""
    c = stats.get("cairn", {}).get("check", {})
    o = stats.get(impl, {}).get("check", {})
    if c.get("first_loss") is not None and o.get("first_loss") is not None:
        return f"loss {c['first_loss']:.6f} vs {o['first_loss']:.6f}"
    if "logp_sum" in c and "logp_sum" in o:
        return f"Σlogp {c['logp_sum']:.3f} vs {o['logp_sum']:.3f}"
    return ""


def matmul_peak(results):
    runs = results.get("matmul", {}).get("runs", [])
    if not runs:
        return None, {}
    by_shape = {}
    for run in runs:
        for entry in run:
            by_shape.setdefault(tuple(entry["shape"]), []).append(entry["gflops_median"])
    shapes = {k: med(v) for k, v in by_shape.items()}
    peak = max(v for k, v in shapes.items() if list(k) in MATMUL_SQUARE)
    return peak, shapes


def render(results):
    f = results["facts"]
    out = []
    out.append(f"Run {f['date']}, git {f['git']}: {f['cpu']}, {f['cores']} cores, {f['threads']} threads "
               f"on both sides, device {f['device']}; torch {f['torch']}, transformers {f.get('transformers')}, "
               f"trl {f.get('trl')}, {f['rustc']}; {f['repeats']} rounds; load average "
               f"{f['loadavg_start']:.2f} at start, {f.get('loadavg_end', float('nan')):.2f} at end.\n")
    labels = {"generate": ("Rollout generation", "new tokens/s"),
              "score": ("Scoring", "tokens/s"),
              "train": ("Training step (GRPO update)", "tokens/s")}
    for kind in ("generate", "score", "train"):
        cases = [c for c in results["cases"] if c["kind"] == kind]
        if not cases:
            continue
        title, unit = labels[kind]
        out.append(f"### {title}\n")
        out.append(f"| case | Cairn s | Cairn {unit} | reference | ref s | ref {unit} | ratio (ref/Cairn) | range | CPU-time ratio | peak RSS Cairn / ref MiB | same work |")
        out.append("|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|")
        for case in cases:
            st = case_stats(case)
            c = st.get("cairn")
            for impl in case["impls"][1:]:
                o = st.get(impl)
                if not c or not o:
                    out.append(f"| {case['name']} | | | {impl} | failed | | | | | | |")
                    continue
                lo, hi = o.get("ratio_range", (None, None))
                out.append(
                    f"| {case['name']} | {fmt(c['median_s'])} | {fmt(c['per_s'])} | {impl} | {fmt(o['median_s'])} | "
                    f"{fmt(o['per_s'])} | **{fmt(o.get('ratio'))}×** | {fmt(lo)}–{fmt(hi)} | {fmt(o.get('cpu_ratio'))}× | "
                    f"{fmt(c['peak_rss_mib'])} / {fmt(o['peak_rss_mib'])} | {agreement(st, impl)} |")
        out.append("")
    peak, shapes = matmul_peak(results)
    if peak:
        out.append("### Roofline\n")
        out.append("| matmul (m × k × n, f32) | GFLOP/s |")
        out.append("|---|---:|")
        for k, v in shapes.items():
            out.append(f"| {k[0]} × {k[1]} × {k[2]} | {fmt(v)} |")
        out.append(f"\nMeasured peak: **{fmt(peak)} GFLOP/s** (best square product, median of repetitions).\n")
        out.append("| training case | GFLOP per step | Cairn GFLOP/s | % of peak | reference GFLOP/s | % of peak |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for case in [c for c in results["cases"] if c["kind"] == "train"]:
            st = case_stats(case)
            gf = case["flops"] / 1e9
            c = st.get("cairn", {}).get("median_s")
            o = st.get("torch", {}).get("median_s")
            cr = gf / c if c else None
            orr = gf / o if o else None
            out.append(f"| {case['name']} | {fmt(gf)} | {fmt(cr)} | {fmt(cr / peak * 100 if cr else None)}% | "
                       f"{fmt(orr)} | {fmt(orr / peak * 100 if orr else None)}% |")
        out.append("")
    pipe = results.get("pipeline") or {}
    if pipe:
        out.append("### Kernel overhead (actor pipeline, default config)\n")
        out.append("| backend | run | step s | backend s | kernel overhead s | overhead share | algorithm plugin s | environment plugin s | rows | rows/s |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for backend in ("torch", "null"):
            for i, run in enumerate(pipe.get(backend, [])):
                m = run["median"]
                share = m["overhead_s"] / m["wall_s"] if m["wall_s"] else None
                out.append(f"| {backend} | {i + 1} | {fmt(m['wall_s'])} | {fmt(m['backend_s'])} | {fmt(m['overhead_s'])} | "
                           f"{fmt(share * 100 if share is not None else None)}% | {fmt(m['algorithm_plugin_s'])} | "
                           f"{fmt(m['environment_plugin_s'])} | {fmt(m['rows'])} | {fmt(m['rows'] / m['wall_s'])} |")
        real = pipe.get("torch") or []
        null = pipe.get("null") or []
        if real and null:
            r = real[0]["median"]
            per_row = med([n["median"]["wall_s"] / n["median"]["rows"] for n in null])
            projected = per_row * r["rows"]
            plugin = (r["algorithm_plugin_s"] + r["environment_plugin_s"]) / r["wall_s"]
            out.append(f"\nReal step: {fmt(r['wall_s'])} s for {fmt(r['rows'])} rows. Null-backend pipeline: "
                       f"{fmt(per_row * 1e6)} µs per turn row, so {fmt(projected * 1e3)} ms for the real step's rows = "
                       f"**{fmt(projected / r['wall_s'] * 100)}%** of the real step. Measured in place (real step minus time "
                       f"inside the backend): **{fmt(r['overhead_s'] / r['wall_s'] * 100)}%**. Plugin calls "
                       f"(algorithm + environment) in the real step: **{fmt(plugin * 100)}%**.\n")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=int(os.environ.get("CAIRN_BENCH_THREADS", os.cpu_count())))
    p.add_argument("--repeats", type=int, help="rounds per case, processes per side (default 3; 1 with --quick)")
    p.add_argument("--out", default=os.path.join(ROOT, "target", "bench"))
    p.add_argument("--only", help="comma-separated parts: matmul,generate,score,train,pipeline")
    p.add_argument("--quick", action="store_true", help="one case per kind (a smoke run)")
    p.add_argument("--cases", help="case indexes per kind, e.g. 'generate=0,2;train=0' (others run all)")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL reference")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--render", action="store_true", help="only re-render results.md from results.json")
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.render:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)
        md = render(results)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(md)
        print(md)
        return
    Suite(args).run()


if __name__ == "__main__":
    main()
