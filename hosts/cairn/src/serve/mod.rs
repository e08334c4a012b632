//! The gateway's HTTP side: `cairn serve`, and the server `cairn train` starts when the
//! pipeline's `[source]` is the gateway.
//!
//! [`start`] builds the kernel's gateway pieces around a running policy actor (the batching
//! [`Sampler`], the [`EpisodeStore`], the [`EpisodeSource`] the trainer collects from) and
//! serves [`routes`] with actix-web on the same actix system. It prints
//! `gateway: listening on http://ADDR` on stderr once the socket is bound (harness scripts and
//! tests read the port from it when `bind` asks for port 0).
//!
//! [`Started::shutdown`] stops it in an order that leaves no request hanging and no generation
//! running: the sampler first (queued and new requests get a 503 `shutting_down`, batches in
//! flight are answered), then the HTTP server (it stops accepting and finishes the responses it
//! is writing), then the episode source.
//!
//! Every request passes [`access::guard`] first: API keys, Host and Origin, the body's
//! deadline, the connections of one client. A server off loopback without a key is refused at
//! start.

mod routes;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::{Context, Result};
use cairn_gateway::{
    EpisodeSource, EpisodeStore, Gateway, GatewayConfig, GatewayLink, RequestSettings, Sampler,
    StopCollecting, StopSampling, WeightLoader,
};
use cairn_kernel::actors::policy::{GenerateStream, LoadWeights, PolicyActor};
use cairn_kernel::actors::threads::SyncThreads;
use cairn_kernel::backend::PolicyBackend;
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::text::{ChatFormat, Tokenizer};
use futures::future::{self, Either};
use parking_lot::Mutex;

use cairn::setup;

use crate::access;
use crate::lifecycle::{exit_now, on_actor_system, Signals};
use crate::ui::Dashboard;

/// A running gateway.
pub struct Started {
    pub gateway: Gateway,
    /// What the trainer needs (collect episodes, pause around updates).
    pub link: GatewayLink,
    server: actix_web::dev::ServerHandle,
    sampler: Addr<Sampler>,
    source: Addr<EpisodeSource>,
}

impl Started {
    /// Stops the gateway (see the module docs). When it returns, no `Generate` of the
    /// gateway's is running or will be sent, the server's workers have stopped and its socket
    /// is closed.
    pub async fn shutdown(self) {
        // Errors only mean the actor has already stopped, which is the goal.
        let _ = self.sampler.send(StopSampling).await;
        self.server.stop(true).await;
        let _ = self.source.send(StopCollecting).await;
        tracing::debug!("gateway stopped");
    }
}

/// Starts the gateway on `bind`. `training`: episode calls are sampled at the rollout
/// temperature and top-p, which the trainer scores at (trl #4159). Call inside an actix system.
pub fn start(
    config: &PipelineConfig,
    gateway_config: &GatewayConfig,
    tokenizer: &Tokenizer,
    policy: Recipient<GenerateStream>,
    training: bool,
    bind: &str,
) -> Result<Started> {
    start_serving(
        config,
        gateway_config,
        tokenizer,
        policy,
        training,
        bind,
        Serving::default(),
    )
}

/// What `cairn serve` adds to a gateway that [`start`] (`cairn train`) does not.
#[derive(Default)]
struct Serving<'a> {
    /// The dashboard of the runs under this directory beside the gateway, under `/ui/`.
    dashboard_root: Option<&'a Path>,
    /// `POST /update_weights_from_disk`: the policy's loader and the directories it may load.
    weights: Option<(Recipient<LoadWeights>, Vec<PathBuf>)>,
    /// `--api-key-env` / `--control-key-env`.
    keys: access::KeyFlags,
    /// The version of the weights the policy holds at start (a checkpoint's step).
    policy_version: u64,
}

/// [`start`], with what `cairn serve` adds ([`Serving`]).
fn start_serving(
    config: &PipelineConfig,
    gateway_config: &GatewayConfig,
    tokenizer: &Tokenizer,
    policy: Recipient<GenerateStream>,
    training: bool,
    bind: &str,
    serving: Serving<'_>,
) -> Result<Started> {
    let Serving {
        dashboard_root,
        weights,
        keys,
        policy_version,
    } = serving;
    let format = ChatFormat::from_tokenizer(tokenizer.clone())
        .context("the gateway renders prompts with the model's chat template")?;
    let r = &config.rollout;
    let settings = RequestSettings {
        model_name: gateway_config.model_name.clone(),
        context_window: setup::context_window(config)?,
        default_max_tokens: r.max_new_tokens,
        max_n: gateway_config.max_n,
        training_sampling: training.then_some((r.temperature, r.top_p)),
    };
    let store = Arc::new(Mutex::new(EpisodeStore::new(
        gateway_config.episode_settings(),
    )));
    let sampler = Sampler::new(
        policy,
        Duration::from_millis(gateway_config.batch_window_ms),
        gateway_config.max_batch_prompts,
        cairn_kernel::rollout::mix(config.run.seed, 0x6A7E),
    );
    let sampling = sampler.stats();
    let sampler = sampler.start();
    let source = EpisodeSource {
        store: store.clone(),
        group_size: r.group_size,
        step_timeout: gateway_config.step_timeout(),
    }
    .start();
    // The HTTP side holds only this recipient: once the sampler stops, a request that still
    // comes gets the 503 from `Gateway::start`.
    let gateway = Gateway::new(
        format,
        settings,
        store,
        sampler.clone().recipient(),
        sampling,
    )
    .with_policy_version(policy_version);
    // Refused before the socket opens when off loopback without a key.
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(bind)
        .with_context(|| format!("gateway: resolving {bind}"))?
        .collect();
    let access = access::Access::gateway(gateway_config, &keys, &addrs)?;
    let listener =
        TcpListener::bind(&addrs[..]).with_context(|| format!("gateway: binding {bind}"))?;
    let addr = listener.local_addr()?;
    let access = Arc::new(access.serving_at(addr));
    let data = actix_web::web::Data::new(gateway.clone());
    let loader = weights.map(|(load, roots)| {
        actix_web::web::Data::new(WeightLoader {
            pause: sampler.clone().recipient(),
            resume: sampler.clone().recipient(),
            load,
            roots,
        })
    });
    let on_connect = access.on_connect();
    let dashboard = dashboard_root
        .map(|root| actix_web::web::Data::new(Dashboard::beside(root, gateway.clone())));
    let dashboard_base = dashboard.as_ref().map(|d| d.base().to_owned());
    let server = actix_web::HttpServer::new(move || {
        let dashboard = dashboard.clone();
        let access = access.clone();
        let mut app = actix_web::App::new().app_data(data.clone());
        if let Some(loader) = &loader {
            app = app.app_data(loader.clone());
        }
        app.configure(move |cfg| {
            if let Some(d) = dashboard {
                crate::ui::configure(cfg, d);
            }
            routes::configure(cfg);
        })
        .wrap(actix_web::middleware::from_fn(
            move |req, next: actix_web::middleware::Next<actix_web::body::BoxBody>| {
                access::guard(access.clone(), req, next)
            },
        ))
    })
    .on_connect(on_connect)
    .workers(2)
    // Under load the two cores go to the model: give slow clients time to send a request.
    .client_request_timeout(Duration::from_secs(60))
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)
    .with_context(|| format!("gateway: serving on {addr}"))?
    .run();
    let handle = server.handle();
    actix::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "gateway server stopped");
        }
    });
    eprintln!("gateway: listening on http://{addr}");
    if let Some(base) = dashboard_base {
        eprintln!("dashboard: http://{addr}{base}/");
    }
    Ok(Started {
        gateway,
        link: GatewayLink {
            collect: source.clone().recipient(),
            pause: sampler.clone().recipient(),
            resume: sampler.clone().recipient(),
        },
        server: handle,
        sampler,
        source,
    })
}

/// `cairn serve CONFIG`: the config's model (optionally a checkpoint's weights, or another HF
/// model directory: `model`) behind the gateway, until SIGINT (Ctrl-C) or SIGTERM. `ui`: the dashboard of the runs under `run.dir`
/// beside it, under `/ui/`. Finished episodes are appended to `record` as
/// JSON lines. A signal stops the gateway in its shutdown order ([`Started::shutdown`]: the
/// requests in flight are answered, streams included, later ones get a 503 or a refused
/// connection), writes the episodes that finished meanwhile, and exits 0; a second signal
/// exits at once (status 130). `weight_roots` (`--weight-root`) add to `source.weight_roots`;
/// `keys` (`--api-key-env`, `--control-key-env`) take the place of `[source]`'s key settings.
// One parameter per `cairn serve` flag (main.rs's `Command::Serve`).
#[allow(clippy::too_many_arguments)]
pub fn serve(
    config_path: &Path,
    bind: Option<String>,
    checkpoint: Option<&Path>,
    model: Option<PathBuf>,
    record: Option<Record>,
    ui: bool,
    weight_roots: Vec<PathBuf>,
    keys: access::KeyFlags,
) -> Result<()> {
    let mut config = cairn_gateway::load_config(config_path)?;
    let model_given = model.is_some();
    if let Some(dir) = model {
        if !dir.join("config.json").is_file() {
            anyhow::bail!(
                "--model {}: no config.json there; give a Hugging Face model directory",
                dir.display()
            );
        }
        config.model.path = Some(dir);
        config.model.scratch = None;
    }
    let record = record.map(|r| r.open(&config.run.dir)).transpose()?;
    let policy_dir = checkpoint.map(setup::checkpoint_policy).transpose()?;
    let mut gateway_config =
        cairn_gateway::GatewayConfig::from_pipeline(&config)?.unwrap_or_default();
    gateway_config.weight_roots.extend(weight_roots);
    let roots = resolve_weight_roots(
        &gateway_config,
        config.model.path.as_deref().filter(|_| model_given),
    )?;
    let tokenizer = match checkpoint {
        Some(_) => setup::run_tokenizer(&config, &config.run.dir)?,
        None => {
            std::fs::create_dir_all(&config.run.dir)
                .with_context(|| format!("creating {}", config.run.dir.display()))?;
            let env = cairn_gateway::HarnessEnvironment::new(&gateway_config);
            setup::tokenizer(&config, &config.run.dir, &env, false)?
        }
    };
    let mut backend = setup::backend(&config, tokenizer.vocab_size())?;
    if let Some(dir) = &policy_dir {
        backend.load(dir)?;
    }
    let policy_version = backend.policy_version();
    let bind = bind.unwrap_or_else(|| gateway_config.bind.clone());
    on_actor_system(async move {
        let threads = SyncThreads::default();
        let backend = Mutex::new(Some(backend));
        let policy = threads.start(move || {
            PolicyActor::new(Box::new(
                backend
                    .lock()
                    .take()
                    .expect("the policy actor is built once"),
            ))
        });
        let served = async {
            let started = start_serving(
                &config,
                &gateway_config,
                &tokenizer,
                policy.clone().recipient(),
                false,
                &bind,
                Serving {
                    dashboard_root: ui.then_some(config.run.dir.as_path()),
                    weights: Some((policy.recipient(), roots)),
                    keys,
                    policy_version,
                },
            )?;
            // Until SIGINT or SIGTERM; an error recording episodes stops the server cleanly.
            let recording = Box::pin(record_episodes(&started, record.as_ref()));
            let mut signals = Signals::new();
            let first = match future::select(recording, Box::pin(signals.next())).await {
                Either::Left((recorded, _)) => Err(recorded),
                Either::Right((signal, _)) => Ok(signal),
            };
            let recorded = match first {
                Err(recorded) => recorded,
                Ok(signal) => {
                    eprintln!(
                        "gateway: {signal}: answering the requests in flight, then stopping \
                         (a second signal stops at once)"
                    );
                    actix::spawn(async move {
                        let again = signals.next().await;
                        eprintln!(
                            "gateway: {again} again: stopping at once (the requests in flight \
                             are not answered)"
                        );
                        exit_now(130);
                    });
                    Ok(())
                }
            };
            let gateway = started.gateway.clone();
            started.shutdown().await;
            // The episodes that finished while the server stopped.
            recorded.and_then(|()| append_finished(&gateway, record.as_ref()))
        }
        .await;
        (threads, served)
    })
}

/// `cairn serve --record PATH [--append]`.
pub struct Record {
    pub path: PathBuf,
    /// Add to an existing file (else an existing file is refused).
    pub append: bool,
}

impl Record {
    /// Opens the file once, before serving, through [`Output::open_append`]: a new file, or an
    /// existing regular one with `--append`; never a link, special file or a store of the run
    /// in `run_dir`.
    ///
    /// [`Output::open_append`]: crate::output::Output::open_append
    fn open(self, run_dir: &Path) -> Result<RecordFile> {
        let file = crate::output::Output {
            flag: "--record",
            path: &self.path,
            stores: &crate::output::run_stores(run_dir),
            existing: if self.append {
                crate::output::Existing::Append
            } else {
                crate::output::Existing::Refuse
            },
        }
        .open_append()?;
        Ok(RecordFile {
            path: self.path,
            file,
        })
    }
}

/// The `--record` file, open for the whole run.
struct RecordFile {
    path: PathBuf,
    file: std::fs::File,
}

/// The directories `POST /update_weights_from_disk` may load from, symlinks resolved:
/// `source.weight_roots` and `--weight-root`, or without them the directory holding `model` (`cairn serve --model
/// DIR`: a trainer's `[rollout.engine]` writes each new version beside the first), else none.
fn resolve_weight_roots(config: &GatewayConfig, model: Option<&Path>) -> Result<Vec<PathBuf>> {
    if config.weight_roots.is_empty() {
        let beside = model.and_then(|m| {
            std::fs::canonicalize(m)
                .ok()?
                .parent()
                .map(Path::to_path_buf)
        });
        return Ok(beside.into_iter().collect());
    }
    config
        .weight_roots
        .iter()
        .map(|root| {
            std::fs::canonicalize(root)
                .ok()
                .filter(|r| r.is_dir())
                .with_context(|| {
                    format!(
                        "source.weight_roots / --weight-root: {} is not a directory; list \
                         the directories `POST /update_weights_from_disk` may load from",
                        root.display()
                    )
                })
        })
        .collect()
}

/// Every 200 ms, appends the finished episodes to `record` as JSON lines (forever, or until
/// a write fails).
async fn record_episodes(started: &Started, record: Option<&RecordFile>) -> Result<()> {
    loop {
        actix::clock::sleep(Duration::from_millis(200)).await;
        append_finished(&started.gateway, record)?;
    }
}

/// Appends the episodes finished since the last call to `record` as JSON lines (nothing
/// without `--record`).
fn append_finished(gateway: &Gateway, record: Option<&RecordFile>) -> Result<()> {
    let Some(record) = record else { return Ok(()) };
    let finished = gateway.store().lock().drain_ready();
    if finished.is_empty() {
        return Ok(());
    }
    let mut lines = String::new();
    for e in finished {
        let line = serde_json::json!({"episode_id": e.id, "task_id": e.group_key,
            "reward": e.reward, "success": e.success, "rows": e.rows});
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    use std::io::Write;
    (&record.file)
        .write_all(lines.as_bytes())
        .with_context(|| format!("appending episodes to {}", record.path.display()))
}
