//! The gateway's HTTP layer against strangers (issue 32, findings 4, 5, 6, 7 and 10), with
//! bare HTTP/1.1 over loopback so every header is the test's own: API and control keys,
//! refusal off loopback without a key, weight loading only under `weight_roots` (and no file
//! bytes in its errors), Content-Type, Host and Origin checks, CORS only when configured, a
//! deadline on the whole request body, and a cap on one client's connections. The dashboard
//! (`cairn ui`) takes the same key, as a browser's password.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::write_config;

const API_KEY: &str = "api-key-0123456789abcdef";
const CONTROL_KEY: &str = "control-key-0123456789abcdef";

/// A `cairn serve` config on a 1-layer scratch model, `extra` added to `[source]`: the gateway
/// tests' config with one task per step and short, two-turn answers.
fn config(run: &Path, extra: &str) -> String {
    crate::gateway::gateway_config(run, 1, extra)
        .replace("tasks_per_step = 3", "tasks_per_step = 1")
        .replace("temperature = 0.7", "temperature = 1.0")
        .replace("max_new_tokens = 8", "max_new_tokens = 4")
        .replace("max_turns = 4", "max_turns = 2")
}

/// A running `cairn` server: its address (`host:port`) and its stderr lines as they come.
struct Server {
    child: Child,
    addr: String,
    stderr: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `cairn ARGS` with `env` and waits (at most 120 s) for `prefix` + address on
    /// `stream` (stderr for the gateway, stdout for the dashboard).
    fn start(args: &[&str], env: &[(&str, &str)], prefix: &str, on_stdout: bool) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .envs(env.iter().copied())
            .env("CAIRN_LOG", "warn")
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start cairn");
        let (tx, rx) = mpsc::channel();
        let (out_tx, out_rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if out_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let watched = if on_stdout { &out_rx } else { &rx };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match watched.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix(prefix) {
                        let addr = url
                            .trim()
                            .trim_start_matches("http://")
                            .trim_end_matches('/')
                            .to_owned();
                        return Server {
                            child,
                            addr,
                            stderr: rx,
                        };
                    }
                    seen.push(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let rest: Vec<String> = rx.try_iter().collect();
        panic!(
            "cairn did not start its server; output:\n{}\n{}",
            seen.join("\n"),
            rest.join("\n")
        );
    }

    fn gateway(cfg: &Path, env: &[(&str, &str)]) -> Server {
        Server::start(
            &["serve", cfg.to_str().unwrap()],
            env,
            "gateway: listening on ",
            false,
        )
    }

    fn port(&self) -> u16 {
        self.addr.rsplit_once(':').unwrap().1.parse().unwrap()
    }

    /// A request on a new connection with `Connection: close`; `head` is the request line
    /// and headers after the method and path (each ending `\r\n`), `Host` added unless given.
    fn send(&self, method: &str, path: &str, head: &str, body: &str) -> Response {
        let mut s = self.connect();
        let has_host = head
            .lines()
            .any(|l| l.to_ascii_lowercase().starts_with("host:"));
        let host = if has_host {
            String::new()
        } else {
            format!("Host: {}\r\n", self.addr)
        };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\n{host}{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        read_response(&mut BufReader::new(s))
    }

    /// A JSON request with `key` as a bearer token (none: no `Authorization`).
    fn json(&self, method: &str, path: &str, key: Option<&str>, body: &str) -> Response {
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        self.send(
            method,
            path,
            &format!("{auth}Content-Type: application/json\r\n"),
            body,
        )
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        // Bounds every wait of the tests on the server.
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// The stderr lines so far.
    fn log(&self) -> String {
        self.stderr.try_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The OpenAI error `code`.
    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn message(&self) -> String {
        self.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// One HTTP/1.1 response (`Content-Length` bodies; the server sends no chunked ones here).
fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    let mut line = String::new();
    r.read_line(&mut line).expect("a status line");
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':').unwrap();
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Finding 4: with keys configured every route needs one; the API key serves the inference
/// routes, only the control key the control routes (episodes, rewards, weights); both are
/// taken as `Authorization: Bearer`, `x-api-key` or HTTP Basic.
#[test]
fn keys_guard_every_route_and_control_routes_take_only_the_control_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key_file = tmp.path().join("control.key");
    std::fs::write(&key_file, format!("{CONTROL_KEY}\n")).unwrap();
    let extra = format!(
        "api_key_env = \"CAIRN_TEST_API_KEY\"\ncontrol_key_file = \"{}\"",
        key_file.display()
    );
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &config(&tmp.path().join("run"), &extra),
    );
    let server = Server::gateway(&cfg, &[("CAIRN_TEST_API_KEY", API_KEY)]);

    let r = server.json("GET", "/v1/models", None, "");
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "missing_api_key"),
        "{r:?}"
    );
    assert!(r.message().contains("Authorization: Bearer"), "{r:?}");
    let r = server.json("GET", "/health", Some("not-the-key-at-all-0000"), "");
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "invalid_api_key"),
        "{r:?}"
    );
    assert_eq!(
        server.json("GET", "/v1/models", Some(API_KEY), "").status,
        200
    );
    let r = server.send("GET", "/health", &format!("x-api-key: {API_KEY}\r\n"), "");
    assert_eq!(r.status, 200, "{r:?}");
    let r = server.json("POST", "/tokenize", Some(API_KEY), r#"{"prompt": "hi"}"#);
    assert_eq!(r.status, 200, "{r:?}");

    // Control routes: the API key is not enough.
    let r = server.json("POST", "/episodes", Some(API_KEY), "{}");
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "control_key_required"),
        "{r:?}"
    );
    let r = server.json(
        "POST",
        "/update_weights_from_disk",
        Some(API_KEY),
        r#"{"model_path": "/", "weight_version": 1}"#,
    );
    assert_eq!(r.status, 403, "{r:?}");
    let r = server.json("POST", "/episodes", Some(CONTROL_KEY), "{}");
    assert_eq!(r.status, 200, "{r:?}");
    let id = r.json()["episode_id"].as_str().unwrap().to_owned();

    // The episode's calls take the API key (the agent's), its reward only the control key.
    let call = format!("/episodes/{id}/v1/completions");
    let r = server.json(
        "POST",
        &call,
        Some(API_KEY),
        r#"{"model": "cairn", "prompt": "hi", "max_tokens": 2}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let reward = format!("/episodes/{id}/reward");
    let r = server.json("POST", &reward, Some(API_KEY), r#"{"reward": 1.0}"#);
    assert_eq!(r.status, 403, "{r:?}");
    let r = server.json("GET", &format!("/episodes/{id}"), None, "");
    assert_eq!(r.status, 401, "{r:?}");
    // HTTP Basic, as a browser sends it: any user name, the key as password.
    let basic = base64_encode(&format!("anyone:{CONTROL_KEY}"));
    let r = server.send(
        "GET",
        &format!("/episodes/{id}"),
        &format!("Authorization: Basic {basic}\r\n"),
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = server.json("POST", &reward, Some(CONTROL_KEY), r#"{"reward": 1.0}"#);
    assert_eq!(r.status, 200, "{r:?}");
}

/// Finding 4: a non-loopback bind without a key is refused before the socket opens, with
/// the fix; so is an unset key variable. The dashboard likewise.
#[test]
fn serving_off_loopback_without_a_key_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &config(&tmp.path().join("run"), ""),
    );
    let err = refused(&["serve", cfg.to_str().unwrap(), "--bind", "0.0.0.0:0"]);
    assert!(
        err.contains("refusing to serve on 0.0.0.0:0 without an API key")
            && err.contains("api_key_env")
            && err.contains("bind 127.0.0.1"),
        "{err}"
    );
    assert!(!err.contains("gateway: listening"), "{err}");

    // Keys that cannot be used stop the start, naming the setting.
    let keyed = config(
        &tmp.path().join("run"),
        "control_key_env = \"CAIRN_TEST_UNSET_KEY\"",
    );
    let cfg = write_config(tmp.path(), "keyed.toml", &keyed);
    let err = refused(&["serve", cfg.to_str().unwrap()]);
    assert!(
        err.contains("CAIRN_TEST_UNSET_KEY is not set") && err.contains("control_key_env"),
        "{err}"
    );
    let short = tmp.path().join("short.key");
    std::fs::write(&short, "short\n").unwrap();
    let keyed = config(
        &tmp.path().join("run"),
        &format!("api_key_file = \"{}\"", short.display()),
    );
    let cfg = write_config(tmp.path(), "short.toml", &keyed);
    let err = refused(&["serve", cfg.to_str().unwrap()]);
    assert!(
        err.contains("api_key_file") && err.contains("has 5 characters; use at least 16"),
        "{err}"
    );

    let runs = tmp.path().join("runs/a");
    std::fs::create_dir_all(&runs).unwrap();
    std::fs::write(runs.join("metrics.jsonl"), "").unwrap();
    let err = refused(&[
        "ui",
        runs.to_str().unwrap(),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
    ]);
    assert!(
        err.contains("refusing to serve on 0.0.0.0:0 without a key") && err.contains("--key-env"),
        "{err}"
    );
    let err = refused(&[
        "ui",
        runs.to_str().unwrap(),
        "--port",
        "0",
        "--key-env",
        "CAIRN_TEST_UNSET_KEY",
    ]);
    assert!(
        err.contains("CAIRN_TEST_UNSET_KEY is not set") && err.contains("--key-env"),
        "{err}"
    );
}

/// A fresh user's way to serve a checkpoint off loopback: the config trains on an environment
/// plugin (its `[source]` is not the gateway's), and `cairn serve` takes the key variables on
/// its command line instead. The refusal without a key gives those flags; a flag's unset
/// variable is named by the flag. `/health` reports the checkpoint's policy version before any
/// completion (it said 0 until the first), the version every answer carries.
#[test]
fn serve_takes_keys_by_flag_and_reports_the_checkpoint_version_from_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "tiny.toml", &crate::tiny_config(&run, 1));
    let cfg = cfg.to_str().unwrap();
    let out = crate::cairn(&["train", cfg]);
    assert!(out.status.success(), "{}", crate::stderr(&out));
    let checkpoint = run.join("checkpoints/step-000001");
    let checkpoint = checkpoint.to_str().unwrap();
    let serve = ["serve", cfg, "--checkpoint", checkpoint];

    let err = refused(&[&serve[..], &["--bind", "0.0.0.0:0"]].concat());
    assert!(
        err.contains("refusing to serve on 0.0.0.0:0 without an API key")
            && err.contains("--api-key-env CAIRN_API_KEY --control-key-env CAIRN_CONTROL_KEY")
            && err.contains("kind = \"gateway\""),
        "{err}"
    );
    let err = refused(&[&serve[..], &["--api-key-env", "CAIRN_TEST_UNSET_KEY"]].concat());
    assert!(
        err.contains("--api-key-env: the environment variable CAIRN_TEST_UNSET_KEY is not set"),
        "{err}"
    );

    let keys = [
        "--bind",
        "127.0.0.1:0",
        "--api-key-env",
        "CAIRN_TEST_API_KEY",
        "--control-key-env",
        "CAIRN_TEST_CONTROL_KEY",
    ];
    let server = Server::start(
        &[&serve[..], &keys[..]].concat(),
        &[
            ("CAIRN_TEST_API_KEY", API_KEY),
            ("CAIRN_TEST_CONTROL_KEY", CONTROL_KEY),
        ],
        "gateway: listening on ",
        false,
    );
    let r = server.json("GET", "/health", None, "");
    assert_eq!((r.status, r.code().as_str()), (401, "missing_api_key"));
    let health = server.json("GET", "/health", Some(API_KEY), "");
    assert_eq!(health.status, 200, "{health:?}");
    let version = health.json()["policy_version"].as_u64().unwrap();
    assert!(version > 0, "a trained checkpoint: {health:?}");
    let r = server.json(
        "POST",
        "/v1/completions",
        Some(API_KEY),
        r#"{"model": "cairn", "prompt": "hi", "max_tokens": 2}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["policy_version"].as_u64(), Some(version), "{r:?}");
    let r = server.json("POST", "/episodes", Some(API_KEY), "{}");
    assert_eq!(r.status, 403, "{r:?}");
    let r = server.json("POST", "/episodes", Some(CONTROL_KEY), "{}");
    assert_eq!(r.status, 200, "{r:?}");
}

/// Runs `cairn ARGS`, which must fail within 60 s (a server that starts instead is killed);
/// its stderr.
fn refused(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cairn");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = reader.join().expect("stderr reader");
    match status {
        Some(s) if !s.success() => err,
        _ => panic!("cairn {args:?} was not refused ({status:?}):\n{err}"),
    }
}

/// The dashboard with a key: a browser is asked for it (HTTP Basic) and gets the page with it.
#[test]
fn the_dashboard_takes_its_key_as_a_browser_password() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("metrics.jsonl"), "").unwrap();
    let key_file = tmp.path().join("ui.key");
    std::fs::write(&key_file, CONTROL_KEY).unwrap();
    let server = Server::start(
        &[
            "ui",
            run.to_str().unwrap(),
            "--port",
            "0",
            "--key-file",
            key_file.to_str().unwrap(),
            "--allow-host",
            "gpu-box",
        ],
        &[],
        "dashboard: ",
        true,
    );
    let r = server.send("GET", "/", "", "");
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"cairn\""));
    let basic = base64_encode(&format!("me:{CONTROL_KEY}"));
    let r = server.send(
        "GET",
        "/run?run=run",
        &format!("Authorization: Basic {basic}\r\n"),
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = server.send(
        "GET",
        "/",
        &format!(
            "Host: evil.example:{}\r\nAuthorization: Basic {basic}\r\n",
            server.port()
        ),
        "",
    );
    assert_eq!(r.status, 403, "{r:?}");
    let r = server.send(
        "GET",
        "/run?run=run",
        &format!(
            "Host: gpu-box:{}\r\nAuthorization: Basic {basic}\r\n",
            server.port()
        ),
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// Findings 5 and 7: `POST /update_weights_from_disk` reads only directories under
/// `weight_roots` (symlinks and `..` resolved), says so without probing the disk for the
/// client, logs every attempt with the client and the path, and a `model.safetensors` that is
/// a symlink to a non-safetensors file is refused without its bytes in the answer.
#[test]
fn weight_loading_takes_only_directories_under_the_weight_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = tmp.path().join("weights");
    let evil = roots.join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let secret = tmp.path().join("passwd");
    std::fs::write(&secret, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    std::os::unix::fs::symlink(&secret, evil.join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink(&outside, roots.join("link")).unwrap();
    let extra = format!("weight_roots = [\"{}\"]", roots.display());
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &config(&tmp.path().join("run"), &extra),
    );
    let server = Server::gateway(&cfg, &[]);
    let load = |path: &Path| {
        let body = serde_json::json!({"model_path": path, "weight_version": 3}).to_string();
        server.json("POST", "/update_weights_from_disk", None, &body)
    };
    for refused in [
        outside.clone(),
        roots.join("../outside"),
        roots.join("link"),
        tmp.path().join("missing"),
        PathBuf::from("/etc"),
    ] {
        let r = load(&refused);
        assert_eq!(
            (r.status, r.code().as_str()),
            (403, "path_not_allowed"),
            "{r:?}"
        );
        assert!(r.message().contains("weight_roots"), "{r:?}");
    }
    let r = load(&evil);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.message().contains("not a safetensors file"), "{r:?}");
    let leaked = u64::from_le_bytes(*b"root:x:0").to_string();
    assert!(
        !r.body.contains(&leaked) && !r.body.contains("root:x"),
        "{r:?}"
    );
    // Every attempt is in the server's log, with the client and the path.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = String::new();
    while Instant::now() < deadline && !log.contains("weight load failed") {
        log.push_str(&server.log());
        log.push('\n');
        std::thread::sleep(Duration::from_millis(50));
    }
    let evil = std::fs::canonicalize(&evil).unwrap();
    for expected in [
        "weight load refused: not a directory under the weight roots client=\"127.0.0.1".to_owned(),
        format!("path={}", outside.display()),
        "weight load requested client=\"127.0.0.1".to_owned(),
        format!("path={}", evil.display()),
        "weight load failed".to_owned(),
    ] {
        assert!(log.contains(&expected), "{expected:?} not in:\n{log}");
    }
}

/// Finding 6: with no key on loopback, a web page still cannot drive the gateway: a JSON
/// body must be declared `application/json` (no `text/plain` post without a preflight), a
/// foreign `Origin` or `Host` (DNS rebinding) is refused, and CORS headers go only to the
/// configured origins.
#[test]
fn browser_requests_are_refused_even_without_a_key() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = "allowed_origins = [\"http://localhost:3000\"]\nallowed_hosts = [\"gpu-box\"]";
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &config(&tmp.path().join("run"), extra),
    );
    let server = Server::gateway(&cfg, &[]);
    let port = server.port();

    let r = server.send("POST", "/episodes", "Content-Type: text/plain\r\n", "{}");
    assert_eq!(
        (r.status, r.code().as_str()),
        (415, "unsupported_media_type"),
        "{r:?}"
    );
    let r = server.send("POST", "/episodes", "", "{}");
    assert_eq!(r.status, 415, "{r:?}");
    let r = server.send(
        "POST",
        "/episodes",
        "Content-Type: application/json\r\nOrigin: http://evil.example\r\n",
        "{}",
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "origin_not_allowed"),
        "{r:?}"
    );
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = server.send(
        "POST",
        "/episodes",
        "Content-Type: application/json\r\nOrigin: null\r\n",
        "{}",
    );
    assert_eq!(r.status, 403, "{r:?}");
    let r = server.send(
        "GET",
        "/health",
        &format!("Host: evil.example:{port}\r\n"),
        "",
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "host_not_allowed"),
        "{r:?}"
    );
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("gpu-box:{port}"),
    ] {
        let r = server.send("GET", "/health", &format!("Host: {host}\r\n"), "");
        assert_eq!(r.status, 200, "{host}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
    // The server's own pages (same origin) may post.
    let r = server.send(
        "POST",
        "/episodes",
        &format!(
            "Content-Type: application/json; charset=utf-8\r\nOrigin: http://{}\r\n",
            server.addr
        ),
        "{}",
    );
    assert_eq!(r.status, 200, "{r:?}");
    // A configured origin: its preflight is answered, its requests get CORS headers.
    let r = server.send(
        "OPTIONS",
        "/v1/chat/completions",
        "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n",
        "",
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert!(r
        .header("access-control-allow-headers")
        .is_some_and(|h| h.contains("authorization")));
    let r = server.send(
        "POST",
        "/tokenize",
        "Content-Type: application/json\r\nOrigin: http://localhost:3000\r\n",
        r#"{"prompt": "hi"}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
}

/// Finding 10: a body announced but not sent is answered 408 within `body_timeout_s` and its
/// connection closed; a body over the limit is refused from its `Content-Length` at once; one
/// client holds at most `max_connections_per_client` connections (429 past it), and a closed
/// one frees its slot.
#[test]
fn slow_bodies_time_out_and_one_client_holds_a_bounded_number_of_connections() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = "body_timeout_s = 1\nmax_connections_per_client = 3";
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &config(&tmp.path().join("run"), extra),
    );
    let server = Server::gateway(&cfg, &[]);
    let health = format!(
        "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: keep-alive\r\n\r\n",
        server.addr
    );
    let keep_alive = || {
        let mut r = BufReader::new(server.connect());
        r.get_mut().write_all(health.as_bytes()).unwrap();
        let response = read_response(&mut r);
        (r, response)
    };

    // Three kept-alive connections fill the client's slots; a fourth is refused.
    let mut held: Vec<BufReader<TcpStream>> = Vec::new();
    for _ in 0..3 {
        let (conn, r) = keep_alive();
        assert_eq!(r.status, 200, "{r:?}");
        held.push(conn);
    }
    let (_, r) = keep_alive();
    assert_eq!(
        (r.status, r.code().as_str()),
        (429, "too_many_connections"),
        "{r:?}"
    );
    assert!(r.message().contains("max_connections_per_client"), "{r:?}");
    // Closing one frees a slot (once the server has seen the close).
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut conn, r) = loop {
        let (conn, r) = keep_alive();
        if r.status == 200 || Instant::now() > deadline {
            break (conn, r);
        }
    };
    assert_eq!(r.status, 200, "{r:?}");

    // On that connection: a 1 MB body announced, 10 bytes sent, then nothing.
    let started = Instant::now();
    write!(
        conn.get_mut(),
        "POST /tokenize HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000000\r\n\r\n{{\"prompt\":",
        server.addr
    )
    .unwrap();
    let r = read_response(&mut conn);
    let waited = started.elapsed();
    assert_eq!(
        (r.status, r.code().as_str()),
        (408, "body_timeout"),
        "{r:?}"
    );
    assert!(
        waited < Duration::from_secs(15),
        "answered after {waited:?}"
    );
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    let mut rest = Vec::new();
    let closed = conn.read_to_end(&mut rest);
    assert!(
        matches!(closed, Ok(0)),
        "the connection stayed open: {closed:?}"
    );
    drop(held);

    // 500 MB announced: refused from the header, without waiting for the body.
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let mut s = server.connect();
        write!(
            s,
            "POST /tokenize HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: 500000000\r\n\r\n",
            server.addr
        )
        .unwrap();
        let r = read_response(&mut BufReader::new(s));
        if r.status != 429 || Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(r.status, 413, "{r:?}");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
