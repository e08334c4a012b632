//! Integration tests of `cairn_gguf::import_gguf` on synthetic GGUF files written by
//! [`writer`]: the tensors round trip exactly (q/k rows un-permuted, names and shapes mapped,
//! f32 and bf16), the written directory is complete, and bad files are refused with errors
//! naming the key or tensor, before anything is written.

mod import;
mod writer;
