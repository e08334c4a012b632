//! One library header however many plugin crates a binary links: this test binary links
//! `echo`, `grpo` and `gigpo` as rlibs (the stack tests) with no linker flag, each registers
//! itself with the SDK's header, and the header refuses to choose among them; the `cdylib`
//! cargo built for this run links `echo` alone, and the host's loader finds it.

use cairn_plugin_sdk::ffi::CairnPluginRef;
use cairn_plugin_sdk::foreign::load_plugin;

#[test]
fn a_binary_linking_three_plugin_crates_has_a_header_that_refuses_to_pick_one() {
    // The stack tests use both estimators; naming them here keeps this test's premise true
    // if those tests move.
    let _ = (
        cairn_grpo::Grpo::from_config_json,
        cairn_gigpo::Gigpo::from_config_json,
    );
    let err = cairn_plugin_sdk::export::LIB_HEADER
        .init_root_module::<CairnPluginRef>()
        .err()
        .expect("three plugins registered");
    assert!(err.to_string().contains("links 3 plugin crates"), "{err}");
}

/// Loads the `cdylib` cargo built for this test run, as the kernel would. Cargo writes it to
/// `target/<profile>/deps/`, beside this test binary.
#[test]
fn the_cdylib_registers_echo_alone_and_loads() {
    let exe = std::env::current_exe().unwrap();
    let file = format!(
        "{}cairn_echo{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = exe.with_file_name(file);
    let plugin = load_plugin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(plugin.info.name, "echo");
}
