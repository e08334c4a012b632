#!/usr/bin/env python3
"""A TextWorld agent harness, trained through Cairn's gateway (docs/gateway.md).

Games are coin-collector games made locally with `tw-make` (the textworld wheel ships the
Inform compiler). Each turn the agent shows the model the observation and the numbered
admissible commands and asks for a number; the first digit of the answer picks the command (no
digit, or one out of range: the turn is wasted on `look`). An episode ends when the coin is
taken (reward 1) or after `--max-steps` turns (reward 0).

Modes:
  --corpus FILE   write the games' text (observations, commands, the prompt frame) for
                  `model.scratch.tokenizer_corpus`
  --train STEPS   play STEPS rounds of `tasks_per_step` games × `group_size` episodes through
                  episodes (POST /episodes with the game as task id, reward posted at the end)
  --eval          play each game once, greedy (temperature 0), without episodes; print the
                  win rate as JSON

    python examples/gateway/textworld_agent.py --games 'runs/textworld/games/cc_*_s10?.z8' \\
        --base-url http://127.0.0.1:8400 --eval
"""

import argparse
import glob
import json
import random
import re
import urllib.request

import openai
import textworld

INFOS = textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=True)
SYSTEM = "You play a text game. Answer with the number of one command."


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def clean(text):
    """The room part of an observation, without TextWorld's banner."""
    text = text.split("$$$$$$$")[-1] if "$$$$$$$" in text else text
    return re.sub(r"\s+", " ", text).strip()


def prompt(observation, commands):
    listed = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(commands))
    return f"{clean(observation)}\nCommands:\n{listed}\nNumber:"


def choose(text, commands):
    m = re.search(r"\d", text or "")
    k = int(m.group()) - 1 if m else -1
    return commands[k] if 0 <= k < len(commands) else "look"


def play(client, model, game, max_steps, temperature, seed):
    env = textworld.start(game, INFOS)
    state = env.reset()
    won = False
    for turn in range(max_steps):
        commands = sorted(state.admissible_commands)
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": prompt(state.feedback, commands)}]
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                           temperature=temperature, seed=seed * 100 + turn)
        state, _, done = env.step(choose(r.choices[0].message.content, commands))
        if state.won:
            won = True
            break
        if done:
            break
    env.close()
    return won


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--games", required=True, help="glob of .z8 games")
    p.add_argument("--base-url", help="the gateway root, http://HOST:PORT")
    p.add_argument("--model", default="cairn")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--corpus")
    p.add_argument("--train", type=int, default=0, metavar="STEPS")
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--eval", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    games = sorted(glob.glob(args.games))
    if not games:
        raise SystemExit(f"no games match {args.games}; make them with tw-make (docs/gateway.md)")

    if args.corpus:
        lines = [SYSTEM, "Commands:", "Number:", "look"] + [str(i) for i in range(10)]
        for game in games:
            env = textworld.start(game, INFOS)
            state = env.reset()
            for command in state.policy_commands + ["look", "inventory"]:
                commands = sorted(state.admissible_commands)
                lines += prompt(state.feedback, commands).split("\n")
                state, _, _ = env.step(command)
            env.close()
        with open(args.corpus, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(json.dumps({"corpus": args.corpus, "lines": len(lines)}))
        return

    if args.eval:
        client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="unused", max_retries=0)
        wins = [play(client, args.model, g, args.max_steps, 0.0, args.seed) for g in games]
        print(json.dumps({"games": len(games), "wins": sum(wins),
                          "win_rate": sum(wins) / len(games), "seed": args.seed,
                          "per_game": dict(zip(games, wins))}))
        return

    rng = random.Random(args.seed)
    for step in range(args.train):
        picked = rng.sample(games, min(args.tasks_per_step, len(games)))
        wins = 0
        for g in range(args.group_size):
            for game in picked:
                opened = post(f"{args.base_url}/episodes", {"task_id": game})
                client = openai.OpenAI(base_url=args.base_url + opened["base_path"],
                                       api_key="unused", max_retries=0)
                won = play(client, args.model, game, args.max_steps, 1.0,
                           rng.randrange(1 << 30))
                wins += won
                post(f"{args.base_url}/episodes/{opened['episode_id']}/reward",
                     {"reward": float(won)})
        print(json.dumps({"step": step, "train_win_rate":
                          wins / (args.group_size * len(picked))}), flush=True)


if __name__ == "__main__":
    main()
