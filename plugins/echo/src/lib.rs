//! `echo`: ECHO, selective turn memory with source-indexed credit (arXiv 2606.31650, abstract
//! only; `docs/algorithms/echo.md`). From the paper: every completed turn becomes a compact
//! memory record, the next prompt is rebuilt under a bounded budget from records the policy
//! selects, and the selected source indices route positive outcome credit to the evidence
//! turns and the selection actions behind a successful answer. Every concrete rule here (the
//! record form, the `select[...]` syntax, the default selection, the credit factor and its
//! transitive walk) is ours, a proposal.
//!
//! A [`Role::Auxiliary`] plugin stacked on an advantage estimator, which keeps computing every
//! advantage; `echo` plans no slots:
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"                 # or "gigpo"
//! [[algorithm.stack]]
//! plugin = "echo"
//! config = { eta = 0.5, record_tokens = 128, context_budget = 256 }
//! ```
//!
//! The hooks:
//! 1. **Records** ([`Algorithm::next_context`] before turn `t ≥ 1`, and
//!    [`Algorithm::observe`] for the last turn): the record of each completed turn is written
//!    to the bank ([`Host::bank_put`], kind `memory_record`, scoped to its trajectory, so no
//!    other trajectory or task ever retrieves it); see [`record`].
//! 2. **Bounded context** (`next_context`): turn `t`'s whole prompt
//!    ([`TurnContext::Prompt`]) is the task, the records the previous response selected (or
//!    the most recent ones), within `context_budget` tokens, and the current observation,
//!    rendered by the kernel's prompt builder ([`Host::render_prompt`]); the row records the
//!    shown indices as `extra.echo_selected` (and `echo_default`, `echo_record_tokens`). Each
//!    turn is its own training row with its own prompt and the sampled ids verbatim.
//! 3. **Credit** ([`Algorithm::signals`], pure): [`Signals::advantage_scale`] `1 + η` on the
//!    evidence turns and the selection tokens of successful trajectories, 1 elsewhere; see
//!    [`credit`].
//!
//! Metrics: per step, summed over turns (from `next_context`): `echo/contexts`,
//! `echo/records_written`, `echo/records_shown`, `echo/record_tokens_shown`,
//! `echo/prompt_tokens`, `echo/default_selections`, `echo/invalid_indices` (selection items
//! naming no existing record, dropped), `echo/over_budget` (selected records left out to keep
//! within `context_budget`); from `signals`: see [`credit::Routed::metrics`]; from `observe`:
//! `echo/final_records_written`.

use std::collections::HashMap;

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{
    Algorithm, BankQuery, Batch, ContextVariant, EntryKind, Host, RenderRequest, Requirements,
    Result, Role, Signals, StepReport, TurnContext, TurnContextRequest,
};
use serde_json::{json, Map};

pub mod config;
pub mod credit;
pub mod record;
pub mod select;
pub mod testing;

pub use config::EchoConfig;
pub use credit::{route, Routed, SELECTED_KEY};
pub use record::Record;
pub use select::Selection;

/// Row `extra` key: whether the prompt showed the default (most recent) records because the
/// previous response had no selection.
pub const DEFAULT_KEY: &str = "echo_default";

/// Row `extra` key: the record tokens the prompt showed (`≤ context_budget`).
pub const TOKENS_KEY: &str = "echo_record_tokens";

pub struct Echo {
    config: EchoConfig,
}

impl Echo {
    /// # Errors
    /// A config error naming the key (see [`EchoConfig::validate`]).
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Echo {
            config: EchoConfig::from_json(json)?,
        })
    }

    pub fn config(&self) -> &EchoConfig {
        &self.config
    }

    /// The records of `trajectory` in the bank, by index (at most `k` read).
    fn stored(host: &dyn Host, trajectory: u64, k: usize) -> Result<HashMap<u32, Record>> {
        let found = host.bank_query(&BankQuery {
            kinds: vec![EntryKind::MemoryRecord],
            trajectory_id: Some(trajectory),
            k,
            ..BankQuery::default()
        })?;
        let mut out = HashMap::new();
        for r in found {
            if let Some(record) = Record::from_entry(&r.entry) {
                out.entry(record.idx).or_insert(record);
            }
        }
        Ok(out)
    }
}

impl Algorithm for Echo {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Auxiliary,
            turn_context: true,
            bank: vec![EntryKind::MemoryRecord],
            ..Requirements::default()
        }
    }

    /// The reconstructed prompt of turn `t = request.turns.len() ≥ 1` (see the crate docs and
    /// [`record`]); writes the records of the turns completed so far that the bank lacks.
    fn next_context(
        &mut self,
        request: &TurnContextRequest,
        host: &dyn Host,
    ) -> Result<TurnContext> {
        let turns = &request.turns;
        let Ok(t) = u32::try_from(turns.len()) else {
            return Ok(TurnContext::Keep);
        };
        if t == 0 {
            return Ok(TurnContext::Keep);
        }
        let trajectory = request.trajectory_id;
        let b = self.config.record_tokens;
        let mut records = Echo::stored(host, trajectory, 4 * t as usize + 16)?;
        let mut new = Vec::new();
        for k in 0..t {
            if records.contains_key(&k) {
                continue;
            }
            let result = match turns.get(k as usize + 1) {
                Some(next) => next.observation.as_str(),
                None => request.observation.text.as_str(),
            };
            new.push(record::build(
                host,
                k,
                &turns[k as usize].action,
                Some(result),
                Some(turns[0].observation.as_str()),
                b,
            )?);
        }
        if !new.is_empty() {
            let entries: Vec<_> = new
                .iter()
                .map(|r| r.to_entry(trajectory, &request.task_id))
                .collect();
            host.bank_put(&entries)?;
            host.log_metric("echo/records_written", new.len() as f64);
            records.extend(new.into_iter().map(|r| (r.idx, r)));
        }
        // The previous response's selection picks the records of this prompt.
        let last = t - 1;
        let previous = &turns[last as usize].action;
        let valid = Selection::parse(previous).map(|s| s.valid(last));
        let candidates: Vec<u32> = (0..last).rev().collect();
        let shown = record::choose(
            valid.as_ref().map(|v| &v.indices[..]),
            &candidates,
            self.config.context_budget,
            |k| records.get(&k).map(|r| r.tokens),
        );
        let block: Vec<&Record> = shown.indices.iter().map(|k| &records[k]).collect();
        let task = self
            .config
            .task_block
            .then(|| turns[0].observation.as_str());
        let variant = ContextVariant {
            inject: record::inject(
                &request.variant.inject,
                task,
                &self.config.header,
                &block,
                last,
                previous,
            ),
            ..request.variant.clone()
        };
        let prompt_ids = host.render_prompt(&RenderRequest {
            variant,
            observation: request.observation.clone(),
            history: Vec::new(),
        })?;
        for (name, value) in [
            ("echo/contexts", 1.0),
            ("echo/records_shown", shown.indices.len() as f64),
            ("echo/record_tokens_shown", f64::from(shown.tokens)),
            ("echo/prompt_tokens", prompt_ids.len() as f64),
            (
                "echo/default_selections",
                f64::from(u8::from(valid.is_none())),
            ),
            (
                "echo/invalid_indices",
                valid.as_ref().map_or(0, |v| v.dropped) as f64,
            ),
            ("echo/over_budget", shown.over_budget as f64),
        ] {
            host.log_metric(name, value);
        }
        let mut extra = Map::new();
        extra.insert(SELECTED_KEY.into(), json!(shown.indices));
        extra.insert(DEFAULT_KEY.into(), json!(valid.is_none()));
        extra.insert(TOKENS_KEY.into(), json!(shown.tokens));
        Ok(TurnContext::Prompt { prompt_ids, extra })
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let routed = credit::route(batch, self.config.eta, host)?;
        Ok(Signals {
            metrics: routed.metrics(),
            advantage_scale: routed.scale,
            ..Signals::default()
        })
    }

    /// Writes the records the bank lacks for each trajectory of the step, from its rows: the
    /// last turn's (whose result no later turn saw; its digest reads `(episode ended)`), and
    /// any earlier one no `next_context` call wrote (e.g. when another stack member answered
    /// the turn's context first).
    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let batch = &report.batch;
        let mut entries = Vec::new();
        for trajectory in trajectories(batch)? {
            let rows: Vec<&cairn_plugin_sdk::TurnRow> =
                trajectory.rows.iter().map(|&i| &batch.rows[i]).collect();
            let Some(last) = rows.last() else { continue };
            let task = rows
                .iter()
                .find(|r| r.turn == 0)
                .map(|r| r.observation.as_str());
            let stored = Echo::stored(host, trajectory.id, 4 * rows.len() + 16)?;
            for (n, row) in rows.iter().enumerate() {
                if stored.contains_key(&row.turn) {
                    continue;
                }
                let result = match rows.get(n + 1) {
                    Some(next) if next.turn == row.turn + 1 => Some(next.observation.as_str()),
                    // A gap: the next turn's row is not in the step; nothing to digest.
                    Some(_) => continue,
                    None => None,
                };
                let r = record::build(
                    host,
                    row.turn,
                    credit::action(row),
                    result,
                    task,
                    self.config.record_tokens,
                )?;
                entries.push(r.to_entry(trajectory.id, &last.task_id));
            }
        }
        if !entries.is_empty() {
            host.bank_put(&entries)?;
        }
        host.log_metric("echo/final_records_written", entries.len() as f64);
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "echo",
    description: "ECHO (proposal): per-turn memory records in the bank, bounded context reconstruction by a select[...] action, source-indexed positive credit on evidence turns and selection tokens",
    create: Echo::from_config_json,
}

#[cfg(test)]
mod tests;
