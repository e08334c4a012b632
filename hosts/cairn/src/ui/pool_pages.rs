//! The dashboard's pages over the run's data pool (`pool.sqlite`, opened read-only through
//! [`PoolReader`]): the RL steps of a run page, the groups of a step with their rewards and
//! the plugin decisions, and an episode turn by turn with its tokens coloured by advantage.

use std::collections::BTreeMap;
use std::fmt::Write;

use actix_web::{web, HttpResponse};
use cairn_kernel::text::Tokenizer;
use cairn_stores::pool::{EpisodeSummary, Filter, PoolReader, TurnRecord};
use serde::Deserialize;
use serde_json::Value as Json;

use super::html::{advantage_colour, escape, num, query_value};
use super::respond::{lookup, not_found, ok_page, run_link};
use super::runs::Run;
use super::{tokens, Dashboard};

/// Steps listed on a run page at most (the newest).
const MAX_LISTED_STEPS: usize = 500;

/// The pool of `run`, or why there is none (the message names the file).
fn open(run: &Run) -> Result<PoolReader, String> {
    PoolReader::open_run(&run.dir).map_err(|e| e.to_string())
}

/// The RL steps table of a run page: per step the episodes, rows, mean reward, success,
/// trained / excluded / failed counts, each linking to its step page.
pub fn steps_table(d: &Dashboard, run: &Run) -> String {
    let pool = match open(run) {
        Ok(pool) => pool,
        Err(e) => return format!("<p>No data pool: {}</p>", escape(&e)),
    };
    let filter = Filter {
        source: Some("train".into()),
        ..Filter::default()
    };
    let steps = match pool.step_summaries(&filter) {
        Ok(steps) => steps,
        Err(e) => return format!(r#"<p class="error">{}</p>"#, escape(&e.to_string())),
    };
    if steps.is_empty() {
        return "<p>No RL step in the data pool yet.</p>".into();
    }
    let mut out = String::new();
    if steps.len() > MAX_LISTED_STEPS {
        let _ = write!(
            out,
            "<p>The newest {MAX_LISTED_STEPS} of {} steps.</p>",
            steps.len()
        );
    }
    out.push_str(
        "<table id=\"steps\"><tr><th>step</th><th>policy version</th><th>episodes</th>\
         <th>turn rows</th><th>mean reward</th><th>success</th><th>trained</th>\
         <th>excluded</th><th>failed</th></tr>",
    );
    for s in steps.iter().rev().take(MAX_LISTED_STEPS) {
        let _ = write!(
            out,
            "<tr><td><a href=\"{}/step?run={}&amp;step={}\">{}</a></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            d.base,
            query_value(&run.name),
            s.step,
            s.step + 1,
            num(s.policy_version.map(|v| v as f64)),
            s.episodes,
            s.rows,
            num(s.mean_reward),
            num(Some(s.success_rate)),
            s.trained,
            s.excluded,
            s.failed
        );
    }
    out.push_str("</table>");
    out
}

#[derive(Deserialize)]
pub struct StepQuery {
    run: String,
    /// The pool's step: 0-based (metrics.jsonl's `rl_step` minus 1).
    step: u64,
}

/// Group ids listed under `key` of the step's decisions (a list of numbers, or of objects
/// with a `group_id`).
fn listed_groups(decisions: &Json, key: &str) -> Vec<u64> {
    decisions[key]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_u64().or_else(|| v["group_id"].as_u64()))
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /step?run=NAME&step=N`: the step's metrics and decisions, then one row per group:
/// its task, the reward of each trajectory (linking to the episode), and what was decided.
pub async fn step(d: web::Data<Dashboard>, q: web::Query<StepQuery>) -> HttpResponse {
    let run = match lookup(&d, &q.run) {
        Ok(run) => run,
        Err(e) => return not_found(&d, &e),
    };
    let pool = match open(&run) {
        Ok(pool) => pool,
        Err(e) => return not_found(&d, &e),
    };
    let filter = Filter {
        step_min: Some(q.step),
        step_max: Some(q.step),
        source: Some("train".into()),
        ..Filter::default()
    };
    let (episodes, record, summary) = match (
        pool.episodes(&filter),
        pool.step_record(q.step),
        pool.step_summaries(&filter),
    ) {
        (Ok(e), Ok(r), Ok(s)) => (e, r, s),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return not_found(&d, &e.to_string()),
    };
    let policy_version = summary.first().and_then(|s| s.policy_version);
    if episodes.is_empty() && record.is_none() {
        return not_found(
            &d,
            &format!(
                "no step {} in the data pool of run `{}`; the run page lists its steps",
                q.step + 1,
                run.name
            ),
        );
    }
    let (metrics, decisions) = record.unwrap_or((Json::Null, Json::Null));
    let mut body = format!("<h1>Step {} of {}</h1>", q.step + 1, run_link(&d, &run));
    let m = |k: &str| metrics[k].as_f64();
    let _ = write!(
        body,
        r#"<p class="meta">policy version {} · mean reward {} · success {} · loss {} · {} episodes</p>"#,
        num(policy_version.map(|v| v as f64)),
        num(m("reward/episode_mean")),
        num(m("success_rate")),
        num(m("loss")),
        episodes.len()
    );

    body.push_str("<h2>Decisions</h2>");
    match decisions.as_object() {
        Some(map) if !map.is_empty() => {
            body.push_str("<table id=\"decisions\">");
            for (k, v) in map {
                let _ = write!(
                    body,
                    "<tr><th>{}</th><td><code>{}</code></td></tr>",
                    escape(k),
                    escape(&v.to_string())
                );
            }
            body.push_str("</table>");
        }
        _ => body.push_str("<p>None recorded.</p>"),
    }

    let dropped = listed_groups(&decisions, "dropped_groups");
    let stale = listed_groups(&decisions, "stale_groups");
    let mut groups: BTreeMap<u64, Vec<&EpisodeSummary>> = BTreeMap::new();
    for e in &episodes {
        groups.entry(e.group_id).or_default().push(e);
    }
    body.push_str(
        "<h2>Groups</h2><table class=\"groups\"><tr><th>group</th><th>task</th><th>rounds</th>\
         <th>rewards (one per trajectory)</th><th>mean</th><th>trained</th><th>decision</th></tr>",
    );
    for (group, members) in &groups {
        let rewards: Vec<Option<f32>> = members.iter().map(|e| e.episode_reward).collect();
        let finished: Vec<f64> = rewards.iter().flatten().map(|&r| f64::from(r)).collect();
        let mean =
            (!finished.is_empty()).then(|| finished.iter().sum::<f64>() / finished.len() as f64);
        let mut links = String::new();
        for e in members {
            let class = match (&e.failure, e.success) {
                (Some(_), _) => "failed",
                (None, true) => "success",
                (None, false) => "fail",
            };
            let shown = match (&e.failure, e.episode_reward) {
                (Some(f), _) => format!("failed ({})", escape(f)),
                (None, Some(r)) => num(Some(f64::from(r))),
                (None, None) => "-".into(),
            };
            let _ = write!(
                links,
                r#"<a class="reward {class}" href="{}/episode?run={}&amp;id={}" title="trajectory {} · {} turns · policy version {}">{shown}</a> "#,
                d.base,
                query_value(&run.name),
                e.id,
                e.trajectory_id,
                e.turns,
                e.policy_version
            );
        }
        let trained = members.iter().filter(|e| e.trained).count();
        let mut decision: Vec<String> = Vec::new();
        if dropped.contains(group) {
            decision.push("dropped by the algorithm".into());
        }
        if stale.contains(group) {
            decision.push("dropped as stale".into());
        }
        let mut reasons: Vec<&str> = members
            .iter()
            .filter_map(|e| e.skip_reason.as_deref().or(e.excluded.as_deref()))
            .collect();
        reasons.sort_unstable();
        reasons.dedup();
        decision.extend(reasons.iter().map(|r| escape(r)));
        let mut rounds: Vec<u32> = members.iter().map(|e| e.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        let rewards_json = serde_json::to_string(&rewards).expect("floats and nulls serialise");
        let class = if trained == 0 {
            " class=\"dropped\""
        } else {
            ""
        };
        let _ = write!(
            body,
            "<tr{class} data-group=\"{group}\" data-rewards=\"{}\"><td>{group}</td><td>{}</td>\
             <td>{}</td><td>{links}</td><td>{}</td><td>{trained} of {}</td><td>{}</td></tr>",
            escape(&rewards_json),
            escape(&members[0].task_id),
            rounds
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            num(mean),
            members.len(),
            if decision.is_empty() {
                "trained".into()
            } else {
                decision.join("; ")
            }
        );
    }
    body.push_str("</table>");
    ok_page(&d, &format!("step {}", q.step + 1), &body)
}

#[derive(Deserialize)]
pub struct EpisodeQuery {
    run: String,
    /// The pool's episode id.
    id: u64,
}

/// `GET /episode?run=NAME&id=ID`: the episode's summary, then each turn: its prompt, the
/// observation, and the response tokens, each a `span.tok` with `data-id`, `data-logprob`,
/// `data-advantage` (absent when the row never reached the signals) and `data-mask`,
/// coloured by advantage (blue negative, white 0, red positive, on ± the episode's largest
/// |advantage|) and greyed when masked; hovering shows the numbers.
pub async fn episode(d: web::Data<Dashboard>, q: web::Query<EpisodeQuery>) -> HttpResponse {
    let run = match lookup(&d, &q.run) {
        Ok(run) => run,
        Err(e) => return not_found(&d, &e),
    };
    let pool = match open(&run) {
        Ok(pool) => pool,
        Err(e) => return not_found(&d, &e),
    };
    let (summary, turns) = match (pool.episode(q.id), pool.turns(q.id)) {
        (Ok(Some(s)), Ok(t)) => (s, t),
        (Ok(None), _) => {
            return not_found(
                &d,
                &format!(
                    "no episode {} in the data pool of run `{}`; a step page links its episodes",
                    q.id, run.name
                ),
            )
        }
        (Err(e), _) | (_, Err(e)) => return not_found(&d, &e.to_string()),
    };
    let tokenizer = d.tokenizers.get(&run.dir);
    let mut body = format!("<h1>Episode {} of {}</h1>", summary.id, run_link(&d, &run));
    body.push_str(&summary_table(&d, &run, &summary));
    if let Err(e) = &tokenizer {
        let _ = write!(
            body,
            r#"<p class="error">Token text unavailable ({}); showing ids.</p>"#,
            escape(e)
        );
    }
    let scale = turns
        .iter()
        .flat_map(|t| {
            let mask = &t.row.response_mask;
            t.advantages
                .iter()
                .flatten()
                .zip(mask)
                .filter(|(_, &m)| m != 0)
                .map(|(a, _)| f64::from(a.abs()))
        })
        .fold(0.0_f64, f64::max);
    let _ = write!(
        body,
        r#"<p class="legend">advantage: <span style="background:{}">−{}</span> <span style="background:#ffffff">0</span> <span style="background:{}">+{}</span> · <span class="tok masked">masked (not trained)</span></p>"#,
        advantage_colour(-scale, scale),
        num(Some(scale)),
        advantage_colour(scale, scale),
        num(Some(scale)),
    );
    for t in &turns {
        body.push_str(&turn_html(t, tokenizer.as_ref().ok(), scale));
    }
    if turns.is_empty() {
        body.push_str("<p>No turns recorded (a failed episode keeps only its failure).</p>");
    }
    ok_page(&d, &format!("episode {}", summary.id), &body)
}

fn summary_table(d: &Dashboard, run: &Run, e: &EpisodeSummary) -> String {
    let mut out = String::from("<table id=\"episode\">");
    let mut row = |k: &str, v: String| {
        let _ = write!(out, "<tr><th>{k}</th><td>{v}</td></tr>");
    };
    row("source", escape(&e.source));
    match e.source.strip_prefix("eval:") {
        // An evaluation is not an RL step: its `step` counts the RL steps done before it.
        Some(label) => row(
            "evaluation",
            format!(
                "<a href=\"{}/run?run={}\">{}</a> after {} RL step{}",
                d.base,
                query_value(&run.name),
                escape(label),
                e.step,
                if e.step == 1 { "" } else { "s" }
            ),
        ),
        None => row(
            "step",
            format!(
                "<a href=\"{}/step?run={}&amp;step={}\">{}</a> (round {})",
                d.base,
                query_value(&run.name),
                e.step,
                e.step + 1,
                e.round
            ),
        ),
    }
    row("task", escape(&e.task_id));
    row("trajectory", e.trajectory_id.to_string());
    row("group", e.group_id.to_string());
    row("seed", e.seed.map_or("-".into(), |s| s.to_string()));
    if let Some(h) = &e.harness_episode {
        row("harness episode", escape(h));
    }
    row("context variant", escape(&e.variant));
    row("policy version", e.policy_version.to_string());
    row("reward", num(e.episode_reward.map(f64::from)));
    row("success", e.success.to_string());
    if let Some(f) = &e.failure {
        row("failure", escape(f));
    }
    row(
        "trained",
        match &e.skip_reason {
            Some(r) => format!("{} ({})", e.trained, escape(r)),
            None => e.trained.to_string(),
        },
    );
    if let Some(x) = &e.excluded {
        row("excluded", escape(x));
    }
    out.push_str("</table>");
    out
}

/// One turn: header, prompt (collapsed), observation, and the response tokens.
fn turn_html(t: &TurnRecord, tokenizer: Option<&Tokenizer>, scale: f64) -> String {
    let r = &t.row;
    let mut out = format!(r#"<div class="turn" data-turn="{}">"#, r.turn);
    let trained = match &t.skip_reason {
        Some(reason) => format!("not trained: {}", escape(reason)),
        None if t.trained => "trained".into(),
        None => "not trained".into(),
    };
    let _ = write!(
        out,
        "<h3>Turn {} · policy version {} · turn reward {} · {} · {}</h3>",
        r.turn,
        r.policy_version,
        num(Some(f64::from(r.turn_reward))),
        escape(&format!("{:?}", r.finish_reason).to_lowercase()),
        trained
    );
    let prompt = match tokenizer {
        Some(tok) => tok
            .decode(&r.prompt_ids)
            .unwrap_or_else(|e| format!("(cannot decode: {e})")),
        None => format!("{:?}", r.prompt_ids),
    };
    let _ = write!(
        out,
        r#"<details><summary>prompt ({} tokens)</summary><pre class="prompt">{}</pre></details>"#,
        r.prompt_ids.len(),
        escape(&prompt)
    );
    if !r.observation.is_empty() {
        let _ = write!(
            out,
            r#"<p class="meta">observation: {}</p>"#,
            escape(&r.observation)
        );
    }
    let pieces = match tokenizer {
        Some(tok) => tokens::pieces(tok, &r.response_ids),
        None => r.response_ids.iter().map(|id| format!("[{id}]")).collect(),
    };
    out.push_str(r#"<div class="tokens">"#);
    for (i, (&id, piece)) in r.response_ids.iter().zip(&pieces).enumerate() {
        let logprob = r.response_logprobs.get(i).map(|&x| f64::from(x));
        let mask = r.response_mask.get(i).copied().unwrap_or(0);
        let advantage = t
            .advantages
            .as_ref()
            .and_then(|a| a.get(i))
            .map(|&x| f64::from(x));
        let title = format!(
            "id {id} · log-prob {} · advantage {} · {}",
            num(logprob),
            num(advantage),
            if mask != 0 { "trained" } else { "masked" }
        );
        let (class, style) = if mask != 0 {
            (
                "tok",
                format!(
                    r#" style="background:{}""#,
                    advantage_colour(advantage.unwrap_or(0.0), scale)
                ),
            )
        } else {
            ("tok masked", String::new())
        };
        let advantage_attr =
            advantage.map_or(String::new(), |a| format!(r#" data-advantage="{a}""#));
        let logprob_attr = logprob.map_or(String::new(), |l| format!(r#" data-logprob="{l}""#));
        let _ = write!(
            out,
            r#"<span class="{class}"{style} data-id="{id}"{logprob_attr}{advantage_attr} data-mask="{mask}" title="{}">{}</span>"#,
            escape(&title),
            escape(piece)
        );
    }
    out.push_str("</div></div>");
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use cairn_plugin_sdk::TurnRow;

    use super::*;

    #[test]
    fn an_evaluation_episode_names_its_evaluation_not_an_rl_step() {
        let d = Dashboard::standalone(Path::new("/runs"));
        let run = Run {
            name: "r".into(),
            dir: "/runs/r".into(),
        };
        let mut e = EpisodeSummary {
            id: 7,
            source: "eval:after_rl".into(),
            step: 20,
            global_step: 296,
            round: 0,
            trajectory_id: 3,
            group_id: 3,
            task_id: "household/test/3".into(),
            seed: None,
            harness_episode: None,
            variant: "plain".into(),
            policy_version: 296,
            turns: 2,
            episode_reward: Some(1.0),
            success: true,
            failure: None,
            trained: false,
            skip_reason: None,
            excluded: None,
        };
        let html = summary_table(&d, &run, &e);
        assert!(
            html.contains(
                "<th>evaluation</th><td><a href=\"/run?run=r\">after_rl</a> after 20 RL steps"
            ),
            "{html}"
        );
        assert!(!html.contains("/step?"), "{html}");
        e.source = "rollout".into();
        let html = summary_table(&d, &run, &e);
        assert!(
            html.contains("<a href=\"/step?run=r&amp;step=20\">21</a> (round 0)"),
            "{html}"
        );
    }

    #[test]
    fn tokens_carry_their_numbers_and_masked_ones_are_greyed() {
        let record = TurnRecord {
            episode: 1,
            row: TurnRow {
                turn: 2,
                response_ids: vec![7, 8, 9],
                response_logprobs: vec![-0.5, -1.25, -2.0],
                response_mask: vec![1, 0, 1],
                ..TurnRow::default()
            },
            advantages: Some(vec![0.5, 0.25, -1.0]),
            trained: true,
            skip_reason: None,
        };
        let html = turn_html(&record, None, 1.0);
        assert!(
            html.starts_with(r#"<div class="turn" data-turn="2">"#),
            "{html}"
        );
        assert!(
            html.contains(
                r##"<span class="tok" style="background:#eb9394" data-id="7" data-logprob="-0.5" data-advantage="0.5" data-mask="1" title="id 7 · log-prob -0.5 · advantage 0.5 · trained">[7]</span>"##
            ),
            "{html}"
        );
        // Masked: greyed by its class, no advantage colour.
        assert!(
            html.contains(r#"<span class="tok masked" data-id="8" data-logprob="-1.25" data-advantage="0.25" data-mask="0""#),
            "{html}"
        );
        assert!(
            html.contains(r##"style="background:#1f77b4" data-id="9""##),
            "{html}"
        );
        // A row that never reached the signals has no advantage attribute.
        let unsignalled = TurnRecord {
            advantages: None,
            ..record
        };
        let html = turn_html(&unsignalled, None, 1.0);
        assert!(!html.contains("data-advantage"), "{html}");
        assert!(html.contains("advantage - · trained"), "{html}");
    }

    #[test]
    fn decisions_list_groups_as_ids_or_objects() {
        let d = serde_json::json!({"dropped_groups": [3, {"group_id": 5}], "stale_groups": []});
        assert_eq!(listed_groups(&d, "dropped_groups"), [3, 5]);
        assert!(listed_groups(&d, "stale_groups").is_empty());
        assert!(listed_groups(&Json::Null, "dropped_groups").is_empty());
    }
}
