//! The plugin through the stable ABI: the built `cdylib`, loaded as the kernel loads it.

use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::Environment;

use super::{env, expert, play, script, test, train};

#[test]
fn the_cdylib_loads_and_plays() {
    let plugin = load_test_cdylib("cairn_search_qa");
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
