//! `faulty`: an algorithm plugin that misbehaves on purpose, so tests (and users checking
//! their deployment) can see that a plugin panic or error becomes an error value with the
//! plugin's name on it and never aborts the host.
//!
//! Config: `{"panic_in": "create" | "plan" | "signals" | "none", "error_in": ... }`. With
//! `"none"` everywhere it returns zero advantages. `"requires": {...}` declares those
//! `Requirements` (e.g. `{"teacher_scores": true}`), to test the host's checks at load.

use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, GroupRequest, Host, PluginError, Requirements, Result,
    Signals,
};
use serde::Deserialize;

/// Where to fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Site {
    #[default]
    None,
    Create,
    Plan,
    Signals,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultyConfig {
    /// Where to panic.
    pub panic_in: Site,
    /// Where to return an error.
    pub error_in: Site,
    /// The requirements to declare (default: none), to test the host's load-time checks.
    pub requires: Requirements,
}

pub struct Faulty {
    config: FaultyConfig,
}

impl Faulty {
    fn trip(&self, site: Site) -> Result<()> {
        if self.config.panic_in == site {
            panic!("faulty plugin: injected panic in {site:?}");
        }
        if self.config.error_in == site {
            return Err(PluginError::internal(format!("injected error in {site:?}")));
        }
        Ok(())
    }

    /// Builds the plugin from its JSON config.
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: FaultyConfig = cairn_plugin_sdk::config::parse_config(json)?;
        let plugin = Faulty { config };
        plugin.trip(Site::Create)?;
        Ok(plugin)
    }
}

impl Algorithm for Faulty {
    fn requirements(&self) -> Requirements {
        self.config.requires.clone()
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        _host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        self.trip(Site::Plan)?;
        Ok(vec![ContextVariant::default(); request.group_size as usize])
    }

    fn signals(&mut self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        self.trip(Site::Signals)?;
        Ok(Signals {
            advantages: batch.zeros_like_responses(),
            ..Default::default()
        })
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "faulty",
    description: "fault injection: panics or errors where configured (for tests)",
    create: Faulty::from_config_json,
}
