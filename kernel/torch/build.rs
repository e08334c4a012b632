//! Links this crate's tests and examples against libtorch with an rpath; the logic lives in
//! `build/link_libtorch.rs` so host binary crates can include the same file.

include!("build/link_libtorch.rs");

fn main() {
    link_libtorch();
}
