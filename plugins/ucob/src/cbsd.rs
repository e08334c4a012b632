//! The signals of a step: records and cells, the pairs of [`crate::pairs`], the prompts of
//! both views, the re-scoring, and the auxiliary rows with their `ucob-cbsd` term.
//!
//! **Prompts.** A record's prompt in its own view is its `prompt_ids`, verbatim. In the other
//! view it is [`Host::render_prompt`] of the row's observation (`RenderRequest::for_row`)
//! under the opposite variant: the group's `good` variant (the skills its `good` slots saw)
//! for a `none` row, the plain variant for a `good` row. That is the prompt the kernel's
//! prompt builder gives the same observation, so it is only trusted for a row whose own
//! prompt the builder reproduces: the row's observation rendered under its own variant must
//! equal its `prompt_ids` (a row whose prompt came from a per-turn context hook, or carried a
//! tool schema, does not; it has no other-view prompt, counted in `ucob/render_mismatch`).
//! A `none` row of a group without `good` slots (an empty bank) has no skill-view prompt.
//!
//! **Scores.** Both sides are scored with [`ScoreWeights::Current`] (inside `signals`: the
//! weights before this step's update, which are also the weights that recompute `ℓ_old`):
//! the teacher, the winner's response after the winner's own prompt, with `top_k = topk_k`;
//! the student, the same response after the target's prompt in the target view. So the gate
//! compares one set of weights under two contexts, as UCOB does (its actor scores both views
//! before the update). A host that cannot return top-k (the request fails, or returns the
//! wrong shape or non-finite values) makes the step use the sampled form
//! (`ucob/topk_unavailable` = 1).
//!
//! **Auxiliary rows.** Each pair is one row of `Signals::extra_rows`: a copy of the winner's
//! row (its `response_ids`, `response_logprobs`, `response_mask` and every other field, bit
//! for bit: never re-tokenised text) whose `train_prompt_ids` is the target's prompt in the
//! target view; its `prompt_ids` stay the winner's (what the policy saw when it sampled
//! them). Its `old_logprobs` hold the student scores (the kernel recomputes them under the
//! training prompt anyway), and `extra.ucob_aux` says where it came from. The kernel trains
//! an extra row only through the terms that target it, so it carries no policy-gradient
//! loss.

use std::collections::HashMap;

use cairn_plugin_sdk::stats::{group_indices, trajectories, turn_returns};
use cairn_plugin_sdk::{
    AuxTerm, Batch, ContextVariant, Host, PluginError, RenderRequest, Result, ScoreRequest,
    ScoreWeights, Scored, Signals, TeacherSource, TeacherTarget, TeacherTerm, TurnRow,
};
use serde_json::{json, Map, Value};

use crate::config::{ActionSpan, Branch, Loss, Scope, UcobConfig};
use crate::pairs::{cell_pairs, Pair, Record};
use crate::plan::{branch_of, BRANCH_KEY, KIND_KEY};
use crate::tokens::{action_tokens, base_weights, gated_weights};

/// The name of the distillation term (a teacher term in the top-k form, an aux term in the
/// sampled form).
pub const TERM: &str = "ucob-cbsd";

/// `TurnRow::extra` key of an auxiliary row: the pair it trains.
pub const AUX_KEY: &str = "ucob_aux";

/// Prompts of both views, rendered once per row.
struct Prompts<'a> {
    batch: &'a Batch,
    host: &'a dyn Host,
    /// The `good` variant of each group (the first `good` row's).
    good: HashMap<u64, &'a ContextVariant>,
    /// Whether the builder reproduces a row's own prompt.
    verified: HashMap<usize, bool>,
    rendered: HashMap<(usize, Branch), Vec<u32>>,
    mismatched: usize,
}

impl<'a> Prompts<'a> {
    fn new(batch: &'a Batch, host: &'a dyn Host) -> Prompts<'a> {
        let mut good = HashMap::new();
        for row in &batch.rows {
            if branch_of(row) == Branch::Good {
                good.entry(row.group_id).or_insert(&row.variant);
            }
        }
        Prompts {
            batch,
            host,
            good,
            verified: HashMap::new(),
            rendered: HashMap::new(),
            mismatched: 0,
        }
    }

    /// The variant of `row`'s observation in `view` (None: the view does not exist for it).
    fn variant(&self, row: &TurnRow, view: Branch) -> Option<ContextVariant> {
        match view {
            Branch::Good => self.good.get(&row.group_id).map(|v| (*v).clone()),
            Branch::NoSkill => {
                let mut extra = Map::new();
                extra.insert(BRANCH_KEY.into(), Branch::NoSkill.as_str().into());
                if let Some(kind) = row.variant.extra.get(KIND_KEY) {
                    extra.insert(KIND_KEY.into(), kind.clone());
                }
                Some(ContextVariant {
                    tools_enabled: row.variant.tools_enabled,
                    extra,
                    ..ContextVariant::default()
                })
            }
        }
    }

    /// Whether row `i` has a prompt in `view`.
    fn available(&mut self, i: usize, view: Branch) -> Result<bool> {
        let row = &self.batch.rows[i];
        if branch_of(row) == view {
            return Ok(true);
        }
        if self.variant(row, view).is_none() {
            return Ok(false);
        }
        if let Some(&ok) = self.verified.get(&i) {
            return Ok(ok);
        }
        let own = self
            .host
            .render_prompt(&RenderRequest::for_row(row.variant.clone(), row))?;
        let ok = own == row.prompt_ids;
        if !ok {
            self.mismatched += 1;
        }
        self.verified.insert(i, ok);
        Ok(ok)
    }

    /// Row `i`'s prompt in `view`; call only where [`Prompts::available`] said so.
    fn prompt(&mut self, i: usize, view: Branch) -> Result<Vec<u32>> {
        let row = &self.batch.rows[i];
        if branch_of(row) == view {
            return Ok(row.prompt_ids.clone());
        }
        if let Some(ids) = self.rendered.get(&(i, view)) {
            return Ok(ids.clone());
        }
        let variant = self.variant(row, view).ok_or_else(|| {
            PluginError::internal(format!("row {i} has no {} view", view.as_str()))
        })?;
        let ids = self
            .host
            .render_prompt(&RenderRequest::for_row(variant, row))?;
        if ids.is_empty() {
            return Err(PluginError::host(format!(
                "the prompt builder rendered an empty {} prompt for row {i}",
                view.as_str()
            )));
        }
        self.rendered.insert((i, view), ids.clone());
        Ok(ids)
    }
}

/// Counts and means of one step, reported as `ucob/*` metrics.
#[derive(Default)]
struct Tally {
    records: usize,
    cells: usize,
    raw: usize,
    margin_filtered: usize,
    missing_prompt: usize,
    fallback: usize,
    good_to_none: usize,
    none_to_good: usize,
    cells_without_skills: usize,
    action_span_missing: usize,
    gap_sum: f64,
    weight_sum: f64,
    gate_sum: f64,
    gates: usize,
}

fn check_len(what: &str, got: usize, want: usize, row: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(PluginError::host(format!(
            "scoring returned {got} {what} for the {want} response tokens of row {row}"
        )))
    }
}

/// Whether `scored` holds usable top-k scores for every request.
fn topk_usable(scored: &[Scored], requests: &[ScoreRequest], k: usize) -> bool {
    scored.len() == requests.len()
        && scored.iter().zip(requests).all(|(s, r)| {
            let n = r.response_ids.len() * k;
            s.top_ids.len() == n
                && s.top_logprobs.len() == n
                && s.top_logprobs.iter().all(|x| x.is_finite())
        })
}

/// Trajectory-level success rate of each branch (`None` when the branch played none).
fn success_rates(batch: &Batch) -> Result<[(Branch, Option<f64>); 2]> {
    let trajs = trajectories(batch)?;
    Ok([Branch::Good, Branch::NoSkill].map(|b| {
        let s: Vec<f64> = trajs
            .iter()
            .filter(|t| branch_of(&batch.rows[t.rows[0]]) == b)
            .map(|t| f64::from(u8::from(t.success)))
            .collect();
        (
            b,
            (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64),
        )
    }))
}

/// The step's signals (see the module docs and [`crate::pairs`]).
pub fn signals(config: &UcobConfig, batch: &Batch, host: &dyn Host) -> Result<Signals> {
    batch.validate()?;
    let trajs = trajectories(batch)?;
    let returns = turn_returns(batch, &trajs, config.gamma)?;
    let mut metrics: Vec<(String, f64)> = Vec::new();
    for (b, rate) in success_rates(batch)? {
        if let Some(rate) = rate {
            metrics.push((format!("ucob/success_{}", b.as_str()), rate));
        }
    }

    let tags = if config.action_span == ActionSpan::Tagged {
        let open = host.tokenize(&config.action_open)?;
        let close = host.tokenize(&config.action_close)?;
        for (key, ids) in [("action_open", &open), ("action_close", &close)] {
            if ids.is_empty() {
                return Err(PluginError::config(format!(
                    "`{key}` tokenises to no ids; give a tag the tokenizer can encode"
                )));
            }
        }
        (open, close)
    } else {
        (Vec::new(), Vec::new())
    };

    // 1–2. Records and cells.
    let mut tally = Tally::default();
    let mut records: Vec<Record> = Vec::new();
    let mut keys: Vec<(u64, &str)> = Vec::new();
    let mut actions: HashMap<usize, Vec<bool>> = HashMap::new();
    for (i, row) in batch.rows.iter().enumerate() {
        if row.trainable_tokens() == 0 || (config.skip_invalid && row.feedback < 0) {
            continue;
        }
        let Some(anchor) = row.anchor.as_deref() else {
            return Err(PluginError::input(format!(
                "row {i} (trajectory {}, turn {}) has no anchor key; ucob groups turns by \
                 anchor state, so the environment must report the anchor of every turn",
                row.trajectory_id, row.turn
            )));
        };
        let (action, found) = action_tokens(row, config.action_span, &tags);
        if !found && config.action_span != ActionSpan::None {
            tally.action_span_missing += 1;
        }
        if config.scope == Scope::Action && !found {
            continue;
        }
        actions.insert(i, action);
        records.push(Record {
            row: i,
            branch: branch_of(row),
            ret: returns[i],
        });
        keys.push((row.group_id, anchor));
    }
    tally.records = records.len();

    // 3–4. Pairs, cell by cell.
    let mut prompts = Prompts::new(batch, host);
    let mut pairs: Vec<Pair> = Vec::new();
    for cell in group_indices(&keys) {
        tally.cells += 1;
        let cell: Vec<Record> = cell.iter().map(|&k| records[k]).collect();
        let mut error: Option<PluginError> = None;
        let out = cell_pairs(&cell, config, &mut |r, view| {
            if error.is_some() {
                return false;
            }
            prompts.available(r.row, view).unwrap_or_else(|e| {
                error = Some(e);
                false
            })
        });
        if let Some(e) = error {
            return Err(e);
        }
        let group = batch.rows[cell[0].row].group_id;
        if out.view == Some(Branch::Good) && !prompts.good.contains_key(&group) {
            tally.cells_without_skills += 1;
        }
        tally.raw += out.raw;
        tally.margin_filtered += out.margin_filtered;
        tally.missing_prompt += out.missing_prompt;
        pairs.extend(out.pairs);
    }

    // 5. Prompts and scores.
    let mut target_prompts = Vec::with_capacity(pairs.len());
    for p in &pairs {
        target_prompts.push(prompts.prompt(p.target.row, p.target_view)?);
    }
    let mut winners: Vec<usize> = Vec::new();
    for p in &pairs {
        if !winners.contains(&p.winner.row) {
            winners.push(p.winner.row);
        }
    }
    let want_topk = config.loss == Loss::TopkOpd;
    let k = config.topk_k as usize;
    let teacher_requests = |top_k: u32| -> Vec<ScoreRequest> {
        winners
            .iter()
            .map(|&w| ScoreRequest {
                context_ids: batch.rows[w].prompt_ids.clone(),
                response_ids: batch.rows[w].response_ids.clone(),
                weights: ScoreWeights::Current,
                temperature: None,
                top_k,
            })
            .collect()
    };
    let (teacher, topk) = if winners.is_empty() {
        (Vec::new(), want_topk)
    } else if want_topk {
        let requests = teacher_requests(config.topk_k);
        match host.score(&requests) {
            Ok(s) if topk_usable(&s, &requests, k) => (s, true),
            _ => (host.score(&teacher_requests(0))?, false),
        }
    } else {
        (host.score(&teacher_requests(0))?, false)
    };
    if want_topk && !winners.is_empty() {
        metrics.push(("ucob/topk_unavailable".into(), f64::from(u8::from(!topk))));
    }
    if teacher.len() != winners.len() {
        return Err(PluginError::host(format!(
            "scoring returned {} results for {} requests",
            teacher.len(),
            winners.len()
        )));
    }
    let teacher_of: HashMap<usize, &Scored> = winners.iter().copied().zip(&teacher).collect();
    let student_requests: Vec<ScoreRequest> = pairs
        .iter()
        .zip(&target_prompts)
        .map(|(p, prompt)| ScoreRequest {
            context_ids: prompt.clone(),
            response_ids: batch.rows[p.winner.row].response_ids.clone(),
            weights: ScoreWeights::Current,
            temperature: None,
            top_k: 0,
        })
        .collect();
    let student = if pairs.is_empty() {
        Vec::new()
    } else {
        host.score(&student_requests)?
    };
    if student.len() != pairs.len() {
        return Err(PluginError::host(format!(
            "scoring returned {} results for {} requests",
            student.len(),
            pairs.len()
        )));
    }

    // 6. Auxiliary rows, weights and the term.
    let base = batch.rows.len();
    let mut extra_rows: Vec<TurnRow> = Vec::with_capacity(pairs.len());
    let mut targets: Vec<TeacherTarget> = Vec::new();
    let mut coefficients: Vec<Vec<f32>> = batch.zeros_like_responses();
    let mut active = 0usize;
    for (j, ((p, prompt), s)) in pairs.iter().zip(target_prompts).zip(&student).enumerate() {
        let w = &batch.rows[p.winner.row];
        let t = teacher_of[&p.winner.row];
        let l = w.response_ids.len();
        check_len("teacher log-probs", t.logprobs.len(), l, p.winner.row)?;
        check_len("student log-probs", s.logprobs.len(), l, p.winner.row)?;
        let bw = base_weights(config, &w.response_mask, &actions[&p.winner.row], p.weight);
        let (weights, gates) = gated_weights(config, &bw, &t.logprobs, &s.logprobs);
        if let Some(bad) = weights.iter().find(|x| !x.is_finite()) {
            return Err(PluginError::host(format!(
                "row {}: a distillation weight is {bad}; the scores of its response must be \
                 finite",
                p.winner.row
            )));
        }
        active += weights.iter().filter(|&&x| x > 0.0).count();
        tally.gate_sum += gates.iter().sum::<f64>();
        tally.gates += gates.len();
        tally.gap_sum += p.gap;
        tally.weight_sum += p.weight;
        tally.fallback += usize::from(p.fallback);
        match (p.winner.branch, p.target_view) {
            (Branch::Good, Branch::NoSkill) => tally.good_to_none += 1,
            (Branch::NoSkill, Branch::Good) => tally.none_to_good += 1,
            _ => {}
        }

        let mut row = w.clone();
        row.train_prompt_ids = Some(prompt);
        row.old_logprobs = s.logprobs.clone();
        row.ref_logprobs = Vec::new();
        row.extra.insert(
            AUX_KEY.into(),
            json!({
                "winner": [w.trajectory_id, w.turn],
                "target": [batch.rows[p.target.row].trajectory_id, batch.rows[p.target.row].turn],
                "source_branch": p.winner.branch.as_str(),
                "target_branch": p.target_view.as_str(),
                "gap": p.gap,
                "weight": p.weight,
                "fallback": p.fallback,
            }),
        );
        if topk {
            targets.push(TeacherTarget {
                row: base + j,
                weights,
                source: TeacherSource::Fixed {
                    logprobs: t.logprobs.clone(),
                    top_ids: t.top_ids.clone(),
                    top_logprobs: t.top_logprobs.clone(),
                },
            });
        } else {
            coefficients.push(weights.iter().map(|&x| -x).collect());
        }
        extra_rows.push(row);
    }

    let mean = |sum: f64, n: usize| if n == 0 { 0.0 } else { sum / n as f64 };
    let n = pairs.len();
    for (name, value) in [
        ("records", tally.records as f64),
        ("cells", tally.cells as f64),
        ("raw_pairs", tally.raw as f64),
        ("margin_filtered", tally.margin_filtered as f64),
        ("missing_prompt", tally.missing_prompt as f64),
        ("pairs", n as f64),
        ("pairs_good_to_none", tally.good_to_none as f64),
        ("pairs_none_to_good", tally.none_to_good as f64),
        ("fallback_pairs", tally.fallback as f64),
        ("cells_without_skills", tally.cells_without_skills as f64),
        ("render_mismatch", prompts.mismatched as f64),
        ("action_span_missing", tally.action_span_missing as f64),
        ("aux_tokens", active as f64),
        ("gap_mean", mean(tally.gap_sum, n)),
        ("weight_mean", mean(tally.weight_sum, n)),
        ("gate_mean", mean(tally.gate_sum, tally.gates)),
    ] {
        metrics.push((format!("ucob/{name}"), value));
    }

    let mut signals = Signals {
        metrics,
        ..Signals::default()
    };
    if n > 0 {
        if topk {
            signals.teacher.push(TeacherTerm {
                name: TERM.into(),
                coef: config.coef,
                form: config.topk_form(),
                targets,
            });
        } else {
            signals.aux.push(AuxTerm {
                name: TERM.into(),
                coef: config.coef,
                coefficients,
            });
        }
    }
    signals.extra_rows = extra_rows;
    Ok(signals)
}

/// The pair an auxiliary row trains, as recorded in its `extra` (None for other rows).
pub fn aux_info(row: &TurnRow) -> Option<&Map<String, Value>> {
    row.extra.get(AUX_KEY).and_then(Value::as_object)
}
