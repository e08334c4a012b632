//! The built `cdylib`, loaded as the kernel loads it.

use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{ContextVariant, Environment};

use super::{env, test};

#[test]
fn the_cdylib_loads_and_plays() {
    let plugin = load_test_cdylib("cairn_arith");
    assert_eq!(plugin.info.name, "arith");
    let err = plugin
        .create_environment(r#"{"ops": ["%"]}"#)
        .err()
        .expect("unknown operator");
    assert!(
        err.message.contains("plugin `arith`") && err.message.contains("unknown operator `%`"),
        "{err}"
    );
    let foreign = plugin.create_environment("{}").unwrap();
    assert_eq!(foreign.info(), env().info());
    for index in [0, 1, 173] {
        let task = test(index);
        assert_eq!(foreign.task(task).unwrap(), env().task(task).unwrap());
        let mut ep = foreign.start(task, 0, &ContextVariant::default()).unwrap();
        let answer = ep.expert_action().unwrap();
        let out = ep.step(&answer).unwrap();
        assert!(out.success && out.done, "{out:?}");
    }
}
