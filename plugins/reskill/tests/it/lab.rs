//! The SDK's mock host as `reskill` meets the kernel, with a skill creator that answers
//! between steps like the kernel's `template` reflector; plus a small household world that
//! plays the plugin's plans.

use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, GroupRequest, NewEntry, Observation, ReflectionRequest,
    StepReport, TurnContext, TurnContextRequest, TurnRow, TurnSummary,
};
use rand::{Rng, SeedableRng};

/// The mock host with bank queries newest first; reflections wait in
/// [`MockHost::pending`] until the test answers them ([`Lab::answer`]).
pub fn lab_host() -> MockHost {
    MockHost::default().with_ranking(|_, matches| matches.reverse())
}

/// The skill creator's move on the [`lab_host`] host.
pub trait Lab {
    /// Answers every pending reflection with an entry whose text is `text(request)` and whose
    /// trigger is `trigger`, the way the skill creator writes it (`extra` from the request
    /// plus `reflection_ticket`); returns the new ids, for the next step's report.
    fn answer(
        &self,
        text: impl Fn(&ReflectionRequest) -> String,
        trigger: Option<&str>,
    ) -> Vec<u64>;
}

impl Lab for MockHost {
    fn answer(
        &self,
        text: impl Fn(&ReflectionRequest) -> String,
        trigger: Option<&str>,
    ) -> Vec<u64> {
        self.answer_pending(|ticket, r| {
            let mut extra = r.extra.clone();
            extra.insert("reflection_ticket".into(), ticket.into());
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
        .unwrap()
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
pub fn play(plugin: &mut dyn Algorithm, lab: &MockHost, step: u64) -> Batch {
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
    lab: &MockHost,
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
