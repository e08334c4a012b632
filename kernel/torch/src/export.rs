//! Export of a policy as a servable Hugging Face model directory.
//!
//! [`export_model_dir`] writes everything transformers needs to load the model
//! (`AutoModelForCausalLM` and `AutoTokenizer`) and vLLM or SGLang need to serve it:
//!
//! | file                     | from                                                        |
//! |--------------------------|-------------------------------------------------------------|
//! | `model.safetensors`      | the model's weights, HF names, the model's dtype            |
//! | `config.json`            | [`crate::model::ModelConfig::to_hf_json`]                    |
//! | tokenizer files          | copied verbatim from the tokenizer's directory              |
//! | `generation_config.json` | the tokenizer directory's, else built from its stop ids     |
//!
//! The tokenizer files are the text side's business ([`cairn_kernel::text::export_tokenizer`]);
//! this module adds the weights and checks that the two belong together. Callers:
//! [`crate::TorchBackend::export`], and hosts exporting a trained policy.

use std::path::Path;

use cairn_kernel::text::{export_tokenizer, Tokenizer};

use crate::error::{Error, Result};
use crate::model::CausalLm;
use crate::weights::{save_model_dir, CONFIG_FILE, MODEL_FILE};

/// Writes `model` and the tokenizer of `tokenizer_dir` as one HF model directory `dir`
/// (created if needed). The tokenizer is loaded and checked first (every id it can produce
/// must have an embedding row), so a bad tokenizer writes nothing. Returns the names of the
/// files written.
pub fn export_model_dir(model: &CausalLm, tokenizer_dir: &Path, dir: &Path) -> Result<Vec<String>> {
    let tokenizer = Tokenizer::from_dir(tokenizer_dir)?;
    let model_vocab = model.config().vocab_size;
    if tokenizer.vocab_size() > model_vocab {
        return Err(Error::TokenizerMismatch {
            dir: tokenizer_dir.to_path_buf(),
            tokenizer_vocab: tokenizer.vocab_size(),
            model_vocab,
        });
    }
    save_model_dir(model, dir)?;
    let mut files = vec![MODEL_FILE.to_string(), CONFIG_FILE.to_string()];
    files.extend(
        export_tokenizer(tokenizer_dir, dir)?
            .into_iter()
            .map(String::from),
    );
    tracing::info!(dir = %dir.display(), files = files.len(), "exported model directory");
    Ok(files)
}
