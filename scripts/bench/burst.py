"""Gateway throughput under a burst: `cairn serve` builds side by side, in alternating rounds.

Each build serves the same model on its own loopback port. A round sends, to one build after
the other, the same load of `/v1/completions` requests with token-id prompts, each asking
`--new` tokens with `ignore_eos` (so every request costs the same), temperature 1 and a seed
of its own:

- `burst`: N requests at once (N = each of `--batch`);
- `stagger`: N requests, one every `--gap-ms` (requests that arrive while a batch runs).

It reports, per build and load, the median over rounds of generated tokens per second (all
requests' tokens over the wall time from the first send to the last answer) and how many
generation passes the gateway ran (`GET /health`, `batches`, where the build reports it).
Ratios are taken within a round. Standard library only.

    python scripts/bench/burst.py --model DIR --build old=/tmp/cairn-old --build new=target/release/cairn
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def start(binary, model, dtype, workdir, label):
    cfg = Path(workdir) / f"serve-{label}.toml"
    cfg.write_text(
        f"""[run]
dir = "{workdir}/run-{label}"
seed = 1

[source]
kind = "gateway"
bind = "127.0.0.1:0"
model_name = "bench"

[algorithm]
plugin = "grpo"

[model]
path = "{model}"
device = "cpu"
dtype = "{dtype}"
"""
    )
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


def post(url, body):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def health(url):
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.load(r)


def load(url, prompts, new, gap_s):
    """Sends every prompt (one every `gap_s`), waits for all; returns (tokens, seconds)."""
    answers = [None] * len(prompts)

    def one(i):
        body = {
            "model": "bench",
            "prompt": prompts[i],
            "max_tokens": new,
            "temperature": 1.0,
            "ignore_eos": True,
            "seed": 1000 + i,
        }
        answers[i] = post(url, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
        if gap_s:
            time.sleep(gap_s)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = 0
    for a in answers:
        if a is None:
            sys.exit("a request failed")
        tokens += sum(len(c.get("token_ids") or []) or new for c in a["choices"])
    return tokens, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", action="append", required=True, help="LABEL=BINARY")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", default="8x64,64x32", help="N x new tokens, comma-separated")
    ap.add_argument("--gap-ms", type=float, default=150.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="target/bench/burst")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    cases = [tuple(int(x) for x in c.split("x")) for c in args.batch.split(",")]
    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="cairn-burst-")
    servers = {label: start(binary, args.model, args.dtype, work, label) for label, binary in builds}
    results = {}
    try:
        for label, (_, url) in servers.items():  # warm-up
            load(url, [[rng.randrange(100, 40000) for _ in range(38)]], 4, 0)
        for r in range(args.rounds):
            for n, new in cases:
                prompts = [[rng.randrange(100, 40000) for _ in range(38)] for _ in range(n)]
                for mode, gap in (("burst", 0.0), ("stagger", args.gap_ms / 1000)):
                    order = builds if r % 2 == 0 else builds[::-1]
                    for label, _ in order:
                        url = servers[label][1]
                        before = health(url).get("sampling", {}).get("batches")
                        tokens, wall = load(url, prompts, new, gap)
                        after = health(url).get("sampling", {}).get("batches")
                        passes = None if before is None else after - before
                        key = f"{mode} {n}x{new}"
                        results.setdefault(key, {}).setdefault(label, []).append(
                            {"tok_s": tokens / wall, "wall_s": wall, "passes": passes}
                        )
                        print(f"round {r} {key} {label}: {tokens / wall:.1f} tok/s, "
                              f"{wall:.2f} s, passes {passes}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    labels = [label for label, _ in builds]
    lines = ["| load | " + " | ".join(f"{l} tok/s (passes)" for l in labels) +
             f" | {labels[-1]} / {labels[0]} |", "|---|" + "---:|" * (len(labels) + 1)]
    for key, per in results.items():
        cells = []
        for l in labels:
            med = statistics.median(s["tok_s"] for s in per[l])
            passes = sorted({s["passes"] for s in per[l]}, key=str)
            cells.append(f"{med:.1f} ({', '.join(str(p) for p in passes)})")
        ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(per[labels[0]], per[labels[-1]])]
        cells.append(f"{statistics.median(ratios):.2f}×")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
