//! The text side of an exported model directory.
//!
//! A Hugging Face model directory that transformers loads and vLLM or SGLang serve needs, next
//! to the weights, the tokenizer (`tokenizer.json`, `tokenizer_config.json` with its chat
//! template, or a separate `chat_template.jinja`) and `generation_config.json` (the stop ids).
//! [`export_tokenizer`] copies these files verbatim from the directory the tokenizer was loaded
//! from, so the served model tokenizes and renders chats byte for byte as the trained one did,
//! and writes a `generation_config.json` from the tokenizer's stop ids when that directory has
//! none (a tokenizer trained for the run, saved by [`Tokenizer::save`]). The weights and
//! `config.json` are the backend's part (`cairn_torch::export`).

use std::path::Path;

use serde_json::{json, Map, Value as Json};

use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// Tokenizer files of a model directory, copied when present. `tokenizer.json` is required.
pub const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// The file holding the default generation settings and stop ids.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Writes the tokenizer files of `src` into `dst` (created if needed) and a
/// `generation_config.json`: `src`'s own, else [`Tokenizer::generation_config`]. The source
/// must load as a [`Tokenizer`] first, so a broken or missing tokenizer is reported (naming
/// the file) before anything is written. Returns the names of the files written, in
/// [`TOKENIZER_FILES`] order, `generation_config.json` last.
pub fn export_tokenizer(src: &Path, dst: &Path) -> Result<Vec<&'static str>> {
    let tokenizer = Tokenizer::from_dir(src)?;
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, e))?;
    let mut written = Vec::new();
    for name in TOKENIZER_FILES.into_iter().chain([GENERATION_CONFIG_FILE]) {
        let from = src.join(name);
        let bytes = match std::fs::read(&from) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&from, e)),
        };
        crate::files::write_atomic(&dst.join(name), &bytes)?;
        written.push(name);
    }
    if !written.contains(&GENERATION_CONFIG_FILE) {
        let text = serde_json::to_string_pretty(&tokenizer.generation_config())
            .expect("a serde_json::Value always serialises");
        crate::files::write_atomic(&dst.join(GENERATION_CONFIG_FILE), (text + "\n").as_bytes())?;
        written.push(GENERATION_CONFIG_FILE);
    }
    Ok(written)
}

impl Tokenizer {
    /// A `generation_config.json` for this tokenizer: its BOS, PAD and stop ids
    /// ([`Tokenizer::eos_ids`], a list when there are several, as transformers writes it).
    /// No sampling defaults: a server then samples with its own or the request's settings.
    pub fn generation_config(&self) -> Json {
        let mut config = Map::new();
        if let Some(id) = self.bos_token_id() {
            config.insert("bos_token_id".into(), json!(id));
        }
        match self.eos_ids() {
            [] => {}
            [id] => {
                config.insert("eos_token_id".into(), json!(id));
            }
            ids => {
                config.insert("eos_token_id".into(), json!(ids));
            }
        }
        if let Some(id) = self.pad_token_id() {
            config.insert("pad_token_id".into(), json!(id));
        }
        Json::Object(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{train_word_level, WordLevelConfig};

    /// A trained tokenizer has no generation_config.json: the export writes one from its stop
    /// and pad ids, and the exported directory loads with the same ids and template.
    #[test]
    fn trained_tokenizer_exports_with_a_generation_config() {
        let src = tempfile::tempdir().expect("tempdir");
        let dst = tempfile::tempdir().expect("tempdir");
        let tokenizer =
            train_word_level(["go to the kitchen"], &WordLevelConfig::default()).expect("trains");
        tokenizer.save(src.path()).expect("saves");
        let written = export_tokenizer(src.path(), dst.path()).expect("exports");
        assert_eq!(
            written,
            [
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json"
            ]
        );
        let eos = tokenizer.eos_token_id().expect("eos");
        let pad = tokenizer.pad_token_id().expect("pad");
        let generation: Json = serde_json::from_str(
            &std::fs::read_to_string(dst.path().join(GENERATION_CONFIG_FILE)).expect("written"),
        )
        .expect("json");
        assert_eq!(
            generation,
            json!({"eos_token_id": eos, "pad_token_id": pad})
        );
        let loaded = Tokenizer::from_dir(dst.path()).expect("loads");
        assert_eq!(loaded.eos_ids(), [eos]);
        assert_eq!(
            loaded.encode("go to the kitchen").expect("encodes"),
            tokenizer.encode("go to the kitchen").expect("encodes")
        );
        assert!(loaded.chat_template().is_some());
    }

    #[test]
    fn missing_tokenizer_is_named_and_nothing_is_written() {
        let src = tempfile::tempdir().expect("tempdir");
        let dst = src.path().join("export");
        let err = export_tokenizer(src.path(), &dst)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let want = format!(
            "{} not found: ",
            src.path().join("tokenizer.json").display()
        );
        assert!(err.starts_with(&want), "{err}");
        assert!(!dst.exists());
    }
}
