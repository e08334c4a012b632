//! The plugin through the stable ABI: the built `cdylib`, loaded as the kernel loads it.

use cairn_plugin_sdk::foreign::load_plugin;
use cairn_plugin_sdk::Environment;

use super::{env, expert, play, script, test, train};

/// Cargo writes the `cdylib` for this test run to `target/<profile>/deps/`, beside this test
/// binary.
#[test]
fn the_cdylib_loads_and_plays() {
    let exe = std::env::current_exe().unwrap();
    let file = format!(
        "{}cairn_search_qa{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = exe.with_file_name(file);
    let plugin = load_plugin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(plugin.info.name, "search-qa");
    let err = plugin
        .create_environment(r#"{"top_k": 99}"#)
        .err()
        .expect("bad top_k");
    assert!(
        err.message.contains("plugin `search-qa`") && err.message.contains("`top_k`"),
        "{err}"
    );
    let err = plugin
        .create_environment(r#"{"corpus": "/nonexistent/elements.txt"}"#)
        .err()
        .expect("missing corpus");
    assert!(
        err.message
            .contains("cannot read `/nonexistent/elements.txt`"),
        "{err}"
    );

    let foreign = plugin.create_environment("{}").unwrap();
    assert_eq!(foreign.info(), env().info());
    for task in [train(0), train(5), train(6), test(3)] {
        for tools in [true, false] {
            assert_eq!(
                play(&foreign, task, 0, tools, expert),
                play(&env(), task, 0, tools, expert)
            );
        }
    }
    let junk = [
        "search[gold]",
        "<tool_call>{\"name\":\"search\"}",
        "answer[1]",
    ];
    assert_eq!(
        play(&foreign, train(1), 0, false, script(&junk)),
        play(&env(), train(1), 0, false, script(&junk))
    );
}
