//! Composing algorithm plugins: one advantage estimator with planners and auxiliary-loss
//! plugins stacked on it (`[algorithm]` plus `[[algorithm.stack]]` in the pipeline config).
//!
//! The composition rules live in the SDK, not the kernel, so a plugin's tests stack it over
//! `grpo` or `gigpo` in process with no kernel dependency; the kernel's `stack` module
//! re-exports these types and builds the pipeline's stack from its config.
//!
//! [`Stack`] implements [`Algorithm`] over its members, so the kernel drives one algorithm
//! whatever the stack:
//! - **plan_group**: the planner's plan (at most one member plans; without one, every slot is
//!   plain);
//! - **next_context**: asked of the member that sets `turn_context` (at most one: two hooks
//!   would each hide the other's answers, depending on their order); the first
//!   answer other than `Keep` wins;
//! - **signals**: the estimator's advantages, re-weighted by every member's credit arrays
//!   (see below); every member's auxiliary and teacher terms, extra rows, dropped groups and
//!   metrics are merged (a stacked member sees the batch and gives no advantages);
//! - **observe**, **save_state**, **load_state**: every member (state is one JSON object keyed
//!   by position and plugin name).
//!
//! [`Stack::new`] checks the composition: exactly one estimator, and it is the `[algorithm]`
//! plugin; at most one planner; no stacked member giving advantages. So `edge` over `gigpo` is
//! a config change, and no advantage code is copied into the stacked plugin.
//!
//! **Credit composition.** A member that re-routes or adds credit (ECHO's source-indexed
//! credit, OPID's teacher advantages) gives [`Signals::advantage_scale`] and/or
//! [`Signals::advantage_add`] (`[rows][L]`, over the batch's rows then its own extra rows);
//! the estimator may give them too. Per token of a mask-1 slot the stack's advantage is
//!
//! `A_l = A^est_l · Π_m scale^m_l + Σ_m add^m_l`
//!
//! over the members `m` that gave each array (a member without one contributes 1 and 0), in
//! f64, rounded once to f32. Mask-0 slots keep the estimator's value. The stack's answer
//! carries these final advantages and leaves `advantage_scale` / `advantage_add` empty, so
//! nothing downstream applies them twice. A member's arrays of the wrong shape, or holding a
//! non-finite value on a mask-1 token, are an error naming the plugin.

use crate::{
    Algorithm, Batch, ContextVariant, GroupRequest, Host, PluginError, Requirements, Role, Signals,
    StepReport, TurnContext, TurnContextRequest, TurnRow,
};

/// A member of a stack: the plugin's name (for errors and state), its requirements, the
/// algorithm itself.
pub struct Member {
    pub name: String,
    pub requirements: Requirements,
    pub algorithm: Box<dyn Algorithm>,
}

/// Why a stack cannot be built: the index of the offending member (0 is `[algorithm]`, `i` is
/// `[[algorithm.stack]]` entry `i − 1`) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackError {
    pub member: usize,
    pub message: String,
}

/// An estimator with planners and auxiliary plugins stacked on it.
pub struct Stack {
    members: Vec<Member>,
    planner: Option<usize>,
    requirements: Requirements,
}

impl Stack {
    /// Checks and builds a stack; `members[0]` is the estimator.
    pub fn new(members: Vec<Member>) -> Result<Stack, StackError> {
        let Some(first) = members.first() else {
            return Err(StackError {
                member: 0,
                message: "a pipeline needs an `[algorithm]` plugin".into(),
            });
        };
        if first.requirements.role != Role::Estimator {
            return Err(StackError {
                member: 0,
                message: format!(
                    "`{}` is {} {} plugin, but `[algorithm]` is the advantage estimator; put \
                     an estimator (grpo, gigpo, ...) there and stack `{}` under \
                     `[[algorithm.stack]]`",
                    first.name,
                    if first.requirements.role == Role::Auxiliary {
                        "an"
                    } else {
                        "a"
                    },
                    first.requirements.role.as_str(),
                    first.name
                ),
            });
        }
        let mut planner: Option<usize> = None;
        for (i, m) in members.iter().enumerate().skip(1) {
            match m.requirements.role {
                Role::Estimator => {
                    return Err(StackError {
                        member: i,
                        message: format!(
                            "`{}` is an advantage estimator, and `{}` already gives the \
                             advantages; a pipeline has exactly one estimator (remove one, or \
                             use a planner/auxiliary plugin in the stack)",
                            m.name, first.name
                        ),
                    })
                }
                Role::Planner => {
                    if let Some(p) = planner {
                        return Err(StackError {
                            member: i,
                            message: format!(
                                "`{}` and `{}` both plan the rollout slots; a stack has at most \
                                 one planner",
                                members[p].name, m.name
                            ),
                        });
                    }
                    planner = Some(i);
                }
                Role::Auxiliary => {}
            }
        }
        for (i, m) in members.iter().enumerate() {
            if let Some(j) = members[..i].iter().position(|o| o.name == m.name) {
                return Err(StackError {
                    member: i,
                    message: format!(
                        "`{}` is in the stack twice (members {j} and {i}, counting `[algorithm]` \
                         as 0); each plugin takes part once, or its terms, credit and metrics \
                         would count twice: remove one",
                        m.name
                    ),
                });
            }
        }
        let hooks: Vec<usize> = (0..members.len())
            .filter(|&i| members[i].requirements.turn_context)
            .collect();
        if let [a, b, ..] = hooks[..] {
            return Err(StackError {
                member: b,
                message: format!(
                    "`{}` and `{}` both set per-turn contexts (`turn_context`); the first answer \
                     of a turn would hide the other's, so a stack has at most one such plugin: \
                     remove one",
                    members[a].name, members[b].name
                ),
            });
        }
        let requirements = union(members.iter().map(|m| &m.requirements));
        Ok(Stack {
            members,
            planner,
            requirements,
        })
    }

    /// The names of the members, estimator first.
    pub fn names(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.name.as_str()).collect()
    }

    /// Each member's name and requirements, estimator first.
    pub fn member_requirements(&self) -> impl Iterator<Item = (&str, &Requirements)> {
        self.members
            .iter()
            .map(|m| (m.name.as_str(), &m.requirements))
    }

    fn named(&self, i: usize, e: PluginError) -> PluginError {
        if self.members.len() == 1 || e.message.starts_with("plugin `") {
            e
        } else {
            PluginError {
                kind: e.kind,
                message: format!("plugin `{}`: {}", self.members[i].name, e.message),
            }
        }
    }
}

/// Checks one member's `advantage_scale` or `advantage_add` (`what`): empty, or one `[L]`
/// vector per row of `rows` (the batch's rows, `base` of them, then the member's own extra
/// rows), finite on every mask-1 token. Errors name the plugin.
fn check_credit(
    name: &str,
    what: &str,
    values: &[Vec<f32>],
    rows: &[&TurnRow],
    base: usize,
) -> crate::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    if values.len() != rows.len() {
        return Err(PluginError::input(format!(
            "plugin `{name}`: {what} has {} rows but the batch has {base} rows and the plugin \
             {} extra rows; give one [L] vector per batch row then per own extra row (or none)",
            values.len(),
            rows.len() - base
        )));
    }
    for (i, (v, row)) in values.iter().zip(rows).enumerate() {
        if v.len() != row.response_ids.len() {
            return Err(PluginError::input(format!(
                "plugin `{name}`: {what}: row {i} has {} values but {} response tokens",
                v.len(),
                row.response_ids.len()
            )));
        }
        let trainable = |l: usize| row.response_mask.get(l) == Some(&1);
        if let Some(l) = (0..v.len()).find(|&l| trainable(l) && !v[l].is_finite()) {
            return Err(PluginError::input(format!(
                "plugin `{name}`: {what}: row {i}, token {l} is {} on a trainable token \
                 (mask 1); give a finite value",
                v[l]
            )));
        }
    }
    Ok(())
}

/// The members' credit arrays merged over the stack's rows (the batch's, then every member's
/// extra rows in stack order): `Π_m scale^m` and `Σ_m add^m` per token, in f64. `None` until a
/// member gives that array, so a stack without credit arrays leaves the advantages untouched.
#[derive(Default)]
struct Credit {
    scale: Option<Vec<Vec<f64>>>,
    add: Option<Vec<Vec<f64>>>,
}

impl Credit {
    /// Folds in one member's arrays. Their rows are the batch's (`base` of them) then the
    /// member's own extra rows, which sit at `base + shift ..` among the stack's rows; `lens`
    /// is the response length of every stack row merged so far (the member's included).
    fn merge(
        &mut self,
        scale: Vec<Vec<f32>>,
        add: Vec<Vec<f32>>,
        base: usize,
        shift: usize,
        lens: &[usize],
    ) {
        let fold = |acc: &mut Option<Vec<Vec<f64>>>,
                    values: Vec<Vec<f32>>,
                    identity: f64,
                    op: fn(f64, f64) -> f64| {
            if let Some(acc) = acc.as_mut() {
                acc.extend(lens[acc.len()..].iter().map(|&l| vec![identity; l]));
            }
            if values.is_empty() {
                return;
            }
            let acc = acc.get_or_insert_with(|| lens.iter().map(|&l| vec![identity; l]).collect());
            for (i, v) in values.into_iter().enumerate() {
                let j = if i < base { i } else { i + shift };
                for (a, x) in acc[j].iter_mut().zip(v) {
                    *a = op(*a, f64::from(x));
                }
            }
        };
        fold(&mut self.scale, scale, 1.0, |a, x| a * x);
        fold(&mut self.add, add, 0.0, |a, x| a + x);
    }

    /// `A_l ← A_l · Π scale_l + Σ add_l` on the mask-1 tokens of `rows`.
    fn apply(&self, rows: &[&TurnRow], advantages: &mut [Vec<f32>]) {
        if self.scale.is_none() && self.add.is_none() {
            return;
        }
        let at = |acc: &Option<Vec<Vec<f64>>>, r: usize, l: usize, identity: f64| {
            acc.as_ref()
                .and_then(|a| a.get(r))
                .and_then(|a| a.get(l))
                .copied()
                .unwrap_or(identity)
        };
        for (r, (row, adv)) in rows.iter().zip(advantages.iter_mut()).enumerate() {
            for (l, a) in adv.iter_mut().enumerate() {
                if row.response_mask.get(l) == Some(&1) {
                    let (s, d) = (at(&self.scale, r, l, 1.0), at(&self.add, r, l, 0.0));
                    *a = (f64::from(*a) * s + d) as f32;
                }
            }
        }
    }
}

/// What the pipeline must provide for a whole stack: every member's needs.
fn union<'a>(all: impl Iterator<Item = &'a Requirements>) -> Requirements {
    let mut out = Requirements::default();
    for r in all {
        out.anchor_keys |= r.anchor_keys;
        out.step_rewards |= r.step_rewards;
        out.feedback |= r.feedback;
        out.teacher_scores |= r.teacher_scores;
        out.teacher_topk |= r.teacher_topk;
        out.ref_logprobs |= r.ref_logprobs;
        out.generation |= r.generation;
        for k in &r.bank {
            if !out.bank.contains(k) {
                out.bank.push(*k);
            }
        }
        out.reflection |= r.reflection;
        out.tool_free_slots |= r.tool_free_slots;
        out.turn_context |= r.turn_context;
        out.min_group_size = out.min_group_size.max(r.min_group_size);
        out.even_group_size |= r.even_group_size;
        out.dynamic_sampling |= r.dynamic_sampling;
    }
    out
}

impl Algorithm for Stack {
    fn requirements(&self) -> Requirements {
        self.requirements.clone()
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> crate::Result<Vec<ContextVariant>> {
        let Some(p) = self.planner else {
            // Without a planner the estimator plans (its default is all-plain).
            return self.members[0].algorithm.plan_group(request, host);
        };
        self.members[p]
            .algorithm
            .plan_group(request, host)
            .map_err(|e| self.named(p, e))
    }

    fn next_context(
        &mut self,
        request: &TurnContextRequest,
        host: &dyn Host,
    ) -> crate::Result<TurnContext> {
        for i in 0..self.members.len() {
            if !self.members[i].requirements.turn_context {
                continue;
            }
            let answer = self.members[i]
                .algorithm
                .next_context(request, host)
                .map_err(|e| self.named(i, e))?;
            if answer != TurnContext::Keep {
                return Ok(answer);
            }
        }
        Ok(TurnContext::Keep)
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> crate::Result<Signals> {
        let mut out = self.members[0]
            .algorithm
            .signals(batch, host)
            .map_err(|e| self.named(0, e))?;
        if out.advantages.is_empty() && !batch.rows.is_empty() {
            return Err(PluginError::internal(format!(
                "plugin `{}` is the advantage estimator but returned no advantages",
                self.members[0].name
            )));
        }
        let base = batch.rows.len();
        let mut credit = Credit::default();
        {
            let name = &self.members[0].name;
            let scale = std::mem::take(&mut out.advantage_scale);
            let add = std::mem::take(&mut out.advantage_add);
            let rows: Vec<&TurnRow> = batch.rows.iter().chain(&out.extra_rows).collect();
            check_credit(name, "advantage_scale", &scale, &rows, base)?;
            check_credit(name, "advantage_add", &add, &rows, base)?;
            let lens: Vec<usize> = rows.iter().map(|r| r.response_ids.len()).collect();
            credit.merge(scale, add, base, 0, &lens);
        }
        for i in 1..self.members.len() {
            let s = self.members[i]
                .algorithm
                .signals(batch, host)
                .map_err(|e| self.named(i, e))?;
            let name = &self.members[i].name;
            if s.advantages.iter().flatten().any(|&a| a != 0.0) {
                return Err(PluginError::internal(format!(
                    "plugin `{name}` is stacked on `{}` but returned advantages; a stacked \
                     plugin adds terms and leaves `advantages` empty",
                    self.members[0].name
                )));
            }
            let member_rows: Vec<&TurnRow> = batch.rows.iter().chain(&s.extra_rows).collect();
            check_credit(
                name,
                "advantage_scale",
                &s.advantage_scale,
                &member_rows,
                base,
            )?;
            check_credit(name, "advantage_add", &s.advantage_add, &member_rows, base)?;
            // Row indices of a member's terms count its own extra rows after the batch's:
            // shift them past the extra rows already merged.
            let shift = out.extra_rows.len();
            let remap = |row: usize| if row >= base { row + shift } else { row };
            for existing in &mut out.aux {
                existing
                    .coefficients
                    .extend(s.extra_rows.iter().map(|r| vec![0.0; r.response_ids.len()]));
            }
            for mut term in s.aux {
                let (head, tail) = term
                    .coefficients
                    .split_at(base.min(term.coefficients.len()));
                let mut coefficients = head.to_vec();
                coefficients.extend(
                    out.extra_rows
                        .iter()
                        .map(|r| vec![0.0; r.response_ids.len()]),
                );
                coefficients.extend_from_slice(tail);
                term.coefficients = coefficients;
                out.aux.push(term);
            }
            for mut term in s.teacher {
                for t in &mut term.targets {
                    t.row = remap(t.row);
                }
                out.teacher.push(term);
            }
            out.advantages
                .extend(s.extra_rows.iter().map(|r| vec![0.0; r.response_ids.len()]));
            out.extra_rows.extend(s.extra_rows);
            let lens: Vec<usize> = batch
                .rows
                .iter()
                .chain(&out.extra_rows)
                .map(|r| r.response_ids.len())
                .collect();
            credit.merge(s.advantage_scale, s.advantage_add, base, shift, &lens);
            for g in s.dropped_groups {
                if !out.dropped_groups.contains(&g) {
                    out.dropped_groups.push(g);
                }
            }
            out.metrics.extend(s.metrics);
        }
        let rows: Vec<&TurnRow> = batch.rows.iter().chain(&out.extra_rows).collect();
        credit.apply(&rows, &mut out.advantages);
        Ok(out)
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> crate::Result<()> {
        for i in 0..self.members.len() {
            self.members[i]
                .algorithm
                .observe(report, host)
                .map_err(|e| self.named(i, e))?;
        }
        Ok(())
    }

    fn save_state(&self) -> crate::Result<String> {
        if self.members.len() == 1 {
            return self.members[0].algorithm.save_state();
        }
        let mut map = serde_json::Map::new();
        for (i, m) in self.members.iter().enumerate() {
            map.insert(
                format!("{i}:{}", m.name),
                serde_json::Value::String(m.algorithm.save_state()?),
            );
        }
        Ok(serde_json::Value::Object(map).to_string())
    }

    fn load_state(&mut self, state: &str) -> crate::Result<()> {
        if self.members.len() == 1 {
            return self.members[0].algorithm.load_state(state);
        }
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(state).map_err(|e| {
                PluginError::input(format!(
                    "the checkpoint's algorithm state is not the state of a stack of {} \
                     plugins ({e}): the file is damaged, or was written by another stack; \
                     resume from another checkpoint or with the stack the run was started \
                     with, or pass --no-resume",
                    self.members.len()
                ))
            })?;
        for (i, m) in self.members.iter_mut().enumerate() {
            let key = format!("{i}:{}", m.name);
            let Some(text) = map.get(&key).and_then(|v| v.as_str()) else {
                return Err(PluginError::input(format!(
                    "the checkpoint's algorithm state has no entry `{key}`: the run was started \
                     with another stack; resume with the same `[algorithm]` and \
                     `[[algorithm.stack]]`, or pass --no-resume"
                )));
            };
            m.algorithm.load_state(text)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AuxTerm, OfflineHost, TeacherForm, TeacherSource, TeacherTarget, TeacherTerm, TurnRow,
    };

    /// A configurable toy member.
    struct Toy {
        role: Role,
        advantage: f32,
        plan_label: Option<&'static str>,
        extra_row: bool,
    }

    impl Algorithm for Toy {
        fn requirements(&self) -> Requirements {
            Requirements {
                role: self.role,
                ..Default::default()
            }
        }
        fn plan_group(
            &mut self,
            request: &GroupRequest,
            _host: &dyn Host,
        ) -> crate::Result<Vec<ContextVariant>> {
            let label = self.plan_label.unwrap_or("plain");
            Ok(vec![
                ContextVariant {
                    label: label.into(),
                    ..Default::default()
                };
                request.group_size as usize
            ])
        }
        fn signals(&self, batch: &Batch, _host: &dyn Host) -> crate::Result<Signals> {
            let mut s = Signals {
                advantages: batch
                    .rows
                    .iter()
                    .map(|r| vec![self.advantage; r.response_ids.len()])
                    .collect(),
                ..Default::default()
            };
            if self.role != Role::Estimator {
                s.advantages.clear();
                let mut coefficients = batch.zeros_like_responses();
                if self.extra_row {
                    let mut row = batch.rows[0].clone();
                    row.train_prompt_ids = Some(vec![42]);
                    coefficients.push(vec![1.0; row.response_ids.len()]);
                    s.teacher.push(TeacherTerm {
                        name: "t".into(),
                        coef: 1.0,
                        form: TeacherForm::SampledReverseKl,
                        targets: vec![TeacherTarget {
                            row: batch.rows.len(),
                            weights: vec![1.0; row.response_ids.len()],
                            source: TeacherSource::Context {
                                context_ids: vec![7],
                            },
                        }],
                    });
                    s.extra_rows.push(row);
                }
                s.aux.push(AuxTerm {
                    name: "aux".into(),
                    coef: 0.5,
                    coefficients,
                });
                s.dropped_groups.push(3);
            }
            Ok(s)
        }
    }

    fn member(name: &str, toy: Toy) -> Member {
        Member {
            name: name.into(),
            requirements: toy.requirements(),
            algorithm: Box::new(toy),
        }
    }

    fn estimator() -> Toy {
        Toy {
            role: Role::Estimator,
            advantage: 1.5,
            plan_label: None,
            extra_row: false,
        }
    }

    fn stacked(role: Role, plan: Option<&'static str>, extra_row: bool) -> Toy {
        Toy {
            role,
            advantage: 0.0,
            plan_label: plan,
            extra_row,
        }
    }

    fn batch() -> Batch {
        Batch {
            step: 0,
            rows: (0..2)
                .map(|i| TurnRow {
                    group_id: 3,
                    trajectory_id: i,
                    response_ids: vec![1, 2],
                    response_logprobs: vec![-1.0; 2],
                    response_mask: vec![1, 1],
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn composition_is_checked() {
        let check = |members: Vec<Member>| Stack::new(members).err();
        let e = check(vec![member("edge", stacked(Role::Planner, None, false))]).unwrap();
        assert_eq!(e.member, 0);
        assert!(
            e.message.starts_with("`edge` is a planner plugin"),
            "{}",
            e.message
        );
        let e = check(vec![
            member("grpo", estimator()),
            member("gigpo", estimator()),
        ])
        .unwrap();
        assert_eq!(e.member, 1);
        assert!(e.message.contains("exactly one estimator"), "{}", e.message);
        let e = check(vec![
            member("gigpo", estimator()),
            member("edge", stacked(Role::Planner, Some("a"), false)),
            member("pats", stacked(Role::Planner, Some("b"), false)),
        ])
        .unwrap();
        assert_eq!(e.member, 2);
        assert_eq!(
            e.message,
            "`edge` and `pats` both plan the rollout slots; a stack has at most one planner"
        );
        assert!(check(vec![
            member("gigpo", estimator()),
            member("edge", stacked(Role::Planner, Some("a"), false)),
            member("aux", stacked(Role::Auxiliary, None, false)),
        ])
        .is_none());
        let e = check(vec![member("sdar", stacked(Role::Auxiliary, None, false))]).unwrap();
        assert!(
            e.message.starts_with("`sdar` is an auxiliary plugin"),
            "{}",
            e.message
        );
        // The same plugin twice: its terms, credit and metrics would count twice.
        let e = check(vec![
            member("grpo", estimator()),
            member("echo", stacked(Role::Auxiliary, None, false)),
            member("echo", stacked(Role::Auxiliary, None, false)),
        ])
        .unwrap();
        assert_eq!(e.member, 2);
        assert!(
            e.message
                .starts_with("`echo` is in the stack twice (members 1 and 2"),
            "{}",
            e.message
        );
        // Two per-turn context hooks: whichever came first would hide the other.
        let hook = |name: &str, role: Role| {
            let mut m = member(name, stacked(role, None, false));
            m.requirements.turn_context = true;
            m
        };
        let e = check(vec![
            member("grpo", estimator()),
            hook("hint", Role::Planner),
            hook("echo", Role::Auxiliary),
        ])
        .unwrap();
        assert_eq!(e.member, 2);
        assert!(
            e.message
                .starts_with("`hint` and `echo` both set per-turn contexts (`turn_context`)"),
            "{}",
            e.message
        );
        assert!(check(vec![
            member("grpo", estimator()),
            hook("hint", Role::Planner),
            member("aux", stacked(Role::Auxiliary, None, false)),
        ])
        .is_none());
    }

    #[test]
    fn the_planner_plans_and_terms_merge_around_the_estimators_advantages() {
        let mut stack = Stack::new(vec![
            member("gigpo", estimator()),
            member("edge", stacked(Role::Planner, Some("experience"), true)),
            member("aux", stacked(Role::Auxiliary, None, true)),
        ])
        .unwrap();
        let host = OfflineHost::default();
        let plan = stack
            .plan_group(
                &GroupRequest {
                    group_size: 2,
                    ..Default::default()
                },
                &host,
            )
            .unwrap();
        assert!(plan.iter().all(|v| v.label == "experience"));
        let b = batch();
        let s = stack.signals(&b, &host).unwrap();
        s.validate_against(&b).unwrap();
        // Two batch rows plus one extra row from each stacked member.
        assert_eq!(s.extra_rows.len(), 2);
        assert_eq!(
            s.advantages,
            vec![
                vec![1.5, 1.5],
                vec![1.5, 1.5],
                vec![0.0, 0.0],
                vec![0.0, 0.0]
            ]
        );
        // Each member's aux term is 1 on its own extra row only.
        assert_eq!(s.aux.len(), 2);
        assert_eq!(s.aux[0].coefficients[2], vec![1.0, 1.0]);
        assert_eq!(s.aux[0].coefficients[3], vec![0.0, 0.0]);
        assert_eq!(s.aux[1].coefficients[2], vec![0.0, 0.0]);
        assert_eq!(s.aux[1].coefficients[3], vec![1.0, 1.0]);
        // The second member's teacher target moved past the first member's extra row.
        let rows: Vec<usize> = s.teacher.iter().map(|t| t.targets[0].row).collect();
        assert_eq!(rows, vec![2, 3]);
        assert_eq!(s.dropped_groups, vec![3]);
    }

    #[test]
    fn a_stacked_member_giving_advantages_is_an_error() {
        let mut stack = Stack::new(vec![
            member("grpo", estimator()),
            member(
                "bad",
                Toy {
                    role: Role::Auxiliary,
                    advantage: 1.0,
                    plan_label: None,
                    extra_row: false,
                },
            ),
        ])
        .unwrap();
        // The toy clears its advantages when stacked; make it keep them.
        struct Keeps;
        impl Algorithm for Keeps {
            fn signals(&self, batch: &Batch, _host: &dyn Host) -> crate::Result<Signals> {
                Ok(Signals {
                    advantages: vec![vec![1.0; 2]; batch.rows.len()],
                    ..Default::default()
                })
            }
        }
        stack.members[1].algorithm = Box::new(Keeps);
        let e = stack
            .signals(&batch(), &OfflineHost::default())
            .unwrap_err();
        assert!(
            e.message
                .starts_with("plugin `bad` is stacked on `grpo` but returned advantages"),
            "{e}"
        );
    }

    /// A stacked member that gives only credit arrays (and optionally one extra row).
    struct Credits {
        scale: Vec<Vec<f32>>,
        add: Vec<Vec<f32>>,
        extra_row: bool,
    }

    impl Algorithm for Credits {
        fn requirements(&self) -> Requirements {
            Requirements {
                role: Role::Auxiliary,
                ..Default::default()
            }
        }
        fn signals(&self, batch: &Batch, _host: &dyn Host) -> crate::Result<Signals> {
            let mut s = Signals {
                advantage_scale: self.scale.clone(),
                advantage_add: self.add.clone(),
                ..Default::default()
            };
            if self.extra_row {
                s.extra_rows.push(batch.rows[0].clone());
            }
            Ok(s)
        }
    }

    fn credits(name: &str, scale: Vec<Vec<f32>>, add: Vec<Vec<f32>>, extra_row: bool) -> Member {
        member_of(
            name,
            Credits {
                scale,
                add,
                extra_row,
            },
        )
    }

    fn member_of(name: &str, algorithm: impl Algorithm + 'static) -> Member {
        Member {
            name: name.into(),
            requirements: algorithm.requirements(),
            algorithm: Box::new(algorithm),
        }
    }

    /// An estimator with fixed advantages (and optional credit arrays of its own).
    struct Fixed(Signals);

    impl Algorithm for Fixed {
        fn signals(&self, _batch: &Batch, _host: &dyn Host) -> crate::Result<Signals> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn credit_arrays_compose_as_estimator_times_scales_plus_adds() {
        // A^est = 0.8 everywhere; ECHO-like scale 1.5 on token 1 of row 0 and token 0 of row
        // 1; OPID-like add 0.2 on every token of row 0; a second scale 2.0 on row 1 token 1.
        let b = batch();
        let stack = Stack::new(vec![
            member_of(
                "grpo",
                Fixed(Signals {
                    advantages: vec![vec![0.8, 0.8], vec![0.8, 0.8]],
                    ..Default::default()
                }),
            ),
            credits("echo", vec![vec![1.0, 1.5], vec![1.5, 1.0]], vec![], false),
            credits("opid", vec![], vec![vec![0.2, 0.2], vec![0.0, 0.0]], false),
            credits("other", vec![vec![1.0, 1.0], vec![1.0, 2.0]], vec![], false),
        ])
        .unwrap();
        let s = stack.signals(&b, &OfflineHost::default()).unwrap();
        s.validate_against(&b).unwrap();
        // Row 0: 0.8·1 + 0.2 = 1.0, 0.8·1.5 + 0.2 = 1.4; row 1: 0.8·1.5 = 1.2, 0.8·2 = 1.6.
        assert_eq!(s.advantages, vec![vec![1.0, 1.4], vec![1.2, 1.6]]);
        assert!(s.advantage_scale.is_empty() && s.advantage_add.is_empty());

        // The add is not scaled by a later member's scale, and mask-0 slots keep A^est.
        let mut masked = batch();
        masked.rows[0].response_mask = vec![1, 0];
        let stack = Stack::new(vec![
            member_of(
                "grpo",
                Fixed(Signals {
                    advantages: vec![vec![0.8, 0.8], vec![-0.5, -0.5]],
                    ..Default::default()
                }),
            ),
            credits("opid", vec![], vec![vec![0.2, 0.2], vec![0.1, 0.1]], false),
            credits(
                "echo",
                vec![vec![1.5, f32::NAN], vec![3.0, 0.0]],
                vec![],
                false,
            ),
        ])
        .unwrap();
        let s = stack.signals(&masked, &OfflineHost::default()).unwrap();
        assert_eq!(s.advantages[0], vec![1.4, 0.8]);
        assert_eq!(s.advantages[1], vec![-1.4, 0.1]);
    }

    #[test]
    fn the_estimator_may_give_credit_arrays_and_extra_rows_shift() {
        let b = batch();
        // The estimator's own scale; a stacked member with an extra row whose arrays cover
        // the batch rows then that extra row; another member before it adds an extra row too.
        let stack = Stack::new(vec![
            member_of(
                "est",
                Fixed(Signals {
                    advantages: vec![vec![1.0, 1.0], vec![2.0, 2.0]],
                    advantage_scale: vec![vec![0.5, 1.0], vec![1.0, 1.0]],
                    ..Default::default()
                }),
            ),
            credits(
                "first",
                vec![],
                vec![vec![0.0, 0.0], vec![0.0, 0.0], vec![7.0, 7.0]],
                true,
            ),
            credits(
                "second",
                vec![vec![1.0, 1.0], vec![1.0, 3.0], vec![1.0, 1.0]],
                vec![vec![0.0, 0.0], vec![0.0, 0.0], vec![0.25, 0.5]],
                true,
            ),
        ])
        .unwrap();
        let s = stack.signals(&b, &OfflineHost::default()).unwrap();
        s.validate_against(&b).unwrap();
        assert_eq!(s.extra_rows.len(), 2);
        assert_eq!(
            s.advantages,
            vec![
                vec![0.5, 1.0],
                vec![2.0, 6.0],
                // The first member's extra row: 0 · 1 + 7.
                vec![7.0, 7.0],
                // The second member's extra row, shifted past the first's: 0 · 1 + add.
                vec![0.25, 0.5],
            ]
        );
    }

    #[test]
    fn credit_arrays_of_the_wrong_shape_or_not_finite_are_errors_naming_the_plugin() {
        let run = |m: Member| {
            let stack = Stack::new(vec![member("grpo", estimator()), m]).unwrap();
            stack
                .signals(&batch(), &OfflineHost::default())
                .unwrap_err()
                .message
        };
        let e = run(credits("echo", vec![vec![1.0, 1.0]], vec![], false));
        assert!(
            e.starts_with(
                "plugin `echo`: advantage_scale has 1 rows but the batch has 2 rows and the \
                 plugin 0 extra rows"
            ),
            "{e}"
        );
        let e = run(credits(
            "opid",
            vec![],
            vec![vec![0.1], vec![0.1, 0.1]],
            false,
        ));
        assert_eq!(
            e,
            "plugin `opid`: advantage_add: row 0 has 1 values but 2 response tokens"
        );
        // A member with an extra row must cover it too.
        let e = run(credits(
            "ucob",
            vec![],
            vec![vec![0.0, 0.0], vec![0.0, 0.0]],
            true,
        ));
        assert!(
            e.contains("advantage_add has 2 rows but the batch has 2 rows and the plugin 1"),
            "{e}"
        );
        let e = run(credits(
            "echo",
            vec![vec![1.0, f32::INFINITY], vec![1.0, 1.0]],
            vec![],
            false,
        ));
        assert!(
            e.starts_with("plugin `echo`: advantage_scale: row 0, token 1 is inf on a trainable"),
            "{e}"
        );
    }
}
