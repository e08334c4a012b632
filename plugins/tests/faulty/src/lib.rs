//! `faulty`: an algorithm plugin that misbehaves on purpose, so tests (and users checking
//! their deployment) can see that a plugin panic or error becomes an error value with the
//! plugin's name on it and never aborts the host.
//!
//! Config: `{"panic_in": "create" | "plan" | "signals" | "observe" | "none", "error_in": ...,
//! "hang_in": ..., "hang_ms": 30000, "from_step": 0}`: where to panic, to return an error, and
//! to hang (sleep `hang_ms` milliseconds, then carry on), at RL steps `from_step` and later
//! (`create` has no step: always). With `"none"` everywhere it returns zero advantages.
//! `"requires": {...}` declares those `Requirements` (e.g. `{"teacher_scores": true}`), to
//! test the host's checks at load.

use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, GroupRequest, Host, PluginError, Requirements, Result,
    Signals, StepReport,
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
    Observe,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultyConfig {
    /// Where to panic.
    pub panic_in: Site,
    /// Where to return an error.
    pub error_in: Site,
    /// Where to hang: sleep `hang_ms`, then go on as if nothing happened.
    pub hang_in: Site,
    /// How long a hang lasts, milliseconds (default 30 000).
    pub hang_ms: u64,
    /// The first RL step at which the faults fire (default 0: every step).
    pub from_step: u64,
    /// The requirements to declare (default: none), to test the host's load-time checks.
    pub requires: Requirements,
}

impl Default for FaultyConfig {
    fn default() -> Self {
        FaultyConfig {
            panic_in: Site::None,
            error_in: Site::None,
            hang_in: Site::None,
            hang_ms: 30_000,
            from_step: 0,
            requires: Requirements::default(),
        }
    }
}

pub struct Faulty {
    config: FaultyConfig,
}

impl Faulty {
    /// Trips `site` at RL step `step` (`None`: a call without a step, always).
    fn trip_at(&self, site: Site, step: Option<u64>) -> Result<()> {
        if step.is_some_and(|s| s < self.config.from_step) {
            return Ok(());
        }
        self.trip(site)
    }

    fn trip(&self, site: Site) -> Result<()> {
        if self.config.hang_in == site {
            std::thread::sleep(std::time::Duration::from_millis(self.config.hang_ms));
        }
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
        self.trip_at(Site::Plan, Some(request.step))?;
        Ok(vec![ContextVariant::default(); request.group_size as usize])
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        self.trip_at(Site::Signals, Some(batch.step))?;
        Ok(Signals {
            advantages: batch.zeros_like_responses(),
            ..Default::default()
        })
    }

    fn observe(&mut self, report: &StepReport, _host: &dyn Host) -> Result<()> {
        self.trip_at(Site::Observe, Some(report.step))
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "faulty",
    description: "fault injection: panics, errors or hangs where configured (for tests)",
    create: Faulty::from_config_json,
}
