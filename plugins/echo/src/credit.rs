//! Source-indexed credit routing (the paper's mechanism; the rule below is ours, a proposal).
//!
//! Start from the estimator's advantage `Â_i` (GRPO's, GiGPO's: `echo` is stacked and gives no
//! advantages). For a trajectory with outcome reward `R_i > 0` whose last (answer) turn `T`
//! cites records with a selection run, `E_i` = the valid cited indices (turns `k < T`). Then
//! every token gets the factor
//!
//! - `1 + η` on every response token of an evidence turn `k ∈ E_i`;
//! - `1 + η` on every response token of the answer turn `T` (its citation and the answer it
//!   supports: the design's worked example gives "t4 (selection + answer) → 1.2");
//! - `1 + η` on the tokens of the selection run of each earlier selection that kept an
//!   evidence record alive: walking back from `u = T − 1`, the selection
//!   of turn `u` kept `k` alive when `k` is in it, was shown in the prompt of turn `u + 1`
//!   (that row's `extra.echo_selected`) and is still alive at `u + 1`; the walk stops at the
//!   first turn that kept none;
//! - `1` everywhere else, and on every token of a
//!   trajectory with `R_i ≤ 0` ("positive outcome credit": failures get no routing).
//!
//! A token in both an evidence turn and a credited selection gets `1 + η` once, never
//! `(1 + η)²`. The factors go out as [`cairn_plugin_sdk::Signals::advantage_scale`], so the
//! stack's advantage is `A = Â_i · (1 + η)` on routed tokens and `Â_i` elsewhere.
//!
//! **Finding the selection's tokens.** Rows carry the sampled ids and the decoded action
//! (`info.action`), not a token-to-text map, and plugins have no detokenizer. The run's text is
//! tokenized with [`Host::tokenize`], alone and after one space (a BPE vocabulary folds the
//! space before a word into its first token), and found as a contiguous id sequence in the
//! row's response ids (first match). A run whose ids do not appear (the sampled tokenisation
//! differs from the canonical one) credits no selection tokens and is counted
//! (`echo/unmatched_selections`); the evidence turns are credited all the same.

use std::collections::HashMap;

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{Batch, Host, Result, TurnRow};
use serde_json::Value;

use crate::select::Selection;

/// The row key recording which memory records a reconstructed prompt showed.
pub const SELECTED_KEY: &str = "echo_selected";

/// The routed factors and what routing did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routed {
    /// `[rows][L]`: `1 + η` on routed tokens, 1 elsewhere.
    pub scale: Vec<Vec<f32>>,
    /// Successful trajectories whose answer cited at least one existing record.
    pub routed_trajectories: usize,
    /// Successful trajectories whose answer turn cited none (no routing).
    pub uncited_successes: usize,
    /// Evidence rows credited.
    pub evidence_turns: usize,
    /// Selection runs credited (answer turn and the ones that kept evidence alive).
    pub credited_selections: usize,
    /// Selection runs whose tokens were not found in the response ids.
    pub unmatched_selections: usize,
    /// Items of answer-turn selections that name no existing record (dropped), over every
    /// trajectory.
    pub invalid_citations: usize,
    /// Trainable tokens routed, and all trainable tokens.
    pub routed_tokens: usize,
    pub trainable_tokens: usize,
}

/// The action text the environment received for a row (`info.action`, set by the kernel).
pub fn action(row: &TurnRow) -> &str {
    row.info.get("action").and_then(Value::as_str).unwrap_or("")
}

/// The records a row's prompt showed (`extra.echo_selected`); `None` when the row's prompt
/// was not one of ours.
pub fn shown(row: &TurnRow) -> Option<Vec<u32>> {
    let list = row.extra.get(SELECTED_KEY)?.as_array()?;
    list.iter()
        .map(|v| v.as_u64().and_then(|k| u32::try_from(k).ok()))
        .collect()
}

/// First position of `needle` in `hay`.
fn find(hay: &[u32], needle: &[u32]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The token range of `run` (a selection run's text) in `response_ids` (see the module docs).
pub fn span(
    host: &dyn Host,
    response_ids: &[u32],
    run: &str,
) -> Result<Option<std::ops::Range<usize>>> {
    for candidate in [run.to_string(), format!(" {run}")] {
        let ids = host.tokenize(&candidate)?;
        if let Some(p) = find(response_ids, &ids) {
            return Ok(Some(p..p + ids.len()));
        }
    }
    Ok(None)
}

/// Routes the credit of `batch` with factor `1 + eta` (see the module docs).
///
/// # Errors
/// A batch whose trajectories break the row invariants ([`trajectories`]), or a host without a
/// tokenizer when a selection's tokens must be found.
pub fn route(batch: &Batch, eta: f64, host: &dyn Host) -> Result<Routed> {
    let factor = (1.0 + eta) as f32;
    let mut out = Routed {
        scale: batch
            .rows
            .iter()
            .map(|r| vec![1.0; r.response_ids.len()])
            .collect(),
        ..Routed::default()
    };
    for trajectory in trajectories(batch)? {
        let Some(&last) = trajectory.rows.last() else {
            continue;
        };
        let last_row = &batch.rows[last];
        let citation = Selection::parse(action(last_row));
        let cited = citation.as_ref().map(|s| s.valid(last_row.turn));
        if let Some(c) = &cited {
            out.invalid_citations += c.dropped;
        }
        if trajectory.episode_reward <= 0.0 || eta == 0.0 {
            continue;
        }
        let (Some(citation), Some(cited)) = (citation, cited) else {
            out.uncited_successes += 1;
            continue;
        };
        if cited.indices.is_empty() {
            out.uncited_successes += 1;
            continue;
        }
        out.routed_trajectories += 1;
        let by_turn: HashMap<u32, usize> = trajectory
            .rows
            .iter()
            .map(|&i| (batch.rows[i].turn, i))
            .collect();
        // Evidence turns: every token.
        for k in &cited.indices {
            if let Some(&i) = by_turn.get(k) {
                out.scale[i].iter_mut().for_each(|x| *x = factor);
                out.evidence_turns += 1;
            }
        }
        // Selection runs: the answer's citation, then the ones that kept evidence alive.
        let mut runs: Vec<(usize, Selection)> = vec![(last, citation)];
        let mut alive = cited.indices.clone();
        let mut u = last_row.turn;
        while u > 1 {
            u -= 1;
            let (Some(&i), Some(&next)) = (by_turn.get(&u), by_turn.get(&(u + 1))) else {
                break;
            };
            let Some(selection) = Selection::parse(action(&batch.rows[i])) else {
                break;
            };
            let shown_next = shown(&batch.rows[next]).unwrap_or_default();
            let kept: Vec<u32> = selection
                .valid(u)
                .indices
                .into_iter()
                .filter(|k| alive.contains(k) && shown_next.contains(k))
                .collect();
            if kept.is_empty() {
                break;
            }
            runs.push((i, selection));
            alive = kept;
        }
        // The answer turn: every token (citation and answer).
        out.scale[last].iter_mut().for_each(|x| *x = factor);
        out.credited_selections += 1;
        for (i, selection) in runs.into_iter().skip(1) {
            let row = &batch.rows[i];
            match span(host, &row.response_ids, selection.run(action(row)))? {
                Some(range) => {
                    out.scale[i][range].iter_mut().for_each(|x| *x = factor);
                    out.credited_selections += 1;
                }
                None => out.unmatched_selections += 1,
            }
        }
    }
    for (row, scale) in batch.rows.iter().zip(&out.scale) {
        for (m, s) in row.response_mask.iter().zip(scale) {
            if *m == 1 {
                out.trainable_tokens += 1;
                if *s != 1.0 {
                    out.routed_tokens += 1;
                }
            }
        }
    }
    Ok(out)
}

impl Routed {
    /// The step's metrics, `echo/...`.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let fraction = if self.trainable_tokens == 0 {
            0.0
        } else {
            self.routed_tokens as f64 / self.trainable_tokens as f64
        };
        [
            ("echo/routed_trajectories", self.routed_trajectories as f64),
            ("echo/uncited_successes", self.uncited_successes as f64),
            ("echo/evidence_turns", self.evidence_turns as f64),
            ("echo/credited_selections", self.credited_selections as f64),
            (
                "echo/unmatched_selections",
                self.unmatched_selections as f64,
            ),
            ("echo/invalid_citations", self.invalid_citations as f64),
            ("echo/routed_token_fraction", fraction),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect()
    }
}
