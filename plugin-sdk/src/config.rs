//! Plugin config parsing with errors that name the key: every plugin's `create` function
//! starts here.

use crate::error::{PluginError, Result};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Parses a plugin's JSON config object (an empty string or `null` means `{}`; every field has
/// a default). On error the message starts with the offending top-level key in backticks,
/// which the kernel turns into `algorithm.config.<key>`: serde's own messages do not name the
/// key of a value of the wrong type, so the key is found by deserialising each entry alone.
pub fn parse_config<T: DeserializeOwned>(json: &str) -> Result<T> {
    let text = json.trim();
    let value: Value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text)
            .map_err(|e| PluginError::config(format!("config is not valid JSON: {e}")))?
    };
    let map = match value {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        other => {
            return Err(PluginError::config(format!(
                "config must be a JSON object, got {other}"
            )))
        }
    };
    serde_json::from_value::<T>(Value::Object(map.clone())).map_err(|e| {
        let message = e.to_string();
        if message.starts_with("unknown field") {
            return PluginError::config(message);
        }
        for (key, v) in &map {
            let alone = Map::from_iter([(key.clone(), v.clone())]);
            if let Err(e) = serde_json::from_value::<T>(Value::Object(alone)) {
                return PluginError::config(format!("`{key}`: {e}"));
            }
        }
        PluginError::config(message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Config {
        omega: f64,
        name: String,
    }

    #[test]
    fn empty_and_null_mean_defaults() {
        assert_eq!(parse_config::<Config>("").unwrap(), Config::default());
        assert_eq!(parse_config::<Config>("null").unwrap(), Config::default());
    }

    #[test]
    fn errors_name_the_key() {
        let e = parse_config::<Config>(r#"{"omega": "big", "name": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("`omega`"), "{e}");
        let e = parse_config::<Config>(r#"{"omegaa": 1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `omegaa`"), "{e}");
        let e = parse_config::<Config>("[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{e}");
    }
}
