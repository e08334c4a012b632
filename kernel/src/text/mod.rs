//! The text pipeline: tokenizers, chat templates and prompt rendering, with no
//! dependency on tch.
//!
//! - [`Tokenizer`] loads a Hugging Face model directory (`tokenizer.json`,
//!   `tokenizer_config.json`, `generation_config.json`) and knows its special tokens, chat
//!   template and stop ids ([`Tokenizer::eos_ids`]).
//! - [`train_word_level`] builds a small word-level tokenizer for a text environment and
//!   [`Tokenizer::save`] writes it in the same format.
//! - [`ChatTemplate`] renders HF chat templates byte-identically to transformers'
//!   `apply_chat_template` (Python-compatible `tojson`, `raise_exception`, `strftime_now`).
//! - [`ChatFormat`] (a tokenizer, its template, end-of-turn and stop ids) renders prompts for
//!   the rollout and the gateway; sampled ids are never re-rendered or re-tokenised (the
//!   gateway merges calls by ids, in `cairn_gateway::Segment`).
//! - [`parse_tool_calls`] reads Qwen/Hermes `<tool_call>` blocks into OpenAI-style calls.
//! - [`export_tokenizer`] writes the tokenizer files and `generation_config.json` of an
//!   exported (servable) model directory.
//!
//! Callers: the rollout actor and the gateway (prompts, stop ids, tool calls), the tch backend
//! (tokenizer), and the host's set-up (tokenizer training and export).

mod export;
mod format;
mod template;
mod template_fns;
mod tokenizer;
mod tool_calls;
mod train;

pub use export::{export_tokenizer, GENERATION_CONFIG_FILE, TOKENIZER_FILES};
pub use format::ChatFormat;
pub use template::{ChatTemplate, RenderOptions};
pub use template_fns::{py_float_repr, py_json_dumps, strftime, CivilTime, JsonDumps};
pub use tokenizer::Tokenizer;
pub use tool_calls::{
    arguments_to_objects, parse_tool_calls, split_reasoning, MalformedToolCall, ParsedTurn,
    ToolCall,
};
pub use train::{train_word_level, WordLevelConfig, CHATML_TEMPLATE, WORD_PATTERN};
