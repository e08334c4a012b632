//! The dashboard: `cairn ui RUN_DIR`, and `cairn serve --ui` beside the gateway (under `/ui/`).
//!
//! Server-rendered HTML (actix-web) over what a run directory holds, plus one small static
//! script (`assets/dashboard.js`, compiled into the binary) that polls a JSON endpoint every
//! 2 s and redraws the metric curves as inline SVG, and refreshes the gateway's episode table.
//! No Node build step and nothing fetched from elsewhere.
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the runs under RUN_DIR (one run: its page) |
//! | `GET /run?run=NAME` | curves of `metrics.jsonl` and `eval.jsonl`, the evaluations, the steps |
//! | `GET /step?run=NAME&step=N` | the groups of an RL step: rewards, plugin decisions |
//! | `GET /episode?run=NAME&id=ID` | an episode turn by turn, tokens coloured by advantage |
//! | `GET /bank?run=NAME` | the experience bank: entries, provenance, utility |
//! | `GET /gateway` | the gateway's live episodes and counters (`cairn serve --ui` only) |
//! | `GET /api/curves?run=NAME&keys=a,b` | the curves as JSON (what the script polls) |
//! | `GET /fragment/gateway` | the gateway tables alone (what the script polls) |
//!
//! **Read-only.** A run directory is only read: JSONL files are read whole on each request
//! (a half-written last line is left out), the data pool and the bank are opened with SQLite's
//! read-only flag (no lock file, no journal written), the tokenizer is loaded once per run. So
//! a finished run can be opened while another process trains into it, and the dashboard never
//! changes what it shows.
//!
//! Callers: `main.rs` ([`serve_dashboard`]) and `serve/` ([`Dashboard`] and [`configure`] on
//! the gateway's server).

mod assets;
mod html;
mod pages;
mod pool_pages;
mod respond;
mod runs;
mod tokens;

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use actix_web::web;
use anyhow::{Context, Result};
use cairn_gateway::Gateway;

use crate::access;

/// The dashboard's state: where the runs are, its path prefix, the gateway it sits beside.
pub struct Dashboard {
    root: PathBuf,
    /// `""` on its own, `"/ui"` beside the gateway.
    base: String,
    gateway: Option<Gateway>,
    tokenizers: tokens::TokenizerCache,
}

impl Dashboard {
    /// The dashboard of the runs under `root`, served at the server's root.
    pub fn standalone(root: &Path) -> Dashboard {
        Dashboard {
            root: root.to_path_buf(),
            base: String::new(),
            gateway: None,
            tokenizers: tokens::TokenizerCache::default(),
        }
    }

    /// The dashboard of the runs under `root` beside `gateway`, under `/ui`.
    pub fn beside(root: &Path, gateway: Gateway) -> Dashboard {
        Dashboard {
            root: root.to_path_buf(),
            base: "/ui".into(),
            gateway: Some(gateway),
            tokenizers: tokens::TokenizerCache::default(),
        }
    }

    /// The path prefix of every route (`""` or `"/ui"`).
    pub fn base(&self) -> &str {
        &self.base
    }
}

/// Registers the dashboard's routes under its base on an app (the state travels with them).
pub fn configure(cfg: &mut web::ServiceConfig, dashboard: web::Data<Dashboard>) {
    let scope = if dashboard.base.is_empty() {
        web::scope("")
    } else {
        web::scope(&dashboard.base.clone())
    };
    cfg.service(
        scope
            .app_data(dashboard)
            .route("/", web::get().to(pages::index))
            .route("/run", web::get().to(pages::run))
            .route("/step", web::get().to(pool_pages::step))
            .route("/episode", web::get().to(pool_pages::episode))
            .route("/bank", web::get().to(pages::bank))
            .route("/gateway", web::get().to(pages::gateway))
            .route("/fragment/gateway", web::get().to(pages::gateway_fragment))
            .route("/api/curves", web::get().to(pages::curves))
            .route("/static/{file}", web::get().to(assets::serve)),
    );
}

/// `cairn ui RUN_DIR`: serves the dashboard on `host:port` (port 0 picks a free one) until
/// Ctrl-C, printing `dashboard: http://ADDR/` on stdout once the socket is bound. Requests pass
/// the gateway's [`access::guard`]: `key` (if any) guards every page, `allowed_hosts` are the
/// `Host` values served besides the bound address and the loopback names.
///
/// Errors: RUN_DIR is not a directory, or holds no run directory (the message names it); the
/// address cannot be bound; it is not loopback and no key is given; the key cannot be read.
pub fn serve_dashboard(
    run_dir: &Path,
    host: &str,
    port: u16,
    key: Option<access::KeySource>,
    allowed_hosts: &[String],
) -> Result<()> {
    let runs = runs::discover(run_dir)?;
    if runs.is_empty() {
        anyhow::bail!(
            "{}: no run directory here (a run directory has a metrics.jsonl or a config.toml); \
             give a run directory or a directory of run directories",
            run_dir.display()
        );
    }
    // Refused before the socket opens when off loopback without a key.
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .with_context(|| format!("dashboard: resolving {host} (--host)"))?
        .collect();
    let access = access::Access::dashboard(key, allowed_hosts, &addrs)?;
    let listener = TcpListener::bind(&addrs[..])
        .with_context(|| format!("dashboard: binding {host}:{port} (--host, --port)"))?;
    let addr = listener.local_addr()?;
    let access = std::sync::Arc::new(access.serving_at(addr));
    let on_connect = access.on_connect();
    let dashboard = web::Data::new(Dashboard::standalone(run_dir));
    actix_web::rt::System::new().block_on(async move {
        let server = actix_web::HttpServer::new(move || {
            let access = access.clone();
            actix_web::App::new()
                .configure(|cfg| configure(cfg, dashboard.clone()))
                .wrap(actix_web::middleware::from_fn(
                    move |req, next: actix_web::middleware::Next<actix_web::body::BoxBody>| {
                        access::guard(access.clone(), req, next)
                    },
                ))
        })
        .on_connect(on_connect)
        .workers(2)
        .listen(listener)
        .with_context(|| format!("dashboard: serving on {addr}"))?
        .run();
        let host = match addr {
            std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
            std::net::SocketAddr::V4(a) => a.ip().to_string(),
        };
        println!("dashboard: http://{host}:{}/", addr.port());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        server.await.context("dashboard server")
    })
}
