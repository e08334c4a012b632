//! The co-evolving experience bank: credit, utility, pruning, capacity and synthesis, once per
//! management window (xvolcano02/EDGE `ray_trainer.py`, gain credits and contrasts;
//! `retrieval_memory.py` / `experience_memory.py`, utility EMA, streaks and eviction).
//!
//! Every step, [`step_outcomes`] reads the trained groups and [`Window::record`] buffers, for
//! every experience an E trajectory saw in a group with both arms, one credit
//! `g = mean_E s − mean_N s` (means over the group's trajectories), its exposures (E
//! trajectories that contained it) and successes. When the window closes, [`manage`]:
//!
//! 1. updates every credited experience: `u ← (1 − β) u + β · mean(credits)`, exposures and
//!    successes added; its negative streak becomes `streak + 1` when the mean credit is
//!    negative and the previous negative window closed exactly `update_frequency` steps
//!    earlier (`last_negative_step`), 1 when negative otherwise, 0 when not negative.
//!    Experiences not credited in the window get their streak reset to 0;
//! 2. retires (hard prune) an experience with `n ≥ min_exposures`, `u ≤ utility_threshold`
//!    and streak `≥ negative_windows`;
//! 3. trims each pool to `max_items` by retiring the lowest retain scores
//!    `u + score_c · c_ucb · sqrt(ln(1 + N) / (1 + n))`, `N` the pool's total exposures, ties
//!    to the older entry, never an entry written fewer than `protect_recent_steps` steps ago.
//!    EDGE's two pools (task-level and step-level experiences) are, in Cairn's bank, the
//!    task-specific entries (`task_id` set) and the general ones (`task_id` none);
//! 4. during the warm-up, asks the skill creator for new experiences (at most
//!    `max_new_experiences`): first from "experience hurt" contrasts (the worst E trajectory
//!    of a group failed, its best N trajectory succeeded), at most `max_failed_trajectories`
//!    of them, weakest task kinds first, and only when some task kind's success rate in the
//!    window is below `update_threshold`; then (ours, `bootstrap`) from a successful
//!    trajectory of a task the bank has no experience for yet.
//!
//! The skill creator attaches the rows of the current step only, so the contrasts and
//! bootstrap candidates are those of the window's last step.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{
    BankEntry, BankQuery, Batch, EntryKind, EntryStats, Host, ReflectionRequest, Result,
    StatsUpdate,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::admission::{arm_of, row_score, Arm};
use crate::config::{EdgeConfig, Scope};
use crate::plan::{experience_ids, task_kind};

/// Trajectories and successes of one task kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub trajectories: u64,
    pub successes: u64,
}

impl Tally {
    pub fn rate(&self) -> f64 {
        if self.trajectories == 0 {
            0.0
        } else {
            self.successes as f64 / self.trajectories as f64
        }
    }
}

/// What a window has buffered so far (checkpointed with the plugin state).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Window {
    /// Steps observed in this window.
    pub steps: u64,
    /// Per experience id: one credit `g` per group with both arms whose E arm saw it.
    pub credits: BTreeMap<u64, Vec<f64>>,
    /// Per experience id: E trajectories that saw it, and how many of them succeeded.
    pub exposures: BTreeMap<u64, Tally>,
    /// Per task kind: every trajectory of the window.
    pub kinds: BTreeMap<String, Tally>,
}

/// A group whose worst E trajectory failed while its best N trajectory succeeded.
#[derive(Clone, Debug, PartialEq)]
pub struct Contrast {
    pub best_n: u64,
    pub worst_e: u64,
    /// The experiences the E arm saw (its injected text).
    pub experiences: String,
}

/// One group of a step, as management sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupOutcome {
    pub group_id: u64,
    pub task_id: String,
    pub task_kind: String,
    /// `mean_E s − mean_N s`; `None` unless both arms played.
    pub gain: Option<f64>,
    /// Per experience id the E arm saw: its E trajectories and their successes.
    pub exposures: BTreeMap<u64, Tally>,
    pub contrast: Option<Contrast>,
    /// The successful trajectory with the highest score (the first on ties).
    pub best_success: Option<u64>,
    /// Every trajectory of the group, for the per-kind success rates.
    pub tally: Tally,
}

struct Played {
    id: u64,
    arm: Option<Arm>,
    score: f64,
    success: bool,
}

/// The groups of a step's batch, in order of first appearance.
pub fn step_outcomes(batch: &Batch, config: &EdgeConfig) -> Result<Vec<GroupOutcome>> {
    let trajs = trajectories(batch)?;
    let mut order: Vec<u64> = Vec::new();
    let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (t, traj) in trajs.iter().enumerate() {
        let members = groups.entry(traj.group_id).or_default();
        if members.is_empty() {
            order.push(traj.group_id);
        }
        members.push(t);
    }
    let mut out = Vec::with_capacity(order.len());
    for group_id in order {
        let members = &groups[&group_id];
        let head = &batch.rows[trajs[members[0]].rows[0]];
        let mut played = Vec::with_capacity(members.len());
        let mut exposures: BTreeMap<u64, Tally> = BTreeMap::new();
        let mut experiences = String::new();
        let mut tally = Tally::default();
        for &t in members {
            let first = trajs[t].rows[0];
            let row = &batch.rows[first];
            let arm = arm_of(&row.variant, first)?;
            if arm == Some(Arm::E) {
                let ids: BTreeSet<u64> = experience_ids(&row.variant).into_iter().collect();
                for id in ids {
                    let e = exposures.entry(id).or_default();
                    e.trajectories += 1;
                    e.successes += u64::from(row.success);
                }
                if experiences.is_empty() {
                    experiences = row.variant.inject.clone();
                }
            }
            tally.trajectories += 1;
            tally.successes += u64::from(row.success);
            played.push(Played {
                id: row.trajectory_id,
                arm,
                score: row_score(row, config.score),
                success: row.success,
            });
        }
        let of = |arm: Arm| played.iter().filter(move |p| p.arm == Some(arm));
        let mean = |arm: Arm| {
            let scores: Vec<f64> = of(arm).map(|p| p.score).collect();
            (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64)
        };
        let gain = match (mean(Arm::E), mean(Arm::N)) {
            (Some(e), Some(n)) => Some(e - n),
            _ => None,
        };
        // `min_by` / `max_by` keep the last of equal elements; fold to keep the first.
        let worst_e = of(Arm::E).fold(None, |w: Option<&Played>, p| match w {
            Some(w) if w.score <= p.score => Some(w),
            _ => Some(p),
        });
        let best_n = of(Arm::N).fold(None, |b: Option<&Played>, p| match b {
            Some(b) if b.score >= p.score => Some(b),
            _ => Some(p),
        });
        let contrast = match (worst_e, best_n) {
            (Some(e), Some(n)) if !e.success && n.success => Some(Contrast {
                best_n: n.id,
                worst_e: e.id,
                experiences: experiences.clone(),
            }),
            _ => None,
        };
        let best_success = played
            .iter()
            .filter(|p| p.success)
            .fold(None, |b: Option<&Played>, p| match b {
                Some(b) if b.score >= p.score => Some(b),
                _ => Some(p),
            })
            .map(|p| p.id);
        out.push(GroupOutcome {
            group_id,
            task_id: head.task_id.clone(),
            task_kind: task_kind(&head.variant).to_string(),
            gain,
            exposures: if gain.is_some() {
                exposures
            } else {
                BTreeMap::new()
            },
            contrast,
            best_success,
            tally,
        });
    }
    Ok(out)
}

impl Window {
    /// Buffers one step's groups.
    pub fn record(&mut self, outcomes: &[GroupOutcome]) {
        self.steps += 1;
        for o in outcomes {
            let kind = self.kinds.entry(o.task_kind.clone()).or_default();
            kind.trajectories += o.tally.trajectories;
            kind.successes += o.tally.successes;
            let Some(g) = o.gain else { continue };
            for (&id, t) in &o.exposures {
                self.credits.entry(id).or_default().push(g);
                let e = self.exposures.entry(id).or_default();
                e.trajectories += t.trajectories;
                e.successes += t.successes;
            }
        }
    }

    /// Whether some task kind's success rate in the window is below `threshold`.
    pub fn struggling(&self, threshold: f64) -> bool {
        self.kinds
            .values()
            .any(|k| k.trajectories > 0 && k.rate() < threshold)
    }
}

/// `(1 − β) u + β · mean(credits)` (u unchanged without credits).
pub fn ema(u: f64, credits: &[f64], beta: f64) -> f64 {
    if credits.is_empty() {
        return u;
    }
    let mean = credits.iter().sum::<f64>() / credits.len() as f64;
    (1.0 - beta) * u + beta * mean
}

/// The negative-streak rule for a window closing at `step` with mean credit `mean`.
pub fn update_streak(stats: &mut EntryStats, mean: f64, step: u64, interval: u64) {
    if mean < 0.0 {
        let contiguous = stats
            .last_negative_step
            .and_then(|s| s.checked_add(interval))
            == Some(step);
        stats.negative_streak = if contiguous {
            stats.negative_streak.saturating_add(1)
        } else {
            1
        };
        stats.last_negative_step = Some(step);
    } else {
        stats.negative_streak = 0;
    }
}

/// The capacity trim's retain score `u + score_c · c_ucb · sqrt(ln(1 + N) / (1 + n))`.
pub fn retain_score(u: f64, n: u64, pool_exposures: u64, score_c: f64, c_ucb: f64) -> f64 {
    u + score_c * c_ucb * ((1.0 + pool_exposures as f64).ln() / (1.0 + n as f64)).sqrt()
}

/// What a window's management did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Managed {
    /// Experiences whose statistics got a credit.
    pub credited: usize,
    /// Hard-pruned experiences.
    pub retired: Vec<u64>,
    /// Experiences the capacity trim removed.
    pub evicted: Vec<u64>,
    /// Active experiences left, and their mean utility (0 without any).
    pub bank_size: usize,
    pub utility_mean: f64,
    /// Reflections the skill creator accepted / refused (e.g. a full queue).
    pub requested: usize,
    pub refused: usize,
}

/// Every active experience (both pools), newest first.
fn all_experiences(host: &dyn Host) -> Result<Vec<BankEntry>> {
    Ok(host
        .bank_query(&BankQuery {
            text: String::new(),
            k: usize::MAX,
            kinds: vec![EntryKind::Experience],
            task_id: None,
            include_general: true,
            statuses: Vec::new(),
            trajectory_id: None,
        })?
        .into_iter()
        .map(|r| r.entry)
        .collect())
}

/// Closes a window at step `step` (see the module docs). `outcomes` are the groups of the
/// window's last step, the only ones the skill creator can be asked about.
pub fn manage(
    config: &EdgeConfig,
    window: &Window,
    step: u64,
    outcomes: &[GroupOutcome],
    host: &dyn Host,
) -> Result<Managed> {
    let mut out = Managed::default();
    let mut entries = all_experiences(host)?;

    // 1. Credits, utility, streaks.
    let mut updates = Vec::new();
    for e in &mut entries {
        let before = e.stats.clone();
        match window.credits.get(&e.id) {
            Some(credits) if !credits.is_empty() => {
                let mean = credits.iter().sum::<f64>() / credits.len() as f64;
                e.stats.utility_ema = ema(e.stats.utility_ema, credits, config.beta);
                let seen = window.exposures.get(&e.id).copied().unwrap_or_default();
                e.stats.exposures += seen.trajectories;
                e.stats.successes += seen.successes;
                update_streak(&mut e.stats, mean, step, config.update_frequency);
                out.credited += 1;
            }
            _ => e.stats.negative_streak = 0,
        }
        if e.stats != before {
            updates.push(StatsUpdate {
                id: e.id,
                set: Some(e.stats.clone()),
                ..StatsUpdate::default()
            });
        }
    }
    if !updates.is_empty() {
        host.bank_update(&updates)?;
    }

    // 2. Hard prune.
    out.retired = entries
        .iter()
        .filter(|e| {
            e.stats.exposures >= config.min_exposures
                && e.stats.utility_ema <= config.utility_threshold
                && e.stats.negative_streak >= config.negative_windows
        })
        .map(|e| e.id)
        .collect();
    let retired: HashSet<u64> = out.retired.iter().copied().collect();
    entries.retain(|e| !retired.contains(&e.id));

    // 3. Capacity trim, per pool.
    for general in [true, false] {
        let pool: Vec<&BankEntry> = entries
            .iter()
            .filter(|e| e.task_id.is_none() == general)
            .collect();
        if pool.len() <= config.max_items {
            continue;
        }
        let total: u64 = pool.iter().map(|e| e.stats.exposures).sum();
        let mut evictable: Vec<(f64, u64)> = pool
            .iter()
            .filter(|e| step.saturating_sub(e.provenance.step) >= config.protect_recent_steps)
            .map(|e| {
                let score = retain_score(
                    e.stats.utility_ema,
                    e.stats.exposures,
                    total,
                    config.score_c,
                    config.c_ucb,
                );
                (score, e.id)
            })
            .collect();
        evictable.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let excess = pool.len() - config.max_items;
        out.evicted
            .extend(evictable.iter().take(excess).map(|&(_, id)| id));
    }
    let evicted: HashSet<u64> = out.evicted.iter().copied().collect();
    entries.retain(|e| !evicted.contains(&e.id));
    let gone: Vec<u64> = out.retired.iter().chain(&out.evicted).copied().collect();
    if !gone.is_empty() {
        host.bank_retire(&gone)?;
    }
    out.bank_size = entries.len();
    if !entries.is_empty() {
        out.utility_mean =
            entries.iter().map(|e| e.stats.utility_ema).sum::<f64>() / entries.len() as f64;
    }

    // 4. Synthesis.
    if config.in_warmup(step) {
        let requests = synthesis_requests(config, window, outcomes, &entries);
        if !requests.is_empty() {
            match host.reflect(&requests) {
                Ok(tickets) => out.requested = tickets.len(),
                // A refused call (a full queue) is a counted drop: training goes on.
                Err(_) => out.refused = requests.len(),
            }
        }
    }
    Ok(out)
}

/// The reflection requests of a window (see the module docs, step 4). `entries` are the
/// active experiences after pruning.
pub fn synthesis_requests(
    config: &EdgeConfig,
    window: &Window,
    outcomes: &[GroupOutcome],
    entries: &[BankEntry],
) -> Vec<ReflectionRequest> {
    let cap = config.max_new_experiences;
    let chars = config.max_experience_chars;
    let mut requests = Vec::new();
    let mut tasks: HashSet<&str> = HashSet::new();
    if window.struggling(config.update_threshold) {
        let mut contrasts: Vec<(&GroupOutcome, &Contrast)> = outcomes
            .iter()
            .filter_map(|o| o.contrast.as_ref().map(|c| (o, c)))
            .take(config.max_failed_trajectories)
            .collect();
        let rate = |kind: &str| window.kinds.get(kind).map_or(0.0, Tally::rate);
        // Stable: within a kind, batch order.
        contrasts.sort_by(|a, b| rate(&a.0.task_kind).total_cmp(&rate(&b.0.task_kind)));
        for (o, c) in contrasts.into_iter().take(cap) {
            tasks.insert(&o.task_id);
            requests.push(request(
                config,
                o,
                vec![c.best_n, c.worst_e],
                format!(
                    "Two attempts at the same task follow. Trajectory {n} played without \
                     experiences and succeeded; trajectory {e} played with the experiences \
                     below and failed. Write one short, general lesson, at most {chars} \
                     characters, that would have made trajectory {e} succeed, correcting any \
                     experience that misled it.\n\nExperiences trajectory {e} was given:\n{x}",
                    n = c.best_n,
                    e = c.worst_e,
                    x = c.experiences
                ),
                "contrast",
            ));
        }
    }
    if config.bootstrap {
        let known: HashSet<&str> = entries.iter().filter_map(source_task).collect();
        for o in outcomes {
            if requests.len() >= cap {
                break;
            }
            let Some(t) = o.best_success else { continue };
            if known.contains(o.task_id.as_str()) || !tasks.insert(&o.task_id) {
                continue;
            }
            requests.push(request(
                config,
                o,
                vec![t],
                format!(
                    "Trajectory {t} below solved its task. Write one short, general lesson, at \
                     most {chars} characters, that would help solve tasks like it."
                ),
                "bootstrap",
            ));
        }
    }
    requests
}

fn request(
    config: &EdgeConfig,
    o: &GroupOutcome,
    trajectories: Vec<u64>,
    prompt: String,
    source: &str,
) -> ReflectionRequest {
    let mut extra = serde_json::Map::new();
    extra.insert("edge_source".into(), json!(source));
    extra.insert("edge_group".into(), json!(o.group_id));
    extra.insert(TASK_KEY.into(), json!(o.task_id));
    ReflectionRequest {
        kind: EntryKind::Experience,
        prompt,
        trajectories,
        task_id: match config.scope {
            Scope::Task => Some(o.task_id.clone()),
            Scope::General => None,
        },
        extra,
        ..ReflectionRequest::default()
    }
}

/// The entry `extra` key holding the task an experience came from (whatever its scope).
pub const TASK_KEY: &str = "edge_task";

/// The task an experience came from: its `task_id`, else `extra.edge_task`.
fn source_task(e: &BankEntry) -> Option<&str> {
    e.task_id
        .as_deref()
        .or_else(|| e.extra.get(TASK_KEY).and_then(|v| v.as_str()))
}
