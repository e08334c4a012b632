"""Streaming against a running `cairn serve` (driven by tests/it/gateway.rs).

With the official `openai` client's streaming API:

1. stream chunks concatenate to the non-streaming answer of the same request (same seed):
   text, `token_ids` and finish reason of every choice exactly, and log-probs within
   `LOGPROB_BOUND`, for chat with `n = 2` and for completions with two prompts, `n = 2`, a stop
   string and the usage chunk;
2. concurrent streams in episodes (sampled in shared batches) are recorded with exactly the
   ids their chunks carried;
3. tokens go out as they are sampled: a client reads the first content chunk of a long
   answer and closes the stream; the server counts the request as abandoned (within 30 s) and
   by then had sampled far fewer ids than `max_tokens` (the same request without `stream`
   runs to `max_tokens`);
4. the server keeps answering after the disconnect: the first request again gives the same
   answer.

Exits non-zero with a message on the first failed check; prints a JSON summary otherwise.
"""

import argparse
import json
import threading
import time
import urllib.request

import openai

MODEL = "cairn"

# Two requests sent one after the other need not share passes the same way: under continuous
# batching a request can join a pass whose previous request is still ending, so its rows sit in
# a batch of another shape. In f32 the sampled ids do not depend on the batch (docs/gateway.md),
# but the log-probs may move in their last bits: on a loaded Zen 5, 2 of 24 differed by 9.5e-7
# (-11.832870483 against -11.832869530, one f32 ulp at that magnitude); docs/gateway.md
# measured up to 2.2e-5 on SmolLM2-135M. The bound is above both, and far below what a wrong
# token or a shifted position would change.
LOGPROB_BOUND = 1e-4


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=60) as r:
        return json.load(r)


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def extra(obj, key):
    return (getattr(obj, "model_extra", None) or {}).get(key)


def fail(message):
    raise SystemExit(message)


def check(what, got, want):
    if got != want:
        fail(f"{what}: streamed {got!r}, not streamed {want!r}")


def check_logprobs(what, got, want):
    """Same length, each within LOGPROB_BOUND (see there for why not exactly equal)."""
    if len(got) != len(want) or any(abs(a - b) > LOGPROB_BOUND for a, b in zip(got, want)):
        fail(f"{what}: streamed {got!r}, not streamed {want!r} (bound {LOGPROB_BOUND})")


def collect_chat(stream):
    """Per choice index: content, ids, log-probs, finish reason; and the prompt ids."""
    choices, prompt_ids = {}, None
    for chunk in stream:
        prompt_ids = prompt_ids or extra(chunk, "prompt_token_ids")
        for c in chunk.choices:
            mine = choices.setdefault(c.index, {"text": "", "ids": [], "logprobs": [],
                                                "finish": None})
            mine["text"] += c.delta.content or ""
            mine["ids"] += extra(c, "token_ids") or []
            if c.logprobs and c.logprobs.content:
                mine["logprobs"] += [t.logprob for t in c.logprobs.content]
            mine["finish"] = c.finish_reason or mine["finish"]
    return choices, prompt_ids


def chat_matches(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "tell me a story"}],
                  max_tokens=24, temperature=1.0, n=2, seed=7, logprobs=True)
    whole = client.chat.completions.create(**kwargs)
    streamed, prompt_ids = collect_chat(client.chat.completions.create(stream=True, **kwargs))
    check("chat prompt ids", prompt_ids, extra(whole, "prompt_token_ids"))
    check("chat choices", sorted(streamed), [0, 1])
    for c in whole.choices:
        s = streamed[c.index]
        check(f"chat choice {c.index} text", s["text"], c.message.content)
        check(f"chat choice {c.index} ids", s["ids"], extra(c, "token_ids"))
        check_logprobs(f"chat choice {c.index} logprobs", s["logprobs"],
              [t.logprob for t in c.logprobs.content])
        check(f"chat choice {c.index} finish", s["finish"], c.finish_reason)
    if streamed[0]["ids"] == streamed[1]["ids"]:
        fail("the two choices sampled the same ids")
    return whole


def completions_match(client):
    prompts = ["once upon a time", "the weather today"]
    first = client.completions.create(model=MODEL, prompt=prompts, n=2, seed=3, max_tokens=16)
    # A stop string the first choice's text holds in its middle: both answers cut there.
    text = first.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if not stop.strip():
        fail(f"no usable stop string in {text!r}")
    kwargs = dict(model=MODEL, prompt=prompts, n=2, seed=3, max_tokens=16, stop=[stop],
                  logprobs=0)
    whole = client.completions.create(**kwargs)
    streamed, usage = {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True},
                                           **kwargs):
        usage = chunk.usage or usage
        for c in chunk.choices:
            mine = streamed.setdefault(c.index, {"text": "", "ids": [], "logprobs": [],
                                                 "finish": None, "prompt": None})
            mine["text"] += c.text
            mine["ids"] += extra(c, "token_ids") or []
            mine["prompt"] = mine["prompt"] or extra(c, "prompt_token_ids")
            if c.logprobs:
                mine["logprobs"] += c.logprobs.token_logprobs or []
            mine["finish"] = c.finish_reason or mine["finish"]
    check("completion choices", sorted(streamed), [0, 1, 2, 3])
    for c in whole.choices:
        s = streamed[c.index]
        check(f"completion {c.index} text", s["text"], c.text)
        check(f"completion {c.index} ids", s["ids"], extra(c, "token_ids"))
        check(f"completion {c.index} prompt ids", s["prompt"], extra(c, "prompt_token_ids"))
        check_logprobs(f"completion {c.index} logprobs", s["logprobs"],
                       c.logprobs.token_logprobs)
        check(f"completion {c.index} finish", s["finish"], c.finish_reason)
    if whole.choices[0].text != text[:text.find(stop)] or whole.choices[0].finish_reason != "stop":
        fail(f"the stop string {stop!r} did not cut {text!r}: {whole.choices[0]}")
    check("usage", usage and usage.model_dump(), whole.usage.model_dump())
    return stop


def episode_streams(base, clients=4):
    """Concurrent streamed calls in episodes: the record holds the streamed ids."""
    opened = [post(base, "/episodes", {"task_id": f"stream-{i}"}) for i in range(clients)]
    results = [None] * clients

    def play(i):
        client = openai.OpenAI(base_url=base + opened[i]["base_path"], api_key="x",
                               max_retries=0)
        results[i] = collect_chat(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"episode {i}"}],
            max_tokens=12, stream=True))

    threads = [threading.Thread(target=play, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i, ep in enumerate(opened):
        if results[i] is None:
            fail(f"episode stream {i} did not finish")
        streamed, prompt_ids = results[i]
        view = get(base, f"/episodes/{ep['episode_id']}")
        if len(view["calls"]) != 1:
            fail(f"episode {i}: {len(view['calls'])} calls recorded, not 1: {view}")
        call = view["calls"][0]
        check(f"episode {i} recorded prompt", prompt_ids, call["prompt_token_ids"])
        check(f"episode {i} recorded ids", streamed[0]["ids"], call["choices"][0]["token_ids"])
        post(base, f"/episodes/{ep['episode_id']}/reward", {"reward": 1.0})
    return clients


def abandoned_stream(base, client, max_tokens):
    """Reads the first content chunk of a long answer, then closes the stream."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "go on forever"}],
                  max_tokens=max_tokens, temperature=1.0, seed=11)
    whole = client.chat.completions.create(**kwargs)
    whole_ids = extra(whole.choices[0], "token_ids")
    if whole.choices[0].finish_reason != "length" or len(whole_ids) != max_tokens:
        fail(f"the long request does not run to max_tokens: {whole.choices[0].finish_reason}, "
             f"{len(whole_ids)} ids")
    before = get(base, "/health")["sampling"]
    stream = client.chat.completions.create(stream=True, **kwargs)
    first = None
    for chunk in stream:
        ids = [i for c in chunk.choices for i in (extra(c, "token_ids") or [])]
        if ids:
            first = ids
            break
    stream.close()
    if not first or first != whole_ids[:len(first)]:
        fail(f"the first streamed ids {first} do not start the answer {whole_ids[:8]}")
    # The server learns of the closed connection when a write to it fails, a few tokens
    # later; it then counts the request as abandoned and samples no more for it. Requests of
    # the same sampling key join a running pass, so no later request can mark that moment:
    # wait for the count instead (bounded).
    deadline = time.time() + 30
    after = get(base, "/health")["sampling"]
    while after["requests_abandoned"] == before["requests_abandoned"] and time.time() < deadline:
        time.sleep(0.05)
        after = get(base, "/health")["sampling"]
    if after["requests_abandoned"] != before["requests_abandoned"] + 1:
        fail(f"the closed stream was not abandoned within 30 s: {before} -> {after}")
    sampled = after["tokens_sampled"] - before["tokens_sampled"]
    if sampled >= max_tokens // 2:
        fail(f"the closed stream went on sampling: {sampled} of {max_tokens} ids")
    return {"max_tokens": max_tokens, "first_chunk_ids": len(first), "sampled": sampled,
            "abandoned": after["requests_abandoned"] - before["requests_abandoned"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("base_url")
    p.add_argument("--long-tokens", type=int, default=900)
    args = p.parse_args()
    base = args.base_url
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    first = chat_matches(client)
    stop = completions_match(client)
    streams = episode_streams(base)
    abandoned = abandoned_stream(base, client, args.long_tokens)
    again = chat_matches(client)
    check("the first request after the disconnect",
          [extra(c, "token_ids") for c in again.choices],
          [extra(c, "token_ids") for c in first.choices])
    health = get(base, "/health")
    if health["status"] != "ok":
        fail(f"health after the disconnect: {health}")
    print(json.dumps({"stop": stop, "episode_streams": streams, "abandoned": abandoned,
                      "health": health["sampling"]}))


if __name__ == "__main__":
    main()
