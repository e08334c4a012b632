//! The tokenizer of a run, for showing token ids as text: the one `cairn train` saved in the
//! run directory (scratch models), or the pretrained model's (`model.path` of the run's
//! `config.toml`), found as [`cairn::setup::tokenizer_dir`] finds it. Loaded once per run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cairn_kernel::config::PipelineConfig;
use cairn_kernel::text::Tokenizer;
use parking_lot::Mutex;

use super::runs::CONFIG_FILE;

/// Tokenizers by run directory; a run whose tokenizer cannot be loaded keeps its error.
#[derive(Default)]
pub struct TokenizerCache {
    loaded: Mutex<HashMap<PathBuf, Result<Tokenizer, String>>>,
}

impl TokenizerCache {
    /// The tokenizer of the run in `run_dir`, or why there is none (the message names the
    /// file).
    pub fn get(&self, run_dir: &Path) -> Result<Tokenizer, String> {
        let mut loaded = self.loaded.lock();
        loaded
            .entry(run_dir.to_path_buf())
            .or_insert_with(|| load(run_dir))
            .clone()
    }
}

fn load(run_dir: &Path) -> Result<Tokenizer, String> {
    let config_path = run_dir.join(CONFIG_FILE);
    let dir = match PipelineConfig::load(&config_path) {
        Ok(config) => cairn::setup::tokenizer_dir(&config, run_dir),
        // An older or hand-edited config: a scratch run's tokenizer is still in the run dir.
        Err(_) if run_dir.join("tokenizer").is_dir() => run_dir.join("tokenizer"),
        Err(e) => return Err(format!("{e}")),
    };
    Tokenizer::from_dir(&dir).map_err(|e| format!("the run's tokenizer ({}): {e}", dir.display()))
}

/// The text of each token of `ids`, decoded one token at a time (a token that is not valid
/// text alone, e.g. half of a UTF-8 character, shows as its vocabulary entry, else `�`).
pub fn pieces(tokenizer: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| match tokenizer.decode(&[id]) {
            Ok(text) if !text.contains('\u{fffd}') => text,
            _ => tokenizer
                .id_to_token(id)
                .unwrap_or_else(|| "\u{fffd}".into()),
        })
        .collect()
}
