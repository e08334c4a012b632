"""SmolLM2-135M-Instruct behind a running `cairn serve` (driven by tests/it/gateway.rs).

With the official `openai` client, greedy (temperature 0):

1. "What is the capital of France?" is answered "The capital of France is Paris." (the
   answer transformers gives on the same weights), ending on `<|im_end|>`;
2. the same request streamed arrives one chunk per sampled id, and the chunks concatenate to
   the same text and ids;
3. a prompt longer than the model's 8192-token context is refused with the lengths.

Exits non-zero with a message on the first failed check; prints a JSON summary otherwise.
"""

import json
import sys

import openai

BASE = sys.argv[1]
MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."


def extra(obj, key):
    return (getattr(obj, "model_extra", None) or {}).get(key)


def main():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
    models = [m.id for m in client.models.list().data]
    if models != [MODEL]:
        sys.exit(f"/v1/models lists {models}")

    kwargs = dict(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    ids = extra(choice, "token_ids")
    if choice.message.content != ANSWER or choice.finish_reason != "stop":
        sys.exit(f"greedy answer: {choice.message.content!r} ({choice.finish_reason})")
    if ids[-1] != 2:
        sys.exit(f"the answer does not end on <|im_end|> (id 2): {ids}")

    text, streamed, content_chunks, finish = "", [], 0, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            piece = extra(c, "token_ids") or []
            text += c.delta.content or ""
            streamed += piece
            content_chunks += bool(piece)
            finish = c.finish_reason or finish
    if (text, streamed, finish) != (ANSWER, ids, "stop"):
        sys.exit(f"stream: {text!r} {streamed} {finish}; not streamed: {ANSWER!r} {ids}")
    # "The capital of France is Paris." is 7 ids, each complete text: a chunk each; the
    # closing <|im_end|> (no text) comes in a chunk of its own.
    if content_chunks != len(ids):
        sys.exit(f"{len(ids)} ids came in {content_chunks} chunks")

    try:
        client.completions.create(model=MODEL, prompt=[1] * 8200, max_tokens=4)
        sys.exit("a prompt past the context window: no error")
    except openai.BadRequestError as e:
        want = ("this model's maximum context length is 8192 tokens, but the request needs "
                "8204: 8200 prompt tokens + max_tokens 4; shorten the prompt or lower max_tokens")
        if e.body.get("code") != "context_length_exceeded" or e.body.get("message") != want:
            sys.exit(f"long prompt: {e.body}")

    print(json.dumps({"answer": choice.message.content, "token_ids": ids,
                      "prompt_tokens": whole.usage.prompt_tokens,
                      "stream_chunks": content_chunks}))


if __name__ == "__main__":
    main()
