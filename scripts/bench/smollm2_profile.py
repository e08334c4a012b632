"""Where the time goes, per engine, on one case of the SmolLM2 benchmark: a `perf` sampling
profile (software clock `cpu-clock`, so it works in VMs without hardware counters) of the
timed calls alone.

    python scripts/bench/smollm2_profile.py CASE_DIR [--reps 3] [--top 15] [--impls cairn,llamacpp]

CASE_DIR is a case directory a run of scripts/bench/smollm2.sh left behind (e.g.
target/bench/smollm2/cases/generate-0, with its spec-IMPL.json files). For every engine the
script records two processes under `perf record -e cpu-clock`: the case with `--reps` timed
calls after its warm-up, and the same with none (load and warm-up only). The difference of
their sample counts, symbol by symbol, is the cost of the timed calls: model loading, imports
and page faults of the set-up cancel out. Prints, per engine, the share of those samples by
shared object and the top symbols (C++ names cut at their first template or argument list).
Needs `perf` (Debian: linux-perf) and a kernel that lets this user sample
(`perf_event_paranoid` <= 2 for own processes). Not part of any test.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402

FREQ = 499
LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*)$")


def short(sym):
    """A readable name: an elementwise TensorIterator loop by its kernel's name, a C++ function
    cut at its first template or argument list."""
    sym = sym.replace("(anonymous namespace)::", "")
    if "callback_fn<" in sym or "VectorizedLoop" in sym:
        kernel = re.search(r"::(\w+)\(at::Tensor", sym) or re.search(r"::(\w+_kernel)", sym)
        return f"elementwise loop: {kernel.group(1) if kernel else '?'}"
    for sep in ("<", "("):
        cut = sym.find(sep)
        if cut > 0:
            sym = sym[:cut]
    return sym.strip()[:80]


def record(cmd, env, out):
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQ), "-o", out, "--"] + cmd,
                   env=env, cwd=suite.ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = subprocess.run(["perf", "report", "-i", out, "--stdio", "--no-children", "-n",
                          "--sort", "dso,sym", "--percent-limit", "0"],
                         capture_output=True, text=True, check=True).stdout
    counts = collections.Counter()
    for line in rep.splitlines():
        m = LINE.match(line)
        if m:
            counts[(m.group(3), short(m.group(5)))] += int(m.group(2))
    return counts


def profile(spec, impl, reps, env, tmp):
    spec = dict(spec, warmup=max(1, spec.get("warmup", 1)))
    runs = {}
    for label, n in (("timed", reps), ("setup", 0)):
        path = os.path.join(tmp, f"{impl}-{label}.json")
        with open(path, "w") as f:
            json.dump(dict(spec, reps=n), f)
        cmd = (["python", os.path.join(suite.ROOT, "scripts", "bench", "smollm2_llamacpp.py"), path]
               if impl == "llamacpp" else
               [suite.CAIRN_BENCH, "run", path] if impl == "cairn" else
               ["python", suite.REFERENCE, path])
        runs[label] = record(cmd, env, os.path.join(tmp, f"{impl}-{label}.data"))
    diff = collections.Counter()
    for key in set(runs["timed"]) | set(runs["setup"]):
        d = runs["timed"][key] - runs["setup"][key]
        if d > 0:
            diff[key] = d
    return diff


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case_dir")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--impls", help="comma-separated engines (default: every spec-*.json in CASE_DIR)")
    p.add_argument("--threads", type=int, help="override the spec's thread count")
    args = p.parse_args()
    impls = args.impls.split(",") if args.impls else sorted(
        f[5:-5] for f in os.listdir(args.case_dir) if f.startswith("spec-") and f.endswith(".json"))
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               PYTHONWARNINGS="ignore", TQDM_DISABLE="1", RUST_LOG="warn")
    with tempfile.TemporaryDirectory() as tmp:
        for impl in impls:
            with open(os.path.join(args.case_dir, f"spec-{impl}.json")) as f:
                spec = json.load(f)
            if args.threads:
                spec["threads"] = args.threads
            env.update(OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]))
            diff = profile(spec, impl, args.reps, env, tmp)
            total = sum(diff.values())
            print(f"\n## {impl}: {total} samples at {FREQ} Hz in {args.reps} timed calls "
                  f"({total / FREQ / args.reps:.2f} CPU s per call)")
            by_dso = collections.Counter()
            for (dso, _), n in diff.items():
                by_dso[dso] += n
            print("by shared object: " + ", ".join(f"{d} {n / total * 100:.1f}%" for d, n in by_dso.most_common(6)))
            for (dso, sym), n in diff.most_common(args.top):
                print(f"  {n / total * 100:5.1f}%  {dso:22} {sym}")


if __name__ == "__main__":
    main()
