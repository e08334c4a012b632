// Link arguments that every crate *producing an executable* that links tch needs.
//
// Shared by `kernel/torch/build.rs` (for this crate's tests and examples) and meant to be
// reused verbatim by host binary crates: `cargo:rustc-link-arg` only applies to the targets of
// the package whose build script prints it, so each package with a `[[bin]]` that links tch
// needs its own build.rs. Such a package depends on `torch-sys` directly (so Cargo passes it
// torch-sys's `links = "tch"` metadata as `DEP_TCH_LIBTORCH_LIB`) and has a build.rs of
// one line plus an include:
//
//     include!("../../kernel/torch/build/link_libtorch.rs");
//     fn main() { link_libtorch(); }
//
// What it emits and why:
// - `-Wl,-rpath,<libtorch lib dir>`: executables find libtorch at run time without
//   `LD_LIBRARY_PATH` (torch-sys only sets an rpath on its own C++ shim, not on our binaries).
// - `-Wl,--no-as-needed -ltorch`: nothing in our code references a symbol of
//   `libtorch_cuda.so`, so with the default `--as-needed` the linker drops it and
//   `tch::Cuda::is_available()` is false even on a GPU machine. Forcing `libtorch.so` (which
//   itself needs `libtorch_cuda.so` when the build has CUDA) keeps CUDA usable. On a CPU-only
//   libtorch this is harmless.

/// Prints the rpath and `--no-as-needed -ltorch` link arguments for the package's executables.
///
/// Panics (failing the build, with the reason) when `DEP_TCH_LIBTORCH_LIB` is absent, which
/// means the package does not depend on `torch-sys` directly.
pub fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib_dir = std::env::var("DEP_TCH_LIBTORCH_LIB").expect(
        "DEP_TCH_LIBTORCH_LIB is set by torch-sys's build script for packages that list \
         torch-sys among their [dependencies]; add `torch-sys.workspace = true`",
    );
    println!("cargo:rustc-link-search=native={lib_dir}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}
