//! `algorithm.stack[i].config` of `edge`: every key, its default (the EDGE ALFWorld script's
//! where it has one) and its checks. `docs/algorithms/edge.md` has the same table.

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::{PluginError, Result, TeacherForm};
use serde::Deserialize;

/// What a row's score `s` is (broadcast to every row of its trajectory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Score {
    /// `TurnRow::success` as 1 / 0 (EDGE's first choice when the environment reports it).
    #[default]
    Success,
    /// `TurnRow::episode_reward`.
    Reward,
}

/// Which rows of an admitted cell are distilled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Only experience-free (N) rows with `s ≤ 0` (at the trajectory level: every N row).
    #[default]
    #[serde(rename = "w_o_experience_only")]
    WithoutExperienceOnly,
    /// Every row of the cell (of the group, at the trajectory level), both arms.
    All,
}

/// Where the marginal gain of the experiences is measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Same-anchor cells `(group, anchor)`.
    #[default]
    Anchor,
    /// Whole groups: `w = max(0, mean_E s − mean_N s)` over trajectories.
    Trajectory,
}

/// Where a synthesized experience is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Specific to the task it came from (`task_id` set): only that task retrieves it,
    /// through `task_specific_top_k`.
    #[default]
    Task,
    /// General (`task_id` none): every task may retrieve it, ranked by BM25 relevance to the
    /// task's description, through `top_k`, as EDGE retrieves its pool by similarity to the
    /// task. The source task is kept in the entry's `extra.edge_task`.
    General,
}

/// Which tokens the distillation term compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSelection {
    /// The policy's own sampled tokens (`TeacherForm::SampledReverseKl`).
    #[default]
    Sampled,
    /// The teacher's top-k ids (`TeacherForm::TopKReverseKl { k: top_k_tokens }`).
    TeacherTopk,
}

/// The plugin's config. Defaults are EDGE's (`run_alfworld_edge.sh`) except where the field
/// says otherwise.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// Coefficient of the `edge-distill` teacher term (`edge_distillation.coef`).
    pub coef: f32,
    /// Steps, counted from 0, during which groups are split into E and N halves: step `s`
    /// (0-based `GroupRequest::step`) splits iff `s < warmup_steps`. EDGE's rule is
    /// `global_step ≤ exp_rollout_warmup_steps` with 1-based global steps, and
    /// `global_step = s + 1`, so the two agree.
    pub warmup_steps: u64,
    /// General experiences (`task_id` none) injected into an E slot.
    pub top_k: usize,
    /// Experiences specific to the group's task injected into an E slot.
    pub task_specific_top_k: usize,
    /// An entry longer than this (Unicode scalar values) is never injected; it is skipped and
    /// counted (`edge/entries_too_long`), never truncated. Ours: EDGE has no such limit.
    pub max_experience_chars: usize,
    /// The line injected above the experiences (each then follows on its own `- ` line).
    /// Empty: the experiences alone, one per line, exactly as the bank holds them (the form
    /// the warm start's hinted demonstrations teach a small policy; ours).
    pub header: String,
    /// What a row's score is.
    pub score: Score,
    /// Anchor level: admit a cell only when the E arm succeeded there and the N arm did not.
    pub require_positive_gain: bool,
    /// Which rows of an admitted cell are distilled.
    pub target: Target,
    /// Where the gain is measured.
    pub level: Level,
    /// Where new experiences are kept (ours; see [`Scope`]).
    pub scope: Scope,
    /// Sampled-token or teacher-top-k reverse KL.
    pub token_selection: TokenSelection,
    /// `k` of the top-k form (read only with `token_selection = "teacher_topk"`).
    pub top_k_tokens: u32,
    /// Steps per bank management window: the window closes after step `s` when
    /// `(s + 1) % update_frequency == 0`.
    pub update_frequency: u64,
    /// EMA rate of the utility: `u ← (1 − beta) u + beta · mean(credits)`.
    pub beta: f64,
    /// Synthesis runs only when some task kind's training success rate in the window is
    /// below this.
    pub update_threshold: f64,
    /// "Experience hurt" contrasts considered per window.
    pub max_failed_trajectories: usize,
    /// Reflections requested per window (contrasts and bootstrap together).
    pub max_new_experiences: usize,
    /// Ours: reflect on a successful trajectory of a task the bank has no experience for yet,
    /// so an empty bank fills up (EDGE starts from a written bank instead).
    pub bootstrap: bool,
    /// Hard prune: exposures at least this ...
    pub min_exposures: u64,
    /// ... utility at most this ...
    pub utility_threshold: f64,
    /// ... and a negative streak of at least this many windows.
    pub negative_windows: u32,
    /// Capacity of each pool (task-specific entries, general entries).
    pub max_items: usize,
    /// Weight of the exploration bonus in the retain score.
    pub score_c: f64,
    /// UCB constant of the retain score. A proposal: EDGE has it as a bank attribute whose
    /// value we could not confirm.
    pub c_ucb: f64,
    /// Entries written within this many steps are never evicted by the capacity trim.
    pub protect_recent_steps: u64,
}

/// The default [`EdgeConfig::header`].
pub const DEFAULT_HEADER: &str = "Experiences from earlier attempts at tasks like this one:";

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            coef: 1.0,
            warmup_steps: 100,
            top_k: 6,
            task_specific_top_k: 4,
            max_experience_chars: 600,
            header: DEFAULT_HEADER.into(),
            score: Score::Success,
            require_positive_gain: true,
            target: Target::WithoutExperienceOnly,
            level: Level::Anchor,
            scope: Scope::Task,
            token_selection: TokenSelection::Sampled,
            top_k_tokens: 20,
            update_frequency: 5,
            beta: 0.1,
            update_threshold: 0.3,
            max_failed_trajectories: 10,
            max_new_experiences: 3,
            bootstrap: true,
            min_exposures: 5,
            utility_threshold: -0.25,
            negative_windows: 2,
            max_items: 200,
            score_c: 1.0,
            c_ucb: 1.0,
            protect_recent_steps: 20,
        }
    }
}

impl EdgeConfig {
    /// Parses and checks a JSON config; errors name the key and the accepted range.
    pub fn from_json(json: &str) -> Result<Self> {
        let config: EdgeConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        check_range("coef", self.coef, Range::AtLeast(0.0), "", "EDGE uses 1.0")?;
        PluginError::check_config(
            self.top_k + self.task_specific_top_k > 0,
            "`top_k` and `task_specific_top_k` are both 0: E slots would get no experience; \
             set at least one (EDGE uses 6 and 4)",
        )?;
        PluginError::check_config(
            self.max_experience_chars >= 1,
            "`max_experience_chars` = 0: give the longest entry to inject, in characters \
             (default 600)",
        )?;
        PluginError::check_config(
            self.top_k_tokens >= 1,
            "`top_k_tokens` = 0: the top-k form needs k ≥ 1 (EDGE uses 20)",
        )?;
        PluginError::check_config(
            self.update_frequency >= 1,
            "`update_frequency` = 0: give the management window in steps, ≥ 1 (EDGE uses 5)",
        )?;
        check_range(
            "beta",
            self.beta,
            Range::OpenClosed(0.0, 1.0),
            "the EMA rate",
            "EDGE uses 0.1",
        )?;
        PluginError::check_config(
            (0.0..=1.0).contains(&self.update_threshold),
            format!(
                "`update_threshold` = {}: a success rate, in [0, 1] (EDGE uses 0.3)",
                self.update_threshold
            ),
        )?;
        PluginError::check_config(
            self.utility_threshold.is_finite(),
            format!(
                "`utility_threshold` = {}: must be finite (EDGE uses -0.25)",
                self.utility_threshold
            ),
        )?;
        PluginError::check_config(
            self.max_items >= 1,
            "`max_items` = 0: give the capacity of each pool, ≥ 1 (EDGE uses 200)",
        )?;
        for (key, value) in [("score_c", self.score_c), ("c_ucb", self.c_ucb)] {
            check_range(key, value, Range::AtLeast(0.0), "", "default 1.0")?;
        }
        Ok(())
    }

    /// The form of the `edge-distill` term.
    pub fn form(&self) -> TeacherForm {
        match self.token_selection {
            TokenSelection::Sampled => TeacherForm::SampledReverseKl,
            TokenSelection::TeacherTopk => TeacherForm::TopKReverseKl {
                k: self.top_k_tokens,
            },
        }
    }

    /// Whether the A/B split (and distillation) is on at step `step` (0-based).
    pub fn in_warmup(&self, step: u64) -> bool {
        step < self.warmup_steps
    }

    /// Whether the management window closes after step `step` (0-based).
    pub fn closes_window(&self, step: u64) -> bool {
        (step + 1).is_multiple_of(self.update_frequency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_edges_and_every_key_parses() {
        let c = EdgeConfig::from_json("").unwrap();
        assert_eq!(c, EdgeConfig::default());
        assert_eq!(c.form(), TeacherForm::SampledReverseKl);
        let c = EdgeConfig::from_json(
            r#"{"coef": 0.5, "warmup_steps": 3, "top_k": 1, "task_specific_top_k": 2,
                "max_experience_chars": 50, "header": "", "score": "reward", "require_positive_gain": false,
                "target": "all", "level": "trajectory", "scope": "general",
                "token_selection": "teacher_topk",
                "top_k_tokens": 5, "update_frequency": 2, "beta": 0.2, "update_threshold": 0.5,
                "max_failed_trajectories": 4, "max_new_experiences": 1, "bootstrap": false,
                "min_exposures": 3, "utility_threshold": -0.5, "negative_windows": 1,
                "max_items": 7, "score_c": 0.5, "c_ucb": 2.0, "protect_recent_steps": 4}"#,
        )
        .unwrap();
        assert_eq!(
            c,
            EdgeConfig {
                coef: 0.5,
                warmup_steps: 3,
                top_k: 1,
                task_specific_top_k: 2,
                max_experience_chars: 50,
                header: String::new(),
                score: Score::Reward,
                require_positive_gain: false,
                target: Target::All,
                level: Level::Trajectory,
                scope: Scope::General,
                token_selection: TokenSelection::TeacherTopk,
                top_k_tokens: 5,
                update_frequency: 2,
                beta: 0.2,
                update_threshold: 0.5,
                max_failed_trajectories: 4,
                max_new_experiences: 1,
                bootstrap: false,
                min_exposures: 3,
                utility_threshold: -0.5,
                negative_windows: 1,
                max_items: 7,
                score_c: 0.5,
                c_ucb: 2.0,
                protect_recent_steps: 4,
            }
        );
        assert_eq!(c.form(), TeacherForm::TopKReverseKl { k: 5 });
    }

    #[test]
    fn warmup_and_windows_count_steps_from_zero() {
        let c = EdgeConfig::from_json(r#"{"warmup_steps": 100, "update_frequency": 5}"#).unwrap();
        // EDGE: global_step = step + 1 ≤ 100.
        assert!(c.in_warmup(0) && c.in_warmup(99) && !c.in_warmup(100));
        let closes: Vec<u64> = (0..12).filter(|&s| c.closes_window(s)).collect();
        assert_eq!(closes, [4, 9]);
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let e = EdgeConfig::from_json(json).unwrap_err();
            assert!(e.message.starts_with(want), "{json}: {e}");
        };
        check(r#"{"coef": -1}"#, "`coef` = -1");
        check(
            r#"{"top_k": 0, "task_specific_top_k": 0}"#,
            "`top_k` and `task_specific_top_k` are both 0",
        );
        check(
            r#"{"max_experience_chars": 0}"#,
            "`max_experience_chars` = 0",
        );
        check(r#"{"top_k_tokens": 0}"#, "`top_k_tokens` = 0");
        check(r#"{"update_frequency": 0}"#, "`update_frequency` = 0");
        check(r#"{"beta": 0}"#, "`beta` = 0");
        check(r#"{"beta": 1.5}"#, "`beta` = 1.5");
        check(r#"{"update_threshold": 1.2}"#, "`update_threshold` = 1.2");
        check(r#"{"max_items": 0}"#, "`max_items` = 0");
        check(r#"{"score_c": -1}"#, "`score_c` = -1");
        check(r#"{"c_ucb": -0.5}"#, "`c_ucb` = -0.5");
        check(r#"{"score": "best"}"#, "`score`");
        check(r#"{"target": "n"}"#, "`target`");
        check(r#"{"level": "row"}"#, "`level`");
        check(r#"{"token_selection": "all"}"#, "`token_selection`");
        check(r#"{"negative_windows": -1}"#, "`negative_windows`");
        let e = EdgeConfig::from_json(r#"{"warmup": 3}"#).unwrap_err();
        assert!(e.message.contains("unknown field `warmup`"), "{e}");
    }
}
