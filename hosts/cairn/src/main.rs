//! `cairn`: train LLM agents with RL on multi-turn tasks.
//!
//! The one binary of the project. It reads the command line and the environment, installs the
//! tracing subscriber, picks devices, and exits with a status; everything else is in
//! `cairn-kernel` (actors, objective, plugins), `cairn-torch` (the model) and the plugins.
//!
//! Subcommands: `train`, `eval`, `plugins list`, `signals`, `loss`, `plot`, `bank`, `config`,
//! `import gguf`, and with the `torch` feature `logprobs`, `serve` and `ui`.

#[cfg(feature = "torch")]
mod access;
mod bank_cmd;
#[cfg(feature = "torch")]
mod check;
mod commands;
#[cfg(feature = "torch")]
mod engine;
mod import;
mod jsonl;
#[cfg(feature = "torch")]
mod lifecycle;
mod output;
mod plot;
mod pool_cmd;
mod progress;
#[cfg(feature = "torch")]
mod serve;
#[cfg(feature = "torch")]
mod ui;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The default pipeline: the household environment, a small model trained from scratch, an
/// SFT warm start on expert demonstrations, then GRPO.
pub const DEFAULT_CONFIG: &str = include_str!("../../../examples/household-grpo.toml");

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Train LLM agents with reinforcement learning on multi-turn tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a training pipeline (the embedded default when CONFIG is omitted).
    #[command(allow_negative_numbers = true)]
    Train {
        /// Pipeline config (TOML). Default: the embedded `examples/household-grpo.toml`.
        config: Option<PathBuf>,
        /// Override `run.dir`.
        #[arg(long)]
        run_dir: Option<PathBuf>,
        /// Override `run.steps` (RL steps).
        #[arg(long)]
        steps: Option<u64>,
        /// Start over even if the run directory has a checkpoint.
        #[arg(long)]
        no_resume: bool,
    },
    /// Check a pipeline config without training: every key, the plugins and their configs,
    /// each plugin's needs and the algorithm stack (errors give the file, line and fix).
    #[cfg(feature = "torch")]
    Check {
        /// Pipeline config (TOML).
        config: PathBuf,
    },
    /// Evaluate a checkpoint on held-out tasks.
    #[command(allow_negative_numbers = true)]
    Eval {
        /// A checkpoint directory (`<run>/checkpoints/step-NNNNNN`).
        checkpoint: PathBuf,
        /// Pipeline config; default: the `config.toml` of the checkpoint's run directory.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Held-out tasks to play (default: `eval.tasks`).
        #[arg(long)]
        tasks: Option<usize>,
        /// Sampling temperature (default: `eval.temperature`; 0 is greedy).
        #[arg(long)]
        temperature: Option<f32>,
        /// Write the played turns to this file, in the batch JSON form (docs/batch-json.md),
        /// whole, once the evaluation is done: a new file, or an existing regular file with
        /// --force. Never a directory, device, FIFO, socket or symbolic link, nor the run's
        /// pool or bank, nor any SQLite file.
        #[arg(long)]
        record: Option<PathBuf>,
        /// With --record: replace an existing file.
        #[arg(long, requires = "record")]
        force: bool,
    },
    /// Inspect plugins.
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
    },
    /// Run one algorithm plugin's signals on a batch JSON file, without a model.
    Signals {
        /// Algorithm plugin name.
        #[arg(long)]
        plugin: String,
        /// Plugin config entries `KEY=VALUE` (VALUE is parsed as JSON, else taken as a string).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        /// A batch in the documented JSON form (see docs/batch-json.md).
        #[arg(long)]
        batch: PathBuf,
        /// Plugin directories (default: $CAIRN_PLUGIN_DIR, then the executable's directory).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// Compute the loss, its gradient w.r.t. the current log-probs, and the metrics, from the
    /// log-probs given in a batch file, without a model.
    #[command(allow_negative_numbers = true)]
    Loss {
        /// A loss input file (see docs/algorithms/loss-tool.md).
        #[arg(long)]
        batch: PathBuf,
        /// token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm | per-rollout
        #[arg(long)]
        aggregation: Option<String>,
        /// Split the rows into this many micro-batches (the result must not change).
        #[arg(long, default_value_t = 1)]
        micro_batches: usize,
        /// KL estimator: k1 | k2 | k3.
        #[arg(long)]
        kl: Option<String>,
        /// KL coefficient.
        #[arg(long)]
        kl_coef: Option<f64>,
        /// Further objective settings `KEY=VALUE` (e.g. clip_high=0.28).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Draw `curves.png` for a run directory (replacing the one `cairn train` drew; never a
    /// link, directory or special file put there).
    Plot { run_dir: PathBuf },
    /// Compare algorithms run with several seeds: a Markdown table of held-out success
    /// (mean ± std) on stdout and a PNG of the training curves.
    Compare {
        /// `LABEL=RUN_DIR` pairs; give one per seed, repeating the label.
        #[arg(required = true, value_name = "LABEL=RUN_DIR")]
        runs: Vec<String>,
        /// Where to write the PNG (whole, at the end): a new file, or an existing regular
        /// file with --force.
        #[arg(long, default_value = "comparison.png")]
        out: PathBuf,
        /// Replace an existing --out file.
        #[arg(long)]
        force: bool,
        /// Training metric to draw (a key of `metrics.jsonl`); repeat for several curves per
        /// algorithm, e.g. `--metric edge/success_e --metric edge/success_n`.
        #[arg(long = "metric", value_name = "KEY", default_value = "success_rate")]
        metrics: Vec<String>,
    },
    /// Serve a pipeline's model through the OpenAI-compatible gateway (docs/gateway.md).
    #[cfg(feature = "torch")]
    Serve {
        /// Pipeline config: `[model]`, `[rollout]` (default max_tokens) and `[source]`
        /// (gateway settings; defaults when the source is not the gateway).
        config: PathBuf,
        /// Override `source.bind` (`host:port`; port 0 picks a free port).
        #[arg(long)]
        bind: Option<String>,
        /// Serve a checkpoint's weights (`<run>/checkpoints/step-NNNNNN`).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Serve this Hugging Face model directory (config.json, safetensors, tokenizer files)
        /// instead of the config's `[model]`: what a trainer with `[rollout.engine]` writes.
        #[arg(long, conflicts_with = "checkpoint")]
        model: Option<PathBuf>,
        /// Write every finished episode (rows in the batch JSON form) to this JSONL file, one
        /// line each, as they finish: a new file, or an existing regular file with --append.
        /// Never a directory, device, FIFO, socket or symbolic link, nor the run's pool or
        /// bank, nor any SQLite file.
        #[arg(long)]
        record: Option<PathBuf>,
        /// With --record: add to an existing file instead of refusing it.
        #[arg(long, requires = "record")]
        append: bool,
        /// Also serve the dashboard (docs/dashboard.md) under `/ui/` of the gateway's address:
        /// the runs under `run.dir` and the gateway's live episodes.
        #[arg(long)]
        ui: bool,
        /// A directory `POST /update_weights_from_disk` may load from (besides
        /// `source.weight_roots`): where a trainer's `[rollout.engine]` writes its weights,
        /// `rollout.engine.weights_dir` (default `<run.dir>/engine`). Repeat for several.
        #[arg(long = "weight-root", value_name = "DIR")]
        weight_roots: Vec<PathBuf>,
        /// An environment variable holding the API key every route needs (`Authorization:
        /// Bearer KEY`); instead of `source.api_key_env`, so any config can be served off
        /// loopback (docs/gateway.md, "Security").
        #[arg(long, value_name = "NAME")]
        api_key_env: Option<String>,
        /// An environment variable holding the control key (weight loading, episodes);
        /// instead of `source.control_key_env`.
        #[arg(long, value_name = "NAME")]
        control_key_env: Option<String>,
    },
    /// Serve the dashboard of a run directory, or of a directory of runs: curves updating
    /// live, episodes token by token, the groups of a step, the bank (docs/dashboard.md).
    /// Read-only: safe while a run trains.
    #[cfg(feature = "torch")]
    Ui {
        /// A run directory (`run.dir` of a config) or a directory of run directories.
        run_dir: PathBuf,
        /// Address to listen on. Off loopback a key is required (--key-env or --key-file).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on; 0 picks a free one (the URL is printed).
        #[arg(long, default_value_t = 8470)]
        port: u16,
        /// An environment variable holding the key every page needs (browsers ask for it as
        /// the password; clients send `Authorization: Bearer KEY`).
        #[arg(long, value_name = "NAME", conflicts_with = "key_file")]
        key_env: Option<String>,
        /// A file holding that key (first line), instead of --key-env.
        #[arg(long, value_name = "PATH")]
        key_file: Option<PathBuf>,
        /// A `Host` value to serve besides the bound address and localhost (`name` or
        /// `name:port`); repeat for several.
        #[arg(long = "allow-host", value_name = "HOST")]
        allow_hosts: Vec<String>,
    },
    /// Query, curate and export a run's data pool (`RUN_DIR/pool.sqlite`: every trajectory,
    /// turn by turn; see docs/pool.md).
    Pool {
        #[command(subcommand)]
        command: pool_cmd::PoolCommand,
    },
    /// A run's data pool in the terminal: per-step summaries, or one episode turn by turn
    /// (prompt and response text, trainable tokens, their advantages and log-probs).
    Inspect {
        run_dir: PathBuf,
        /// Show this trajectory id turn by turn (of the training episodes unless --source).
        #[arg(long)]
        episode: Option<u64>,
        /// With --episode: the source to look in (rollout, gateway, eval:LABEL, train, eval).
        #[arg(long, requires = "episode")]
        source: Option<String>,
        /// Show the episode with this pool id (the `id` column of `cairn pool query`).
        #[arg(long, conflicts_with = "episode")]
        id: Option<u64>,
    },
    /// Inspect a run's experience bank (`RUN_DIR/bank.sqlite`, or a checkpoint's copy).
    Bank {
        #[command(subcommand)]
        command: bank_cmd::BankCommand,
    },
    /// Print the embedded default pipeline config.
    Config,
    /// Convert a model from another format into a Hugging Face model directory.
    Import {
        #[command(subcommand)]
        command: import::ImportCommand,
    },
    /// Print the per-token log-probs of responses under a model, as JSON.
    #[cfg(feature = "torch")]
    #[command(allow_negative_numbers = true)]
    Logprobs {
        /// A Hugging Face model directory.
        model_dir: PathBuf,
        /// A JSON list of `{"prompt_ids": [...], "response_ids": [...]}`.
        #[arg(long)]
        input: PathBuf,
        /// Softmax temperature applied to the logits.
        #[arg(long, default_value_t = 1.0)]
        temperature: f32,
        /// cpu | cuda | auto
        #[arg(long, default_value = "cpu")]
        device: String,
    },
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// Name, version, kind, ABI and path of each plugin, and the files that failed to load.
    List {
        /// Plugin directories (default: $CAIRN_PLUGIN_DIR, then the executable's directory).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train {
            config,
            run_dir,
            steps,
            no_resume,
        } => commands::train(config.as_deref(), run_dir, steps, no_resume),
        #[cfg(feature = "torch")]
        Command::Check { config } => check::check(&config),
        Command::Eval {
            checkpoint,
            config,
            tasks,
            temperature,
            record,
            force,
        } => commands::eval(
            &checkpoint,
            config.as_deref(),
            tasks,
            temperature,
            record.as_deref(),
            force,
        ),
        Command::Plugins {
            command: PluginsCommand::List { dirs },
        } => commands::plugins_list(&dirs),
        Command::Signals {
            plugin,
            config,
            batch,
            dirs,
        } => commands::signals(&plugin, &config, &batch, &dirs),
        Command::Loss {
            batch,
            aggregation,
            micro_batches,
            kl,
            kl_coef,
            set,
        } => commands::loss(&batch, aggregation, micro_batches, kl, kl_coef, &set),
        Command::Plot { run_dir } => plot::plot_run(&run_dir).map(|p| println!("{}", p.display())),
        Command::Compare {
            runs,
            out,
            force,
            metrics,
        } => commands::compare(&runs, &metrics, &out, force),
        #[cfg(feature = "torch")]
        Command::Serve {
            config,
            bind,
            checkpoint,
            model,
            record,
            append,
            ui,
            weight_roots,
            api_key_env,
            control_key_env,
        } => serve::serve(
            &config,
            bind,
            checkpoint.as_deref(),
            model,
            record.map(|path| serve::Record { path, append }),
            ui,
            weight_roots,
            access::KeyFlags {
                api_key_env,
                control_key_env,
            },
        ),
        #[cfg(feature = "torch")]
        Command::Ui {
            run_dir,
            host,
            port,
            key_env,
            key_file,
            allow_hosts,
        } => {
            let key = match (key_env, key_file) {
                (Some(name), _) => Some(access::KeySource::Env(name)),
                (None, Some(path)) => Some(access::KeySource::File(path)),
                (None, None) => None,
            };
            ui::serve_dashboard(&run_dir, &host, port, key, &allow_hosts)
        }
        Command::Pool { command } => pool_cmd::run(command),
        Command::Inspect {
            run_dir,
            episode,
            source,
            id,
        } => pool_cmd::inspect(
            &run_dir,
            pool_cmd::EpisodeChoice {
                trajectory: episode,
                pool_id: id,
                source,
            },
        ),
        Command::Bank { command } => bank_cmd::run(command),
        Command::Import { command } => import::run(command),
        Command::Config => {
            print!("{DEFAULT_CONFIG}");
            Ok(())
        }
        #[cfg(feature = "torch")]
        Command::Logprobs {
            model_dir,
            input,
            temperature,
            device,
        } => commands::logprobs(&model_dir, &input, temperature, &device),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
