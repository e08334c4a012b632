//! One library header however many plugin crates a binary links: this test binary links
//! `echo`, `grpo` and `gigpo` as rlibs (the stack tests) with no linker flag, each registers
//! itself with the SDK's header, and the header refuses to choose among them; the `cdylib`
//! cargo built for this run links `echo` alone, and the host's loader finds it.

use cairn_plugin_sdk::host::ffi::CairnPluginRef;
use cairn_plugin_sdk::testing::load_test_cdylib;

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

/// Loads the `cdylib` cargo built for this test run, as the kernel would.
#[test]
fn the_cdylib_registers_echo_alone_and_loads() {
    let plugin = load_test_cdylib("cairn_echo");
    assert_eq!(plugin.info.name, "echo");
}
