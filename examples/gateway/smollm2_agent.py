"""A multi-turn quiz harness for SmolLM2-135M-Instruct through the Cairn gateway.

Each game is one conversation and one gateway episode: the harness asks a question (a
capital city or a sum), the model answers, and the harness gives feedback in its next
message ("Correct." or "Not quite: the answer is X."), followed by the next question. The
conversation grows each turn, so the gateway merges the game's calls into one segment
(docs/gateway.md, "Episodes and token bookkeeping"). The reward posted at the end is the
fraction of questions answered right. Calls use the official `openai` client; `--stream`
streams every answer and prints its text as the chunks arrive.

    bash scripts/smollm2.sh                       # once: the model directory
    target/debug/cairn serve examples/gateway/smollm2.toml &        # 127.0.0.1:8410
    .venv/bin/python examples/gateway/smollm2_agent.py --base-url http://127.0.0.1:8410 \\
        --games 2 --questions 4 --stream

Prints the transcript and, per game, the reward and what the gateway recorded; `--json FILE`
also writes them as JSON. With `--group-size G` each game is played G times under one task
id, which is what `cairn train` on the same config groups for GRPO (episode calls are then
sampled at the config's rollout temperature, whatever `--temperature` says).
"""

import argparse
import json
import random
import re
import sys
import time
import urllib.request

import openai

SYSTEM = "You are a quiz contestant. Answer each question in one short sentence."

CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Germany", "Berlin"),
            ("Spain", "Madrid"), ("Egypt", "Cairo"), ("Russia", "Moscow"),
            ("the United Kingdom", "London"), ("Australia", "Canberra"), ("Canada", "Ottawa")]
SUMS = [(2, 3), (4, 4), (7, 5), (10, 6), (17, 25), (38, 47)]


def questions(rng, count):
    """`count` (question, answer) pairs: capitals and small sums, no repeats."""
    pool = [(f"What is the capital of {c}?", a) for c, a in CAPITALS]
    pool += [(f"What is {a} + {b}?", str(a + b)) for a, b in SUMS]
    return rng.sample(pool, count)


def correct(reply, answer):
    """The reply names the answer: the city as a word, or the sum as a number."""
    if answer.isdigit():
        return answer in re.findall(r"\d+", reply)
    return re.search(rf"\b{re.escape(answer)}\b", reply, re.IGNORECASE) is not None


def post(base, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=120) as r:
        return json.load(r)


def ask(client, args, messages, seed):
    """One call: the reply text and its sampled ids (streamed: printed as they come)."""
    kwargs = dict(model=args.model, messages=messages, max_tokens=args.max_tokens,
                  temperature=args.temperature, seed=seed)
    if not args.stream:
        r = client.chat.completions.create(**kwargs)
        choice = r.choices[0]
        print(f"  model: {choice.message.content}")
        return choice.message.content or "", choice.model_extra["token_ids"]
    text, ids = "", []
    print("  model: ", end="", flush=True)
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            piece = c.delta.content or ""
            text += piece
            ids += (c.model_extra or {}).get("token_ids") or []
            print(piece, end="", flush=True)
    print()
    return text, ids


def play(args, game, repeat, asked):
    opened = post(args.base_url, "/episodes", {"task_id": f"quiz-{game}"})
    episode = opened["episode_id"]
    client = openai.OpenAI(base_url=args.base_url + opened["base_path"], api_key="unused",
                           max_retries=0)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": asked[0][0]}]
    print(f"game {game}, play {repeat + 1} (episode {episode})")
    print(f"  harness: {asked[0][0]}")
    right, turns = 0, []
    for turn, (question, answer) in enumerate(asked):
        started = time.monotonic()
        seed = ((args.seed * 1000 + game) * 10 + repeat) * 10 + turn
        reply, ids = ask(client, args, messages, seed)
        ok = correct(reply, answer)
        right += ok
        turns.append({"question": question, "answer": answer, "reply": reply,
                      "sampled_ids": len(ids), "correct": ok,
                      "seconds": round(time.monotonic() - started, 2)})
        feedback = "Correct." if ok else f"Not quite: the answer is {answer}."
        messages.append({"role": "assistant", "content": reply})
        if turn + 1 < len(asked):
            feedback += f" Next question: {asked[turn + 1][0]}"
            messages.append({"role": "user", "content": feedback})
        print(f"  harness: {feedback}")
    reward = right / len(asked)
    post(args.base_url, f"/episodes/{episode}/reward", {"reward": reward,
                                                        "success": right == len(asked)})
    view = get(args.base_url, f"/episodes/{episode}")
    segments = view["segments"]
    sampled = sum(sum(s["response_mask"]) for s in segments)
    print(f"  reward {reward:.2f}; the gateway recorded {len(view['calls'])} calls in "
          f"{len(segments)} segment(s): {len(segments[0]['prompt_token_ids'])} prompt ids, "
          f"{sum(len(s['response_token_ids']) for s in segments)} response ids of which "
          f"{sampled} sampled (mask 1)")
    return {"episode_id": episode, "task_id": f"quiz-{game}", "reward": reward, "turns": turns,
            "calls": len(view["calls"]), "segments": len(segments), "sampled_ids": sampled}


def policy_version(base, model):
    """The version that samples now: a one-token call outside any episode (the gateway's
    sampler waits while the trainer updates the weights, so this answer follows an update
    in progress)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    r = client.completions.create(model=model, prompt="ping", max_tokens=1)
    return r.model_extra["policy_version"]


def wait_for_step(args, version, last):
    """Until the policy version passes `version` (the step trained on this group) or, after
    the last group, until the run ends and the gateway refuses calls."""
    while True:
        try:
            now = policy_version(args.base_url, args.model)
        except (openai.APIConnectionError, openai.APIStatusError) as e:
            if last:
                print(f"the training run ended ({type(e).__name__})")
                return
            raise
        if now > version and not last:
            print(f"policy version {now}: the step trained on this game's episodes")
            return
        time.sleep(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="the gateway, e.g. http://127.0.0.1:8410")
    p.add_argument("--model", default="smollm2", help="the config's source.model_name")
    p.add_argument("--games", type=int, default=2)
    p.add_argument("--questions", type=int, default=3, help="questions (turns) per game")
    p.add_argument("--group-size", type=int, default=1,
                   help="plays of each game, one episode each under the game's task id (for "
                        "`cairn train`: the config's rollout.group_size)")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=0, help="question order and request seeds")
    p.add_argument("--stream", action="store_true", help="stream every answer")
    p.add_argument("--train", action="store_true",
                   help="against `cairn train` with rollout.tasks_per_step = 1: after each "
                        "game's group, wait for the training step it starts, so that no "
                        "episode straddles an update (the gateway drops such episodes)")
    p.add_argument("--json", help="write the games as JSON here")
    args = p.parse_args()
    if not 1 <= args.questions <= len(CAPITALS) + len(SUMS):
        sys.exit(f"--questions must be in [1, {len(CAPITALS) + len(SUMS)}]")
    rng = random.Random(args.seed)
    games = []
    for g in range(1, args.games + 1):
        asked = questions(rng, args.questions)
        version = policy_version(args.base_url, args.model) if args.train else None
        games += [play(args, g, r, asked) for r in range(args.group_size)]
        if args.train:
            wait_for_step(args, version, last=g == args.games)
    mean = sum(g["reward"] for g in games) / len(games)
    print(f"mean reward {mean:.2f} over {len(games)} episodes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"games": games, "mean_reward": mean}, f, indent=1)


if __name__ == "__main__":
    main()
