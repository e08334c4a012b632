//! [`EpisodeStore`]: the gateway's episodes, from the first call to the training rows.
//!
//! An episode is opened by the harness (or by its first call through a header), collects one
//! [`CallRecord`] per completion call (the rendered prompt ids and every sampled choice,
//! verbatim), merges calls into [`Segment`]s as they arrive, and ends in one of three ways:
//! a posted reward, a close without reward, or a timeout (no call, reward or close for
//! `timeout`; the episode is then *failed*). An episode without a reward follows
//! [`MissingReward`]: dropped, or filled with a value. A finished episode becomes rows
//! ([`RowMode`]) waiting in a queue until [`EpisodeStore::take_groups`] hands them to a training
//! step, grouped by the harness's task id.
//!
//! Bounds: at most [`EpisodeSettings::max_open`] episodes are open (more are a 429), a task id
//! has at most [`MAX_TASK_ID_BYTES`], and a call whose sampled log-probs are not all finite is
//! never recorded: its episode is dropped when it ends, so no NaN reaches a row.
//!
//! Merging (see [`super::segment`]): a call extends the open segment whose ids its prompt starts
//! with, when the same policy version sampled both (a row carries one version); every other
//! open segment is sealed. Otherwise all open segments are sealed and the call starts new ones
//! (one per choice). The store is plain data: the clock is an argument, so timeouts are tested
//! without sleeping. Callers: the gateway service (calls, rewards) and the episode source actor
//! (training steps), both through a mutex.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use cairn_plugin_sdk::{ContextVariant, TurnRow};
use serde_json::{json, Map, Value as Json};

use super::api_error::{ApiError, ApiErrorKind};
use super::segment::{SampledChoice, Segment};
use super::{MissingReward, RowMode};

/// How episodes end and become rows.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeSettings {
    /// An open episode idle this long is failed.
    pub timeout: Duration,
    pub missing_reward: MissingReward,
    pub rows: RowMode,
    /// Finished episodes kept for `GET /episodes/{id}` and duplicate-reward checks.
    pub keep_finished: usize,
    /// Finished episodes queued for training at most; the oldest are dropped past it (a
    /// `cairn serve` without a trainer or a recorder).
    pub max_ready: usize,
    /// Open episodes at most (`source.max_open_episodes`); opening one more is a 429 until
    /// some are rewarded, closed or time out.
    pub max_open: usize,
}

/// Longest `task_id`, bytes: it is kept with the episode and copied onto every row. A
/// harness that groups by a long description sends a hash of it.
pub const MAX_TASK_ID_BYTES: usize = 4096;

/// One completion call of an episode, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    /// 0-based call index within the episode.
    pub index: u32,
    /// The prompt ids the gateway rendered and the policy saw, `[P]`.
    pub prompt_ids: Vec<u32>,
    pub choices: Vec<SampledChoice>,
    pub policy_version: u64,
    /// The temperature the choices were sampled (and their log-probs computed) at.
    pub temperature: f32,
    pub anchor: Option<String>,
    /// The text of the call's last message (what the policy acted on).
    pub observation: String,
}

/// What recording a call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallReceipt {
    pub call: u32,
    /// Whether the call extended an open segment.
    pub merged: bool,
    /// The segment of each choice.
    pub segments: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq)]
enum Status {
    Open,
    Rewarded { reward: f32, success: bool },
    Closed,
    TimedOut,
}

impl Status {
    fn label(&self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Rewarded { .. } => "rewarded",
            Status::Closed => "closed",
            Status::TimedOut => "timed_out",
        }
    }
}

struct Episode {
    id: String,
    /// Run-unique sequence number: the rows' trajectory id.
    seq: u64,
    task_id: Option<String>,
    last_activity: Instant,
    calls: Vec<CallRecord>,
    segments: Vec<Segment>,
    /// Segments the next call may extend (those of the latest call).
    open: Vec<usize>,
    status: Status,
    /// A call sampled non-finite log-probs and was not recorded: the episode has a hole, so
    /// it is dropped when it ends instead of becoming rows.
    nonfinite: bool,
}

/// A finished episode's rows, waiting for a training step.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedEpisode {
    pub id: String,
    pub seq: u64,
    /// The grouping key: the harness's task id, or the episode id when it gave none.
    pub group_key: String,
    pub reward: f32,
    pub success: bool,
    pub rows: Vec<TurnRow>,
}

/// Episodes handed to one training step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    pub episodes: Vec<FinishedEpisode>,
    /// Episodes dropped since the last collection: (trajectory id, task, reason).
    pub dropped: Vec<(u64, String, String)>,
}

/// One episode of the store, as the dashboard lists it (`cairn serve --ui`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EpisodeListing {
    pub episode_id: String,
    /// The rows' trajectory id.
    pub trajectory_id: u64,
    pub task_id: Option<String>,
    /// `open`, `rewarded`, `closed` or `timed_out`.
    pub status: &'static str,
    pub calls: usize,
    pub segments: usize,
    /// Sampled tokens over every call and choice.
    pub sampled_tokens: usize,
    pub reward: Option<f32>,
    /// Seconds since the last call, reward or close.
    pub idle_s: f64,
}

/// Counters for `/health` and the load report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub episodes_opened: u64,
    pub episodes_rewarded: u64,
    pub episodes_closed_without_reward: u64,
    pub episodes_timed_out: u64,
    pub episodes_dropped: u64,
    pub calls: u64,
    pub merged_calls: u64,
    /// Calls that started a new segment although a segment was open.
    pub segment_breaks: u64,
    /// Of those, breaks because a new policy version sampled the call.
    pub version_breaks: u64,
    pub sampled_tokens: u64,
    /// Calls not recorded because a sampled log-prob was NaN or infinite (their episodes
    /// are dropped when they end).
    pub calls_nonfinite: u64,
    /// Episodes refused because `max_open` episodes were open.
    pub episodes_refused: u64,
}

/// The gateway's episodes; see the module docs.
pub struct EpisodeStore {
    settings: EpisodeSettings,
    episodes: HashMap<String, Episode>,
    /// Finished episode ids, oldest first, for retention.
    finished: VecDeque<String>,
    ready: VecDeque<FinishedEpisode>,
    dropped: Vec<(u64, String, String)>,
    next_seq: u64,
    stats: StoreStats,
}

/// An id or key as shown in a message: its first 128 bytes at most (a char boundary).
fn shown(id: &str) -> &str {
    let mut end = id.len().min(128);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    &id[..end]
}

/// Episode ids are path segments and header values: keep them plain.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

impl EpisodeStore {
    pub fn new(settings: EpisodeSettings) -> EpisodeStore {
        EpisodeStore {
            settings,
            episodes: HashMap::new(),
            finished: VecDeque::new(),
            ready: VecDeque::new(),
            dropped: Vec::new(),
            next_seq: 0,
            stats: StoreStats::default(),
        }
    }

    pub fn settings(&self) -> &EpisodeSettings {
        &self.settings
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Open episodes.
    pub fn open_count(&self) -> usize {
        self.episodes
            .values()
            .filter(|e| e.status == Status::Open)
            .count()
    }

    /// Finished episodes waiting for training.
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// Opens an episode. `id`: the harness's own id (else one is made up); `task_id` groups
    /// episodes for group-relative algorithms. Returns the episode id.
    pub fn open(
        &mut self,
        now: Instant,
        id: Option<String>,
        task_id: Option<String>,
    ) -> Result<String, ApiError> {
        if let Some(task) = &task_id {
            if task.len() > MAX_TASK_ID_BYTES {
                return Err(ApiError::string_too_long(
                    "task_id",
                    task.len(),
                    MAX_TASK_ID_BYTES,
                ));
            }
        }
        self.sweep(now);
        let open = self.open_count();
        if open >= self.settings.max_open {
            self.stats.episodes_refused += 1;
            return Err(ApiError::new(
                ApiErrorKind::TooManyRequests,
                format!(
                    "{open} episodes are open, the most this gateway keeps \
                     (source.max_open_episodes = {}); reward or close some (idle ones time \
                     out after {} s), or raise the limit",
                    self.settings.max_open,
                    self.settings.timeout.as_secs_f64()
                ),
            )
            .with_code("too_many_open_episodes"));
        }
        let seq = self.next_seq;
        let id = match id {
            Some(id) if !valid_id(&id) => {
                return Err(ApiError::invalid(
                    "episode_id",
                    format!(
                        "episode id `{}` must be 1-128 characters of A-Z a-z 0-9 - _ . :",
                        shown(&id)
                    ),
                ))
            }
            Some(id) if self.episodes.contains_key(&id) => {
                return Err(ApiError::conflict(format!("episode `{id}` already exists"))
                    .with_code("episode_exists"))
            }
            Some(id) => id,
            None => format!(
                "ep-{seq}-{:08x}",
                cairn_kernel::rollout::mix(0xE915, seq) as u32
            ),
        };
        self.next_seq += 1;
        self.stats.episodes_opened += 1;
        self.episodes.insert(
            id.clone(),
            Episode {
                id: id.clone(),
                seq,
                task_id,
                last_activity: now,
                calls: Vec::new(),
                segments: Vec::new(),
                open: Vec::new(),
                status: Status::Open,
                nonfinite: false,
            },
        );
        Ok(id)
    }

    fn episode_mut(&mut self, id: &str, now: Instant) -> Result<&mut Episode, ApiError> {
        self.sweep(now);
        let episode = self.episodes.get_mut(id).ok_or_else(|| {
            ApiError::not_found(format!(
                "episode `{}` not found; open one with POST /episodes",
                shown(id)
            ))
            .with_code("episode_not_found")
        })?;
        if episode.status != Status::Open {
            return Err(ApiError::conflict(format!(
                "episode `{id}` is {} and takes no more calls or rewards",
                episode.status.label()
            ))
            .with_code("episode_closed"));
        }
        Ok(episode)
    }

    /// Errors unless `id` names an open episode (checked before generating for it).
    pub fn check_open(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        self.episode_mut(id, now).map(|_| ())
    }

    /// Records a call and merges it into the episode's segments (module docs).
    pub fn record(
        &mut self,
        id: &str,
        now: Instant,
        call: CallRecord,
    ) -> Result<CallReceipt, ApiError> {
        let episode = self.episode_mut(id, now)?;
        episode.last_activity = now;
        if let Some(bad) = call
            .choices
            .iter()
            .flat_map(|c| &c.logprobs)
            .find(|lp| !lp.is_finite())
        {
            // A NaN or infinite log-prob poisons every loss it enters; the call is kept out
            // of the rows, and its episode (now with a hole) out of training.
            episode.nonfinite = true;
            self.stats.calls_nonfinite += 1;
            tracing::warn!(episode = %id, logprob = %bad, temperature = call.temperature,
                policy_version = call.policy_version,
                "call sampled a non-finite log-prob; not recorded, episode will be dropped");
            return Err(ApiError::internal(format!(
                "the policy sampled a non-finite log-prob ({bad}) at temperature {} (policy \
                 version {}); the call is not recorded and episode `{id}` will not be \
                 trained on",
                call.temperature, call.policy_version
            ))
            .with_code("nonfinite_logprobs"));
        }
        let index = episode.calls.len() as u32;
        let candidates: Vec<usize> = episode
            .open
            .iter()
            .copied()
            .filter(|&s| episode.segments[s].prefix_of(&call.prompt_ids).is_ok())
            .collect();
        let same_version = candidates
            .iter()
            .copied()
            .filter(|&s| episode.segments[s].policy_version == call.policy_version)
            .max_by_key(|&s| episode.segments[s].len());
        let had_open = !episode.open.is_empty();
        let mut segments = Vec::with_capacity(call.choices.len());
        match same_version {
            Some(base) => {
                let prefix = episode.segments[base].clone();
                for (c, choice) in call.choices.iter().enumerate() {
                    let mut segment = prefix.clone();
                    segment.extend(&call.prompt_ids, choice, (index, c as u32));
                    if c == 0 {
                        episode.segments[base] = segment;
                        segments.push(base);
                    } else {
                        episode.segments.push(segment);
                        segments.push(episode.segments.len() - 1);
                    }
                }
            }
            None => {
                for (c, choice) in call.choices.iter().enumerate() {
                    episode.segments.push(Segment::start(
                        &call.prompt_ids,
                        choice,
                        (index, c as u32),
                        call.policy_version,
                        call.anchor.clone(),
                        call.observation.clone(),
                    ));
                    segments.push(episode.segments.len() - 1);
                }
            }
        }
        episode.open = segments.clone();
        let merged = same_version.is_some();
        let tokens: usize = call.choices.iter().map(|c| c.ids.len()).sum();
        episode.calls.push(call);
        self.stats.calls += 1;
        self.stats.sampled_tokens += tokens as u64;
        if merged {
            self.stats.merged_calls += 1;
        } else if had_open {
            self.stats.segment_breaks += 1;
            if !candidates.is_empty() {
                self.stats.version_breaks += 1;
            }
        }
        Ok(CallReceipt {
            call: index,
            merged,
            segments,
        })
    }

    /// Posts the episode's reward and closes it. A second reward (or a reward after a close
    /// or timeout) is a conflict.
    pub fn reward(
        &mut self,
        id: &str,
        now: Instant,
        reward: f32,
        success: Option<bool>,
    ) -> Result<(), ApiError> {
        if !reward.is_finite() {
            return Err(ApiError::invalid(
                "reward",
                format!("reward must be a finite number, got {reward}"),
            ));
        }
        // A second reward is `reward_already_posted`; a reward after a close or a timeout is
        // `episode_closed` (no reward was posted: the episode ended without one).
        let rewarded = self
            .episodes
            .get(id)
            .is_some_and(|e| matches!(e.status, Status::Rewarded { .. }));
        let episode = self
            .episode_mut(id, now)
            .map_err(|e| match e.code.as_deref() {
                Some("episode_closed") if rewarded => {
                    ApiError::conflict(format!("{}; a reward is posted once", e.message))
                        .with_code("reward_already_posted")
                }
                _ => e,
            })?;
        episode.status = Status::Rewarded {
            reward,
            success: success.unwrap_or(reward > 0.0),
        };
        self.stats.episodes_rewarded += 1;
        self.finish(id);
        Ok(())
    }

    /// Closes the episode without a reward ([`MissingReward`] applies).
    pub fn close(&mut self, id: &str, now: Instant) -> Result<(), ApiError> {
        let episode = self.episode_mut(id, now)?;
        episode.status = Status::Closed;
        self.stats.episodes_closed_without_reward += 1;
        self.finish(id);
        Ok(())
    }

    /// Fails every open episode idle for the timeout. Returns how many timed out.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let timeout = self.settings.timeout;
        let expired: Vec<String> = self
            .episodes
            .values()
            .filter(|e| e.status == Status::Open && now.duration_since(e.last_activity) >= timeout)
            .map(|e| e.id.clone())
            .collect();
        for id in &expired {
            if let Some(e) = self.episodes.get_mut(id) {
                tracing::warn!(episode = %id, calls = e.calls.len(), "episode timed out; marked failed");
                e.status = Status::TimedOut;
            }
            self.stats.episodes_timed_out += 1;
            self.finish(id);
        }
        expired.len()
    }

    /// Turns a just-ended episode into rows (or drops it) and queues them.
    fn finish(&mut self, id: &str) {
        let Some(episode) = self.episodes.get(id) else {
            return;
        };
        let group_key = episode
            .task_id
            .clone()
            .unwrap_or_else(|| episode.id.clone());
        let seq = episode.seq;
        let outcome = match (&episode.status, self.settings.missing_reward) {
            (Status::Rewarded { reward, success }, _) => Ok((*reward, *success)),
            (_, MissingReward::Fill(value)) => Ok((value, false)),
            (status, MissingReward::Drop) => Err(format!(
                "{} without a reward (missing_reward = \"drop\")",
                status.label()
            )),
        };
        let finished = match outcome {
            Ok(_) if episode.nonfinite => {
                Err("a call sampled non-finite log-probs and was not recorded".to_string())
            }
            Ok(_) if episode.calls.is_empty() => Err("no completion calls".to_string()),
            Ok((reward, success)) => Ok(FinishedEpisode {
                id: episode.id.clone(),
                seq,
                group_key: group_key.clone(),
                reward,
                success,
                rows: build_rows(episode, self.settings.rows, reward, success),
            }),
            Err(reason) => Err(reason),
        };
        match finished {
            Ok(finished) => self.ready.push_back(finished),
            Err(reason) => self.drop_episode(seq, group_key, reason),
        }
        while self.ready.len() > self.settings.max_ready {
            if let Some(old) = self.ready.pop_front() {
                let reason = "not collected before the queue filled".to_string();
                self.drop_episode(old.seq, old.group_key, reason);
            }
        }
        self.finished.push_back(id.to_owned());
        while self.finished.len() > self.settings.keep_finished {
            if let Some(old) = self.finished.pop_front() {
                self.episodes.remove(&old);
            }
        }
    }

    fn drop_episode(&mut self, seq: u64, task: String, reason: String) {
        tracing::debug!(trajectory = seq, %task, %reason, "episode dropped");
        self.stats.episodes_dropped += 1;
        self.dropped.push((seq, task, reason));
    }

    /// Takes `groups` groups of `group_size` finished episodes (episodes sharing a task id),
    /// oldest complete groups first, and numbers them from `first_group_id`. `None` while
    /// fewer complete groups are ready, unless `partial`: then whatever is ready (complete
    /// groups first, then the largest partial ones) is taken, and `None` only when nothing is.
    pub fn take_groups(
        &mut self,
        groups: usize,
        group_size: usize,
        first_group_id: u64,
        partial: bool,
    ) -> Option<Collected> {
        let group_size = group_size.max(1);
        // Group keys in order of first arrival, with the queue positions of their episodes.
        let mut keys: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, e) in self.ready.iter().enumerate() {
            match keys.iter_mut().find(|(k, _)| *k == e.group_key) {
                Some((_, members)) => members.push(i),
                None => keys.push((e.group_key.clone(), vec![i])),
            }
        }
        let mut chosen: Vec<Vec<usize>> = keys
            .iter()
            .filter(|(_, m)| m.len() >= group_size)
            .map(|(_, m)| m[..group_size].to_vec())
            .take(groups)
            .collect();
        if chosen.len() < groups {
            if !partial || keys.is_empty() {
                return None;
            }
            let mut rest: Vec<&Vec<usize>> = keys
                .iter()
                .map(|(_, m)| m)
                .filter(|m| m.len() < group_size)
                .collect();
            rest.sort_by_key(|m| std::cmp::Reverse(m.len()));
            chosen.extend(rest.into_iter().take(groups - chosen.len()).cloned());
        }
        let mut take: Vec<(usize, u64)> = Vec::new();
        for (g, members) in chosen.iter().enumerate() {
            take.extend(members.iter().map(|&i| (i, first_group_id + g as u64)));
        }
        take.sort_unstable();
        let mut episodes = Vec::with_capacity(take.len());
        for &(i, group_id) in take.iter().rev() {
            let Some(mut e) = self.ready.remove(i) else {
                continue;
            };
            for row in &mut e.rows {
                row.group_id = group_id;
            }
            episodes.push(e);
        }
        episodes.sort_by_key(|e| (e.rows.first().map_or(0, |r| r.group_id), e.seq));
        Some(Collected {
            episodes,
            dropped: std::mem::take(&mut self.dropped),
        })
    }

    /// The open episodes and the finished ones still kept (`keep_finished`), newest first.
    pub fn listing(&mut self, now: Instant) -> Vec<EpisodeListing> {
        self.sweep(now);
        let mut listed: Vec<EpisodeListing> = self
            .episodes
            .values()
            .map(|e| EpisodeListing {
                episode_id: e.id.clone(),
                trajectory_id: e.seq,
                task_id: e.task_id.clone(),
                status: e.status.label(),
                calls: e.calls.len(),
                segments: e.segments.len(),
                sampled_tokens: e
                    .calls
                    .iter()
                    .flat_map(|c| &c.choices)
                    .map(|ch| ch.ids.len())
                    .sum(),
                reward: match e.status {
                    Status::Rewarded { reward, .. } => Some(reward),
                    _ => None,
                },
                idle_s: now.saturating_duration_since(e.last_activity).as_secs_f64(),
            })
            .collect();
        listed.sort_by_key(|e| std::cmp::Reverse(e.trajectory_id));
        listed
    }

    /// Every finished episode that is ready, oldest first (a recorder without a trainer).
    pub fn drain_ready(&mut self) -> Vec<FinishedEpisode> {
        self.ready.drain(..).collect()
    }

    /// The episode as JSON: status, calls (prompt ids, sampled ids and log-probs) and
    /// segments, for inspection.
    pub fn view(&mut self, id: &str, now: Instant) -> Result<Json, ApiError> {
        self.sweep(now);
        let e = self.episodes.get(id).ok_or_else(|| {
            ApiError::not_found(format!("episode `{}` not found", shown(id)))
                .with_code("episode_not_found")
        })?;
        let calls: Vec<Json> = e
            .calls
            .iter()
            .map(|c| {
                json!({
                    "index": c.index,
                    "prompt_token_ids": c.prompt_ids,
                    "policy_version": c.policy_version,
                    "temperature": c.temperature,
                    "anchor": c.anchor,
                    "choices": c.choices.iter().map(|ch| json!({
                        "token_ids": ch.ids,
                        "logprobs": ch.logprobs,
                        "finish_reason": ch.finish_reason,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let segments: Vec<Json> = e
            .segments
            .iter()
            .map(|s| {
                json!({
                    "prompt_token_ids": s.prompt_ids,
                    "response_token_ids": s.response_ids,
                    "response_mask": s.response_mask,
                    "policy_version": s.policy_version,
                    "calls": s.calls,
                })
            })
            .collect();
        let reward = match e.status {
            Status::Rewarded { reward, .. } => Some(reward),
            _ => None,
        };
        Ok(json!({
            "episode_id": e.id,
            "trajectory_id": e.seq,
            "task_id": e.task_id,
            "status": e.status.label(),
            "reward": reward,
            "calls": calls,
            "segments": segments,
        }))
    }
}

/// The training rows of an episode: one per segment ([`RowMode::Merged`]) or one per call
/// choice ([`RowMode::PerCall`]). The reward sits on the last row's `turn_reward` (the reward
/// actor sums turn rewards into the episode reward) and in every row's `episode_reward`.
fn build_rows(episode: &Episode, mode: RowMode, reward: f32, success: bool) -> Vec<TurnRow> {
    let per_call: Vec<Segment>;
    let segments: &[Segment] = match mode {
        RowMode::Merged => &episode.segments,
        RowMode::PerCall => {
            per_call = episode
                .calls
                .iter()
                .flat_map(|c| {
                    c.choices.iter().enumerate().map(move |(k, choice)| {
                        Segment::start(
                            &c.prompt_ids,
                            choice,
                            (c.index, k as u32),
                            c.policy_version,
                            c.anchor.clone(),
                            c.observation.clone(),
                        )
                    })
                })
                .collect();
            &per_call
        }
    };
    let task_id = episode
        .task_id
        .clone()
        .unwrap_or_else(|| episode.id.clone());
    let last = segments.len().saturating_sub(1);
    segments
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let mut info = Map::new();
            info.insert("episode_id".into(), json!(episode.id));
            info.insert("calls".into(), json!(s.calls));
            info.insert("outcome".into(), json!(episode.status.label()));
            TurnRow {
                group_id: 0,
                trajectory_id: episode.seq,
                turn: k as u32,
                task_id: task_id.clone(),
                policy_version: s.policy_version,
                variant: ContextVariant {
                    label: "gateway".into(),
                    ..ContextVariant::default()
                },
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response_ids.clone(),
                response_logprobs: s.response_logprobs.clone(),
                response_mask: s.response_mask.clone(),
                finish_reason: s.finish_reason,
                turn_reward: if k == last { reward } else { 0.0 },
                episode_reward: reward,
                success,
                last_turn: k == last,
                anchor: s.anchor.clone(),
                observation: s.observation.clone(),
                feedback: 0,
                tool_calls: s.tool_calls,
                info,
                ..TurnRow::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::FinishReason;

    use super::*;

    fn settings(missing_reward: MissingReward, rows: RowMode) -> EpisodeSettings {
        EpisodeSettings {
            timeout: Duration::from_secs(10),
            missing_reward,
            rows,
            keep_finished: 100,
            max_ready: 100,
            max_open: 100,
        }
    }

    fn call(prompt: &[u32], sampled: &[&[u32]], version: u64) -> CallRecord {
        CallRecord {
            index: 0,
            prompt_ids: prompt.to_vec(),
            choices: sampled
                .iter()
                .map(|ids| SampledChoice {
                    ids: ids.to_vec(),
                    logprobs: vec![-0.5; ids.len()],
                    finish_reason: FinishReason::Stop,
                    tool_calls: 0,
                })
                .collect(),
            policy_version: version,
            temperature: 1.0,
            anchor: None,
            observation: String::new(),
        }
    }

    #[test]
    fn listing_shows_open_and_finished_episodes_newest_first() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let a = s.open(t, None, Some("task".into())).unwrap();
        s.record(&a, t, call(&[1, 2], &[&[3, 4, 5]], 0)).unwrap();
        s.reward(&a, t, 1.0, Some(true)).unwrap();
        let b = s.open(t, Some("b".into()), None).unwrap();
        let listed = s.listing(t + Duration::from_secs(2));
        let ids: Vec<&str> = listed.iter().map(|e| e.episode_id.as_str()).collect();
        assert_eq!(ids, [b.as_str(), a.as_str()]);
        assert_eq!(listed[0].status, "open");
        assert_eq!((listed[0].calls, listed[0].reward), (0, None));
        assert_eq!(listed[1].status, "rewarded");
        assert_eq!(listed[1].task_id.as_deref(), Some("task"));
        assert_eq!((listed[1].calls, listed[1].sampled_tokens), (1, 3));
        assert_eq!(listed[1].reward, Some(1.0));
        assert!((listed[1].idle_s - 2.0).abs() < 1e-9);
    }

    #[test]
    fn extending_calls_merge_and_others_start_segments() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let id = s.open(t, None, Some("task".into())).unwrap();
        assert!(
            !s.record(&id, t, call(&[1, 2], &[&[3, 4]], 0))
                .unwrap()
                .merged
        );
        assert!(
            s.record(&id, t, call(&[1, 2, 3, 4, 5], &[&[6]], 0))
                .unwrap()
                .merged
        );
        // A rewritten context seals the segment.
        assert!(!s.record(&id, t, call(&[1, 9], &[&[7]], 0)).unwrap().merged);
        // A new policy version seals it too, even when the prefix matches.
        assert!(
            !s.record(&id, t, call(&[1, 9, 7, 8], &[&[2]], 1))
                .unwrap()
                .merged
        );
        assert_eq!(s.stats().version_breaks, 1);
        s.reward(&id, t, 1.0, None).unwrap();
        let got = s.take_groups(1, 1, 40, false).unwrap();
        let rows = &got.episodes[0].rows;
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].response_ids, vec![3, 4, 5, 6]);
        assert_eq!(rows[0].response_mask, vec![1, 1, 0, 1]);
        assert_eq!(rows[2].prompt_ids, vec![1, 9, 7, 8]);
        assert_eq!(rows[2].policy_version, 1);
        let rewards: Vec<f32> = rows.iter().map(|r| r.turn_reward).collect();
        assert_eq!(rewards, vec![0.0, 0.0, 1.0]);
        assert!(rows
            .iter()
            .all(|r| r.group_id == 40 && r.episode_reward == 1.0));
    }

    #[test]
    fn n_choices_fork_and_the_next_call_continues_one() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let id = s.open(t, None, None).unwrap();
        let r = s.record(&id, t, call(&[1], &[&[2], &[3]], 0)).unwrap();
        assert_eq!(r.segments.len(), 2);
        let r = s.record(&id, t, call(&[1, 3, 4], &[&[5]], 0)).unwrap();
        assert!(r.merged);
        s.reward(&id, t, 0.0, None).unwrap();
        let rows = s
            .take_groups(1, 1, 0, false)
            .unwrap()
            .episodes
            .remove(0)
            .rows;
        let responses: Vec<_> = rows.iter().map(|r| r.response_ids.clone()).collect();
        assert_eq!(responses, vec![vec![2], vec![3, 4, 5]]);
    }

    #[test]
    fn per_call_rows_keep_each_call_whole() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::PerCall));
        let id = s.open(t, None, None).unwrap();
        s.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
        s.record(&id, t, call(&[1, 2, 3], &[&[4]], 0)).unwrap();
        s.reward(&id, t, 2.0, Some(true)).unwrap();
        let rows = s
            .take_groups(1, 1, 0, false)
            .unwrap()
            .episodes
            .remove(0)
            .rows;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].prompt_ids, vec![1, 2, 3]);
        assert_eq!(rows[1].response_ids, vec![4]);
        assert!(rows[1].success && rows[1].last_turn && !rows[0].last_turn);
    }

    #[test]
    fn rewards_twice_unknown_ids_and_closed_episodes_are_errors() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let id = s.open(t, Some("a".into()), None).unwrap();
        assert_eq!(s.open(t, Some("a".into()), None).unwrap_err().status(), 409);
        assert_eq!(
            s.open(t, Some("a/b".into()), None).unwrap_err().status(),
            400
        );
        s.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
        s.reward(&id, t, 1.0, None).unwrap();
        let again = s.reward(&id, t, 1.0, None).unwrap_err();
        assert_eq!(
            (again.status(), again.code.as_deref()),
            (409, Some("reward_already_posted"))
        );
        assert_eq!(
            s.record(&id, t, call(&[1], &[&[2]], 0))
                .unwrap_err()
                .status(),
            409
        );
        assert_eq!(s.check_open("nope", t).unwrap_err().status(), 404);
        assert_eq!(s.reward("a", t, f32::NAN, None).unwrap_err().status(), 400);
    }

    /// docs/gateway.md: a reward on an episode that ended without one (closed, timed out) is
    /// `episode_closed`, not `reward_already_posted` (no reward was posted).
    #[test]
    fn a_reward_after_a_close_or_timeout_is_episode_closed() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let closed = s.open(t, None, None).unwrap();
        s.close(&closed, t).unwrap();
        let idle = s.open(t, None, None).unwrap();
        let later = t + Duration::from_secs(11);
        for id in [&closed, &idle] {
            let e = s.reward(id, later, 1.0, None).unwrap_err();
            assert_eq!(
                (e.status(), e.code.as_deref()),
                (409, Some("episode_closed"))
            );
        }
        assert!(s
            .reward(&closed, later, 1.0, None)
            .unwrap_err()
            .message
            .contains("is closed"));
    }

    /// Issue 32 finding 9: `task_id` has a length limit, and open episodes a cap; an episode
    /// that ends (or times out) makes room again.
    #[test]
    fn task_ids_are_bounded_and_open_episodes_capped() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(EpisodeSettings {
            max_open: 2,
            ..settings(MissingReward::Drop, RowMode::Merged)
        });
        let long = "t".repeat(MAX_TASK_ID_BYTES + 1);
        let e = s.open(t, None, Some(long)).unwrap_err();
        assert_eq!(
            (e.status(), e.param.as_deref(), e.code.as_deref()),
            (400, Some("task_id"), Some("string_above_max_length"))
        );
        assert!(e.message.len() < 200, "the id is not echoed: {}", e.message);
        s.open(t, None, Some("t".repeat(MAX_TASK_ID_BYTES)))
            .unwrap();
        let second = s.open(t, None, None).unwrap();
        let e = s.open(t, None, None).unwrap_err();
        assert_eq!(
            (e.status(), e.code.as_deref()),
            (429, Some("too_many_open_episodes"))
        );
        assert!(
            e.message.contains("source.max_open_episodes = 2"),
            "{}",
            e.message
        );
        assert_eq!((s.open_count(), s.stats().episodes_refused), (2, 1));
        s.close(&second, t).unwrap();
        s.open(t, None, None).unwrap();
        assert!(s.open(t, None, None).is_err());
        // Idle episodes time out and free their places.
        s.open(t + Duration::from_secs(10), None, None).unwrap();
    }

    /// Issue 32 finding 11: a call whose log-probs are not all finite is not recorded, and
    /// its episode is dropped when it ends, so no NaN reaches a row (trainer or `--record`).
    #[test]
    fn non_finite_log_probs_are_never_recorded() {
        let t = Instant::now();
        for bad in [f32::NAN, f32::NEG_INFINITY] {
            let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::PerCall));
            let id = s.open(t, None, Some("task".into())).unwrap();
            s.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
            let mut poisoned = call(&[1, 2, 3], &[&[4, 5]], 0);
            poisoned.choices[0].logprobs[1] = bad;
            let e = s.record(&id, t, poisoned).unwrap_err();
            assert_eq!(
                (e.status(), e.code.as_deref()),
                (500, Some("nonfinite_logprobs"))
            );
            assert_eq!((s.stats().calls, s.stats().calls_nonfinite), (1, 1));
            let view = s.view(&id, t).unwrap();
            assert_eq!(view["calls"].as_array().unwrap().len(), 1);
            s.reward(&id, t, 1.0, None).unwrap();
            assert!(
                s.drain_ready().is_empty(),
                "the episode has a hole: dropped"
            );
            assert_eq!(s.stats().episodes_dropped, 1);
        }
    }

    /// `source.max_open_episodes` reaches the store, and 0 is refused.
    #[test]
    fn max_open_episodes_is_read_and_checked() {
        let config: super::super::GatewayConfig = toml::from_str("max_open_episodes = 3").unwrap();
        assert_eq!(config.episode_settings().max_open, 3);
        let zero = super::super::GatewayConfig {
            max_open_episodes: 0,
            ..Default::default()
        };
        assert_eq!(
            zero.problem().map(|p| p.0),
            Some("source.max_open_episodes")
        );
    }

    #[test]
    fn timeouts_fail_episodes_and_missing_rewards_follow_the_rule() {
        let t = Instant::now();
        let later = t + Duration::from_secs(11);
        let mut drop = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        let id = drop.open(t, None, None).unwrap();
        drop.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
        let other = drop.open(t, None, None).unwrap();
        drop.record(
            &other,
            later - Duration::from_secs(5),
            call(&[1], &[&[2]], 0),
        )
        .unwrap();
        assert_eq!(drop.sweep(later), 1);
        assert_eq!(drop.check_open(&id, later).unwrap_err().status(), 409);
        drop.check_open(&other, later).unwrap();
        let got = drop.take_groups(1, 1, 0, true);
        assert!(got.is_none(), "the timed-out episode was dropped");
        drop.close(&other, later).unwrap();
        assert_eq!(drop.stats().episodes_dropped, 2);

        let mut fill = EpisodeStore::new(settings(MissingReward::Fill(-1.0), RowMode::Merged));
        let id = fill.open(t, None, None).unwrap();
        fill.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
        fill.sweep(later);
        let rows = fill
            .take_groups(1, 1, 0, false)
            .unwrap()
            .episodes
            .remove(0)
            .rows;
        assert_eq!((rows[0].episode_reward, rows[0].success), (-1.0, false));
        assert_eq!(rows[0].info["outcome"], "timed_out");
    }

    #[test]
    fn groups_wait_for_group_size_episodes_of_a_task() {
        let t = Instant::now();
        let mut s = EpisodeStore::new(settings(MissingReward::Drop, RowMode::Merged));
        for task in ["a", "b", "a", "c"] {
            let id = s.open(t, None, Some(task.into())).unwrap();
            s.record(&id, t, call(&[1], &[&[2]], 0)).unwrap();
            s.reward(&id, t, 1.0, None).unwrap();
        }
        assert!(s.take_groups(2, 2, 0, false).is_none());
        let got = s.take_groups(1, 2, 5, false).unwrap();
        let keys: Vec<_> = got
            .episodes
            .iter()
            .map(|e| (e.group_key.as_str(), e.rows[0].group_id))
            .collect();
        assert_eq!(keys, vec![("a", 5), ("a", 5)]);
        // Partial: the rest, one group each, at most `groups` groups.
        let got = s.take_groups(1, 2, 6, true).unwrap();
        assert_eq!(got.episodes.len(), 1);
        assert_eq!(s.ready_count(), 1);
    }
}
