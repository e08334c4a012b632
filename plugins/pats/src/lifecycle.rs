//! `observe`: the life of a scaffold across steps. Cards are written and judged, scaffolds
//! are retired, the skill creator is asked for new scaffolds and revisions, and its answers
//! are checked and put in play.
//!
//! The order within a step matters. Answers are collected **last**, so this step's cards (played
//! with the old scaffold) are judged before a revision replaces it, and a task whose creation
//! request is in flight is not asked again.

use std::collections::BTreeSet;

use cairn_plugin_sdk::{
    BankQuery, EntryKind, EntryStatus, Host, PluginError, ReflectionRequest, Result, StatsUpdate,
    StepReport,
};

use crate::arms::{GroupArms, ScaffoldRef};
use crate::card::{cards, EvidenceCard};
use crate::evaluate::{judge, Decision};
use crate::reflect::{creation, request_of, revision};
use crate::state::{Counters, Pending, Purpose, Removal, Removed};
use crate::Pats;

/// Under-test scaffolds of a task an answer query looks at.
const ANSWER_QUERY_K: usize = 16;

/// A request about to be sent, with what Pats will remember of it.
struct Outgoing {
    id: u64,
    task_id: String,
    request: ReflectionRequest,
    purpose: Purpose,
}

impl Pats {
    pub(crate) fn observe_step(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let mut step = Counters::default();
        if std::mem::take(&mut self.resumed) {
            self.settle_after_resume(host, &mut step)?;
        }
        for (ticket, _reason) in &report.failed_reflections {
            let failed: Vec<u64> = self
                .state
                .pending
                .iter()
                .filter(|(_, p)| p.ticket == *ticket)
                .map(|(&id, _)| id)
                .collect();
            for id in failed {
                self.state.pending.remove(&id);
                step.reflections_failed += 1;
            }
        }

        let groups = crate::arms::groups(&report.batch)?;
        let cards = cards(report.step, &groups);
        if !cards.is_empty() {
            let entries: Vec<_> = cards.iter().map(EvidenceCard::to_entry).collect();
            host.bank_put(&entries)?;
            step.cards = cards.len() as u64;
        }
        let mut outgoing = self.judge_cards(&cards, report.step, host, &mut step)?;
        outgoing.extend(self.creation_requests(&groups));
        self.send(outgoing, report.step, host, &mut step)?;
        self.collect_answers(host, &mut step)?;

        for (name, value) in step.metrics() {
            host.log_metric(name, value);
        }
        self.state.totals.add(&step);
        self.state.steps += 1;
        Ok(())
    }

    /// A resumed run's skill creator has an empty queue: a reflection pending in the restored
    /// state either was written into the bank before the checkpoint (collected now) or never
    /// will be (counted as failed and forgotten, so the task may be asked again).
    fn settle_after_resume(&mut self, host: &dyn Host, step: &mut Counters) -> Result<()> {
        self.collect_answers(host, step)?;
        step.reflections_failed += self.state.pending.len() as u64;
        self.state.pending.clear();
        Ok(())
    }

    fn next_request_id(&mut self) -> u64 {
        self.state.next_request += 1;
        self.state.next_request
    }

    /// Adds each card to its task's window, judges the window and acts on the decision:
    /// retires removed bank scaffolds, returns the revision requests.
    fn judge_cards(
        &mut self,
        cards: &[EvidenceCard],
        step_index: u64,
        host: &dyn Host,
        step: &mut Counters,
    ) -> Result<Vec<Outgoing>> {
        let window = self.config.window as usize;
        let mut retire = Vec::new();
        let mut outgoing = Vec::new();
        for card in cards {
            let pending = self.state.is_pending(&card.task_id);
            let track = self.state.tasks.entry(card.task_id.clone()).or_default();
            if track.removed.is_some() || track.replaced.contains(&card.scaffold) {
                // Planned before the removal or the replacement (an asynchronous pipeline plans
                // the next groups before this step's `observe`): the card is in the bank, the
                // decision stands.
                continue;
            }
            if track.scaffold != Some(card.scaffold) {
                track.scaffold = Some(card.scaffold);
                track.cards.clear();
            }
            track.cards.push(card.counts);
            let excess = track.cards.len().saturating_sub(window);
            track.cards.drain(..excess);
            let Some(judgement) = judge(&track.cards, &self.config) else {
                continue;
            };
            match judgement.decision {
                Decision::Keep => step.kept += 1,
                Decision::Undecided => step.undecided += 1,
                Decision::Graduated | Decision::NoEffect => {
                    let reason = if judgement.decision == Decision::Graduated {
                        step.removed_graduated += 1;
                        Removal::Graduated
                    } else {
                        step.removed_no_effect += 1;
                        Removal::NoEffect
                    };
                    track.removed = Some(Removed {
                        reason,
                        scaffold: card.scaffold,
                        step: step_index,
                    });
                    track.cards.clear();
                    if let ScaffoldRef::Bank(id) = card.scaffold {
                        retire.push(id);
                    }
                }
                // One reflection per task at a time: while a revision is in flight the old
                // scaffold stays in play and keeps being judged.
                Decision::Revise if !pending => {
                    let window = track.cards.clone();
                    let id = self.next_request_id();
                    outgoing.push(Outgoing {
                        id,
                        task_id: card.task_id.clone(),
                        request: revision(
                            card,
                            &window,
                            &judgement,
                            id,
                            self.config.max_scaffold_chars,
                        ),
                        purpose: Purpose::Revise {
                            replaces: card.scaffold,
                        },
                    });
                }
                Decision::Revise => {}
            }
        }
        if !retire.is_empty() {
            host.bank_retire(&retire)?;
        }
        Ok(outgoing)
    }

    /// Creation requests, at most `max_new_scaffolds`, in order of the tasks' first group: a
    /// task all of whose groups played plain, not removed, with no reflection in flight, and
    /// with a succeeding and a failing trajectory in the step (the first of each, in slot
    /// order; the success goes first).
    fn creation_requests(&mut self, groups: &[GroupArms]) -> Vec<Outgoing> {
        let mut tasks: Vec<&str> = Vec::new();
        for g in groups {
            if !tasks.contains(&g.task_id.as_str()) {
                tasks.push(&g.task_id);
            }
        }
        let mut outgoing = Vec::new();
        for task in tasks {
            if outgoing.len() >= self.config.max_new_scaffolds as usize {
                break;
            }
            let mine: Vec<&GroupArms> = groups.iter().filter(|g| g.task_id == task).collect();
            if mine.iter().any(|g| g.scaffold.is_some())
                || self.state.is_removed(task)
                || self.state.is_pending(task)
            {
                continue;
            }
            let played = || mine.iter().flat_map(|g| g.with.iter().chain(&g.without));
            let (Some(success), Some(failure)) =
                (played().find(|t| t.success), played().find(|t| !t.success))
            else {
                continue;
            };
            let id = self.next_request_id();
            outgoing.push(Outgoing {
                id,
                task_id: task.to_string(),
                request: creation(
                    task,
                    success.trajectory_id,
                    failure.trajectory_id,
                    id,
                    self.config.max_scaffold_chars,
                ),
                purpose: Purpose::Create,
            });
        }
        outgoing
    }

    /// Sends the step's requests in one call. A refused call (a full skill-creator queue)
    /// counts every request as failed and training goes on; they are asked again when their
    /// conditions hold at a later step.
    fn send(
        &mut self,
        outgoing: Vec<Outgoing>,
        step_index: u64,
        host: &dyn Host,
        step: &mut Counters,
    ) -> Result<()> {
        if outgoing.is_empty() {
            return Ok(());
        }
        let requests: Vec<ReflectionRequest> = outgoing.iter().map(|o| o.request.clone()).collect();
        let tickets = match host.reflect(&requests) {
            Ok(tickets) => tickets,
            Err(_) => {
                step.reflections_failed += requests.len() as u64;
                return Ok(());
            }
        };
        if tickets.len() != requests.len() {
            return Err(PluginError::host(format!(
                "the skill creator returned {} tickets for {} reflection requests; it must \
                 return one per request",
                tickets.len(),
                requests.len()
            )));
        }
        for (o, ticket) in outgoing.into_iter().zip(tickets) {
            match o.purpose {
                Purpose::Create => step.new_requested += 1,
                Purpose::Revise { .. } => step.revised += 1,
            }
            self.state.pending.insert(
                o.id,
                Pending {
                    ticket,
                    task_id: o.task_id,
                    step: step_index,
                    purpose: o.purpose,
                },
            );
        }
        Ok(())
    }

    /// Finds the answers to pending requests in the bank (under-test scaffolds of the task
    /// whose `extra.pats_request` names the request) and settles each: retired when its task's
    /// scaffold was removed meanwhile, or when its text may not be injected (too long or
    /// blank: `too_long`); otherwise made active, retiring the scaffold a revision replaces, and
    /// judged from a fresh window.
    fn collect_answers(&mut self, host: &dyn Host, step: &mut Counters) -> Result<()> {
        let tasks: BTreeSet<String> = self
            .state
            .pending
            .values()
            .map(|p| p.task_id.clone())
            .collect();
        let mut updates = Vec::new();
        let status = |id: u64, status: EntryStatus| StatsUpdate {
            id,
            status: Some(status),
            ..StatsUpdate::default()
        };
        for task in tasks {
            let found = host.bank_query(&BankQuery {
                kinds: vec![EntryKind::Scaffold],
                task_id: Some(task.clone()),
                include_general: false,
                statuses: vec![EntryStatus::UnderTest],
                k: ANSWER_QUERY_K,
                ..BankQuery::default()
            })?;
            for entry in found.into_iter().map(|r| r.entry) {
                let Some(request) = request_of(&entry.extra) else {
                    continue;
                };
                if self.state.pending.get(&request).map(|p| p.task_id.as_str()) != Some(&task) {
                    continue;
                }
                let Some(pending) = self.state.pending.remove(&request) else {
                    continue;
                };
                if self.state.is_removed(&task) {
                    updates.push(status(entry.id, EntryStatus::Retired));
                    continue;
                }
                if !self.config.fits(&entry.text) {
                    updates.push(status(entry.id, EntryStatus::Retired));
                    step.too_long += 1;
                    continue;
                }
                updates.push(status(entry.id, EntryStatus::Active));
                if let Purpose::Revise {
                    replaces: ScaffoldRef::Bank(old),
                } = pending.purpose
                {
                    updates.push(status(old, EntryStatus::Retired));
                }
                let track = self.state.tasks.entry(task.clone()).or_default();
                if let Purpose::Revise { replaces } = pending.purpose {
                    track.replaced.push(replaces);
                }
                track.scaffold = Some(ScaffoldRef::Bank(entry.id));
                track.cards.clear();
                step.accepted += 1;
            }
        }
        if !updates.is_empty() {
            host.bank_update(&updates)?;
        }
        Ok(())
    }
}
