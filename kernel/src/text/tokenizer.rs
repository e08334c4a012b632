//! [`Tokenizer`]: a Hugging Face `tokenizers` tokenizer plus what a model directory says about
//! it: special tokens and the chat template from `tokenizer_config.json` (or
//! `chat_template.jinja`), and the stop ids from `generation_config.json`.
//!
//! Encoding never adds a BOS/EOS post-processor sequence unless asked
//! ([`Tokenizer::encode_with_special_tokens`]); added tokens that appear in the text
//! (`<|im_start|>`, `<tool_call>`) are always matched as single ids, as transformers does with
//! `split_special_tokens=False`. Text round trips through ids are not bijective for special
//! tokens (agent-lightning #326), so callers keep sampled ids and decode only for display and
//! parsing. Callers: [`super::trace`], the rollout actor, the gateway, the tch backend.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde_json::{Map, Value as Json};
use tokenizers::AddedToken;

use super::template::ChatTemplate;
use crate::error::{Error, Result};

mod word_level;

use word_level::WordLevelEncoder;

/// The named special tokens transformers passes to chat templates (`SPECIAL_TOKENS_ATTRIBUTES`).
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A loaded tokenizer. Cheap to clone (the vocabulary is shared).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// `tokenizer_config.json` as read (or as built by the trainer); written back by `save`.
    config: Map<String, Json>,
    eos_ids: Vec<u32>,
    chat_template: Option<ChatTemplate>,
    /// `inner.get_vocab_size(true)`, counted once: the `tokenizers` call builds a map of the
    /// whole vocabulary each time, and the gateway asks for it on every request.
    vocab_size: usize,
    /// [`Tokenizer::max_token_bytes`], worked out from the same vocabulary map.
    max_token_bytes: Option<usize>,
    /// The scan that encodes a trained word-level tokenizer's plain text without the
    /// `tokenizers` pipeline (`None`: another kind of tokenizer).
    word_level: Option<Arc<WordLevelEncoder>>,
}

impl Tokenizer {
    /// Loads a model directory: `tokenizer.json` (required), `tokenizer_config.json`,
    /// `chat_template.jinja` (preferred over the config's `chat_template`, as in transformers)
    /// and `generation_config.json` (optional). Errors name the file and what is wrong.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let json_path = dir.join("tokenizer.json");
        let text = read_file(&json_path)?;
        let inner = tokenizers::Tokenizer::from_str(&text)
            .map_err(|e| bad_file(&json_path, e.to_string()))?;

        let config_path = dir.join("tokenizer_config.json");
        let config = match read_optional(&config_path)? {
            Some(text) => match serde_json::from_str(&text) {
                Ok(Json::Object(config)) => config,
                Ok(_) => return Err(bad_file(&config_path, "expected a JSON object".into())),
                Err(e) => return Err(bad_file(&config_path, e.to_string())),
            },
            None => Map::new(),
        };
        let mut tokenizer = Tokenizer::from_parts(inner, config, &config_path)?;

        let template_path = dir.join("chat_template.jinja");
        if let Some(source) = read_optional(&template_path)? {
            let template = ChatTemplate::new(&template_path.display().to_string(), &source)?;
            tokenizer.chat_template =
                Some(template.with_special_tokens(tokenizer.special_tokens_map()));
        }

        let generation_path = dir.join("generation_config.json");
        if let Some(text) = read_optional(&generation_path)? {
            let generation: Json = serde_json::from_str(&text)
                .map_err(|e| bad_file(&generation_path, e.to_string()))?;
            let ids = match generation.get("eos_token_id") {
                None | Some(Json::Null) => Vec::new(),
                Some(Json::Array(ids)) => ids
                    .iter()
                    .map(Json::as_u64)
                    .collect::<Option<Vec<_>>>()
                    .unwrap_or_default(),
                Some(id) => id.as_u64().into_iter().collect(),
            };
            if ids.is_empty() && generation.get("eos_token_id").is_some_and(|v| !v.is_null()) {
                return Err(bad_file(
                    &generation_path,
                    "eos_token_id must be an id or a list of ids".into(),
                ));
            }
            for id in ids {
                let id = u32::try_from(id)
                    .map_err(|_| bad_file(&generation_path, format!("eos id {id} out of range")))?;
                if !tokenizer.eos_ids.contains(&id) {
                    tokenizer.eos_ids.push(id);
                }
            }
        }
        Ok(tokenizer)
    }

    /// Loads a bare `tokenizer.json` (no special-token roles, template or stop ids).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let text = read_file(path)?;
        let inner =
            tokenizers::Tokenizer::from_str(&text).map_err(|e| bad_file(path, e.to_string()))?;
        Tokenizer::from_parts(inner, Map::new(), path)
    }

    /// Wraps a built tokenizer with a `tokenizer_config.json`-shaped `config` (special tokens,
    /// `added_tokens_decoder`, `chat_template`). `config_path` only labels errors.
    pub(crate) fn from_parts(
        mut inner: tokenizers::Tokenizer,
        config: Map<String, Json>,
        config_path: &Path,
    ) -> Result<Tokenizer> {
        add_config_tokens(&mut inner, &config, config_path)?;
        // `get_vocab_size(true)` is the length of this map (it builds it too).
        let vocab = inner.get_vocab(true);
        let max_token_bytes = max_token_bytes(&inner, &vocab);
        let word_level = WordLevelEncoder::of(&inner).map(Arc::new);
        let mut tokenizer = Tokenizer {
            word_level,
            inner: Arc::new(inner),
            config,
            eos_ids: Vec::new(),
            chat_template: None,
            vocab_size: vocab.len(),
            max_token_bytes,
        };
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(token) = tokenizer.special_token(key) {
                if tokenizer.token_to_id(token).is_none() {
                    return Err(bad_file(
                        config_path,
                        format!("{key} `{token}` is not in the vocabulary"),
                    ));
                }
            }
        }
        tokenizer.eos_ids = tokenizer.eos_token_id().into_iter().collect();
        tokenizer.chat_template = match tokenizer.config.get("chat_template") {
            None | Some(Json::Null) => None,
            Some(template) => {
                let source = select_template(template).ok_or_else(|| {
                    bad_file(
                        config_path,
                        "chat_template must be a string or a list with a `default` entry".into(),
                    )
                })?;
                let name = format!("{}:chat_template", config_path.display());
                Some(
                    ChatTemplate::new(&name, source)?
                        .with_special_tokens(tokenizer.special_tokens_map()),
                )
            }
        };
        Ok(tokenizer)
    }

    /// Ids of `text`; added tokens in the text map to their ids, no BOS/EOS is added. No
    /// offsets are computed; a trained word-level tokenizer's plain ASCII text is scanned
    /// without the `tokenizers` pipeline, to the same ids ([`word_level`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        if let Some(ids) = self.word_level.as_ref().and_then(|w| w.encode(text)) {
            return Ok(ids);
        }
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Ids of `text` with the post-processor's special tokens (BOS, ...) added.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (`<|im_end|>` stays in the text).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Text of `ids` without the tokens flagged `special` (non-special added tokens such as
    /// Qwen's `<tool_call>` stay).
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The id of a token (vocabulary or added), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of an id, if any.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token that must exist, e.g. a template's end-of-turn token.
    pub fn require_id(&self, token: &str) -> Result<u32> {
        self.token_to_id(token)
            .ok_or_else(|| Error::Tokenizer(format!("token `{token}` is not in the vocabulary")))
    }

    /// Vocabulary size including added tokens (the embedding needs at least this many rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The most bytes of input text one token can stand for, so that a text of more than
    /// `n × max_token_bytes` bytes surely encodes to more than `n` ids (the gateway refuses
    /// such prompts before encoding them). `None` when the tokenizer bounds no such span: a
    /// model with an unknown token that takes a word of any length (word-level, WordPiece,
    /// Unigram, BPE with `fuse_unk`), or a normalizer or pre-tokenizer that may drop text.
    pub fn max_token_bytes(&self) -> Option<usize> {
        self.max_token_bytes
    }

    /// A named special token from the config (`"eos_token"` → `<|im_end|>`), in either the
    /// string or the `{"content": ...}` form.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        match self.config.get(key)? {
            Json::String(token) => Some(token),
            Json::Object(token) => token.get("content")?.as_str(),
            _ => None,
        }
    }

    /// The config's `eos_token` id: the template's end-of-turn token for chat models.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.special_token("eos_token")
            .and_then(|t| self.token_to_id(t))
    }

    /// The config's `pad_token` id.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.special_token("pad_token")
            .and_then(|t| self.token_to_id(t))
    }

    /// The config's `bos_token` id.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special_token("bos_token")
            .and_then(|t| self.token_to_id(t))
    }

    /// Every id that ends generation: the config's `eos_token`, then `generation_config.json`'s
    /// `eos_token_id` list, without duplicates. Qwen3: `[151645 <|im_end|>, 151643 <|endoftext|>]`.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The chat template of the model directory, with the special tokens bound.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The named special tokens as transformers' `special_tokens_map` passes them to templates.
    pub fn special_tokens_map(&self) -> Map<String, Json> {
        SPECIAL_TOKEN_KEYS
            .iter()
            .filter_map(|key| {
                Some((
                    key.to_string(),
                    Json::String(self.special_token(key)?.to_owned()),
                ))
            })
            .collect()
    }

    /// The `tokenizer_config.json` contents.
    pub fn config(&self) -> &Map<String, Json> {
        &self.config
    }

    /// The wrapped `tokenizers` tokenizer, for offsets, batching or streaming decode.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Writes `tokenizer.json` (pretty, deterministic) and `tokenizer_config.json` into `dir`,
    /// creating it; loadable by [`Tokenizer::from_dir`] and by transformers' `AutoTokenizer`.
    /// `generation_config.json` (stop ids) and a separate `chat_template.jinja` belong to the
    /// model export and are not written here.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let json = self
            .inner
            .to_string(true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        write_file(&dir.join("tokenizer.json"), &(json + "\n"))?;
        let config = serde_json::to_string_pretty(&self.config)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        write_file(&dir.join("tokenizer_config.json"), &(config + "\n"))
    }
}

/// The template text of a `chat_template` entry: a string, or the `default` of a named list.
fn select_template(template: &Json) -> Option<&str> {
    match template {
        Json::String(source) => Some(source),
        Json::Array(named) => named
            .iter()
            .find(|entry| entry.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|entry| entry.get("template")?.as_str()),
        _ => None,
    }
}

/// Checks `added_tokens_decoder` against `tokenizer.json` and adds the entries it lacks, which
/// must then land on their declared ids.
fn add_config_tokens(
    inner: &mut tokenizers::Tokenizer,
    config: &Map<String, Json>,
    path: &Path,
) -> Result<()> {
    let Some(Json::Object(decoder)) = config.get("added_tokens_decoder") else {
        return Ok(());
    };
    let mut entries = Vec::new();
    for (id, entry) in decoder {
        let id: u32 = id.parse().map_err(|_| {
            bad_file(
                path,
                format!("added_tokens_decoder key `{id}` is not an id"),
            )
        })?;
        let content = entry.get("content").and_then(Json::as_str).ok_or_else(|| {
            bad_file(path, format!("added_tokens_decoder[{id}] has no `content`"))
        })?;
        let special = entry
            .get("special")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        entries.push((id, content.to_owned(), special));
    }
    entries.sort_by_key(|(id, _, _)| *id);
    for (id, content, special) in entries {
        match inner.token_to_id(&content) {
            Some(existing) if existing == id => {}
            Some(existing) => {
                return Err(bad_file(
                    path,
                    format!(
                        "added token `{content}` has id {id} here but {existing} in tokenizer.json"
                    ),
                ))
            }
            None => {
                let token = AddedToken::from(content.clone(), special).normalized(!special);
                if special {
                    inner.add_special_tokens(&[token]);
                } else {
                    inner.add_tokens(&[token]);
                }
                if inner.token_to_id(&content) != Some(id) {
                    return Err(bad_file(
                        path,
                        format!(
                            "added token `{content}` (id {id}) is missing from tokenizer.json \
                             and does not fit at that id"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Normalizers that may shorten a text: a character folds to one of at least a quarter of
/// its bytes (U+212A KELVIN SIGN, 3 bytes, is `K`; U+1D400, 4 bytes, is `A` under NFKC), and
/// canonical composition folds at most three characters of 9 bytes into one of 3 (Hangul
/// L+V+T).
const SHRINKING_NORMALIZERS: [&str; 5] = ["NFC", "NFD", "NFKC", "NFKD", "Lowercase"];
/// Normalizers that never shorten a text (`Sequence` only chains others). The rest (`Strip`,
/// `Replace`, `BertNormalizer`, `Precompiled`...) may drop any amount of it.
const LENGTHENING_NORMALIZERS: [&str; 3] = ["Prepend", "ByteLevel", "Sequence"];
/// Pre-tokenizers that split the text without dropping any of it (unless a `Split` or
/// `Punctuation` says `"behavior": "Removed"`).
const KEEPING_PRE_TOKENIZERS: [&str; 8] = [
    "ByteLevel",
    "Split",
    "Punctuation",
    "Digits",
    "Metaspace",
    "UnicodeScripts",
    "FixedLength",
    "Sequence",
];

/// See [`Tokenizer::max_token_bytes`]. For a BPE model: the longest vocabulary entry, in input
/// bytes (a byte-level alphabet shows each byte as one character; an added token is matched
/// in the text as it is), at least 4 (an unknown character, when `unk_token` is set without
/// `fuse_unk`), times 4 when a normalizer may shorten the text ([`SHRINKING_NORMALIZERS`]).
fn max_token_bytes(
    inner: &tokenizers::Tokenizer,
    vocab: &std::collections::HashMap<String, u32>,
) -> Option<usize> {
    let tokenizers::models::ModelWrapper::BPE(bpe) = inner.get_model() else {
        return None;
    };
    if bpe.unk_token.is_some() && bpe.fuse_unk {
        return None;
    }
    // The `type` of every component, and whether any drops its delimiters.
    fn components(value: &Json, types: &mut Vec<String>) -> bool {
        match value {
            Json::Object(map) => {
                if let Some(Json::String(t)) = map.get("type") {
                    types.push(t.clone());
                }
                let mut removes = map.get("behavior").and_then(Json::as_str) == Some("Removed");
                for v in map.values() {
                    removes |= components(v, types);
                }
                removes
            }
            Json::Array(items) => {
                let mut removes = false;
                for v in items {
                    removes |= components(v, types);
                }
                removes
            }
            _ => false,
        }
    }
    let mut factor = 1;
    if let Some(normalizer) = inner.get_normalizer() {
        let mut types = Vec::new();
        components(&serde_json::to_value(normalizer).ok()?, &mut types);
        for t in &types {
            if SHRINKING_NORMALIZERS.contains(&t.as_str()) {
                factor = 4;
            } else if !LENGTHENING_NORMALIZERS.contains(&t.as_str()) {
                return None;
            }
        }
    }
    let mut byte_level = false;
    if let Some(pre) = inner.get_pre_tokenizer() {
        let mut types = Vec::new();
        if components(&serde_json::to_value(pre).ok()?, &mut types) {
            return None;
        }
        if types
            .iter()
            .any(|t| !KEEPING_PRE_TOKENIZERS.contains(&t.as_str()))
        {
            return None;
        }
        byte_level = types.iter().any(|t| t == "ByteLevel");
    }
    let added: std::collections::HashSet<String> = inner
        .get_added_tokens_decoder()
        .into_values()
        .map(|t| t.content)
        .collect();
    let longest = vocab
        .keys()
        .map(|token| {
            if byte_level && !added.contains(token) {
                token.chars().count()
            } else {
                token.len()
            }
        })
        .max()
        .unwrap_or(0);
    Some(longest.max(4) * factor)
}

fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => Error::FileNotFound {
            path: path.to_path_buf(),
            error: source,
        },
        _ => Error::io(path, source),
    })
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

fn bad_file(path: &Path, detail: String) -> Error {
    Error::BadFile {
        path: PathBuf::from(path),
        detail,
    }
}
