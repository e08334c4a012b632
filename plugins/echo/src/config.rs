//! `algorithm.stack[i].config` of `echo`: every key, its default and its checks.
//! `docs/algorithms/echo.md` has the same table. Token counts are in the policy's own tokens
//! ([`cairn_plugin_sdk::Host::tokenize`]).

use cairn_plugin_sdk::{PluginError, Result};
use serde::Deserialize;

/// The instruction line above the memory records in a reconstructed prompt (default of
/// [`EchoConfig::header`]).
pub const DEFAULT_HEADER: &str =
    "Memory records. Write select[i,j] before your action to keep records i and j in view, \
     and to cite the records an answer rests on:";

/// The plugin's config. Everything but `eta` and the record budget `b` is ours (proposal):
/// the ECHO paper (arXiv 2606.31650) publishes only its abstract.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EchoConfig {
    /// `η`: the routed tokens' advantage factor is `1 + η` (0.5). 0 turns the routing off.
    pub eta: f64,
    /// `b`: the most tokens one memory record holds, index, action summary and observation
    /// digest together (128).
    pub record_tokens: u32,
    /// `B`: the most record tokens one reconstructed prompt shows, summed over its records
    /// (256, small enough for the CPU demo; the proposal's 8k suits a real model's window).
    /// The task block and the current observation come on top, as the environment gives them.
    pub context_budget: u32,
    /// Put the trajectory's first observation (the task) at the top of every reconstructed
    /// prompt (true).
    pub task_block: bool,
    /// The instruction line above the records (see [`DEFAULT_HEADER`]; empty: none).
    pub header: String,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            eta: 0.5,
            record_tokens: 128,
            context_budget: 256,
            task_block: true,
            header: DEFAULT_HEADER.into(),
        }
    }
}

/// The largest `eta` accepted: a routed advantage of `11 Â` is already far outside anything the
/// clipped surrogate was tuned for.
pub const MAX_ETA: f64 = 10.0;

/// The smallest record budget: `[k] ` and a few words.
pub const MIN_RECORD_TOKENS: u32 = 8;

impl EchoConfig {
    /// Parses and checks a JSON config (empty: the defaults).
    ///
    /// # Errors
    /// A config error naming the key: an unknown key, a value of the wrong type, or a value
    /// out of range (see [`EchoConfig::validate`]).
    pub fn from_json(json: &str) -> Result<Self> {
        let config: EchoConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; each error names its key and the accepted range.
    pub fn validate(&self) -> Result<()> {
        PluginError::check_config(
            self.eta.is_finite() && (0.0..=MAX_ETA).contains(&self.eta),
            format!(
                "`eta` = {}: the credit factor is 1 + eta, give a number in [0, {MAX_ETA}] \
                 (default 0.5)",
                self.eta
            ),
        )?;
        PluginError::check_config(
            self.record_tokens >= MIN_RECORD_TOKENS,
            format!(
                "`record_tokens` = {}: a memory record needs at least {MIN_RECORD_TOKENS} \
                 tokens (default 128)",
                self.record_tokens
            ),
        )?;
        PluginError::check_config(
            self.context_budget >= self.record_tokens,
            format!(
                "`context_budget` = {} is below `record_tokens` = {}: a prompt could not show \
                 even one full record; raise `context_budget` (default 256) or lower \
                 `record_tokens`",
                self.context_budget, self.record_tokens
            ),
        )?;
        PluginError::check_config(
            !self.header.contains('\n'),
            "`header` holds a line break; give one line (or an empty string for none)",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = EchoConfig::from_json("").unwrap();
        assert_eq!(c, EchoConfig::default());
        assert_eq!(
            (c.eta, c.record_tokens, c.context_budget, c.task_block),
            (0.5, 128, 256, true)
        );
    }

    #[test]
    fn config_errors_name_the_key() {
        for (json, key) in [
            (r#"{"eta": -0.1}"#, "`eta`"),
            (r#"{"eta": 11}"#, "`eta`"),
            (r#"{"eta": "half"}"#, "`eta`"),
            (r#"{"record_tokens": 4}"#, "`record_tokens`"),
            (
                r#"{"record_tokens": 64, "context_budget": 32}"#,
                "`context_budget`",
            ),
            (r#"{"header": "a\nb"}"#, "`header`"),
            (r#"{"budget": 3}"#, "`budget`"),
        ] {
            let e = EchoConfig::from_json(json).unwrap_err();
            assert_eq!(e.kind, cairn_plugin_sdk::ErrorKind::Config, "{json}");
            assert!(e.message.contains(key), "{json}: {e}");
        }
        let c = EchoConfig::from_json(r#"{"eta": 0, "record_tokens": 8, "context_budget": 8}"#)
            .unwrap();
        assert_eq!((c.eta, c.context_budget), (0.0, 8));
    }
}
