//! The host side of `[rollout.engine]` (docs/engine.md): launch a local engine when asked,
//! connect to the engines, and refuse one that serves another model, tokenizer or context
//! length before anything trains.
//!
//! A launched engine ([`Launched`]) is started on the policy's weights, exported in HF format
//! into `weights_dir`, with its output in `<run>/engine.log`; the run waits for its
//! `GET /health`, and stops it (SIGTERM, then SIGKILL after 10 s) when the run ends, whichever
//! way it ends.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cairn_gateway::engine::{EngineClient, EngineConfig, EngineKind, EngineSettings, LaunchConfig};
use cairn_kernel::backend::PolicyBackend;
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::text::Tokenizer;

/// Ids in the probe prompt.
const PROBE_LEN: usize = 16;
/// How long a launched engine gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A server Cairn started; stopped when dropped.
pub struct Launched {
    child: Child,
    url: String,
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGTERM first: vLLM and `cairn serve` finish their requests and exit.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: `kill` with a pid of our own child and a valid signal has no memory
            // effects.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                eprintln!("engine: the launched server at {} stopped", self.url);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!(
            "engine: the launched server at {} did not stop within {} s of SIGTERM; killed it",
            self.url,
            STOP_GRACE.as_secs()
        );
    }
}

/// The connected engine for the pipeline, and the launched server to keep alive meanwhile.
pub struct Prepared {
    pub client: EngineClient,
    pub settings: EngineSettings,
    pub launched: Option<Launched>,
}

/// Connects the run's engine, launching it first when configured; `None` without
/// `[rollout.engine]`. `context_window` is the trainer's model's.
pub fn prepare(
    config: &PipelineConfig,
    run_root: &Path,
    backend: &dyn PolicyBackend,
    tokenizer: &Tokenizer,
    context_window: usize,
) -> Result<Option<Prepared>> {
    let Some(engine) = EngineConfig::from_pipeline(config)? else {
        return Ok(None);
    };
    let weights_dir = engine
        .weights_dir
        .clone()
        .unwrap_or_else(|| run_root.join("engine"));
    std::fs::create_dir_all(&weights_dir).with_context(|| {
        format!(
            "rollout.engine.weights_dir: creating {}",
            weights_dir.display()
        )
    })?;
    let tokenizer_dir = cairn::setup::tokenizer_dir(config, run_root);
    let mut urls = engine.base_urls.clone();
    let launched = match &engine.launch {
        Some(launch) => {
            let program = launch_program(launch)?;
            let dir = match engine.kind {
                EngineKind::Vllm => weights_dir.clone(),
                _ => weights_dir.join("launch"),
            };
            backend.export(&tokenizer_dir, &dir).with_context(|| {
                format!("writing the engine's first weights to {}", dir.display())
            })?;
            let l = launch_engine(&engine, launch, &program, &dir, run_root)?;
            urls = vec![l.url.clone()];
            Some(l)
        }
        None => None,
    };
    let client = EngineClient::connect(&engine, &urls, tokenizer.vocab_size())?;
    check_context(&client, context_window)?;
    check_tokenizer(&client, tokenizer)?;
    eprintln!(
        "engine: {} `{}` at {}",
        engine.kind.as_str(),
        client.model(),
        client.urls().join(", ")
    );
    let r = &config.rollout;
    Ok(Some(Prepared {
        settings: EngineSettings {
            temperature: r.temperature,
            top_p: r.top_p,
            probe_tolerance: engine.probe_tolerance,
            weights_dir,
            tokenizer_dir,
            probe_prompt: cairn_gateway::engine::probe_prompt(tokenizer.vocab_size(), PROBE_LEN),
            seed: config.run.seed,
        },
        client,
        launched,
    }))
}

/// The program `launch.command` starts, found the way the launch will look for it: a name with a
/// `/` as a path (relative to the working directory), any other on `PATH`.
///
/// # Errors
/// The program is missing, is not a file, or is not executable; the error names
/// `rollout.engine.launch.command` and the program.
pub fn launch_program(launch: &LaunchConfig) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let program = launch
        .command
        .first()
        .map(String::as_str)
        .unwrap_or_default();
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        if executable(&path) {
            return Ok(path);
        }
        bail!(
            "rollout.engine.launch.command: the program `{program}` {}; give the path of the \
             server's executable (vLLM: the python of its venv, with `-m \
             vllm.entrypoints.openai.api_server`)",
            if path.exists() {
                "is not an executable file"
            } else {
                "does not exist"
            }
        );
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .with_context(|| {
            format!(
                "rollout.engine.launch.command: the program `{program}` is not on PATH; give \
                 its full path"
            )
        })
}

/// Every engine's `max_model_len` must be the trainer's context window.
fn check_context(client: &EngineClient, context_window: usize) -> Result<()> {
    for served in client.models()? {
        if let Some(w) = served.context_window {
            if w != context_window {
                bail!(
                    "rollout engine {}: it serves a context of {w} tokens, but the trainer's \
                     model has {context_window}; start the engine with that length (vLLM: \
                     `--max-model-len {context_window}`), or the rows it samples could not be \
                     trained on as they are",
                    served.url
                );
            }
        }
    }
    Ok(())
}

/// The engine's ids for a text made of the trainer's vocabulary must be the trainer's.
fn check_tokenizer(client: &EngineClient, tokenizer: &Tokenizer) -> Result<()> {
    let probe = cairn_gateway::engine::probe_prompt(tokenizer.vocab_size(), PROBE_LEN);
    let text = tokenizer.decode(&probe)?;
    let ours = tokenizer.encode(&text)?;
    for url in client.urls() {
        match client.tokenize(&url, &text)? {
            Some(theirs) if theirs == ours => {}
            Some(theirs) => {
                let at = ours
                    .iter()
                    .zip(&theirs)
                    .position(|(a, b)| a != b)
                    .unwrap_or(ours.len().min(theirs.len()));
                bail!(
                    "rollout engine {url}: its tokenizer differs from the trainer's: for the text \
                     {text:?} it gives {} ids and the trainer {} (first difference at position \
                     {at}: {} vs {}); serve the model directory with the trainer's tokenizer \
                     files",
                    theirs.len(),
                    ours.len(),
                    theirs.get(at).map_or("none".into(), u32::to_string),
                    ours.get(at).map_or("none".into(), u32::to_string)
                );
            }
            None => eprintln!(
                "engine: {url} has no POST /tokenize, so its tokenizer was not compared with \
                 the trainer's (the vocabulary bound and the log-prob probe still are)"
            ),
        }
    }
    Ok(())
}

/// Starts `program` ([`launch_program`]) with the arguments of `launch.command` (placeholders
/// filled in) and waits for its `/health`.
fn launch_engine(
    engine: &EngineConfig,
    launch: &LaunchConfig,
    program: &Path,
    model_dir: &Path,
    run_root: &Path,
) -> Result<Launched> {
    let (url, port) = match engine.base_urls.first() {
        Some(u) => {
            let port = u
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
                .with_context(|| {
                    format!("rollout.engine.base_urls: `{u}` names no port for `{{port}}`")
                })?;
            (u.trim_end_matches('/').to_owned(), port)
        }
        None => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .context("finding a free port for the engine")?
                .port();
            (format!("http://127.0.0.1:{port}"), port)
        }
    };
    let fill = |arg: &str| {
        arg.replace("{model}", &model_dir.display().to_string())
            .replace("{port}", &port.to_string())
            .replace("{host}", "127.0.0.1")
    };
    let args: Vec<String> = launch.command.iter().map(|a| fill(a)).collect();
    let log_path = run_root.join("engine.log");
    // Appended to, never truncated: a resumed run keeps the output of the server it had
    // before (the line below marks where each start begins).
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    writeln!(log, "==> cairn: starting `{}`", args.join(" "))
        .with_context(|| format!("writing {}", log_path.display()))?;
    let err = log.try_clone()?;
    let mut command = Command::new(program);
    command
        .args(&args[1..])
        .envs(&launch.env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err));
    // The server goes with the trainer, even when the trainer is killed with SIGKILL.
    // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = command.spawn().with_context(|| {
        format!(
            "rollout.engine.launch.command: starting `{}`",
            args.join(" ")
        )
    })?;
    let mut launched = Launched {
        child,
        url: url.clone(),
    };
    eprintln!(
        "engine: started `{}` (pid {}, output in {}); waiting for {url}/health",
        args.join(" "),
        launched.child.id(),
        log_path.display()
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs_f64(launch.startup_timeout_s);
    loop {
        if let Some(status) = launched.child.try_wait()? {
            bail!(
                "rollout.engine.launch: `{}` exited ({status}) before it served {url}/health; \
                 the end of {}:\n{}",
                args.join(" "),
                log_path.display(),
                tail(&log_path, 20)
            );
        }
        if agent
            .get(format!("{url}/health"))
            .call()
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(launched);
        }
        if Instant::now() > deadline {
            bail!(
                "rollout.engine.launch: {url}/health did not answer within {} s \
                 (`rollout.engine.launch.startup_timeout_s`); the end of {}:\n{}",
                launch.startup_timeout_s,
                log_path.display(),
                tail(&log_path, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The last `n` lines of a file, for errors.
fn tail(path: &PathBuf, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
