//! Word-level tokenizers trained on environment text, saved in Hugging Face format.
//!
//! Small policies (around a million parameters) on text environments train far better on whole
//! words than on byte-level BPE pieces. [`train_word_level`] builds a `WordLevel` model whose
//! pre-tokenizer is a GPT-2-style split on words (with their leading space), single digits,
//! single punctuation marks and whitespace runs, with a `Fuse` decoder: decoding concatenates
//! tokens, so in-vocabulary text round-trips exactly (`decode(encode(t)) == t`) and re-encoding
//! decoded ids gives the same ids, which [`super::trace`] relies on. Unknown words become the
//! `[UNK]` token.
//!
//! Every word is added in both forms (`"apple"` and `" apple"`), so a word seen only mid-line
//! still encodes at the start of a line; digits, the ChatML role names, `"\n"` and `" "` are
//! always in the vocabulary. Ids: special tokens first in the given order, then required words,
//! then the rest by descending count, ties by text. Same corpus multiset, same
//! `tokenizer.json` bytes. Caller: the host's set-up for small models (it saves the result
//! next to the model weights).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use serde_json::{json, Map, Value as Json};
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// The pre-tokenizer regex (Oniguruma): a word with its optional leading space, one digit, one
/// other symbol, or one whitespace character (a space before a word goes to the word). Single
/// whitespace characters keep any layout encodable without `[UNK]`.
pub const WORD_PATTERN: &str = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]|\s";

/// A minimal ChatML template (Qwen's markup, no tools, no system default) for trained
/// tokenizers: `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// What [`train_word_level`] builds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordLevelConfig {
    /// Added special tokens, given ids `0..` in this order. Must contain the three below.
    pub special_tokens: Vec<String>,
    pub unk_token: String,
    /// The end-of-turn token (`eos_token` in `tokenizer_config.json`).
    pub eos_token: String,
    pub pad_token: String,
    /// Words seen fewer times are left out (and encode as `unk_token`).
    pub min_frequency: u64,
    /// Upper bound on the vocabulary, special tokens included.
    pub max_vocab_size: usize,
    /// Words always in the vocabulary (both space forms), whatever their count.
    pub required_words: Vec<String>,
    /// The template written as `chat_template`.
    pub chat_template: String,
}

impl Default for WordLevelConfig {
    fn default() -> Self {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        WordLevelConfig {
            special_tokens: strings(&[
                "<|endoftext|>",
                "<|im_start|>",
                "<|im_end|>",
                "<pad>",
                "[UNK]",
            ]),
            unk_token: "[UNK]".into(),
            eos_token: "<|im_end|>".into(),
            pad_token: "<pad>".into(),
            min_frequency: 1,
            max_vocab_size: 8192,
            required_words: strings(&[
                "\n",
                " ",
                "\t",
                "system",
                "user",
                "assistant",
                "tool",
                "0",
                "1",
                "2",
                "3",
                "4",
                "5",
                "6",
                "7",
                "8",
                "9",
            ]),
            chat_template: CHATML_TEMPLATE.into(),
        }
    }
}

/// Trains a word-level tokenizer on `corpus` (raw environment text, or rendered chats: special
/// tokens in the text are recognised and not counted).
pub fn train_word_level<I, S>(corpus: I, config: &WordLevelConfig) -> Result<Tokenizer>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    for (role, token) in [
        ("unk", &config.unk_token),
        ("eos", &config.eos_token),
        ("pad", &config.pad_token),
    ] {
        if !config.special_tokens.contains(token) {
            return Err(Error::Tokenizer(format!(
                "{role} token `{token}` must be one of the special tokens"
            )));
        }
    }
    let split = Split::new(
        SplitPattern::Regex(WORD_PATTERN.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::Tokenizer(format!("word pattern: {e}")))?;

    // Count by the word without its leading space; whitespace counts as itself.
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for text in corpus {
        for segment in split_specials(text.as_ref(), &config.special_tokens) {
            let mut pieces = PreTokenizedString::from(segment);
            split
                .pre_tokenize(&mut pieces)
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
            for (piece, _, _) in pieces.get_splits(OffsetReferential::Original, OffsetType::Byte) {
                *counts.entry(base_form(piece).to_owned()).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<(&str, u64)> = counts
        .iter()
        .filter(|(_, &n)| n >= config.min_frequency)
        .map(|(w, &n)| (w.as_str(), n))
        .collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));

    let mut vocab: Vec<String> = config.special_tokens.clone();
    let mut seen: BTreeSet<String> = vocab.iter().cloned().collect();
    let words = config
        .required_words
        .iter()
        .map(|w| base_form(w))
        .chain(ranked.iter().map(|(w, _)| *w));
    for word in words {
        for form in space_forms(word) {
            if vocab.len() < config.max_vocab_size && seen.insert(form.clone()) {
                vocab.push(form);
            }
        }
    }

    let added: Vec<Json> = config
        .special_tokens
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            })
        })
        .collect();
    let vocab_map: Map<String, Json> = vocab
        .iter()
        .enumerate()
        .map(|(id, w)| (w.clone(), json!(id)))
        .collect();
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split", "pattern": {"Regex": WORD_PATTERN}, "behavior": "Isolated", "invert": false,
        },
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab_map, "unk_token": config.unk_token},
    });
    let inner = tokenizers::Tokenizer::from_str(&tokenizer_json.to_string())
        .map_err(|e| Error::Tokenizer(format!("building the word-level tokenizer: {e}")))?;

    let decoder: Map<String, Json> = config
        .special_tokens
        .iter()
        .enumerate()
        .map(|(id, content)| {
            let entry = json!({
                "content": content, "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": true,
            });
            (id.to_string(), entry)
        })
        .collect();
    let mut tokenizer_config = Map::new();
    tokenizer_config.insert("added_tokens_decoder".into(), Json::Object(decoder));
    tokenizer_config.insert("bos_token".into(), Json::Null);
    tokenizer_config.insert("chat_template".into(), json!(config.chat_template));
    tokenizer_config.insert("clean_up_tokenization_spaces".into(), json!(false));
    tokenizer_config.insert("eos_token".into(), json!(config.eos_token));
    tokenizer_config.insert("pad_token".into(), json!(config.pad_token));
    tokenizer_config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    tokenizer_config.insert("unk_token".into(), json!(config.unk_token));
    Tokenizer::from_parts(
        inner,
        tokenizer_config,
        Path::new("<trained>/tokenizer_config.json"),
    )
}

/// A piece without its leading space (a whitespace piece is kept whole).
fn base_form(piece: &str) -> &str {
    match piece.strip_prefix(' ') {
        Some(rest) if !rest.is_empty() && !rest.starts_with(char::is_whitespace) => rest,
        _ => piece,
    }
}

/// `word` and `" word"`, or the whitespace alone.
fn space_forms(word: &str) -> Vec<String> {
    if word.chars().all(char::is_whitespace) {
        vec![word.to_owned()]
    } else {
        vec![word.to_owned(), format!(" {word}")]
    }
}

/// The text between occurrences of the special tokens (leftmost, then longest match).
fn split_specials<'a>(text: &'a str, specials: &[String]) -> Vec<&'a str> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let next = specials
            .iter()
            .filter_map(|s| rest.find(s.as_str()).map(|at| (at, s.len())))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        match next {
            Some((at, len)) => {
                if at > 0 {
                    segments.push(&rest[..at]);
                }
                rest = &rest[at + len..];
            }
            None => {
                if !rest.is_empty() {
                    segments.push(rest);
                }
                return segments;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_forms() {
        assert_eq!(base_form(" apple"), "apple");
        assert_eq!(base_form("apple"), "apple");
        assert_eq!(base_form(" "), " ");
        assert_eq!(base_form("\n\n"), "\n\n");
        assert_eq!(
            split_specials(
                "<|im_start|>user\nhi<|im_end|>\n",
                &["<|im_start|>".into(), "<|im_end|>".into()]
            ),
            ["user\nhi", "\n"]
        );
    }
}
