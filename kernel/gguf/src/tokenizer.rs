//! The tokenizer files of an imported model, built from the GGUF's `tokenizer.*` metadata:
//! `tokenizer.json` for Hugging Face `tokenizers`, `tokenizer_config.json` (special tokens and
//! the chat template) and `generation_config.json` (BOS, EOS and PAD ids).
//!
//! Only byte-level BPE (`tokenizer.ggml.model` = `gpt2`) is supported. The vocabulary is
//! `tokenizer.ggml.tokens` (already in GPT-2's byte-to-unicode alphabet, `Ġ` for a space), the
//! merges `tokenizer.ggml.merges` (`"left right"`, in rank order), and the pre-tokenizer
//! follows llama.cpp's for `tokenizer.ggml.pre`:
//!
//! | `tokenizer.ggml.pre` | llama.cpp's regexes | `tokenizers` pre-tokenizer |
//! |---|---|---|
//! | `gpt2` | the GPT-2 pattern | `ByteLevel` (no prefix space, GPT-2 regex) |
//! | `smollm` | `\p{N}`, then the GPT-2 pattern | `Digits` (individual digits), then the same `ByteLevel` |
//!
//! Tokens whose `tokenizer.ggml.token_type` is CONTROL (3) become special added tokens and
//! USER_DEFINED (4) ones non-special added tokens, as llama.cpp matches both in text before
//! BPE. The built `tokenizer.json` is loaded with `tokenizers` before anything is written, so
//! a vocabulary or merge list it would refuse is an error at import time.

use std::collections::HashMap;

use std::str::FromStr;

use serde_json::{json, Map, Value as Json};

use crate::error::{GgufError, Result};
use crate::gguf::GgufFile;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The special token ids of the GGUF (`tokenizer.ggml.*_token_id`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: the end of a chat turn, when it differs from EOS.
    pub eot: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
}

/// The three tokenizer files, as JSON.
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    /// `tokenizer.json`, as `tokenizers` loaded it (compact JSON).
    pub tokenizer: String,
    pub tokenizer_config: Json,
    pub generation_config: Json,
    pub special: SpecialIds,
    /// Tokens in the vocabulary (`tokenizer.ggml.tokens`).
    pub vocab_len: usize,
}

fn tok_err(file: &GgufFile, reason: String) -> GgufError {
    GgufError::Tokenizer {
        file: file.path.clone(),
        reason,
    }
}

fn special_id(file: &GgufFile, key: &str, vocab_len: usize) -> Result<Option<u32>> {
    match file.opt_u64(key)? {
        None => Ok(None),
        Some(id) if (id as usize) < vocab_len => Ok(Some(id as u32)),
        Some(id) => Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: key.into(),
            value: id.to_string(),
            supported: format!("an id below the vocabulary size {vocab_len}"),
        }),
    }
}

fn pre_tokenizer(file: &GgufFile) -> Result<Json> {
    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": true,
        "use_regex": true
    });
    match file.req_str("tokenizer.ggml.pre")? {
        "gpt2" => Ok(byte_level),
        "smollm" => Ok(json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level
            ]
        })),
        other => Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: "tokenizer.ggml.pre".into(),
            value: format!("'{other}'"),
            supported: "smollm, gpt2".into(),
        }),
    }
}

/// Builds the tokenizer files. `context_length` becomes `model_max_length`.
///
/// Errors: a tokenizer model other than `gpt2` or a pre-tokenizer other than `smollm`/`gpt2`
/// ([`GgufError::UnsupportedValue`] naming the key), missing tokens or merges, a token listed
/// twice, a merge that is not two tokens, a special id outside the vocabulary, a
/// `tokenizer.json` that `tokenizers` refuses.
pub fn build(file: &GgufFile, context_length: usize) -> Result<TokenizerFiles> {
    let model = file.req_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: "tokenizer.ggml.model".into(),
            value: format!("'{model}'"),
            supported: "gpt2 (byte-level BPE)".into(),
        });
    }
    let pre_tokenizer = pre_tokenizer(file)?;
    let tokens = file.req_str_array("tokenizer.ggml.tokens")?;
    let types = file.opt_int_array("tokenizer.ggml.token_type")?;
    if let Some(types) = &types {
        if types.len() != tokens.len() {
            return Err(tok_err(
                file,
                format!(
                    "tokenizer.ggml.token_type has {} entries for {} tokens",
                    types.len(),
                    tokens.len()
                ),
            ));
        }
    }

    let mut vocab = Map::with_capacity(tokens.len());
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, &token) in tokens.iter().enumerate() {
        if let Some(first) = seen.insert(token, id) {
            return Err(tok_err(
                file,
                format!(
                    "token {token:?} appears twice in tokenizer.ggml.tokens (ids {first} and {id})"
                ),
            ));
        }
        vocab.insert(token.to_string(), json!(id));
        let ty = types.as_ref().map_or(1, |t| t[id]);
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty == TOKEN_TYPE_CONTROL
            }));
        }
    }

    let merges = file
        .req_str_array("tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(rank, merge)| match merge.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => Ok(json!([a, b])),
            _ => Err(tok_err(
                file,
                format!(
                    "tokenizer.ggml.merges entry {rank} is {merge:?}, not two tokens separated \
                     by one space"
                ),
            )),
        })
        .collect::<Result<Vec<_>>>()?;

    let vocab_len = tokens.len();
    let special = SpecialIds {
        bos: special_id(file, "tokenizer.ggml.bos_token_id", vocab_len)?,
        eos: special_id(file, "tokenizer.ggml.eos_token_id", vocab_len)?,
        eot: special_id(file, "tokenizer.ggml.eot_token_id", vocab_len)?,
        pad: special_id(file, "tokenizer.ggml.padding_token_id", vocab_len)?,
        unk: special_id(file, "tokenizer.ggml.unknown_token_id", vocab_len)?,
    };
    let add_bos = file
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(false);
    let add_eos = file
        .opt_bool("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);
    let token = |id: Option<u32>| id.map(|id| tokens[id as usize].to_string());

    // BOS/EOS added by the post-processor, as llama.cpp adds them when tokenizing with
    // `add_special`; none when neither is added.
    let mut ends = [None, None];
    for (slot, add, key, id) in [
        (0, add_bos, "tokenizer.ggml.bos_token_id", special.bos),
        (1, add_eos, "tokenizer.ggml.eos_token_id", special.eos),
    ] {
        if add {
            let id = id.ok_or_else(|| GgufError::MissingKey {
                file: file.path.clone(),
                key: key.into(),
            })?;
            ends[slot] = Some((id, tokens[id as usize]));
        }
    }
    let post_processor = match ends {
        [None, None] => Json::Null,
        [bos, eos] => template_processing(bos, eos),
    };

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": true,
            "use_regex": true
        },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges
        }
    });
    let tokenizer_text = serde_json::to_string(&tokenizer).expect("JSON values serialize");
    tokenizers::Tokenizer::from_str(&tokenizer_text).map_err(|e| {
        tok_err(
            file,
            format!("the tokenizer.json built from the metadata does not load: {e}"),
        )
    })?;

    let mut config = Map::new();
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    for (key, id) in [
        ("bos_token", special.bos),
        ("eos_token", special.eos),
        ("pad_token", special.pad),
        ("unk_token", special.unk),
    ] {
        if let Some(text) = token(id) {
            config.insert(key.into(), json!(text));
        }
    }
    if let Some(template) = file.opt_str("tokenizer.chat_template")? {
        config.insert("chat_template".into(), json!(template));
    }
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    config.insert("model_max_length".into(), json!(context_length));
    // Load `tokenizer.json` as it is; a model-specific class could rebuild its pre-tokenizer.
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));

    let mut generation = Map::new();
    if let Some(id) = special.bos {
        generation.insert("bos_token_id".into(), json!(id));
    }
    match (special.eos, special.eot) {
        (Some(eos), Some(eot)) if eos != eot => {
            generation.insert("eos_token_id".into(), json!([eos, eot]));
        }
        (Some(id), _) | (None, Some(id)) => {
            generation.insert("eos_token_id".into(), json!(id));
        }
        (None, None) => {}
    }
    if let Some(id) = special.pad {
        generation.insert("pad_token_id".into(), json!(id));
    }

    Ok(TokenizerFiles {
        tokenizer: tokenizer_text,
        tokenizer_config: Json::Object(config),
        generation_config: Json::Object(generation),
        special,
        vocab_len,
    })
}

/// A `TemplateProcessing` post-processor adding `bos` before and `eos` after each sequence,
/// as transformers' `LlamaTokenizerFast.update_post_processor` builds it.
fn template_processing(bos: Option<(u32, &str)>, eos: Option<(u32, &str)>) -> Json {
    let special =
        |text: &str, type_id: u32| json!({"SpecialToken": {"id": text, "type_id": type_id}});
    let sequence = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (seq, type_id) in [("A", 0), ("B", 1)] {
        let mut pieces = Vec::new();
        if let Some((_, text)) = bos {
            pieces.push(special(text, type_id));
        }
        pieces.push(sequence(seq, type_id));
        if let Some((_, text)) = eos {
            pieces.push(special(text, type_id));
        }
        if seq == "A" {
            single.clone_from(&pieces);
        }
        pair.extend(pieces);
    }
    let mut special_tokens = Map::new();
    for (id, text) in bos.into_iter().chain(eos) {
        special_tokens.insert(
            text.to_string(),
            json!({"id": text, "ids": [id], "tokens": [text]}),
        );
    }
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special_tokens
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::gguf::Value;

    /// ids: 0 `<|endoftext|>` and 1 `<|im_start|>` (control), 2 `<tool>` (user-defined),
    /// then a b c ab abc Ġ 1 2 3 12 (3..=12).
    const TOKENS: [&str; 13] = [
        "<|endoftext|>",
        "<|im_start|>",
        "<tool>",
        "a",
        "b",
        "c",
        "ab",
        "abc",
        "Ġ",
        "1",
        "2",
        "3",
        "12",
    ];

    fn file(pre: &str, extra: Vec<(&str, Value)>) -> GgufFile {
        let strings = |items: &[&str]| {
            Value::Array(items.iter().map(|s| Value::String(s.to_string())).collect())
        };
        let mut types = vec![Value::I32(1); TOKENS.len()];
        types[0] = Value::I32(3);
        types[1] = Value::I32(3);
        types[2] = Value::I32(4);
        let mut metadata = vec![
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("gpt2".into()),
            ),
            ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".to_string(), strings(&TOKENS)),
            ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
            (
                "tokenizer.ggml.merges".to_string(),
                strings(&["a b", "ab c", "1 2"]),
            ),
            ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(0)),
        ];
        metadata.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        GgufFile {
            path: PathBuf::from("tiny.gguf"),
            version: 3,
            metadata,
            tensors: Vec::new(),
            alignment: 32,
            data_offset: 0,
            file_len: 0,
        }
    }

    fn encode(files: &TokenizerFiles, text: &str, add_special: bool) -> Vec<u32> {
        let tokenizer = tokenizers::Tokenizer::from_str(&files.tokenizer).expect("loads");
        tokenizer
            .encode(text, add_special)
            .expect("encodes")
            .get_ids()
            .to_vec()
    }

    #[test]
    fn smollm_splits_digits_before_byte_level_bpe() {
        let files = build(&file("smollm", vec![]), 64).unwrap();
        // "abc", " " and each digit on its own: the merge `1 2` cannot apply across digits.
        assert_eq!(encode(&files, "abc 123", false), [7, 8, 9, 10, 11]);
        // Control and user-defined tokens are matched in the text before BPE.
        assert_eq!(encode(&files, "<|im_start|>ab<tool>c", false), [1, 6, 2, 5]);
        // Decoding maps `Ġ` back to a space.
        let tokenizer = tokenizers::Tokenizer::from_str(&files.tokenizer).unwrap();
        assert_eq!(tokenizer.decode(&[7, 8, 12, 11], false).unwrap(), "abc 123");
        let special = tokenizer.get_added_tokens_decoder();
        assert!(special[&1].special && !special[&2].special);
    }

    #[test]
    fn gpt2_keeps_digit_runs_together() {
        let files = build(&file("gpt2", vec![]), 64).unwrap();
        // " 123" is one pre-token: Ġ 1 2 3, then the merge `1 2`.
        assert_eq!(encode(&files, "abc 123", false), [7, 8, 12, 11]);
    }

    #[test]
    fn config_files_carry_the_special_tokens_and_template() {
        let files = build(
            &file(
                "smollm",
                vec![
                    ("tokenizer.ggml.padding_token_id", Value::U32(0)),
                    ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
                    ("tokenizer.ggml.eot_token_id", Value::U32(2)),
                    ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
                    (
                        "tokenizer.chat_template",
                        Value::String("{{ bos_token }}{{ messages[0]['content'] }}".into()),
                    ),
                ],
            ),
            128,
        )
        .unwrap();
        assert_eq!(
            files.tokenizer_config,
            json!({
                "add_bos_token": false,
                "add_eos_token": false,
                "bos_token": "<|im_start|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}",
                "clean_up_tokenization_spaces": false,
                "model_max_length": 128,
                "tokenizer_class": "PreTrainedTokenizerFast"
            })
        );
        // An end-of-turn token other than EOS stops generation too.
        assert_eq!(
            files.generation_config,
            json!({"bos_token_id": 1, "eos_token_id": [0, 2], "pad_token_id": 0})
        );
    }

    #[test]
    fn add_bos_token_puts_bos_first() {
        let files = build(
            &file(
                "smollm",
                vec![("tokenizer.ggml.add_bos_token", Value::Bool(true))],
            ),
            64,
        )
        .unwrap();
        assert_eq!(encode(&files, "abc", true), [1, 7]);
        assert_eq!(encode(&files, "abc", false), [7]);
        assert_eq!(files.tokenizer_config["add_bos_token"], json!(true));
    }

    fn error(f: GgufFile) -> String {
        build(&f, 64).unwrap_err().to_string()
    }

    #[test]
    fn unsupported_tokenizers_are_refused_naming_the_key() {
        assert_eq!(
            error(file("qwen2", vec![])),
            "tiny.gguf: key `tokenizer.ggml.pre` = 'qwen2'; supported: smollm, gpt2"
        );
        let mut f = file("smollm", vec![]);
        f.metadata[0].1 = Value::String("llama".into());
        assert_eq!(
            error(f),
            "tiny.gguf: key `tokenizer.ggml.model` = 'llama'; supported: gpt2 (byte-level BPE)"
        );
        let mut f = file("smollm", vec![]);
        f.metadata.retain(|(k, _)| k != "tokenizer.ggml.pre");
        assert_eq!(
            error(f),
            "tiny.gguf: required key `tokenizer.ggml.pre` is missing"
        );
        let mut f = file("smollm", vec![]);
        f.metadata[4].1 = Value::Array(vec![Value::String("abc".into())]);
        assert_eq!(
            error(f),
            "tiny.gguf: tokenizer: tokenizer.ggml.merges entry 0 is \"abc\", not two tokens \
             separated by one space"
        );
        let f = file(
            "smollm",
            vec![("tokenizer.ggml.padding_token_id", Value::U32(13))],
        );
        assert_eq!(
            error(f),
            "tiny.gguf: key `tokenizer.ggml.padding_token_id` = 13; supported: an id below the \
             vocabulary size 13"
        );
        let mut f = file("smollm", vec![]);
        f.metadata[2].1 = Value::Array(vec![Value::String("a".into()), Value::String("a".into())]);
        f.metadata[3].1 = Value::Array(vec![Value::I32(1), Value::I32(1)]);
        assert_eq!(
            error(f),
            "tiny.gguf: tokenizer: token \"a\" appears twice in tokenizer.ggml.tokens (ids 0 and 1)"
        );
    }
}
