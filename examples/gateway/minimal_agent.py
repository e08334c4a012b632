#!/usr/bin/env python3
"""A minimal agent harness trained through Cairn's gateway (docs/gateway.md).

The task is built in: "What is A + B?", with a `calculator` tool. Each episode opens an
episode on the gateway (POST /episodes with a task id, so the G episodes of one task form a
group), runs the agent loop with the official `openai` client pointed at the episode's base URL
(tool calls are executed and fed back as `tool` messages), and posts the reward (1 when the
final answer holds A + B). Nothing here knows about training: the harness owns its loop.

Every call's ids, as the API returned them, are written to `--log` (JSON), so a test can check
that the ids trained on are the ids returned. `--stream-every K` streams every K-th episode
(SSE) to exercise that path; `--token-episodes N` adds N episodes driven through
`/v1/completions` with token-id prompts that extend the previous prompt + response ids
(the gateway merges those calls into one row).

    python examples/gateway/minimal_agent.py --base-url http://127.0.0.1:8400 --tasks 2 \\
        --group-size 2 --log calls.json
"""

import argparse
import json
import random
import urllib.request

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * and integers.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def calculator(expression):
    allowed = set("0123456789+-* ()")
    if not expression or not set(expression) <= allowed:
        return "error: only integers and + - * are allowed"
    try:
        return str(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 (checked above)
    except Exception as e:  # a malformed expression is the agent's mistake, not ours
        return f"error: {e}"


def extra(obj, key):
    """A field the gateway adds beside the OpenAI ones (`token_ids`, `prompt_token_ids`)."""
    return (getattr(obj, "model_extra", None) or {}).get(key)


def chat_call(client, model, messages, stream, seed, log):
    kwargs = dict(model=model, messages=messages, tools=TOOLS, max_tokens=8, temperature=1.0,
                  logprobs=True, seed=seed)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        choice = r.choices[0]
        message = {"role": "assistant", "content": choice.message.content}
        if choice.message.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in choice.message.tool_calls]
        log.append({"prompt_token_ids": extra(r, "prompt_token_ids"),
                    "token_ids": extra(choice, "token_ids"),
                    "logprobs": [t.logprob for t in choice.logprobs.content],
                    "cairn": extra(r, "cairn"), "stream": False})
        return message
    content, ids, logprobs, prompt_ids, tool_calls = "", [], [], None, []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        prompt_ids = prompt_ids or extra(chunk, "prompt_token_ids")
        for choice in chunk.choices:
            ids += extra(choice, "token_ids") or []
            content += choice.delta.content or ""
            tool_calls += [c.model_dump() for c in choice.delta.tool_calls or []]
            if choice.logprobs and choice.logprobs.content:
                logprobs += [t.logprob for t in choice.logprobs.content]
    for call in tool_calls:
        call.pop("index", None)
    log.append({"prompt_token_ids": prompt_ids, "token_ids": ids, "logprobs": logprobs,
                "cairn": None, "stream": True})
    message = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def play_chat(base_url, model, task, episode_seed, stream, log):
    a, b = task
    opened = post(f"{base_url}/episodes", {"task_id": f"add-{a}-{b}"})
    client = openai.OpenAI(base_url=base_url + opened["base_path"], api_key="unused",
                           max_retries=0)
    messages = [
        {"role": "system", "content": "Answer with the number only. Use the calculator."},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]
    calls, reward = [], 0.0
    for turn in range(3):
        message = chat_call(client, model, messages, stream, episode_seed * 10 + turn, calls)
        messages.append(message)
        if not message.get("tool_calls"):
            reward = float(str(a + b) in (message["content"] or ""))
            break
        for call in message["tool_calls"]:
            try:
                expression = json.loads(call["function"]["arguments"]).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": calculator(str(expression))})
    post(f"{base_url}/episodes/{opened['episode_id']}/reward", {"reward": reward})
    return {"episode_id": opened["episode_id"], "task_id": opened["task_id"],
            "reward": reward, "calls": calls}


def play_tokens(base_url, model, index, log):
    """Token-level harness: each prompt extends the previous prompt + response ids."""
    opened = post(f"{base_url}/episodes", {"task_id": f"tokens-{index // 2}"})
    client = openai.OpenAI(base_url=base_url + opened["base_path"], api_key="unused",
                           max_retries=0)
    calls, prompt = [], None
    for turn in range(3):
        if prompt is None:
            r = client.completions.create(model=model, prompt=f"Count to ten: 1 2 {index}",
                                          max_tokens=4, logprobs=1)
        else:
            r = client.completions.create(model=model, prompt=prompt, max_tokens=4, logprobs=1)
        choice = r.choices[0]
        prompt_ids, ids = extra(choice, "prompt_token_ids"), extra(choice, "token_ids")
        calls.append({"prompt_token_ids": prompt_ids, "token_ids": ids,
                      "logprobs": choice.logprobs.token_logprobs, "cairn": extra(r, "cairn"),
                      "stream": False})
        # The "observation": a few ids of the first prompt, appended after the response.
        prompt = prompt_ids + ids + calls[0]["prompt_token_ids"][:3]
    post(f"{base_url}/episodes/{opened['episode_id']}/reward", {"reward": float(index % 2)})
    return {"episode_id": opened["episode_id"], "task_id": opened["task_id"],
            "reward": float(index % 2), "calls": calls}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="the gateway root, http://HOST:PORT")
    p.add_argument("--model", default="cairn")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group-size", type=int, default=2, help="episodes per task")
    p.add_argument("--token-episodes", type=int, default=0)
    p.add_argument("--stream-every", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", help="write every call's ids here (JSON)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    tasks = [(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(args.tasks)]
    episodes = []
    for g in range(args.group_size):
        for t, task in enumerate(tasks):
            n = len(episodes)
            stream = args.stream_every > 0 and n % args.stream_every == 1
            episodes.append(play_chat(args.base_url, args.model, task, args.seed * 1000 + n,
                                      stream, None))
    for i in range(args.token_episodes):
        episodes.append(play_tokens(args.base_url, args.model, i, None))
    wins = sum(e["reward"] for e in episodes)
    print(json.dumps({"episodes": len(episodes), "reward_sum": wins}))
    if args.log:
        with open(args.log, "w") as f:
            json.dump(episodes, f)


if __name__ == "__main__":
    main()
