#!/usr/bin/env python3
"""Writes kernel/fixtures/text/chat/renders.json: expected chat-template renders for the Rust
tests of kernel/src/text/template.rs.

Each case renders one conversation with one template through a jinja2 environment set up exactly
as Hugging Face transformers' `_cached_compile_jinja_template` does (sandboxed, trim_blocks,
lstrip_blocks, loopcontrols, `tojson` = json.dumps(ensure_ascii=False), `raise_exception`,
`strftime_now`, `dict`, `namespace`) with the inputs `apply_chat_template` passes (None-valued
message keys dropped, reasoning aliased, tools, documents=None, add_generation_prompt, named
special tokens, then extra kwargs). `strftime_now` reads a pinned clock (FIXED_NOW) so the
fixtures are stable; the Rust test pins the same time.

If transformers is installed, every case without `strftime_now` is cross-checked against
transformers' own `render_jinja_template`. If `tokenizers` is installed, the Qwen renders also
get `expected_ids` from the Qwen3 tokenizer.json fixture.

Usage (from the repository root):
    source scripts/env.sh
    python scripts/text/gen_chat_fixtures.py
"""

import copy
import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "kernel" / "fixtures" / "text"
TEMPLATES = FIXTURES / "chat-templates"
OUT = FIXTURES / "chat" / "renders.json"
FIXED_NOW = datetime(2024, 7, 26, 15, 4, 5)

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
HERMES = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
INLINE = "inline"

# Named special tokens as each model's tokenizer_config.json gives them (transformers passes
# only the ones that are set).
SPECIAL_TOKENS = {
    QWEN25: {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    QWEN3: {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    LLAMA31: {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    HERMES: {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|end_of_text|>"},
    INLINE: {},
}


def hf_environment(now):
    """transformers' chat-template environment (utils/chat_template_utils.py), with a pinned clock."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


def normalize(messages):
    """apply_chat_template's _normalize_chat_messages + _alias_reasoning_fields."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next(
            (message[k] for k in ("reasoning_content", "thinking", "reasoning") if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(source, case):
    env = hf_environment(FIXED_NOW)
    kwargs = {**case["special_tokens"], **case["extra"]}
    return env.from_string(source).render(
        messages=normalize(copy.deepcopy(case["messages"])),
        tools=copy.deepcopy(case["tools"]),
        documents=None,
        add_generation_prompt=case["add_generation_prompt"],
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# Conversations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the café <index> & return matches.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Query text"},
                    "max_results": {"type": "integer", "description": "At most this many", "minimum": 1},
                    "threshold": {"type": "number", "description": "Score cut-off", "default": 0.5},
                    "tags": {"type": "array", "items": {"type": "string"}, "description": "Filter tags"},
                },
                "required": ["query"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER_WEATHER = {"role": "user", "content": "What is the weather in Paris?"}


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CALL_WEATHER = {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]}
TOOL_WEATHER = {"role": "tool", "content": "Sunny, 20C"}
FINAL_WEATHER = {"role": "assistant", "content": "It is sunny and 20C in Paris."}

MULTI_TURN = [
    SYSTEM,
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Goodbye!"},
]

UNICODE_USER = {"role": "user", "content": "Café ☕ <b>bold</b> & \"quotes\"\n\tand 日本語 😀"}

TWO_CALLS = {
    "role": "assistant",
    "content": "Let me check both.",
    "tool_calls": [
        call("get_weather", {"city": "Paris", "unit": "celsius"}),
        call("search", {"query": "café ☕ \"best\"", "max_results": 3, "threshold": 0.25, "tags": ["a", "b"]}),
    ],
}
TWO_RESULTS = [
    {"role": "tool", "content": "Sunny, 20C"},
    {"role": "tool", "content": "[\"Le Café\", \"Chez Marie\"]"},
]


def cases():
    out = []

    def add(template, name, messages, *, tools=None, gen=False, extra=None, expect_error=None):
        # expect_error: None (renders), True (any error), or the template's raise_exception message.
        out.append(
            {
                "template": template,
                "case": name,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": gen,
                "extra": extra or {},
                "special_tokens": SPECIAL_TOKENS[template],
                "expect_error": expect_error,
            }
        )

    # The Hermes tool_use template is for requests with tools: it iterates `tools` unguarded.
    for t in [QWEN25, QWEN3, LLAMA31, HERMES]:
        tools = TOOLS[:1] if t == HERMES else None
        add(t, "system_user_prompt", [SYSTEM, {"role": "user", "content": "Hello"}], tools=tools, gen=True)
        add(t, "user_only_prompt", [{"role": "user", "content": "Hello"}], tools=tools, gen=True)
        add(t, "multi_turn_transcript", MULTI_TURN, tools=tools)
        add(t, "multi_turn_prompt", MULTI_TURN + [{"role": "user", "content": "Wait, one more thing."}], tools=tools,
            gen=True)
        add(t, "unicode_and_html", [SYSTEM, UNICODE_USER], tools=tools, gen=True)
    add(HERMES, "no_tools_fails", [{"role": "user", "content": "Hello"}], gen=True, expect_error=True)
    # Known divergence: Python raises TypeError iterating None; minijinja iterates none as empty.
    out[-1]["rust_lenient"] = "minijinja iterates `none` as an empty sequence; Python raises TypeError"

    # Tools: definitions, one call, tool response, final answer.
    for t in [QWEN25, QWEN3, LLAMA31, HERMES]:
        add(t, "tools_prompt", [SYSTEM, USER_WEATHER], tools=TOOLS, gen=True)
        add(t, "tools_no_system_prompt", [USER_WEATHER], tools=TOOLS, gen=True)
        add(t, "tool_call_then_response_prompt", [SYSTEM, USER_WEATHER, CALL_WEATHER, TOOL_WEATHER], tools=TOOLS, gen=True)
        add(
            t,
            "tool_call_full_transcript",
            [SYSTEM, USER_WEATHER, CALL_WEATHER, TOOL_WEATHER, FINAL_WEATHER],
            tools=TOOLS,
        )
    # Several calls and responses in one step (Llama 3.1 refuses: raise_exception).
    for t in [QWEN25, QWEN3, HERMES]:
        add(t, "two_calls_two_results_prompt", [SYSTEM, USER_WEATHER, TWO_CALLS] + TWO_RESULTS, tools=TOOLS, gen=True)
    add(
        LLAMA31,
        "two_calls_raise_exception",
        [SYSTEM, USER_WEATHER, TWO_CALLS] + TWO_RESULTS,
        tools=TOOLS,
        gen=True,
        expect_error="This model only supports single tool-calls at once!",
    )
    # Arguments given as a JSON string (Qwen3 and Hermes print strings verbatim).
    string_args = {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "{\"city\":\"Paris\"}")]}
    for t in [QWEN3, HERMES]:
        add(t, "string_arguments_prompt", [USER_WEATHER, string_args, TOOL_WEATHER], tools=TOOLS, gen=True)
    # verl-6501: the assistant turn carries the raw tool-call text as content.
    raw_call = {
        "role": "assistant",
        "content": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    }
    for t in [QWEN25, QWEN3]:
        add(t, "verl_6501_raw_tool_call_prompt", [USER_WEATHER, raw_call, TOOL_WEATHER], gen=True)

    # Qwen3 reasoning: think blocks dropped before the last user query, kept after it.
    q3_think = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "Times 3?"},
        {"role": "assistant", "content": "12", "reasoning_content": "\nmultiply\n"},
    ]
    add(QWEN3, "think_history_transcript", q3_think)
    add(QWEN3, "think_history_prompt", q3_think + [{"role": "user", "content": "Thanks"}], gen=True)
    add(QWEN3, "verl_3477_transcript", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Times 3?"},
        {"role": "assistant", "content": "12"},
    ])
    add(QWEN3, "enable_thinking_false_prompt", [{"role": "user", "content": "Hi"}], gen=True, extra={"enable_thinking": False})
    add(
        QWEN3,
        "multi_step_tool_reasoning_prompt",
        [
            USER_WEATHER,
            {"role": "assistant", "content": "", "reasoning": "need weather", "tool_calls": [call("get_weather", {"city": "Paris"})]},
            {"role": "tool", "content": "Sunny, 20C"},
            {"role": "assistant", "content": "Checking more.", "reasoning_content": "also search",
             "tool_calls": [call("search", {"query": "Paris"})]},
            {"role": "tool", "content": "<none>"},
        ],
        tools=TOOLS,
        gen=True,
    )
    add(QWEN3, "tool_response_as_user_content", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nx\n</think>\n\nA"},
        {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
    ], gen=True)

    # Llama 3.1 specifics.
    add(LLAMA31, "date_string_and_system_tools", [SYSTEM, USER_WEATHER], tools=TOOLS, gen=True,
        extra={"date_string": "01 Jan 2025", "tools_in_user_message": False})
    add(LLAMA31, "builtin_tools_python_tag", [
        SYSTEM,
        {"role": "user", "content": "Search the news"},
        {"role": "assistant", "tool_calls": [call("brave_search", {"query": "news today"})]},
        {"role": "ipython", "content": {"results": ["a", "b"], "count": 2}},
    ], gen=True, extra={"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]})
    add(LLAMA31, "tool_content_mapping", [
        USER_WEATHER, CALL_WEATHER, {"role": "tool", "content": {"temp_c": 20.5, "sky": "sunny", "rain": None}},
    ], tools=TOOLS, gen=True)
    add(LLAMA31, "tools_without_user_raises", [SYSTEM], tools=TOOLS, gen=True,
        expect_error="Cannot put tools in the first user message when there's no first user message!")

    # Hermes: return types and missing descriptions.
    hermes_tools = [{
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a record.",
            "parameters": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "  Record key  "},
                    "ids": {"type": "array", "items": {"type": "integer"}, "description": "Ids"},
                    "meta": {"type": "object", "additionalProperties": {"type": "number"}, "description": "Meta"},
                    "mode": {"type": ["string", "integer"], "description": "Mode"},
                },
                "required": ["key"],
            },
            "return": {"type": "string", "description": "The record."},
        },
    }, {"type": "function", "function": {"name": "ping", "description": "Ping.",
                                          "parameters": {"type": "object", "properties": {}}}}]
    add(HERMES, "return_and_union_types", [USER_WEATHER], tools=hermes_tools, gen=True)

    # Inline templates for the environment helpers (strftime_now, tojson options, string methods).
    inline = [
        ("strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %-d %H:%M:%S %j %y %p %I') }}", {}),
        (
            "tojson_options",
            "{{ data | tojson }}\n{{ data | tojson(indent=2) }}\n{{ data | tojson(sort_keys=true) }}\n"
            "{{ data | tojson(separators=(',', ':')) }}\n{{ data | tojson(ensure_ascii=true) }}\n"
            "{{ data | tojson(indent='\\t') }}",
            {"data": {"z": [1, 2.5, 1e-05, 1e16, 0.1, -0.0, 123456789.123, 12345678901234567890],
                      "a": "héllo ☃ \u2028 <>&' \u0001\u001f\t", "n": None, "t": True, "e": {}, "l": [],
                      "nested": {"k": [{"x": 1.0}]}}},
        ),
        (
            "string_methods",
            "{{ s.strip() }}|{{ s.lstrip(' x') }}|{{ s.rstrip() }}|{{ s.split('</think>')[-1] }}|"
            "{{ 'T' if s.startswith('  x') else 'F' }}|{{ 'T' if s.endswith('y  ') else 'F' }}|{{ s.upper() }}|{{ s.replace('x', 'X') }}|"
            "{{ s.split() | join(',') }}|{{ 'T' if '</think>' in s else 'F' }}|{{ s | trim }}|{{ d.get('a') }}|{{ d.get('zz', 'dflt') }}|"
            "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d | items | list | length }}",
            {"s": "  xa</think>b y  ", "d": {"b": 1, "a": 2}},
        ),
    ]
    for name, source, extra in inline:
        out.append({"template": INLINE, "source": source, "case": name, "messages": [], "tools": None,
                    "add_generation_prompt": False, "extra": extra, "special_tokens": {}, "expect_error": None})
    return out


def main():
    try:
        from transformers import __version__ as transformers_version
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        transformers_version, render_jinja_template = None, None
    try:
        from tokenizers import Tokenizer
        qwen = Tokenizer.from_file(str(FIXTURES / "qwen3" / "tokenizer.json"))
    except ImportError:
        qwen = None

    results = []
    for case in cases():
        source = case.pop("source", None)
        if source is None:
            source = (TEMPLATES / case["template"]).read_text(encoding="utf-8")
        else:
            case["source"] = source
        try:
            expected = render(source, case)
            error = None
        except Exception as e:  # noqa: BLE001 - jinja2 lets TypeError etc. through
            expected, error = None, f"{type(e).__name__}: {e}"
        if case["expect_error"] is True:
            assert error is not None, case["case"]
        elif case["expect_error"] is not None:
            assert error == f"TemplateError: {case['expect_error']}", (case["case"], error)
        else:
            assert error is None, (case["template"], case["case"], error)

        if render_jinja_template is not None and "strftime_now" not in source and error is None:
            kwargs = {**case["special_tokens"], **case["extra"]}
            rendered, _ = render_jinja_template(
                conversations=[normalize(copy.deepcopy(case["messages"]))],
                tools=copy.deepcopy(case["tools"]),
                chat_template=source,
                add_generation_prompt=case["add_generation_prompt"],
                **kwargs,
            )
            assert rendered[0] == expected, f"transformers disagrees on {case['template']} {case['case']}"

        case["expected"] = expected
        case["python_error"] = error
        if qwen is not None and expected is not None and case["template"] in (QWEN25, QWEN3):
            case["expected_ids"] = qwen.encode(expected, add_special_tokens=False).ids
        results.append(case)

    doc = {
        "about": "Chat-template renders by Python jinja2 set up like transformers' apply_chat_template; "
                 "generated by scripts/text/gen_chat_fixtures.py. Do not edit by hand.",
        "jinja2": jinja2.__version__,
        "transformers_cross_check": transformers_version,
        "now": FIXED_NOW.isoformat(),
        "cases": results,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(results)} cases to {OUT.relative_to(ROOT)} "
          f"(jinja2 {jinja2.__version__}, transformers cross-check: {transformers_version})", file=sys.stderr)


if __name__ == "__main__":
    main()
