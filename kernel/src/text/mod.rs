//! The text pipeline: tokenizers, chat templates and multi-turn token bookkeeping, with no
//! dependency on tch.
//!
//! - [`Tokenizer`] loads a Hugging Face model directory (`tokenizer.json`,
//!   `tokenizer_config.json`, `generation_config.json`) and knows its special tokens, chat
//!   template and stop ids ([`Tokenizer::eos_ids`]).
//! - [`train_word_level`] builds a small word-level tokenizer for a text environment and
//!   [`Tokenizer::save`] writes it in the same format.
//! - [`ChatTemplate`] renders HF chat templates byte-identically to transformers'
//!   `apply_chat_template` (Python-compatible `tojson`, `raise_exception`, `strftime_now`).
//! - [`TokenTrace`] (with a [`ChatFormat`]) keeps the exact ids of an episode: prompt, sampled
//!   turns (loss mask 1) and template-inserted observation ids (mask 0), never re-tokenising
//!   model output.
//! - [`parse_tool_calls`] reads Qwen/Hermes `<tool_call>` blocks into OpenAI-style calls.
//! - [`export_tokenizer`] writes the tokenizer files and `generation_config.json` of an
//!   exported (servable) model directory.
//!
//! Callers: the rollout actor and the gateway (traces, stop ids, tool calls), the tch backend
//! (tokenizer), and the host's set-up (tokenizer training and export).

mod export;
mod template;
mod template_fns;
mod tokenizer;
mod tool_calls;
mod trace;
mod train;

pub use export::{export_tokenizer, GENERATION_CONFIG_FILE, TOKENIZER_FILES};
pub use template::{ChatTemplate, RenderOptions};
pub use template_fns::{py_float_repr, py_json_dumps, strftime, CivilTime, JsonDumps};
pub use tokenizer::Tokenizer;
pub use tool_calls::{
    arguments_to_objects, parse_tool_calls, split_reasoning, MalformedToolCall, ParsedTurn,
    ToolCall,
};
pub use trace::{ChatFormat, PrefixMismatch, Span, SpanKind, TokenTrace};
pub use train::{train_word_level, WordLevelConfig, CHATML_TEMPLATE, WORD_PATTERN};
