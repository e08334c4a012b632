//! The scratch model of `[model.scratch]` as a [`ModelConfig`]: one definition for the
//! backend ([`crate::setup`]) and the memory pre-flight ([`crate::memory`]), so the estimate
//! is made for the model that is built.

use cairn_kernel::config::ScratchModel;
use cairn_torch::ModelConfig;

/// Positions a scratch model takes (its context window).
pub const SCRATCH_CONTEXT: usize = 1024;

/// The Qwen3-layout config of the scratch model `s` with `vocab_size` tokens and a context of
/// [`SCRATCH_CONTEXT`] positions. Not validated here: the caller does that (naming the key) or
/// the backend refuses it when it builds the model.
pub fn model_config(s: &ScratchModel, vocab_size: usize) -> ModelConfig {
    let mut mc = ModelConfig::qwen3(
        vocab_size,
        s.hidden_size,
        s.intermediate_size,
        s.num_hidden_layers,
        s.num_attention_heads,
        s.num_key_value_heads,
    );
    mc.tie_word_embeddings = s.tie_word_embeddings;
    mc.max_position_embeddings = SCRATCH_CONTEXT;
    mc
}
