"""Bad input against a running `cairn serve` (driven by tests/it/gateway.rs).

Each bad request must get an OpenAI-style error with the right status, the server must keep
serving, and an episode in progress must be unaffected. Exits non-zero with a message on the
first failed check; prints a JSON summary otherwise.
"""

import json
import socket
import sys
import urllib.error
import urllib.request

import openai

BASE = sys.argv[1]  # http://127.0.0.1:PORT
CONTEXT = int(sys.argv[2])  # the served model's context window, tokens
MODEL = "cairn"


def raw(method, path, body=None):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def expect_error(what, status, body, want_status, want_type=None, want_code=None):
    error = body.get("error") if isinstance(body, dict) else None
    ok = (status == want_status and isinstance(error, dict)
          and isinstance(error.get("message"), str) and error.get("message")
          and (want_type is None or error.get("type") == want_type)
          and (want_code is None or error.get("code") == want_code))
    if not ok:
        sys.exit(f"{what}: expected {want_status} {want_type} {want_code}, got {status} {body}")


def main():
    results = {}
    # An episode in progress, continued after every bad request below.
    status, opened = raw("POST", "/episodes", {"task_id": "steady"})
    assert status == 200, opened
    ep = opened["episode_id"]
    steady = openai.OpenAI(base_url=BASE + opened["base_path"], api_key="x", max_retries=0)
    first = steady.completions.create(model=MODEL, prompt="one two three", max_tokens=3)
    first_prompt = first.choices[0].model_extra["prompt_token_ids"]
    first_ids = first.choices[0].model_extra["token_ids"]

    client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
    user = [{"role": "user", "content": "hello"}]

    status, body = raw("POST", "/v1/chat/completions", b'{"model": "cairn", "messages": [')
    expect_error("malformed JSON", status, body, 400, "invalid_request_error", "invalid_json")
    results["malformed_json"] = status

    try:
        client.chat.completions.create(model="gpt-9", messages=user, max_tokens=2)
        sys.exit("unknown model: no error")
    except openai.NotFoundError as e:
        expect_error("unknown model", e.status_code, e.body and {"error": e.body}, 404,
                     "not_found_error", "model_not_found")
        results["unknown_model"] = e.status_code

    # Past the context window: refused with the window, the prompt's tokens and max_tokens.
    window = f"this model's maximum context length is {CONTEXT} tokens, but "
    over = CONTEXT + 476
    cases = [
        ([11] * over, 2, f"the request needs {over + 2}: {over} prompt tokens + max_tokens 2; "
                         "shorten the prompt or lower max_tokens"),
        ([11] * over, None, f"the prompt has {over} tokens, which leaves no room for a "
                            "completion; shorten the prompt"),
        ([11] * 10, CONTEXT, f"the request needs {CONTEXT + 10}: 10 prompt tokens + max_tokens "
                             f"{CONTEXT}; shorten the prompt or lower max_tokens"),
    ]
    for prompt, max_tokens, tail in cases:
        limit = {} if max_tokens is None else {"max_tokens": max_tokens}
        try:
            client.completions.create(model=MODEL, prompt=prompt, **limit)
            sys.exit(f"a prompt of {len(prompt)} tokens + max_tokens {max_tokens}: no error")
        except openai.BadRequestError as e:
            expect_error("long prompt", e.status_code, {"error": e.body}, 400,
                         "invalid_request_error", "context_length_exceeded")
            if e.body["message"] != window + tail or e.body.get("param") != "prompt":
                sys.exit(f"long prompt: got {e.body}, expected the message {window + tail!r}")
    long_text = " ".join(["word"] * 5000)
    try:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": long_text}])
        sys.exit("prompt longer than the context window: no error")
    except openai.BadRequestError as e:
        expect_error("long chat prompt", e.status_code, {"error": e.body}, 400,
                     "invalid_request_error", "context_length_exceeded")
        message = e.body["message"]
        if not (message.startswith(window + "the request needs ")
                and "prompt tokens + max_tokens 2;" in message and e.body["param"] == "messages"):
            sys.exit(f"long chat prompt: {e.body}")
        results["context_window"] = e.status_code

    try:
        client.chat.completions.create(model=MODEL, messages=user, max_tokens=-5)
        sys.exit("negative max_tokens: no error")
    except openai.BadRequestError as e:
        expect_error("negative max_tokens", e.status_code, {"error": e.body}, 400,
                     "invalid_request_error")
        results["negative_max_tokens"] = e.status_code

    # Options whose answer the gateway cannot give, and a prompt of the wrong shape: a 400
    # that names the parameter, never a silently different answer.
    refused = [
        ("/v1/completions", {"prompt": "hi", "logprobs": 5}, "logprobs"),
        ("/v1/chat/completions", {"messages": user, "logprobs": True, "top_logprobs": 5},
         "top_logprobs"),
        ("/v1/completions", {"prompt": {"text": "hi"}}, "prompt"),
        ("/v1/completions", {"prompt": [1.5, 2]}, "prompt"),
        # A value of the wrong type is named by its field, not as the whole body.
        ("/v1/chat/completions", {"messages": user, "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/chat/completions", {"messages": user, "max_tokens": 1e23}, "max_tokens"),
    ]
    for path, extra, param in refused:
        status, body = raw("POST", path, {"model": MODEL, "max_tokens": 2, **extra})
        expect_error(f"{path} {extra}", status, body, 400, "invalid_request_error")
        if body["error"].get("param") != param:
            sys.exit(f"{path} {extra}: expected param {param}, got {body}")
    status, body = raw("POST", "/v1/completions",
                       {"model": MODEL, "prompt": "hi", "max_tokens": 2, "logprobs": 1})
    if status != 200 or len(body["choices"][0]["logprobs"]["token_logprobs"]) != 2:
        sys.exit(f"completions with logprobs 1: {status} {body}")
    results["refused_options"] = len(refused)

    status, body = raw("POST", "/episodes/no-such-episode/v1/chat/completions",
                       {"model": MODEL, "messages": user, "max_tokens": 2})
    expect_error("unknown episode", status, body, 404, "not_found_error", "episode_not_found")
    status, body = raw("POST", "/episodes/no-such-episode/reward", {"reward": 1})
    expect_error("reward for an unknown episode", status, body, 404)
    results["unknown_episode"] = status

    status, other = raw("POST", "/episodes", {"task_id": "twice"})
    status, body = raw("POST", f"/episodes/{other['episode_id']}/reward", {"reward": 1})
    assert status == 200, body
    status, body = raw("POST", f"/episodes/{other['episode_id']}/reward", {"reward": 0})
    expect_error("reward twice", status, body, 409, "conflict_error", "reward_already_posted")
    results["reward_twice"] = status

    # A client that disconnects mid-stream, and one that leaves before any answer.
    status, victim = raw("POST", "/episodes", {"task_id": "victim"})
    host, port = BASE.removeprefix("http://").split(":")
    request = json.dumps({"model": MODEL, "messages": user, "max_tokens": 16,
                          "stream": True}).encode()
    head = (f"POST /episodes/{victim['episode_id']}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(request)}\r\n\r\n")
    for read in (64, 0):
        s = socket.create_connection((host, int(port)), timeout=30)
        s.sendall(head.encode() + request)
        if read:
            s.recv(read)
        s.close()
    results["disconnects"] = 2

    # The server still serves, and the steady episode continues: its next call extends the
    # first call's ids, so it merges; its reward is accepted.
    status, health = raw("GET", "/health")
    assert status == 200 and health["status"] == "ok", health
    again = steady.completions.create(model=MODEL, prompt=first_prompt + first_ids + [11, 12],
                                      max_tokens=3)
    cairn = again.model_extra["cairn"]
    if [c["merged"] for c in cairn["calls"]] != [True]:
        sys.exit(f"the steady episode's continuation did not merge: {cairn}")
    status, body = raw("POST", f"/episodes/{ep}/reward", {"reward": 0.5})
    assert status == 200, body
    status, view = raw("GET", f"/episodes/{ep}")
    assert status == 200 and view["status"] == "rewarded", view
    if len(view["calls"]) != 2 or len(view["segments"]) != 1:
        sys.exit(f"the steady episode was affected: {view}")
    status, body = raw("POST", f"/episodes/{victim['episode_id']}/reward", {"reward": 0})
    assert status == 200, body
    results["steady_calls"] = len(view["calls"])
    status, body = raw("GET", "/no/such/route")
    expect_error("unknown route", status, body, 404)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
