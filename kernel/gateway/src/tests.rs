//! The sections this crate owns in a pipeline config (`[source]` with `kind = "gateway"`,
//! `[rollout.engine]`): read, checked and reported by key through [`parse_config`].

use cairn_kernel::config::PipelineConfig;

use super::{parse_config, GatewayConfig, HarnessEnvironment};
use crate::engine::EngineConfig;

/// A pipeline with the gateway source: no `[environment]`, a scratch model with a tokenizer.
const GATEWAY: &str = r#"
[run]
dir = "runs/t"
seed = 1
steps = 2

[source]
kind = "gateway"

[algorithm]
plugin = "grpo"

[model]
[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
tokenizer = "tok"

[rollout]
tasks_per_step = 2
group_size = 4
temperature = 1.0
max_new_tokens = 8
max_turns = 8

[optimizer]
lr = 1e-3

[eval]
tasks = 4
"#;

/// The same pipeline on an environment, with an external engine launched by a command.
fn engine() -> String {
    GATEWAY
        .replace(
            "[source]\nkind = \"gateway\"\n",
            "[environment]\nplugin = \"household\"\n",
        )
        .replace(
            "max_turns = 8\n\n[optimizer]",
            "max_turns = 8\n\n[rollout.engine]\nkind = \"vllm\"\n\n\
             [rollout.engine.launch]\ncommand = [\"serve\", \"{port}\"]\n\n[optimizer]",
        )
}

fn err(text: &str) -> String {
    parse_config(text, "test.toml").unwrap_err().to_string()
}

/// A bad value in `[source]` is reported with its key and line, not only at the table's
/// header (the fuzz harness found `bind = []` reported as "invalid type: sequence" at
/// `[source]`).
#[test]
fn gateway_errors_name_their_key() {
    for (line, key) in [
        ("bind = []", "`source.bind`"),
        ("episode_timeout_s = {}", "`source.episode_timeout_s`"),
        ("missing_reward = []", "`source.missing_reward`"),
        ("no_such_key = 1", "no_such_key"),
        ("episode_timeout_s = 0", "`source.episode_timeout_s`"),
    ] {
        let text = GATEWAY.replace(
            "kind = \"gateway\"\n",
            &format!("kind = \"gateway\"\n{line}\n"),
        );
        let e = err(&text);
        // Line 9 is the key's own line (the `[source]` header is line 7).
        assert!(e.contains(key) && e.contains("line 9"), "{line}: {e}");
    }
    let c = parse_config(
        &GATEWAY.replace(
            "kind = \"gateway\"\n",
            "kind = \"gateway\"\nbind = \"127.0.0.1:0\"\n",
        ),
        "t.toml",
    )
    .unwrap();
    let g = GatewayConfig::from_pipeline(&c)
        .unwrap()
        .expect("gateway source");
    assert_eq!(
        (g.bind.as_str(), g.model_name.as_str()),
        ("127.0.0.1:0", "cairn")
    );
    // The kernel alone takes the table as written; the host's loader is what refuses it.
    let unknown = GATEWAY.replace("kind = \"gateway\"\n", "kind = \"gateway\"\nbnd = 1\n");
    assert!(PipelineConfig::parse(&unknown, "t.toml").is_ok());
    assert!(err(&unknown).contains("unknown field `bnd`"));
}

/// Every float of the two sections, defaults included (listed from the typed settings as
/// they serialise, so a new key is covered without touching this test), refuses inf and NaN
/// by its key.
#[test]
fn every_float_key_refuses_inf_and_nan_by_name() {
    let mut checked = 0;
    let gateway = GatewayConfig::from_pipeline(&parse_config(GATEWAY, "t").unwrap())
        .unwrap()
        .unwrap();
    let engine_text = engine();
    let engine = EngineConfig::from_pipeline(&parse_config(&engine_text, "t").unwrap())
        .unwrap()
        .unwrap();
    let sections = [
        (
            "source",
            toml::Value::try_from(&gateway).unwrap(),
            GATEWAY.to_string(),
            "[source]\nkind = \"gateway\"\n",
        ),
        (
            "rollout.engine",
            toml::Value::try_from(&engine).unwrap(),
            engine_text.clone(),
            "",
        ),
    ];
    for (prefix, value, text, header) in sections {
        let mut keys = Vec::new();
        float_keys("", &value, &mut keys);
        assert!(keys.len() >= 3, "{prefix}: {keys:?}");
        for key in &keys {
            for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
                let mut section = value.clone();
                set_float(&mut section, key, bad);
                let written = match prefix {
                    "source" => text.replace(
                        header,
                        &format!("{header}{}", toml::to_string(&section).unwrap()),
                    ),
                    _ => {
                        let mut doc: toml::Table = toml::from_str(&text).unwrap();
                        doc["rollout"]
                            .as_table_mut()
                            .unwrap()
                            .insert("engine".into(), section);
                        toml::to_string(&doc).unwrap()
                    }
                };
                let e = parse_config(&written, "test.toml")
                    .map(|_| ())
                    .expect_err(&format!("{prefix}.{key} = {bad} passes"))
                    .to_string();
                assert!(
                    e.contains(&format!("key `{prefix}.{key}`")),
                    "{prefix}.{key} = {bad}: {e}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 15, "{checked}");
}

/// The dotted keys of every float in `value`.
fn float_keys(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
    match value {
        toml::Value::Float(_) => out.push(prefix.to_string()),
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                float_keys(&key, v, out);
            }
        }
        _ => {}
    }
}

fn set_float(value: &mut toml::Value, key: &str, x: f64) {
    let mut node = value;
    for part in key.split('.') {
        node = node
            .get_mut(part)
            .expect("the key was listed from this value");
    }
    *node = toml::Value::Float(x);
}

#[test]
fn the_gateway_harness_provides_only_what_it_posts() {
    let gateway = GATEWAY.replace("\"grpo\"", "\"gigpo\"");
    let c = parse_config(&gateway, "test.toml").unwrap();
    let g = GatewayConfig::from_pipeline(&c)
        .unwrap()
        .expect("gateway source");
    let harness = HarnessEnvironment::new(&g);
    let info = cairn_plugin_sdk::Environment::info(&harness);
    assert_eq!(info, cairn_plugin_sdk::EnvironmentInfo::default());
    let gigpo = cairn_plugin_sdk::Requirements {
        anchor_keys: true,
        step_rewards: false,
        ..Default::default()
    };
    let e = c.check_requirements(&gigpo, &info).unwrap_err().to_string();
    assert!(
        e.contains("algorithm `gigpo` sets `requirements.anchor_keys`")
            && e.contains("environment `gateway harness` does not provide it")
            && e.contains("`[source] anchors = true`"),
        "{e}"
    );
    // A harness that declares its anchors may train gigpo.
    let declared = gateway.replace(
        "kind = \"gateway\"\n",
        "kind = \"gateway\"\nanchors = true\n",
    );
    let c = parse_config(&declared, "test.toml").unwrap();
    let g = GatewayConfig::from_pipeline(&c).unwrap().unwrap();
    let harness = HarnessEnvironment::new(&g);
    let info = cairn_plugin_sdk::Environment::info(&harness);
    assert!(info.anchor_keys && !info.step_rewards && !info.feedback && !info.tools);
    assert!(c.check_requirements(&gigpo, &info).is_ok());
    // Nothing else a harness cannot provide is claimed.
    for needs in [
        cairn_plugin_sdk::Requirements {
            step_rewards: true,
            ..Default::default()
        },
        cairn_plugin_sdk::Requirements {
            feedback: true,
            ..Default::default()
        },
        cairn_plugin_sdk::Requirements {
            tool_free_slots: true,
            ..Default::default()
        },
    ] {
        assert!(c.check_requirements(&needs, &info).is_err(), "{needs:?}");
    }
}
