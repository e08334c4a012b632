//! A plugin's checkpointed state as JSON: [`save_state`] and [`load_state`] serve any
//! `Serialize + Deserialize` state, so an [`crate::Algorithm`]'s `save_state` and `load_state`
//! are one line each.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{PluginError, Result};

/// `state` as the JSON text the kernel writes into a checkpoint; `plugin` names the plugin
/// in the error.
pub fn save_state<T: Serialize>(plugin: &str, state: &T) -> Result<String> {
    serde_json::to_string(state)
        .map_err(|e| PluginError::internal(format!("serialising the {plugin} state: {e}")))
}

/// The state in a checkpoint's JSON text, or `None` for the empty text (a run that saved no
/// state yet: keep the fresh state). A text that does not parse is an input error that
/// starts with `the {plugin} state is not valid`.
pub fn load_state<T: DeserializeOwned>(plugin: &str, text: &str) -> Result<Option<T>> {
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text).map(Some).map_err(|e| {
        PluginError::input(format!(
            "the {plugin} state is not valid ({e}); resume from a checkpoint of a run with \
             `{plugin}`"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct State {
        step: u64,
        seen: Vec<String>,
    }

    #[test]
    fn state_round_trips_and_empty_text_keeps_the_fresh_state() {
        let state = State {
            step: 3,
            seen: vec!["a".into()],
        };
        let text = save_state("toy", &state).unwrap();
        assert_eq!(load_state::<State>("toy", &text).unwrap(), Some(state));
        assert_eq!(load_state::<State>("toy", "").unwrap(), None);
    }

    #[test]
    fn a_damaged_state_is_an_input_error_naming_the_plugin() {
        let e = load_state::<State>("toy", "{\"step\": \"x\"}").unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Input);
        assert!(e.message.starts_with("the toy state is not valid ("), "{e}");
        assert!(e.message.ends_with("of a run with `toy`"), "{e}");
    }
}
