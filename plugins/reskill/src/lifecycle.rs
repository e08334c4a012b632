//! The skill life cycle run by `observe`: the A/B flush and decision, the verification of an
//! arriving skill, and the creator's request to the skill creator.

use serde_json::{json, Map, Value};

use cairn_plugin_sdk::{
    BankEntry, BankQuery, EntryKind, EntryStatus, Host, ReflectionRequest, Result, StatsUpdate,
    StepReport,
};

use crate::ab::{AbTest, Discount, StepCounts, WeightingStrategy};
use crate::assertion::{self, Assertion};
use crate::creator::{self, Episode, Version};
use crate::state::{Counters, Pending, Skill, TrackedAssertion, Verdict, MAX_TRACKED_ASSERTIONS};
use crate::Reskill;

impl Reskill {
    fn track(&mut self, entry: TrackedAssertion) {
        self.state.assertions.push(entry);
        if self.state.assertions.len() > MAX_TRACKED_ASSERTIONS {
            self.state.assertions.remove(0);
        }
    }

    fn set_verdict(
        &mut self,
        kind: &str,
        assertion: &Assertion,
        verdict: Verdict,
        skill: Option<u64>,
    ) {
        if let Some(t) = self
            .state
            .assertions
            .iter_mut()
            .rev()
            .find(|t| t.task_kind == kind && &t.assertion == assertion)
        {
            t.verdict = verdict;
            if skill.is_some() {
                t.skill = skill;
            }
        }
    }

    /// Flushes the running test's outcomes of this step and decides it when it is ready.
    pub(crate) fn run_test(&mut self, played: &[creator::Played], host: &dyn Host) -> Result<()> {
        let (lo, hi) = (self.config.p_new_min, self.config.p_new_max);
        let discount = Discount::of(self.config.weighting_strategy, self.state.fit.m_hat());
        let Some(test) = self.state.test.as_mut() else {
            return Ok(());
        };
        let mut counts = StepCounts::default();
        for p in played {
            let Some((id, version)) = p.test else {
                continue;
            };
            if id != test.id {
                continue;
            }
            let success = u64::from(p.reward > 0.5);
            match version {
                Version::New => {
                    counts.new_n += 1;
                    counts.new_m += success;
                }
                Version::Old => {
                    counts.old_n += 1;
                    counts.old_m += success;
                }
            }
        }
        test.flush(counts, discount, lo, hi);
        for (name, value) in [
            ("reskill/p_new", test.p_new),
            ("reskill/alpha_new", test.new.alpha),
            ("reskill/beta_new", test.new.beta),
            ("reskill/alpha_old", test.old.alpha),
            ("reskill/beta_old", test.old.beta),
        ] {
            host.log_metric(name, value);
        }
        if !test.ready(self.config.test_steps, self.config.min_episodes) {
            return Ok(());
        }
        let accepted = test.accepts();
        let (skill, parent) = (test.skill, test.parent);
        let (m, n) = test.new_totals();
        let mut updates = vec![StatsUpdate {
            id: skill,
            add_exposures: n,
            add_successes: m,
            status: Some(if accepted {
                EntryStatus::Active
            } else {
                EntryStatus::Retired
            }),
            ..StatsUpdate::default()
        }];
        if let (true, Some(parent)) = (accepted, parent) {
            updates.push(StatsUpdate {
                id: parent,
                status: Some(EntryStatus::Retired),
                ..StatsUpdate::default()
            });
        }
        host.bank_update(&updates)?;
        let Some(test) = self.state.test.take() else {
            return Ok(());
        };
        if self.config.weighting_strategy == WeightingStrategy::Dynamic {
            self.state.fit.score(&test.steps);
        }
        let kind = self
            .state
            .skills
            .get(&skill)
            .map(|s| s.task_kind.clone())
            .unwrap_or_default();
        let tracked = self
            .state
            .assertions
            .iter()
            .rev()
            .find(|t| t.skill == Some(skill))
            .map(|t| t.assertion.clone());
        let verdict = if accepted {
            self.state.counters.accepted += 1;
            if let Some(s) = self.state.skills.get_mut(&skill) {
                s.status = EntryStatus::Active;
            }
            if let Some(parent) = parent {
                self.state.skills.remove(&parent);
                self.triggers.remove(&parent);
            }
            Verdict::Accepted
        } else {
            self.state.counters.reverted += 1;
            self.state.skills.remove(&skill);
            self.triggers.remove(&skill);
            Verdict::Reverted
        };
        if let Some(a) = tracked {
            self.set_verdict(&kind, &a, verdict, None);
        }
        Ok(())
    }

    /// Verifies the answer to the pending reflection, if it arrived this step, and starts its
    /// test when it passes.
    pub(crate) fn receive(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let Some(pending) = self.state.pending.clone() else {
            return Ok(());
        };
        if report.new_entries.is_empty() {
            return Ok(());
        }
        let entries = host.bank_query(&BankQuery {
            text: String::new(),
            k: report.new_entries.len() + 16,
            kinds: vec![EntryKind::Skill],
            task_id: None,
            include_general: true,
            statuses: vec![EntryStatus::UnderTest],
            trajectory_id: None,
        })?;
        let ours = |e: &BankEntry| {
            report.new_entries.contains(&e.id)
                && e.extra.get("reflection_ticket").and_then(Value::as_u64) == Some(pending.ticket)
        };
        let Some(entry) = entries.into_iter().map(|r| r.entry).find(ours) else {
            return Ok(());
        };
        self.state.pending = None;
        let reject = |this: &mut Reskill, counter: fn(&mut Counters) -> &mut u64| -> Result<()> {
            host.bank_retire(&[entry.id])?;
            *counter(&mut this.state.counters) += 1;
            this.set_verdict(
                &pending.task_kind,
                &pending.assertion,
                Verdict::Rejected,
                Some(entry.id),
            );
            Ok(())
        };
        if entry.text.chars().count() > self.config.max_skill_chars as usize {
            return reject(self, |c| &mut c.rejected_too_long);
        }
        // The reflector's own trigger wins; else the one the request proposed.
        let trigger = entry
            .trigger
            .clone()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| {
                entry
                    .extra
                    .get("trigger")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        let compiled = match &trigger {
            Some(t) => match assertion::pattern(t, "trigger") {
                Ok(re) => Some(re),
                Err(_) => return reject(self, |c| &mut c.rejected_invalid_trigger),
            },
            None => None,
        };
        let kind = pending.task_kind.as_str();
        let rate = creator::trigger_rate(
            compiled.as_ref(),
            self.state
                .reservoir
                .iter()
                .filter(|e| kind.is_empty() || e.task_kind == kind),
        );
        host.log_metric("reskill/trigger_rate", rate);
        if rate < self.config.min_trigger_rate {
            return reject(self, |c| &mut c.rejected_trigger_rate);
        }
        let parent = pending.parent.filter(|p| self.state.skills.contains_key(p));
        self.state.skills.insert(
            entry.id,
            Skill {
                text: entry.text.clone(),
                trigger,
                task_kind: pending.task_kind.clone(),
                status: EntryStatus::UnderTest,
            },
        );
        self.triggers.insert(entry.id, compiled);
        let (lo, hi) = (self.config.p_new_min, self.config.p_new_max);
        self.state.test = Some(AbTest::new(
            self.state.next_test,
            entry.id,
            parent,
            report.step,
            lo,
            hi,
        ));
        self.state.next_test += 1;
        self.set_verdict(
            &pending.task_kind,
            &pending.assertion,
            Verdict::Testing,
            Some(entry.id),
        );
        Ok(())
    }

    /// Asks the skill creator for a skill when the creator is due and a diagnosis is found.
    pub(crate) fn create(&mut self, current: &[Episode], step: u64, host: &dyn Host) -> Result<()> {
        let due = self.state.test.is_none()
            && self.state.pending.is_none()
            && self.state.reservoir.len() >= self.config.min_reservoir as usize
            && self
                .state
                .last_request_step
                .is_none_or(|last| step >= last + u64::from(self.config.create_every));
        if !due {
            return Ok(());
        }
        let tried: Vec<(String, Assertion)> = self
            .state
            .assertions
            .iter()
            .map(|t| (t.task_kind.clone(), t.assertion.clone()))
            .collect();
        let reservoir: &[Episode] = self.state.reservoir.make_contiguous();
        let Some(d) = creator::diagnose(reservoir, current, &tried)? else {
            return Ok(());
        };
        let parent = self
            .state
            .skills
            .iter()
            .find(|(_, s)| s.status == EntryStatus::Active && s.task_kind == d.task_kind)
            .map(|(&id, s)| (id, s.text.clone()));
        let prompt = creator::contrastive_prompt(
            &d,
            parent.as_ref().map(|(_, t)| t.as_str()),
            self.config.max_skill_chars,
        );
        let mut extra = Map::new();
        extra.insert("trigger".into(), json!(d.trigger));
        extra.insert("assertion".into(), json!(d.assertion));
        extra.insert("task_kind".into(), json!(d.task_kind));
        let request = ReflectionRequest {
            kind: EntryKind::Skill,
            prompt,
            trajectories: vec![d.success_example, d.failure_example],
            task_id: None,
            parent: parent.as_ref().map(|(id, _)| *id),
            status: EntryStatus::UnderTest,
            extra,
        };
        self.state.last_request_step = Some(step);
        let ticket = host
            .reflect(&[request])
            .ok()
            .and_then(|t| t.first().copied());
        let Some(ticket) = ticket else {
            // Refused (e.g. a full queue): counted, and asked again at the next window.
            self.state.counters.reflections_failed += 1;
            return Ok(());
        };
        self.state.counters.reflections_requested += 1;
        self.state.pending = Some(Pending {
            ticket,
            task_kind: d.task_kind.clone(),
            assertion: d.assertion.clone(),
            parent: parent.map(|(id, _)| id),
            step,
        });
        self.track(TrackedAssertion {
            task_kind: d.task_kind.clone(),
            assertion: d.assertion.clone(),
            success_rate: d.success_rate,
            failure_rate: d.failure_rate,
            step,
            verdict: Verdict::Requested,
            skill: None,
        });
        Ok(())
    }

    pub(crate) fn log_state(&self, host: &dyn Host) {
        let c = &self.state.counters;
        for (name, value) in [
            ("reskill/active_skills", self.state.active().len() as f64),
            (
                "reskill/testing",
                f64::from(u8::from(self.state.test.is_some())),
            ),
            ("reskill/reservoir", self.state.reservoir.len() as f64),
            ("reskill/assertions", self.state.assertions.len() as f64),
            ("reskill/accepted", c.accepted as f64),
            ("reskill/reverted", c.reverted as f64),
            (
                "reskill/rejected_trigger_rate",
                c.rejected_trigger_rate as f64,
            ),
            ("reskill/rejected_too_long", c.rejected_too_long as f64),
            (
                "reskill/rejected_invalid_trigger",
                c.rejected_invalid_trigger as f64,
            ),
            (
                "reskill/reflections_requested",
                c.reflections_requested as f64,
            ),
            ("reskill/reflections_failed", c.reflections_failed as f64),
        ] {
            host.log_metric(name, value);
        }
        if self.config.weighting_strategy == WeightingStrategy::Dynamic {
            if let Some(m) = self.state.fit.m_hat() {
                host.log_metric("reskill/m_hat", f64::from(m));
            }
        }
    }
}
