//! The dashboard's pages that read files and the bank: the run list, a run's curves and
//! evaluations, the experience bank, the gateway, and the curves' JSON.

use std::fmt::Write;
use std::time::Instant;

use actix_web::{web, HttpResponse};
use cairn_stores::bank::{bank_path, Bank, EntryFilter};
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::html::{escape, num, query_value};
use super::respond::{html, lookup, not_found, ok_page, run_link};
use super::runs::{self, EVAL_FILE, METRICS_FILE};
use super::{pool_pages, Dashboard};

/// Curves drawn when a run page opens (those the run has); `eval:` keys come from
/// `eval.jsonl`.
const DEFAULT_CURVES: &[&str] = &[
    "reward/episode_mean",
    "success_rate",
    "eval:success_rate",
    "loss",
    "sft_loss",
    "kl",
    "clip_fraction",
    "response_length/mean",
];

/// Characters of a bank entry's text shown before "more".
const BANK_TEXT_CHARS: usize = 160;

#[derive(Deserialize)]
pub struct RunQuery {
    pub run: String,
}

fn problems_html(problems: &[String]) -> String {
    if problems.is_empty() {
        return String::new();
    }
    let items: String = problems
        .iter()
        .map(|p| format!("<li>{}</li>", escape(p)))
        .collect();
    format!(r#"<ul class="error">{items}</ul>"#)
}

/// `GET /`: the runs (one run: its page).
pub async fn index(d: web::Data<Dashboard>) -> HttpResponse {
    let runs = match runs::discover(&d.root) {
        Ok(runs) => runs,
        Err(e) => return not_found(&d, &format!("{e:#}")),
    };
    if let [run] = runs.as_slice() {
        if d.gateway.is_none() {
            return HttpResponse::Found()
                .insert_header((
                    "location",
                    format!("{}/run?run={}", d.base, query_value(&run.name)),
                ))
                .finish();
        }
    }
    let mut body = format!("<h1>Runs in {}</h1>", escape(&d.root.display().to_string()));
    if runs.is_empty() {
        body.push_str("<p>No run directory here yet.</p>");
    } else {
        body.push_str(
            "<table id=\"runs\"><tr><th>run</th><th>steps</th><th>phase</th>\
             <th>last step</th><th>reward</th><th>success</th><th>held-out success</th>\
             <th>updated</th></tr>",
        );
        for run in &runs {
            let metrics = runs::read_jsonl(&run.dir.join(METRICS_FILE)).rows;
            let evals = runs::read_jsonl(&run.dir.join(EVAL_FILE)).rows;
            let last = metrics.last();
            let get = |k: &str| last.and_then(|m| m.get(k)).and_then(Json::as_f64);
            let phase = last
                .and_then(|m| m.get("phase"))
                .and_then(Json::as_str)
                .unwrap_or("-");
            let eval = evals
                .last()
                .and_then(|e| e.get("success_rate"))
                .and_then(Json::as_f64);
            let updated = std::fs::metadata(run.dir.join(METRICS_FILE))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or("-".into(), |e| format!("{} s ago", e.as_secs()));
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                run_link(&d, run),
                metrics.len(),
                escape(phase),
                num(get("step")),
                num(get("reward/episode_mean")),
                num(get("success_rate")),
                num(eval),
                updated
            );
        }
        body.push_str("</table>");
    }
    ok_page(&d, "runs", &body)
}

/// `GET /run?run=NAME`: the curves (drawn by the script from `/api/curves`), the
/// evaluations, the RL steps of the data pool, and a link to the bank.
pub async fn run(d: web::Data<Dashboard>, q: web::Query<RunQuery>) -> HttpResponse {
    let run = match lookup(&d, &q.run) {
        Ok(run) => run,
        Err(e) => return not_found(&d, &e),
    };
    let metrics = runs::read_jsonl(&run.dir.join(METRICS_FILE));
    let evals = runs::read_jsonl(&run.dir.join(EVAL_FILE));
    let mut keys = runs::numeric_keys(&metrics.rows);
    keys.extend(
        runs::numeric_keys(&evals.rows)
            .into_iter()
            .map(|k| format!("eval:{k}")),
    );
    let mut body = format!(
        r#"<h1>Run {}</h1><p class="path">{}</p>"#,
        escape(&run.name),
        escape(&run.dir.display().to_string())
    );
    body.push_str(&problems_html(&metrics.problems));
    body.push_str(&problems_html(&evals.problems));
    // The script draws the checked curves and redraws them every 2 s; the key list grows
    // with the run (new keys appear after a reload).
    let _ = write!(
        body,
        r#"<h2>Curves</h2><section id="curves" data-run="{}" data-api="{}/api/curves">"#,
        escape(&run.name),
        d.base
    );
    body.push_str(r#"<details class="keys"><summary>curves shown</summary>"#);
    for key in &keys {
        let checked = if DEFAULT_CURVES.contains(&key.as_str()) {
            " checked"
        } else {
            ""
        };
        let _ = write!(
            body,
            r#"<label><input type="checkbox" value="{k}"{checked}> {k}</label>"#,
            k = escape(key)
        );
    }
    body.push_str(
        r#"</details><p class="live" id="curves-status">loading…</p><div id="charts"></div></section>"#,
    );

    body.push_str("<h2>Held-out evaluations</h2>");
    if evals.rows.is_empty() {
        body.push_str("<p>None yet.</p>");
    } else {
        body.push_str(
            "<table id=\"evals\"><tr><th>label</th><th>step</th><th>policy version</th>\
             <th>success</th><th>tasks</th><th>mean turns</th><th>temperature</th></tr>",
        );
        for e in &evals.rows {
            let f = |k: &str| e.get(k).and_then(Json::as_f64);
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                escape(e.get("label").and_then(Json::as_str).unwrap_or("-")),
                num(f("step")),
                num(f("policy_version")),
                num(f("success_rate")),
                num(f("tasks")),
                num(f("mean_turns")),
                num(f("temperature"))
            );
        }
        body.push_str("</table>");
    }

    body.push_str("<h2>RL steps</h2>");
    body.push_str(&pool_pages::steps_table(&d, &run));

    let bank = bank_path(&run.dir);
    if bank.is_file() {
        let _ = write!(
            body,
            r#"<h2>Experience bank</h2><p><a href="{}/bank?run={}">the bank's entries</a></p>"#,
            d.base,
            query_value(&run.name)
        );
    }
    ok_page(&d, &run.name, &body)
}

#[derive(Deserialize)]
pub struct CurvesQuery {
    run: String,
    /// Comma-separated keys; `eval:` ones come from `eval.jsonl`.
    #[serde(default)]
    keys: String,
}

/// `GET /api/curves?run=NAME&keys=a,b`: `{"run", "lines", "eval_lines", "curves": [{"key",
/// "points": [[step, value], ...]}], "problems": [...]}`, a curve per requested key (empty
/// when the run has no such number).
pub async fn curves(d: web::Data<Dashboard>, q: web::Query<CurvesQuery>) -> HttpResponse {
    let run = match lookup(&d, &q.run) {
        Ok(run) => run,
        Err(e) => return HttpResponse::NotFound().json(json!({ "error": e })),
    };
    let metrics = runs::read_jsonl(&run.dir.join(METRICS_FILE));
    let evals = runs::read_jsonl(&run.dir.join(EVAL_FILE));
    let curves: Vec<Json> = q
        .keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(|key| {
            let points = match key.strip_prefix("eval:") {
                Some(k) => runs::series(&evals.rows, k),
                None => runs::series(&metrics.rows, key),
            };
            json!({"key": key, "points": points.iter().map(|&(x, y)| [x, y]).collect::<Vec<_>>()})
        })
        .collect();
    let mut problems = metrics.problems;
    problems.extend(evals.problems);
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(json!({
            "run": run.name,
            "lines": metrics.rows.len(),
            "eval_lines": evals.rows.len(),
            "curves": curves,
            "problems": problems,
        }))
}

/// `GET /bank?run=NAME`: every entry of the run's bank (opened read-only), with its
/// provenance and utility statistics.
pub async fn bank(d: web::Data<Dashboard>, q: web::Query<RunQuery>) -> HttpResponse {
    let run = match lookup(&d, &q.run) {
        Ok(run) => run,
        Err(e) => return not_found(&d, &e),
    };
    let path = bank_path(&run.dir);
    if !path.is_file() {
        return not_found(
            &d,
            &format!(
                "no experience bank in {}: {} does not exist (runs made before the bank existed \
                 have none)",
                run.dir.display(),
                path.display()
            ),
        );
    }
    let entries = match Bank::open_read_only(&path).and_then(|b| b.list(&EntryFilter::default())) {
        Ok(entries) => entries,
        Err(e) => return not_found(&d, &format!("{e}")),
    };
    let mut body = format!(
        r#"<h1>Experience bank of {}</h1><p class="path">{} · {} entries</p>"#,
        run_link(&d, &run),
        escape(&path.display().to_string()),
        entries.len()
    );
    body.push_str(
        "<table id=\"bank\"><tr><th>id</th><th>kind</th><th>status</th><th>version</th>\
         <th>task</th><th>text</th><th>written at step</th><th>policy version</th>\
         <th>writer</th><th>source trajectories</th><th>utility EMA</th><th>exposures</th>\
         <th>successes</th><th>Beta(α, β)</th></tr>",
    );
    for e in &entries {
        let text = if e.text.chars().count() > BANK_TEXT_CHARS {
            let head: String = e.text.chars().take(BANK_TEXT_CHARS).collect();
            format!(
                "<details><summary>{}…</summary><pre>{}</pre></details>",
                escape(&head),
                escape(&e.text)
            )
        } else {
            escape(&e.text)
        };
        let trigger = e
            .trigger
            .as_deref()
            .map(|t| format!(r#"<div class="trigger">trigger: {}</div>"#, escape(t)))
            .unwrap_or_default();
        let version = match e.parent {
            Some(p) => format!("{} (revises {p})", e.version),
            None => e.version.to_string(),
        };
        let sources: Vec<String> = e
            .provenance
            .source_trajectories
            .iter()
            .map(u64::to_string)
            .collect();
        let _ = write!(
            body,
            "<tr data-id=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"text\">{text}{trigger}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>({}, {})</td></tr>",
            e.id,
            e.id,
            escape(e.kind.as_str()),
            escape(e.status.as_str()),
            version,
            escape(e.task_id.as_deref().unwrap_or("-")),
            e.provenance.step,
            e.provenance.policy_version,
            escape(&e.provenance.writer),
            escape(&sources.join(", ")),
            num(Some(e.stats.utility_ema)),
            e.stats.exposures,
            e.stats.successes,
            num(Some(e.stats.beta_alpha)),
            num(Some(e.stats.beta_beta)),
        );
    }
    body.push_str("</table>");
    ok_page(&d, "bank", &body)
}

/// `GET /gateway`: the gateway's counters and episodes, refreshed every 2 s by the script.
pub async fn gateway(d: web::Data<Dashboard>) -> HttpResponse {
    let Some(fragment) = gateway_tables(&d) else {
        return not_found(
            &d,
            "no gateway here: the gateway page is served by `cairn serve CONFIG --ui`",
        );
    };
    let body = format!(
        r#"<h1>Gateway</h1><div id="gateway" data-live="{}/fragment/gateway">{fragment}</div>"#,
        d.base
    );
    ok_page(&d, "gateway", &body)
}

/// `GET /fragment/gateway`: the gateway tables alone.
pub async fn gateway_fragment(d: web::Data<Dashboard>) -> HttpResponse {
    match gateway_tables(&d) {
        Some(fragment) => html(actix_web::http::StatusCode::OK, fragment),
        None => HttpResponse::NotFound().body("no gateway here"),
    }
}

/// The counters of `/health` and one row per episode of the gateway's store.
fn gateway_tables(d: &Dashboard) -> Option<String> {
    let gw = d.gateway.as_ref()?;
    let health = gw.health();
    let listing = gw.store().lock().listing(Instant::now());
    let mut out = String::from("<table id=\"gateway-counters\">");
    let mut counter = |name: &str, value: &Json| {
        let shown = match value {
            Json::String(s) => escape(s),
            other => escape(&other.to_string()),
        };
        let _ = write!(out, "<tr><th>{}</th><td>{shown}</td></tr>", escape(name));
    };
    for key in ["model", "policy_version", "episodes_open", "episodes_ready"] {
        counter(key, &health[key]);
    }
    if let Some(stats) = health["stats"].as_object() {
        for (k, v) in stats {
            counter(k, v);
        }
    }
    out.push_str("</table>");
    out.push_str(
        "<table id=\"gateway-episodes\"><tr><th>episode</th><th>trajectory</th><th>task</th>\
         <th>status</th><th>calls</th><th>segments</th><th>sampled tokens</th><th>reward</th>\
         <th>idle</th></tr>",
    );
    for e in &listing {
        let _ = write!(
            out,
            "<tr class=\"{status}\"><td>{}</td><td>{}</td><td>{}</td><td>{status}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{:.1} s</td></tr>",
            escape(&e.episode_id),
            e.trajectory_id,
            escape(e.task_id.as_deref().unwrap_or("-")),
            e.calls,
            e.segments,
            e.sampled_tokens,
            num(e.reward.map(f64::from)),
            e.idle_s,
            status = e.status,
        );
    }
    out.push_str("</table>");
    if listing.is_empty() {
        out.push_str("<p>No episodes yet.</p>");
    }
    Some(out)
}
