//! [`Hooks`]: the one way the kernel calls an algorithm hook. Every call runs under the plugin
//! deadline (`run.plugin_timeout_s`, [`crate::deadline`]), with a [`KernelHost`] for the
//! call's step, policy version and rows, and returns the metrics the plugin logged through
//! that host with its answer.

use std::sync::Arc;
use std::time::Duration;

use cairn_plugin_sdk::{Algorithm, Host, TurnRow};
use parking_lot::Mutex;

use crate::actors::host::{HostLinks, KernelHost};
use crate::deadline::{plugin_call, Site};
use crate::error::Result;

/// Metrics a plugin logged through the host during one call.
pub type HookMetrics = Vec<(String, f64)>;

/// The algorithm stack and what its calls need.
#[derive(Clone)]
pub struct Hooks {
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub links: HostLinks,
    /// `run.plugin_timeout_s` (`None`: no deadline).
    pub timeout: Option<Duration>,
    /// The calling actor, for errors: `rollout` or `optimizer`.
    pub actor: &'static str,
}

impl Hooks {
    /// Calls `f` on the algorithm with a host at `(step, version)` whose reflection requests
    /// may name the rows `rows(&data)`. `data` moves into the call and comes back with the
    /// answer; `context` names the call in a deadline error ("RL step 3, 48 rows").
    #[allow(clippy::too_many_arguments)]
    pub fn call<D, T>(
        &self,
        hook: &'static str,
        step: u64,
        version: u64,
        context: impl FnOnce() -> String,
        data: D,
        rows: fn(&D) -> &[TurnRow],
        f: impl FnOnce(&mut dyn Algorithm, &D, &dyn Host) -> T + Send + 'static,
    ) -> Result<(D, T, HookMetrics)>
    where
        D: Send + 'static,
        T: Send + 'static,
    {
        let plugin = format!("algorithm `{}`", self.links.writer);
        let site = Site {
            actor: self.actor,
            plugin: &plugin,
            call: hook,
            key: "run.plugin_timeout_s",
        };
        let (links, algorithm) = (self.links.clone(), self.algorithm.clone());
        plugin_call(self.timeout, &site, context, move || {
            let host = KernelHost::new(&links, step, version, rows(&data));
            let answer = f(&mut **algorithm.lock(), &data, &host);
            let metrics = host.into_metrics();
            (data, answer, metrics)
        })
    }

    /// [`Hooks::call`] for a hook that needs no rows.
    pub fn call_plain<T>(
        &self,
        hook: &'static str,
        step: u64,
        version: u64,
        context: impl FnOnce() -> String,
        f: impl FnOnce(&mut dyn Algorithm, &dyn Host) -> T + Send + 'static,
    ) -> Result<(T, HookMetrics)>
    where
        T: Send + 'static,
    {
        let ((), answer, metrics) = self.call(
            hook,
            step,
            version,
            context,
            (),
            no_rows,
            move |a, (), h| f(a, h),
        )?;
        Ok((answer, metrics))
    }
}

fn no_rows(_: &()) -> &[TurnRow] {
    &[]
}
