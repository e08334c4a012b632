//! The library half of the `cairn` host: assembling a pipeline from its config (plugins and
//! their checks, tokenizer, prompt format, model backend). The `cairn` binary and the
//! benchmark harness (`benches/`) build pipelines the same way through it.

#[cfg(feature = "torch")]
pub mod memory;
#[cfg(feature = "torch")]
pub mod scratch;
#[cfg(feature = "torch")]
pub mod setup;
