//! Tests of `cairn_kernel::text` against committed fixtures (`kernel/fixtures/text/`, sources
//! in its NOTICE.md): the real Qwen3 tokenizer, llama.cpp golden ids, four real chat templates
//! with renders from Python jinja2, and the multi-turn token cases of docs/bug-cases.md.

mod chat_template;
mod segments;
mod tokenizer;
mod tool_calls;
mod train;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cairn_kernel::text::{ChatTemplate, Tokenizer};
use serde_json::{json, Value as Json};

pub const QWEN25: &str = "Qwen-Qwen2.5-7B-Instruct.jinja";
pub const QWEN3: &str = "Qwen-Qwen3-0.6B.jinja";

/// A path under `kernel/fixtures/text/`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/text")
        .join(rel)
}

/// The Qwen3 model directory fixture, loaded once per test binary (11 MB of JSON).
pub fn qwen3() -> &'static Tokenizer {
    static QWEN3_TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    QWEN3_TOKENIZER
        .get_or_init(|| Tokenizer::from_dir(&fixture("qwen3")).expect("the qwen3 fixture loads"))
}

/// A chat template fixture by file name.
pub fn template(file: &str) -> ChatTemplate {
    let source = std::fs::read_to_string(fixture("chat-templates").join(file))
        .expect("template fixture exists");
    ChatTemplate::new(file, &source).expect("template fixture compiles")
}

pub fn msg(role: &str, content: &str) -> Json {
    json!({"role": role, "content": content})
}
