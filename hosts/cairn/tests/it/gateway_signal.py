"""Ctrl-C to a running `cairn serve` (driven by tests/it/gateway.rs).

Plays one rewarded episode, then starts a long streamed answer and, once its first chunk is
in, sends SIGINT to the server (`PID`). The stream must still arrive whole (`max_tokens` ids,
finish reason `length`): the requests in flight are answered. A request sent after that must
be refused with the 503 `shutting_down` or a refused connection, never answered or left
hanging. Prints a JSON summary; the Rust test checks the exit status and the record file.
"""

import json
import os
import signal
import sys
import urllib.request

import openai

BASE, PID, LONG = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
MODEL = "cairn"


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    opened = post("/episodes", {"task_id": "before-the-signal"})
    episode = openai.OpenAI(base_url=BASE + opened["base_path"], api_key="x", max_retries=0)
    episode.completions.create(model=MODEL, prompt="one two", max_tokens=2)
    post(f"/episodes/{opened['episode_id']}/reward", {"reward": 1.0})

    client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
    ids, finish, signalled = [], None, False
    for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "go on"}], max_tokens=LONG,
            stream=True, seed=4):
        for c in chunk.choices:
            ids += (c.model_extra or {}).get("token_ids") or []
            finish = c.finish_reason or finish
        if ids and not signalled:
            os.kill(PID, signal.SIGINT)
            signalled = True
    if (len(ids), finish) != (LONG, "length"):
        sys.exit(f"the stream in flight at the signal was cut: {len(ids)} ids, {finish}")

    try:
        client.completions.create(model=MODEL, prompt="after", max_tokens=2, timeout=60)
        sys.exit("a request after the signal was answered")
    except openai.APIStatusError as e:
        if e.status_code != 503 or e.body.get("code") != "shutting_down":
            sys.exit(f"a request after the signal got {e.status_code}: {e.body}")
        after = "503"
    except openai.APITimeoutError:
        sys.exit("a request after the signal hung")
    except openai.APIConnectionError:
        after = "refused"
    print(json.dumps({"episode": opened["episode_id"], "stream_ids": len(ids), "after": after}))


if __name__ == "__main__":
    main()
