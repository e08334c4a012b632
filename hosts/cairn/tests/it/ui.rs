//! The dashboard (`cairn ui`, `cairn serve --ui`) in a real headless Chromium: a finished tiny
//! run's curves, an episode's tokens, advantages and mask, the groups of a step, and a live
//! update, each checked by `tests/ui/check.mjs` against values read here from `metrics.jsonl`
//! and the data pool through the kernel (not through the page). Also: the run directory is
//! left byte for byte as it was, and a bad RUN_DIR is refused naming it.
//!
//! Needs Node.js and Debian's chromium with playwright-core installed by `scripts/setup.sh`; a
//! missing one fails the test (it is never skipped).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cairn_kernel::text::Tokenizer;
use cairn_stores::pool::{Filter, PoolReader};
use serde_json::{json, Map, Value};

use crate::{cairn, jsonl, stderr, tiny_config, write_config};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `node` and the system Chromium, or a failure saying to run the setup.
fn require_browser() {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is missing: install Node.js 20+ (Debian: apt-get install nodejs npm), then run \
         scripts/setup.sh"
    );
    assert!(
        Path::new("/usr/bin/chromium").is_file(),
        "/usr/bin/chromium is missing: run scripts/setup.sh (it installs Debian's chromium)"
    );
    assert!(
        repo()
            .join("hosts/cairn/tests/ui/node_modules/playwright-core")
            .is_dir(),
        "playwright-core is not installed in hosts/cairn/tests/ui: run scripts/setup.sh"
    );
}

/// A running `cairn` whose URL was read from the first line of its output that starts with
/// `prefix`.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(args: &[&str], prefix: &str, from_stderr: bool) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .env("CAIRN_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cairn");
        let out: Box<dyn Read + Send> = if from_stderr {
            Box::new(child.stderr.take().expect("piped"))
        } else {
            Box::new(child.stdout.take().expect("piped"))
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => match line.strip_prefix(prefix) {
                    Some(url) => {
                        let url = url.trim().to_owned();
                        // Keep draining so the child never blocks on a full pipe.
                        std::thread::spawn(move || rx.iter().for_each(drop));
                        return Server { child, url };
                    }
                    None => seen.push(line),
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = child.wait();
        panic!(
            "cairn printed no `{prefix}` line: {}\n{err}",
            seen.join("\n")
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file under `dir` with its bytes, by relative path.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for (rel, bytes) in snapshot(from) {
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, bytes).unwrap();
    }
}

/// `[[step, value], ...]` of `key` over the lines of a JSONL file, where it is a number.
fn points(lines: &[Value], key: &str) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| Some(json!([l["step"].as_f64()?, l[key].as_f64()?])))
        .collect()
}

/// What the page must show, read from the run directory without the dashboard.
fn expected(tmp: &Path, run: &Path, live: &Path) -> Value {
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let evals = jsonl(&run.join("eval.jsonl"));
    let mut curves = Map::new();
    for key in ["success_rate", "reward/episode_mean", "loss", "sft_loss"] {
        let p = points(&metrics, key);
        assert!(!p.is_empty(), "metrics.jsonl has no {key}");
        curves.insert(key.into(), Value::Array(p));
    }
    curves.insert(
        "eval:success_rate".into(),
        Value::Array(points(&evals, "success_rate")),
    );

    let pool = PoolReader::open_run(run).expect("the run's data pool");
    let tokenizer = Tokenizer::from_dir(&run.join("tokenizer")).expect("the run's tokenizer");
    let train = Filter {
        source: Some("train".into()),
        ..Filter::default()
    };
    // The episode with the most trained tokens of non-zero advantage, so the colours are
    // checked on real values.
    let episodes = pool.episodes(&train).unwrap();
    let nonzero = |id: u64| -> usize {
        pool.turns(id)
            .unwrap()
            .iter()
            .map(|t| {
                t.advantages.as_ref().map_or(0, |a| {
                    a.iter()
                        .zip(&t.row.response_mask)
                        .filter(|(&a, &m)| a != 0.0 && m != 0)
                        .count()
                })
            })
            .sum()
    };
    let chosen = episodes
        .iter()
        .max_by_key(|e| (nonzero(e.id), e.turns, std::cmp::Reverse(e.id)))
        .expect("the pool has training episodes");
    assert!(
        nonzero(chosen.id) > 0,
        "no episode with a non-zero advantage"
    );
    let turns: Vec<Value> = pool
        .turns(chosen.id)
        .unwrap()
        .iter()
        .map(|t| {
            let r = &t.row;
            json!({
                "turn": r.turn,
                "ids": r.response_ids,
                "texts": r.response_ids.iter().map(|&id| tokenizer.decode(&[id]).unwrap())
                    .collect::<Vec<_>>(),
                "logprobs": r.response_logprobs.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
                "advantages": t.advantages.as_ref().map(|a| a.iter().map(|&x| f64::from(x))
                    .collect::<Vec<_>>()),
                "mask": r.response_mask,
            })
        })
        .collect();

    let step0 = pool
        .episodes(&Filter {
            step_min: Some(0),
            step_max: Some(0),
            ..train.clone()
        })
        .unwrap();
    let mut groups: BTreeMap<u64, Vec<Option<f32>>> = BTreeMap::new();
    for e in &step0 {
        groups.entry(e.group_id).or_default().push(e.episode_reward);
    }
    assert!(groups.len() >= 2, "{groups:?}");

    // The live copy gains a step with a success rate no step had.
    let last_step = metrics.last().unwrap()["step"].as_u64().unwrap();
    let line = json!({"step": last_step + 1, "phase": "rl", "success_rate": 0.3125});
    json!({
        "runs": ["live", "run"],
        "run": "run",
        "curves": curves,
        "episode": {"path": format!("/episode?run=run&id={}", chosen.id), "turns": turns},
        "step": {
            "path": "/step?run=run&step=0",
            "groups": groups.iter().map(|(g, r)| json!({"group_id": g, "rewards": r}))
                .collect::<Vec<_>>(),
        },
        "live": {
            "run": "live",
            "metrics": live.join("metrics.jsonl"),
            "line": format!("{line}\n"),
            "key": "success_rate",
            "step": last_step + 1,
            "value": 0.3125,
        },
        "tmp": tmp,
    })
}

#[test]
fn the_dashboard_shows_a_runs_curves_episodes_and_steps_in_chromium() {
    require_browser();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The tiny policy never succeeds in two steps; DAPO's overlong penalty on the response
    // length gives the trajectories of a group different rewards, so advantages are non-zero.
    let config = tiny_config(&run, 2).replace(
        "plugin = \"grpo\"\n",
        "plugin = \"grpo\"\nconfig = { overlong = { max_response_length = 48, buffer_length = 40 } }\n",
    );
    assert!(config.contains("overlong"));
    let cfg = write_config(tmp.path(), "tiny.toml", &config);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let live = tmp.path().join("live");
    copy_dir(&run, &live);
    let before = snapshot(&run);

    let expected = expected(tmp.path(), &run, &live);
    let expected_path = tmp.path().join("expected.json");
    std::fs::write(&expected_path, expected.to_string()).unwrap();

    let server = Server::start(
        &["ui", tmp.path().to_str().unwrap(), "--port", "0"],
        "dashboard: ",
        false,
    );
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
    let check = Command::new("node")
        .arg(repo().join("hosts/cairn/tests/ui/check.mjs"))
        .arg(&server.url)
        .arg(&expected_path)
        .output()
        .expect("run node");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "{report}");
    for what in [
        "curve success_rate",
        "the episode shows",
        "the step shows",
        "live curve",
    ] {
        assert!(report.contains(what), "{report}");
    }
    drop(server);
    // Read-only: every file of the finished run is byte for byte as it was. The only new
    // files are SQLite's side files of a read-only WAL reader (`-shm`, the reader's own
    // index, and an empty `-wal`), made by the first reader of a pool whose writer closed.
    let mut after = snapshot(&run);
    after.retain(|path, bytes| {
        let name = path.to_string_lossy();
        let side = !before.contains_key(path)
            && (name.ends_with(".sqlite-shm")
                || (name.ends_with(".sqlite-wal") && bytes.is_empty()));
        !side
    });
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    assert!(before == after, "the dashboard changed a file of the run");
}

/// A bare HTTP/1.0 request; returns the status line's code and the body.
fn http(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let addr = addr.split('/').next().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (code, body)
}

#[test]
fn serve_ui_shows_the_gateways_live_episodes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let tokenizer = repo().join("kernel/fixtures/text/qwen3");
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &format!(
            r#"[run]
dir = "{run}"
seed = 5
steps = 1

[source]
kind = "gateway"
bind = "127.0.0.1:0"

[algorithm]
plugin = "grpo"

[model]
device = "cpu"
threads = 1

[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
tokenizer = "{tokenizer}"

[rollout]
tasks_per_step = 1
group_size = 2
temperature = 0.7
max_new_tokens = 8
max_turns = 4

[optimizer]
lr = 1e-3
"#,
            run = run.display(),
            tokenizer = tokenizer.display()
        ),
    );
    let server = Server::start(
        &["serve", cfg.to_str().unwrap(), "--ui"],
        "dashboard: ",
        true,
    );
    assert!(server.url.ends_with("/ui/"), "{}", server.url);
    let (code, _) = http(
        &server.url,
        "POST",
        "/episodes",
        r#"{"episode_id": "ep-<b>1</b>", "task_id": "t1"}"#,
    );
    // The id is refused (not plain), so its markup can never reach the page; a plain one is
    // listed.
    assert_eq!(code, 400);
    let (code, _) = http(
        &server.url,
        "POST",
        "/episodes",
        r#"{"episode_id": "harness-7", "task_id": "task <b>x</b>"}"#,
    );
    assert_eq!(code, 200);
    let (code, page) = http(&server.url, "GET", "/ui/gateway", "");
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("<td>harness-7</td>"), "{page}");
    assert!(page.contains("task &lt;b&gt;x&lt;/b&gt;"), "{page}");
    assert!(page.contains("<td>episodes_opened</td>") || page.contains("<th>episodes_opened</th>"));
    let (code, fragment) = http(&server.url, "GET", "/ui/fragment/gateway", "");
    assert_eq!(code, 200);
    assert!(fragment.contains("<tr class=\"open\">"), "{fragment}");
    // The gateway's own routes still answer beside the dashboard.
    let (code, health) = http(&server.url, "GET", "/health", "");
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&health).unwrap()["episodes_open"],
        1
    );
}

#[test]
fn ui_refuses_a_bad_run_dir_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-run");
    let out = cairn(&["ui", missing.to_str().unwrap(), "--port", "0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}: no such directory", missing.display())),
        "{err}"
    );
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = cairn(&["ui", empty.to_str().unwrap(), "--port", "0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}: no run directory here", empty.display())),
        "{err}"
    );
}
