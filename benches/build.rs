//! Gives the `cairn-bench` binary an rpath to libtorch; see `kernel/torch/build/link_libtorch.rs`.

include!("../kernel/torch/build/link_libtorch.rs");

fn main() {
    link_libtorch();
}
