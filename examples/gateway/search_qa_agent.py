#!/usr/bin/env python3
"""The search-qa tasks played through Cairn's gateway, with the official `openai` client.

The same tasks as the `search-qa` environment plugin (docs/search-qa.md): the questions, the
BM25 `search` tool and the reward come from `search-qa-env`, the plugin crate's JSON-lines
bridge (built with the workspace: `target/debug/search-qa-env`), so nothing here re-implements
the environment. The harness owns the agent loop: each episode opens a gateway episode under
the question's task id (the G episodes of one question form a GRPO group), offers the `search`
tool in the request's `tools` (unless `--no-tools`), turns a returned tool call into the
environment's `<tool_call>` action and its passages into a `tool` message, sends plain text as
the action (`search[query]` / `answer[text]`), and posts the environment's reward (exact match
or token F1, as `--env-config` says) when the answer ends the episode or the turns run out.

Context: `--context chat` (the default) keeps one growing conversation, which the gateway
merges into one training row per episode; `--context env` sends the environment's own
observation as a fresh conversation each turn (question, history cut to `context_budget`,
latest results), as `cairn train` with the plugin does.

    target/debug/cairn train examples/gateway/search_qa.toml &     # 127.0.0.1:8420
    .venv/bin/python examples/gateway/search_qa_agent.py --base-url http://127.0.0.1:8420 \\
        --tasks 4 --group-size 4 --train 10

Modes: `--corpus FILE` writes the text of expert episodes on training tasks (for
`model.scratch.tokenizer_corpus`) and exits; `--eval` plays the tasks once each without
gateway episodes (nothing is trained) and prints accuracy and tool calls as JSON; otherwise
the tasks are played `--group-size` times each inside episodes (`--train ROUNDS`: ROUNDS
rounds of `--tasks` tasks, waiting after each round for the training step it starts). `--log
FILE` writes every episode with its calls' ids (JSON).
"""

import argparse
import json
import pathlib
import subprocess
import time
import urllib.request

import openai

REPO = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = ("You answer questions about the chemical elements. Search with the search tool or "
          "search[query]; give the final answer as answer[text].")
SYSTEM_NO_TOOLS = "You answer questions about the chemical elements. Reply with answer[text]."


class Env:
    """The search-qa environment in a `search-qa-env` child process (JSON lines)."""

    def __init__(self, binary, config):
        if not pathlib.Path(binary).is_file():
            raise SystemExit(f"{binary} is missing: build it with `cargo build -p cairn-search-qa`")
        self.proc = subprocess.Popen([str(binary), "--config", config], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("search-qa-env exited (a bad --env-config? its message is above)")
        reply = json.loads(line)
        if "error" in reply:
            raise SystemExit(f"search-qa-env: {reply['error']} (request {request})")
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def post(base, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def extra(obj, key):
    """A field the gateway adds beside the OpenAI ones (`token_ids`, `prompt_token_ids`)."""
    return (getattr(obj, "model_extra", None) or {}).get(key)


def feedback_text(info, turns_left):
    """What the harness tells the model after a step that did not end the episode."""
    if info.get("action") == "search":
        passages = info.get("passages") or []
        lines = [f"{i + 1}. {p}" for i, p in enumerate(passages)] or ["no results"]
    else:
        lines = [info.get("message", "unrecognised reply")]
    return "\n".join(lines + [f"Turns left: {turns_left}."])


def action_of(message):
    """The environment action of an assistant message: its first tool call as a `<tool_call>`
    block (arguments as the client returned them, a JSON string), else its text."""
    if message.tool_calls:
        call = message.tool_calls[0]
        body = {"name": call.function.name, "arguments": call.function.arguments}
        return f"<tool_call>{json.dumps(body)}</tool_call>"
    return message.content or ""


def play(env, client, args, max_turns, split, index, seed):
    """One episode of task (split, index); returns its record."""
    started = env.ask(op="start", split=split, index=index, tools=not args.no_tools)
    episode, observation = started["episode"], started["observation"]
    tools = observation.get("tools") or None
    system = SYSTEM_NO_TOOLS if args.no_tools else SYSTEM
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": observation["text"]}]
    calls, reward, success, tool_calls, turns = [], 0.0, False, 0, 0
    for turn in range(max_turns):
        if args.context == "env":
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": observation["text"]}]
        kwargs = dict(model=args.model, messages=messages, max_tokens=args.max_tokens,
                      temperature=args.temperature, seed=seed * 100 + turn, logprobs=True)
        if tools:
            kwargs["tools"] = tools
        r = client.chat.completions.create(**kwargs)
        choice = r.choices[0]
        message = choice.message
        calls.append({"prompt_token_ids": extra(r, "prompt_token_ids"),
                      "token_ids": extra(choice, "token_ids"),
                      "logprobs": [t.logprob for t in (choice.logprobs.content or [])]
                      if choice.logprobs else [],
                      "tool_call": bool(message.tool_calls)})
        out = env.ask(op="step", episode=episode, action=action_of(message))
        turns += 1
        tool_calls += out["tool_calls"]
        observation = out["observation"]
        assistant = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            assistant["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        messages.append(assistant)
        if out["done"]:
            reward, success = out["reward"], out["success"]
            break
        text = feedback_text(out["info"], max_turns - turns)
        if message.tool_calls:
            for k, call in enumerate(message.tool_calls):
                content = text if k == 0 else "one search per turn: only the first ran"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        else:
            messages.append({"role": "user", "content": text})
    env.ask(op="close", episode=episode)
    return {"reward": reward, "success": success, "tool_calls": tool_calls, "turns": turns,
            "calls": calls}


def policy_version(base, model):
    """The version that samples now (a one-token call outside any episode waits while the
    trainer updates the weights)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    r = client.completions.create(model=model, prompt="ping", max_tokens=1)
    return r.model_extra["policy_version"]


def wait_for_step(args, version, last):
    """Until the version passes `version` (the step trained on the round) or, after the last
    round, until the run ends and the gateway refuses calls."""
    while True:
        try:
            now = policy_version(args.base_url, args.model)
        except (openai.APIConnectionError, openai.APIStatusError):
            if last:
                return
            raise
        if now > version and not last:
            return
        time.sleep(1)


def write_corpus(env, info, path, episodes):
    """The text of expert episodes on the first training tasks (never held-out ones)."""
    lines = [SYSTEM, SYSTEM_NO_TOOLS]
    for index in range(min(episodes, info["train_tasks"])):
        started = env.ask(op="start", split="train", index=index, tools=True)
        episode, text = started["episode"], started["observation"]["text"]
        lines += text.split("\n")
        for _ in range(info["max_turns"]):
            action = env.ask(op="expert", episode=episode)["action"]
            if action is None:
                break
            lines.append(action)
            out = env.ask(op="step", episode=episode, action=action)
            lines += out["observation"]["text"].split("\n")
            if out["done"]:
                break
        env.ask(op="close", episode=episode)
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", help="the gateway root, http://HOST:PORT")
    p.add_argument("--model", default="cairn", help="the config's source.model_name")
    p.add_argument("--env-bin", default=str(REPO / "target/debug/search-qa-env"),
                   help="the search-qa-env bridge binary")
    p.add_argument("--env-config", default="{}",
                   help="the plugin's config as JSON (as [environment] config)")
    p.add_argument("--split", choices=["train", "test"], default="train")
    p.add_argument("--tasks", type=int, default=2, help="tasks per round")
    p.add_argument("--first-task", type=int, default=0)
    p.add_argument("--group-size", type=int, default=2, help="episodes per task")
    p.add_argument("--train", type=int, default=0, metavar="ROUNDS",
                   help="play ROUNDS rounds (the next --tasks tasks each), waiting after each "
                        "for the training step; 0: one round, no waiting")
    p.add_argument("--context", choices=["chat", "env"], default="chat")
    p.add_argument("--no-tools", action="store_true",
                   help="offer no tool; the environment refuses searches (EAPO's tool-free slot)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="no episodes: accuracy and tool calls")
    p.add_argument("--corpus", metavar="FILE", help="write a tokenizer corpus and exit")
    p.add_argument("--corpus-episodes", type=int, default=400)
    p.add_argument("--log", help="write the episodes here (JSON)")
    args = p.parse_args()

    env = Env(args.env_bin, args.env_config)
    info = env.ask(op="info")
    if args.corpus:
        n = write_corpus(env, info, args.corpus, args.corpus_episodes)
        print(json.dumps({"corpus": args.corpus, "lines": n}))
        env.close()
        return
    if not args.base_url:
        raise SystemExit("--base-url is required (the gateway root, http://HOST:PORT)")
    count = info["train_tasks" if args.split == "train" else "test_tasks"]
    max_turns = info["max_turns"]
    episodes = []
    rounds = max(args.train, 1)
    for round_ in range(rounds):
        first = args.first_task + round_ * args.tasks
        tasks = [i % count for i in range(first, first + args.tasks)]
        version = policy_version(args.base_url, args.model) if args.train else None
        for g in range(1 if args.eval else args.group_size):
            for index in tasks:
                task = env.ask(op="task", split=args.split, index=index)
                seed = args.seed * 100_000 + len(episodes)
                if args.eval:
                    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="unused",
                                           max_retries=0)
                    record = play(env, client, args, max_turns, args.split, index, seed)
                    record.update(task_id=task["id"], kind=task["kind"], question=task["goal"])
                    episodes.append(record)
                    continue
                opened = post(args.base_url, "/episodes", {"task_id": task["id"]})
                client = openai.OpenAI(base_url=args.base_url + opened["base_path"],
                                       api_key="unused", max_retries=0)
                record = play(env, client, args, max_turns, args.split, index, seed)
                post(args.base_url, f"/episodes/{opened['episode_id']}/reward",
                     {"reward": record["reward"], "success": record["success"]})
                record.update(episode_id=opened["episode_id"], task_id=task["id"],
                              kind=task["kind"], question=task["goal"])
                episodes.append(record)
        if args.train:
            wait_for_step(args, version, last=round_ + 1 == rounds)
    env.close()
    n = len(episodes)
    summary = {"episodes": n, "split": args.split,
               "accuracy": sum(e["success"] for e in episodes) / n,
               "mean_reward": sum(e["reward"] for e in episodes) / n,
               "tool_calls_per_episode": sum(e["tool_calls"] for e in episodes) / n}
    print(json.dumps(summary))
    if args.log:
        with open(args.log, "w") as f:
            json.dump(episodes, f)


if __name__ == "__main__":
    main()
