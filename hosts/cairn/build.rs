//! Gives the `cairn` binary (and this package's tests) an rpath to libtorch, when built with
//! the `torch` feature. See `kernel/torch/build/link_libtorch.rs`.

include!("../../kernel/torch/build/link_libtorch.rs");

fn main() {
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() {
        link_libtorch();
    }
}
