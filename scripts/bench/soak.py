#!/usr/bin/env python3
"""Soak benchmark: N concurrent harness clients against a *training* gateway, on loopback.

Starts `cairn train` with a gateway source (a tiny random model with the Qwen3 tokenizer
fixture, so the clients, not the model, are what is soaked), then runs `--clients` threads for
`--duration` seconds. Each client plays episodes of `--calls` token-level calls through
`/episodes/{id}/v1/completions` (each prompt extends the previous prompt and the returned ids
with ids of the client's own, so ids of another client would show) and posts a reward; a
client's consecutive episodes share a task id, so they form the trainer's groups.

While it runs, the trainer's resident memory is sampled every `--sample-every` seconds. At the
end the run is stopped with SIGINT (it stops at a step boundary), the data pool is exported, and
every trained row is checked against what its client received: the prompt of the episode's
first call, the returned ids with mask 1, the client's own ids between calls with mask 0, and
the log-probs the API reported. Episodes the trainer did not train on (stale at a weight
update, or unfinished at the end) are counted, not checked.

Prints a JSON report: calls/s, sampled tokens/s, latency p50/p99, RSS per minute and its slope
after the first minute, and `lost_or_mixed` (rows that differ from their client's receipt plus
returned ids missing from a trained episode). Exits 1 when anything was lost or mixed, or a
client failed. Loopback only; every loop is bounded by the duration.

    python3 scripts/bench/soak.py --cairn target/release/cairn --clients 64 --duration 600
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def config(run, tokenizer, args):
    return f"""[run]
dir = "{run}"
seed = 5
steps = 1000000
checkpoint_every = 1000000

[source]
kind = "gateway"
bind = "127.0.0.1:0"
episode_timeout_s = 120
max_batch_prompts = {args.clients}

[algorithm]
plugin = "grpo"

[model]
device = "cpu"
threads = 1

[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
tokenizer = "{tokenizer}"

[rollout]
tasks_per_step = {args.tasks_per_step}
group_size = 2
temperature = 1.0
max_new_tokens = {args.max_tokens}
max_turns = {args.calls}

[optimizer]
lr = 1e-3
"""


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def play(base, index, args, deadline, out):
    marker = [1000 + index, 2000 + index, 3000 + index]
    episode = 0
    while time.monotonic() < deadline:
        opened = post(f"{base}/episodes", {"task_id": f"soak-{index}"}, 60)
        prompt, calls = marker + [index % 100 + 10] * 4, []
        for _ in range(args.calls):
            started = time.monotonic()
            r = post(f"{base}{opened['base_path']}/completions",
                     {"model": "cairn", "prompt": prompt, "max_tokens": args.max_tokens,
                      "temperature": 1.0, "logprobs": 1}, 300)
            out["latencies"].append(time.monotonic() - started)
            choice = r["choices"][0]
            ids = choice["token_ids"]
            calls.append({"prompt": prompt, "ids": ids,
                          "logprobs": choice["logprobs"]["token_logprobs"]})
            out["tokens"] += len(ids)
            prompt = prompt + ids + marker
        post(f"{base}/episodes/{opened['episode_id']}/reward", {"reward": float(episode % 2)},
             60)
        out["episodes"][opened["episode_id"]] = calls
        episode += 1


def client(base, index, args, deadline, out):
    try:
        play(base, index, args, deadline, out)
    except Exception as e:  # reported: the run fails, nothing is lost silently
        out["errors"].append(f"client {index}: {e!r}")


def expected_row(calls):
    """The row the trainer should build from consecutive calls of one segment (merged mode)."""
    ids, mask, logprobs = [], [], []
    so_far = list(calls[0]["prompt"])
    for k, call in enumerate(calls):
        if k > 0:
            observation = call["prompt"][len(so_far):]
            ids += observation
            mask += [0] * len(observation)
            logprobs += [0.0] * len(observation)
            so_far = list(call["prompt"])
        ids += call["ids"]
        mask += [1] * len(call["ids"])
        logprobs += call["logprobs"]
        so_far += call["ids"]
    return calls[0]["prompt"], ids, mask, logprobs


def check_rows(rows, episodes):
    """Problems between trained rows and receipts; the set of trained episode ids.

    An episode is one row per segment: its calls merge while each prompt extends the last one
    and the policy version stays the same (`info.calls` names the row's calls). A row whose
    calls were sampled before the step's weight update is dropped as stale at
    `max_staleness = 0`, so an episode may be trained on only in part; every row that is
    trained must equal its calls exactly, and no call may be trained twice.
    """
    problems, trained, seen = [], set(), set()
    for row in rows:
        info = row.get("info") or {}
        ep = info.get("episode_id")
        if ep not in episodes:
            continue
        trained.add(ep)
        members = [c[0] for c in info.get("calls") or []]
        calls = episodes[ep]
        if not members or any(not 0 <= m < len(calls) for m in members):
            problems.append(f"{ep}: the row names calls {members} of {len(calls)}")
            continue
        if any((ep, m) in seen for m in members):
            problems.append(f"{ep}: calls {members} trained twice")
        seen.update((ep, m) for m in members)
        prompt, ids, mask, logprobs = expected_row([calls[m] for m in members])
        if row["prompt_ids"] != prompt:
            problems.append(f"{ep}: the row's prompt is not its first call's")
        if row["response_ids"] != ids or row["response_mask"] != mask:
            problems.append(f"{ep}: the row's ids are not the returned ids and observations")
        elif any(abs(a - b) > 1e-6 for a, b in zip(row["response_logprobs"], logprobs)):
            problems.append(f"{ep}: the row's log-probs are not the reported ones")
    return problems, trained, len(seen)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def slope_mb_per_min(samples):
    """Least-squares slope of RSS (MB) over time (min)."""
    if len(samples) < 2:
        return float("nan")
    xs = [t / 60 for t, _ in samples]
    ys = [r / 2**20 for _, r in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cairn", default=str(ROOT / "target/release/cairn"), help="the binary")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--calls", type=int, default=4, help="calls per episode")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS reads")
    p.add_argument("--run-dir", help="keep the run here, and the trainer's log beside it as "
                   "soak-train.log (default: a temporary directory)")
    args = p.parse_args()
    for name in ("clients", "calls", "max_tokens", "tasks_per_step"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.duration <= 0 or args.sample_every <= 0:
        p.error("--duration and --sample-every must be positive")
    if not os.access(args.cairn, os.X_OK):
        p.error(f"--cairn {args.cairn}: not an executable (build with cargo build --release)")

    tmp = tempfile.TemporaryDirectory(prefix="cairn-soak-")
    run = Path(args.run_dir) if args.run_dir else Path(tmp.name) / "run"
    cfg = Path(tmp.name) / "soak.toml"
    cfg.write_text(config(run, ROOT / "kernel/fixtures/text/qwen3", args))
    # With --run-dir the trainer's log is kept beside the run.
    if args.run_dir:
        if run.exists():
            p.error(f"--run-dir {run}: already exists; give a new path (a soak starts a run)")
        run.parent.mkdir(parents=True, exist_ok=True)
    log = open((run.parent if args.run_dir else Path(tmp.name)) / "soak-train.log", "w+")
    trainer = subprocess.Popen([args.cairn, "train", str(cfg)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "CAIRN_LOG": os.environ.get("CAIRN_LOG", "warn")})
    base = None
    start_deadline = time.monotonic() + 300
    for line in trainer.stderr:
        log.write(line)
        m = re.search(r"gateway: listening on (http://\S+)", line)
        if m:
            base = m.group(1)
            break
        if time.monotonic() > start_deadline:
            break
    if base is None:
        trainer.kill()
        sys.exit(f"soak: the trainer did not start its gateway; its log is in {log.name}")
    drain = threading.Thread(target=lambda: [log.write(x) for x in trainer.stderr], daemon=True)
    drain.start()

    began = time.monotonic()
    deadline = began + args.duration
    rss, stop_sampling = [], threading.Event()

    def sample():
        while not stop_sampling.is_set():
            rss.append((time.monotonic() - began, rss_bytes(trainer.pid)))
            stop_sampling.wait(args.sample_every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outs = [{"latencies": [], "tokens": 0, "episodes": {}, "errors": []}
            for _ in range(args.clients)]
    threads = [threading.Thread(target=client, args=(base, i, args, deadline, outs[i]),
                                daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic() + 360))
    wall = time.monotonic() - began
    stop_sampling.set()
    health = get(f"{base}/health", 60)

    trainer.send_signal(signal.SIGINT)
    try:
        trainer.wait(600)
    except subprocess.TimeoutExpired:
        trainer.kill()
        trainer.wait()
    drain.join(10)
    exported = subprocess.run([args.cairn, "pool", "export", str(run), "--format", "batch"],
                              capture_output=True, text=True)
    if exported.returncode != 0:
        sys.exit(f"soak: cairn pool export failed: {exported.stderr}")
    rows = json.loads(exported.stdout)["rows"]

    episodes = {ep: calls for o in outs for ep, calls in o["episodes"].items()}
    problems, trained, trained_calls = check_rows(rows, episodes)
    errors = [e for o in outs for e in o["errors"]]
    hung = sum(t.is_alive() for t in threads)
    latencies = [x for o in outs for x in o["latencies"]]
    per_minute = {}
    for t, r in rss:
        per_minute.setdefault(int(t // 60), []).append(r)
    report = {
        "clients": args.clients, "duration_s": round(wall, 1),
        "episodes": len(episodes), "episodes_trained": len(trained),
        "episodes_not_trained": len(episodes) - len(trained),
        "calls": len(latencies), "calls_trained": trained_calls,
        "calls_per_s": round(len(latencies) / wall, 2),
        "tokens_per_s": round(sum(o["tokens"] for o in outs) / wall, 1),
        "latency_p50_ms": round(1000 * percentile(latencies, 0.50), 1),
        "latency_p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        "rss_mb_per_minute": {m: round(max(v) / 2**20, 1) for m, v in sorted(per_minute.items())},
        "rss_slope_mb_per_min_after_1st_min": round(
            slope_mb_per_min([(t, r) for t, r in rss if t >= 60]), 3),
        "rl_steps": sum(1 for _ in open(run / "metrics.jsonl"))
        if (run / "metrics.jsonl").exists() else 0,
        "trainer_exit": trainer.returncode,
        "lost_or_mixed": len(problems), "problems": problems[:5],
        "client_errors": errors[:5], "hung_clients": hung,
        "sampling": health.get("sampling"),
    }
    print(json.dumps(report, indent=1))
    # SIGINT stops the run after its last finished step and exits 1 saying so.
    log.seek(0)
    stopped = trainer.returncode == 0 or (
        trainer.returncode == 1 and "error: interrupted (SIGINT)" in log.read())
    if not stopped:
        log.flush()
        log.seek(0)
        tail = log.read().splitlines()[-20:]
        print("soak: the trainer exited with", trainer.returncode, "; its log ends:",
              *tail, sep="\n", file=sys.stderr)
    log.close()
    sys.exit(1 if problems or errors or hung or not stopped else 0)


if __name__ == "__main__":
    main()
