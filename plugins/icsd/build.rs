//! Links the integration tests, which put `icsd`, `grpo` and `gigpo` into one binary as rlibs.
//!
//! Every plugin's `export_algorithm!` defines the abi_stable library header under one fixed
//! symbol name (the name the host looks up in a `.so`), so two plugin rlibs in one binary
//! define it twice. The tests never look the header up, so the linker may keep either one.
//! The flag reaches the `tests/` binaries only, never the plugin itself.

fn main() {
    println!("cargo::rustc-link-arg-tests=-Wl,--allow-multiple-definition");
    println!("cargo::rerun-if-changed=build.rs");
}
