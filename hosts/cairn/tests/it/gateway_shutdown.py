"""Harness calls in flight while `cairn train` ends (driven by tests/it/gateway.rs).

Plays the last group the training step waits for (`--task`, `--group-size` episodes of one
short call each) but posts the rewards only once `--clients` threads are each sending long
`/v1/completions` requests (official `openai` client, one seed per request, and a temperature
of its own per client: requests of other sampling settings never join a running pass, so at
any moment one client's request is generating and the others wait in the gateway's queue). The step then trains and the run ends with requests in flight. Each client
goes on until the gateway refuses it (503) or no longer accepts connections.

Prints a JSON summary: one outcome per request (`status` 200 / 503 with the error body, or
`connection` with the exception's name), each with its `elapsed` seconds. The Rust test
judges it; this script only exits non-zero when its own calls before the rewards fail.
"""

import argparse
import json
import sys
import threading
import time
import urllib.request

import openai


def post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def received(base_url):
    """Requests the gateway's sampler has taken so far (`GET /health`)."""
    with urllib.request.urlopen(base_url + "/health", timeout=60) as response:
        return json.load(response)["sampling"]["requests_received"]


def client_loop(base_url, index, max_tokens, started, outcomes):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    for k in range(1000):
        if k == 0:
            started.set()
        t0 = time.monotonic()
        outcome = {"client": index, "request": k}
        try:
            r = client.completions.create(model="cairn", prompt=[11, 22, 33 + index],
                                          max_tokens=max_tokens, seed=index * 1000 + k,
                                          temperature=0.5 + 0.1 * index, timeout=120)
            outcome.update(status=200, tokens=len(r.choices[0].model_extra["token_ids"]))
        except openai.APIStatusError as e:
            try:
                body = e.response.json()
            except ValueError:
                body = e.response.text
            outcome.update(status=e.status_code, body=body)
        except openai.APIConnectionError as e:
            outcome.update(connection=type(e.__cause__ or e).__name__, detail=str(e))
        outcome["elapsed"] = round(time.monotonic() - t0, 3)
        outcomes.append(outcome)
        if outcome.get("status") != 200:
            return


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--task", default="late")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=200)
    args = p.parse_args()

    episodes = []
    for g in range(args.group_size):
        opened = post(f"{args.base_url}/episodes", {"task_id": args.task})
        client = openai.OpenAI(base_url=args.base_url + opened["base_path"], api_key="unused",
                               max_retries=0)
        client.completions.create(model="cairn", prompt=f"late episode {g}", max_tokens=2)
        episodes.append(opened["episode_id"])

    before = received(args.base_url)
    outcomes, threads = [], []
    for i in range(args.clients):
        started = threading.Event()
        t = threading.Thread(target=client_loop,
                             args=(args.base_url, i, args.max_tokens, started, outcomes),
                             daemon=True)
        t.start()
        if not started.wait(30):
            sys.exit(f"client {i} did not start within 30 s")
        threads.append(t)
    # Post the rewards once every client's first request has reached the sampler (one
    # generating, the others queued), bounded: the Rust test then finds no request waiting.
    deadline = time.monotonic() + 60
    while (taken := received(args.base_url) - before) < args.clients:
        if time.monotonic() > deadline:
            sys.exit(f"{taken} of {args.clients} clients' first requests reached the sampler "
                     "within 60 s (GET /health: sampling.requests_received)")
        time.sleep(0.01)
    for g, ep in enumerate(episodes):
        post(f"{args.base_url}/episodes/{ep}/reward", {"reward": float(g)})
    for t in threads:
        t.join(300)
    hung = sum(t.is_alive() for t in threads)
    print(json.dumps({"outcomes": outcomes, "hung_clients": hung}))


if __name__ == "__main__":
    main()
