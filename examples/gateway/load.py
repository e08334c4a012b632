#!/usr/bin/env python3
"""Load test of Cairn's gateway on loopback: N concurrent clients, bounded counts and time.

Each client plays `--episodes` episodes of `--calls` calls through `/episodes/{id}/v1/completions`
with token-id prompts, each prompt extending the previous prompt + returned ids with a few
client-specific ids (so every call should merge, and ids from another client would show).
Then every episode is fetched back (`GET /episodes/{id}`) and checked: the gateway recorded
exactly the calls the client saw, with the same prompt and returned ids, merged into one
segment whose mask-1 ids are the returned ids in order. Prints throughput and latency
percentiles as JSON. Standard library only; loopback only.

    python examples/gateway/load.py --base-url http://127.0.0.1:8400 --clients 16
"""

import argparse
import json
import threading
import time
import urllib.request


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def client(args, index, deadline, out):
    try:
        play(args, index, deadline, out)
    except Exception as e:  # reported, and the run fails: nothing may be lost silently
        out["errors"].append(f"client {index}: {e!r}")


def play(args, index, deadline, out):
    marker = [1000 + index, 2000 + index, 3000 + index]  # this client's "observation" ids
    for e in range(args.episodes):
        if time.monotonic() > deadline:
            out["stopped_early"] = True
            return
        opened = post(f"{args.base_url}/episodes", {"task_id": f"load-{index}"}, 30)
        ep = opened["episode_id"]
        prompt, calls = marker + [index % 100 + 10] * 4, []
        for _ in range(args.calls):
            started = time.monotonic()
            r = post(f"{args.base_url}{opened['base_path']}/completions",
                     {"model": "cairn", "prompt": prompt, "max_tokens": args.max_tokens,
                      "temperature": 1.0}, 120)
            out["latencies"].append(time.monotonic() - started)
            choice = r["choices"][0]
            calls.append({"prompt": prompt, "ids": choice["token_ids"],
                          "merged": r["cairn"]["calls"][0]["merged"]})
            out["tokens"] += len(choice["token_ids"])
            prompt = prompt + choice["token_ids"] + marker
        post(f"{args.base_url}/episodes/{ep}/reward", {"reward": float(e % 2)}, 30)
        out["episodes"].append((ep, calls))


def check(args, episodes):
    """Every episode as the gateway recorded it equals what its client saw."""
    problems = []
    for ep, calls in episodes:
        view = get(f"{args.base_url}/episodes/{ep}", 30)
        if len(view["calls"]) != len(calls):
            problems.append(f"{ep}: {len(view['calls'])} calls recorded, {len(calls)} made")
            continue
        for k, (seen, recorded) in enumerate(zip(calls, view["calls"])):
            if recorded["prompt_token_ids"] != seen["prompt"]:
                problems.append(f"{ep} call {k}: prompt ids differ")
            if recorded["choices"][0]["token_ids"] != seen["ids"]:
                problems.append(f"{ep} call {k}: returned ids differ from recorded")
        if len(view["segments"]) != 1:
            problems.append(f"{ep}: {len(view['segments'])} segments, expected 1")
            continue
        seg = view["segments"][0]
        sampled = [i for i, m in zip(seg["response_token_ids"], seg["response_mask"]) if m]
        if sampled != [i for c in calls for i in c["ids"]]:
            problems.append(f"{ep}: trained ids are not the returned ids")
        if seg["prompt_token_ids"] != calls[0]["prompt"]:
            problems.append(f"{ep}: row prompt is not the first prompt")
    return problems


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--episodes", type=int, default=4, help="per client")
    p.add_argument("--calls", type=int, default=4, help="per episode")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds, whole run")
    args = p.parse_args()
    deadline = time.monotonic() + args.time_limit
    outs = [{"latencies": [], "tokens": 0, "episodes": [], "errors": []}
            for _ in range(args.clients)]
    threads = [threading.Thread(target=client, args=(args, i, deadline, outs[i]))
               for i in range(args.clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic() + 60))
    wall = time.monotonic() - started
    latencies = [x for o in outs for x in o["latencies"]]
    episodes = [e for o in outs for e in o["episodes"]]
    problems = check(args, episodes) + [e for o in outs for e in o["errors"]]
    health = get(f"{args.base_url}/health", 30)
    report = {
        "clients": args.clients, "episodes": len(episodes), "calls": len(latencies),
        "wall_s": round(wall, 3),
        "calls_per_s": round(len(latencies) / wall, 2),
        "tokens_per_s": round(sum(o["tokens"] for o in outs) / wall, 1),
        "latency_p50_ms": round(1000 * percentile(latencies, 0.50), 1),
        "latency_p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        "merged_calls": sum(c["merged"] for _, calls in episodes for c in calls),
        "lost_or_mixed": len(problems), "problems": problems[:5],
        "gateway_stats": health["stats"],
    }
    print(json.dumps(report))
    raise SystemExit(1 if problems or len(episodes) != args.clients * args.episodes else 0)


if __name__ == "__main__":
    main()
