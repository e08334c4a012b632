//! A test host with an in-memory bank, a queued skill creator that answers like the kernel's
//! `template` reflector, and a metric log; plus a small household world that plays the
//! plugin's plans.

use std::sync::Mutex;

use cairn_plugin_sdk::{
    Algorithm, BankEntry, BankQuery, Batch, ContextVariant, EntryStatus, GroupRequest, Host,
    NewEntry, Observation, PluginError, ReflectionRequest, Result, Retrieved, StatsUpdate,
    StepReport, TurnContext, TurnContextRequest, TurnRow, TurnSummary,
};
use rand::{Rng, SeedableRng};

#[derive(Default)]
pub struct Lab {
    pub entries: Mutex<Vec<BankEntry>>,
    /// Reflections asked and not answered yet: (ticket, request).
    pub queue: Mutex<Vec<(u64, ReflectionRequest)>>,
    /// Every reflection ever asked.
    pub asked: Mutex<Vec<ReflectionRequest>>,
    pub tickets: Mutex<u64>,
    pub updates: Mutex<Vec<StatsUpdate>>,
    pub metrics: Mutex<Vec<(String, f64)>>,
    /// `reflect` refuses, as with a full queue.
    pub refuse: Mutex<bool>,
}

impl Host for Lab {
    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        let entries = self.entries.lock().unwrap();
        let statuses = if q.statuses.is_empty() {
            vec![EntryStatus::Active, EntryStatus::UnderTest]
        } else {
            q.statuses.clone()
        };
        Ok(entries
            .iter()
            .rev()
            .filter(|e| {
                (q.kinds.is_empty() || q.kinds.contains(&e.kind)) && statuses.contains(&e.status)
            })
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 0.0,
            })
            .collect())
    }

    fn bank_put(&self, new: &[NewEntry]) -> Result<Vec<u64>> {
        let mut entries = self.entries.lock().unwrap();
        let mut ids = Vec::new();
        for e in new {
            let id = entries.len() as u64 + 1;
            entries.push(BankEntry {
                id,
                kind: e.kind,
                text: e.text.clone(),
                trigger: e.trigger.clone(),
                task_id: e.task_id.clone(),
                parent: e.parent,
                status: e.status,
                provenance: e.provenance.clone(),
                extra: e.extra.clone(),
                ..BankEntry::default()
            });
            ids.push(id);
        }
        Ok(ids)
    }

    fn bank_update(&self, updates: &[StatsUpdate]) -> Result<()> {
        let mut entries = self.entries.lock().unwrap();
        for u in updates {
            let Some(e) = entries.iter_mut().find(|e| e.id == u.id) else {
                return Err(PluginError::host(format!("no entry {}", u.id)));
            };
            e.stats.exposures += u.add_exposures;
            e.stats.successes += u.add_successes;
            if let Some(s) = u.status {
                e.status = s;
            }
        }
        self.updates.lock().unwrap().extend_from_slice(updates);
        Ok(())
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        if *self.refuse.lock().unwrap() {
            return Err(PluginError::host(
                "the skill creator's queue is full (`skills.queue`)",
            ));
        }
        let mut tickets = self.tickets.lock().unwrap();
        let mut out = Vec::new();
        for r in requests {
            *tickets += 1;
            self.queue.lock().unwrap().push((*tickets, r.clone()));
            self.asked.lock().unwrap().push(r.clone());
            out.push(*tickets);
        }
        Ok(out)
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.to_string(), value));
    }
}

impl Lab {
    /// Answers every queued reflection with an entry whose text is `text(request)` and whose
    /// trigger is `trigger`, the way the skill creator writes it (`extra` from the request
    /// plus `reflection_ticket`); returns the new ids, for the next step's report.
    pub fn answer(
        &self,
        text: impl Fn(&ReflectionRequest) -> String,
        trigger: Option<&str>,
    ) -> Vec<u64> {
        let queue: Vec<(u64, ReflectionRequest)> = self.queue.lock().unwrap().drain(..).collect();
        let entries: Vec<NewEntry> = queue
            .iter()
            .map(|(ticket, r)| {
                let mut extra = r.extra.clone();
                extra.insert("reflection_ticket".into(), (*ticket).into());
                extra.insert("requested_by".into(), "grpo+reskill".into());
                NewEntry {
                    kind: r.kind,
                    text: text(r),
                    trigger: trigger.map(str::to_string),
                    task_id: r.task_id.clone(),
                    parent: r.parent,
                    status: r.status,
                    extra,
                    ..NewEntry::default()
                }
            })
            .collect();
        self.bank_put(&entries).unwrap()
    }

    /// The last value logged under `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }

    pub fn entry(&self, id: u64) -> BankEntry {
        self.entries.lock().unwrap()[id as usize - 1].clone()
    }
}

pub const KINDS: [&str; 2] = ["cool", "heat"];
pub const GROUP: u32 = 8;

pub fn win() -> Vec<&'static str> {
    vec![
        "go to drawer 1",
        "open drawer 1",
        "take apple 1 from drawer 1",
        "heat apple 1 with microwave 1",
    ]
}

pub fn lose() -> Vec<&'static str> {
    vec![
        "go to drawer 2",
        "take apple 1 from drawer 2",
        "take apple 1 from drawer 2",
    ]
}

pub fn observation(kind: &str, turn: usize) -> String {
    format!("task : {kind} some apple and put it on the table . you are at drawer {turn} .")
}

pub fn row(
    group: u64,
    traj: u64,
    turn: usize,
    kind: &str,
    variant: &ContextVariant,
    action: &str,
    success: bool,
) -> TurnRow {
    let mut r = TurnRow {
        group_id: group,
        trajectory_id: traj,
        turn: turn as u32,
        task_id: format!("{kind}-{group}"),
        variant: variant.clone(),
        episode_reward: if success { 1.0 } else { 0.0 },
        success,
        observation: observation(kind, turn),
        ..TurnRow::default()
    };
    r.info.insert("action".into(), action.into());
    r
}

/// Plays one step: two groups (one per kind) of eight slots, planned by the plugin. A slot
/// whose plan fired a skill on the goal succeeds with probability 0.8, a plain one with 0.2; slot 0
/// always succeeds and slot 7 always fails, so every group has both. Turns after the first
/// go through `next_context`, and each row records the variant of its own turn.
pub fn play(plugin: &mut dyn Algorithm, lab: &Lab, step: u64) -> Batch {
    let mut rows = Vec::new();
    for (g, kind) in KINDS.iter().enumerate() {
        let group = step * 10 + g as u64;
        let request = GroupRequest {
            step,
            group_id: group,
            task_id: format!("{kind}-{group}"),
            task_kind: kind.to_string(),
            task_description: format!("{kind} some apple and put it on the table"),
            group_size: GROUP,
            seed: 1000 * step + g as u64,
        };
        let plan = plugin.plan_group(&request, lab).unwrap();
        assert_eq!(plan.len(), GROUP as usize);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(77 + group);
        for (k, planned) in plan.into_iter().enumerate() {
            let helped = planned.extra["triggered"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
            let p = if helped { 0.8 } else { 0.2 };
            let draw: f64 = rng.gen();
            let success = k == 0 || (k != 7 && draw < p);
            let actions = if success { win() } else { lose() };
            let traj = group * 100 + k as u64;
            let mut variant = planned;
            let mut turns = Vec::new();
            for (t, action) in actions.iter().enumerate() {
                if t > 0 {
                    let answer = plugin
                        .next_context(
                            &TurnContextRequest {
                                step,
                                group_id: group,
                                trajectory_id: traj,
                                task_id: request.task_id.clone(),
                                turn: t as u32,
                                variant: variant.clone(),
                                turns: turns.clone(),
                                observation: Observation {
                                    text: observation(kind, t),
                                    ..Observation::default()
                                },
                            },
                            lab,
                        )
                        .unwrap();
                    if let TurnContext::Variant { variant: v } = answer {
                        variant = v;
                    }
                }
                rows.push(row(group, traj, t, kind, &variant, action, success));
                turns.push(TurnSummary {
                    observation: observation(kind, t),
                    action: action.to_string(),
                    ..TurnSummary::default()
                });
            }
        }
    }
    Batch { step, rows }
}

/// The `template` reflector's text for a request: the first successful trajectory of the
/// request's, by turn.
pub fn template(batch: &Batch) -> impl Fn(&ReflectionRequest) -> String + '_ {
    move |r: &ReflectionRequest| {
        for &id in &r.trajectories {
            let mut rows: Vec<&TurnRow> = batch
                .rows
                .iter()
                .filter(|row| row.trajectory_id == id)
                .collect();
            rows.sort_by_key(|row| row.turn);
            if rows.first().is_some_and(|row| row.success) {
                let actions: Vec<&str> = rows
                    .iter()
                    .map(|row| row.info["action"].as_str().unwrap())
                    .collect();
                return format!("solved in {} turns: {}", actions.len(), actions.join("; "));
            }
        }
        "failed".into()
    }
}

/// Plays `steps` and observes each one, answering reflections between steps like the skill
/// creator does (entries reach the plugin in the next step's report).
pub fn run(
    plugin: &mut dyn Algorithm,
    lab: &Lab,
    steps: std::ops::RangeInclusive<u64>,
    delivered: &mut Vec<u64>,
) -> Vec<Batch> {
    let mut batches = Vec::new();
    for step in steps {
        let batch = play(plugin, lab, step);
        let report = StepReport {
            step,
            policy_version: step,
            batch: batch.clone(),
            new_entries: std::mem::take(delivered),
            ..StepReport::default()
        };
        plugin.observe(&report, lab).unwrap();
        *delivered = lab.answer(template(&batch), None);
        batches.push(batch);
    }
    batches
}
