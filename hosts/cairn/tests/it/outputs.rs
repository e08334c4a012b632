//! No command destroys a file it was not asked to replace: every output path (`eval --record`,
//! `pool export -o`, `bank export --out`, `serve --record`, `plot`, `compare --out`,
//! `import gguf OUT_DIR`) refuses a device, a FIFO (without blocking on it), a socket, a
//! directory, a symbolic link and the run's own stores, and an existing file without
//! `--force` (`--append` for `serve --record`). The run directories here are built without
//! training (a pool and a bank through the kernel, a checkpoint's `policy/` directory), except
//! one tiny run for the evaluation that `--record --force` writes.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cairn_stores::bank::{bank_path, Bank};
use cairn_stores::pool::{pool_path, Pool};

use crate::{cairn, stderr, tiny_config, write_config};

/// How long a refused command may take; a write that blocks on a FIFO would exceed it.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `cairn` with `args` and no stdin, failing the test if it has not exited within
/// [`REFUSAL_TIMEOUT`] (it is killed then).
fn cairn_bounded(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cairn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(REFUSAL_TIMEOUT) {
        Ok(out) => out.expect("wait for cairn"),
        Err(_) => {
            // SAFETY: kill(2) on the pid of the child this test spawned and has not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("cairn {args:?} did not exit within {REFUSAL_TIMEOUT:?} (blocked on a FIFO?)");
        }
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn is_fifo(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_fifo()
}

fn dev_null_is_intact() {
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert!(meta.file_type().is_char_device(), "/dev/null was replaced");
}

/// Asserts `out` failed with every one of `says` in its stderr.
fn refused(out: &Output, says: &[&str], what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    for s in says {
        assert!(err.contains(s), "{what}: {s:?} not in {err}");
    }
}

/// A run directory with an empty pool, a one-entry bank and a fake checkpoint (its
/// `policy/` directory), plus the targets every command must refuse: a FIFO, a directory, a
/// link to the pool, and a text file.
struct Fixture {
    _tmp: tempfile::TempDir,
    run: PathBuf,
    checkpoint: PathBuf,
    fifo: PathBuf,
    dir: PathBuf,
    link_to_pool: PathBuf,
    notes: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("config.toml"), tiny_config(&run, 0)).unwrap();
        drop(Pool::open(&pool_path(&run)).unwrap());
        let mut bank = Bank::open(&bank_path(&run)).unwrap();
        bank.put(
            &[cairn_plugin_sdk::bank::NewEntry {
                text: "look in the fridge first".into(),
                ..Default::default()
            }],
            &Default::default(),
        )
        .unwrap();
        drop(bank);
        let checkpoint = run.join("checkpoints/step-000000");
        std::fs::create_dir_all(checkpoint.join("policy")).unwrap();
        let fifo = tmp.path().join("fifo");
        mkfifo(&fifo);
        let dir = tmp.path().join("a-directory");
        std::fs::create_dir(&dir).unwrap();
        let link_to_pool = tmp.path().join("link.jsonl");
        std::os::unix::fs::symlink(pool_path(&run), &link_to_pool).unwrap();
        let notes = tmp.path().join("notes.txt");
        std::fs::write(&notes, "mine\n").unwrap();
        Fixture {
            _tmp: tmp,
            run,
            checkpoint,
            fifo,
            dir,
            link_to_pool,
            notes,
        }
    }

    /// The files that must come out of every refusal as they went in.
    fn snapshot(&self) -> Vec<Vec<u8>> {
        [
            pool_path(&self.run),
            bank_path(&self.run),
            self.notes.clone(),
        ]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
    }

    fn assert_untouched(&self, before: &[Vec<u8>]) {
        assert_eq!(
            self.snapshot(),
            before,
            "the pool, bank and notes as they were"
        );
        assert!(is_fifo(&self.fifo));
        assert!(self.dir.is_dir());
        assert!(std::fs::symlink_metadata(&self.link_to_pool)
            .unwrap()
            .is_symlink());
        dev_null_is_intact();
    }

    /// (target, --force?, what stderr says) for the refusals every file output makes.
    fn refusals(&self) -> Vec<(PathBuf, bool, &'static str)> {
        vec![
            (PathBuf::from("/dev/null"), true, "a character device"),
            (self.fifo.clone(), true, "a FIFO"),
            (self.dir.clone(), true, "a directory"),
            (self.link_to_pool.clone(), true, "a store of the run"),
            (pool_path(&self.run), true, "a store of the run"),
            (bank_path(&self.run), true, "a store of the run"),
            (self.notes.clone(), false, "--force"),
        ]
    }
}

/// Finding 1: `eval --record` onto an existing file without --force, or onto the run's pool
/// through a link, replaced it (exit 0). Now both, and every special file, are refused before
/// any evaluation.
#[test]
fn eval_record_refuses_existing_files_special_files_and_the_runs_stores() {
    let f = Fixture::new();
    let before = f.snapshot();
    let checkpoint = f.checkpoint.to_str().unwrap();
    for (target, force, says) in f.refusals() {
        let mut args = vec!["eval", checkpoint, "--record", target.to_str().unwrap()];
        if force {
            args.push("--force");
        }
        let out = cairn_bounded(&args);
        refused(&out, &["--record", target.to_str().unwrap(), says], says);
    }
    f.assert_untouched(&before);
}

/// `eval --record` writes a new file, and replaces an existing one with --force; the record
/// is written at the end, so a refused path costs no evaluation and a failed one leaves it.
#[test]
fn eval_record_writes_a_new_file_and_replaces_one_with_force() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "tiny.toml", &tiny_config(&run, 0));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let checkpoint = run.join("checkpoints").join(latest.trim());
    let checkpoint = checkpoint.to_str().unwrap();
    let record = tmp.path().join("record.json");
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            checkpoint,
            "--tasks",
            "1",
            "--record",
            record.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        cairn_bounded(&args)
    };
    let out = eval(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let batch: cairn_plugin_sdk::Batch =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert!(!batch.rows.is_empty());
    std::fs::write(&record, "mine\n").unwrap();
    refused(&eval(&[]), &["--force"], "an existing record");
    assert_eq!(std::fs::read_to_string(&record).unwrap(), "mine\n");
    let out = eval(&["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: cairn_plugin_sdk::Batch =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(again.rows.len(), batch.rows.len());
}

/// Finding 2: `pool export -o` and `bank export --out` replaced a device node with a regular
/// file (as root, `-o /dev/null` destroyed `/dev/null`), and hung on a FIFO. Now every
/// special file, link and store is refused even with --force, without blocking.
#[test]
fn pool_and_bank_exports_refuse_devices_fifos_links_and_stores() {
    let f = Fixture::new();
    let before = f.snapshot();
    let run = f.run.to_str().unwrap();
    let checkpoint_bank = bank_path(&f.checkpoint);
    std::fs::copy(bank_path(&f.run), &checkpoint_bank).unwrap();
    for (target, force, says) in f.refusals() {
        let t = target.to_str().unwrap();
        for (mut args, flag) in [
            (
                vec!["pool", "export", run, "--format", "jsonl", "-o", t],
                "-o",
            ),
            (vec!["bank", "export", run, "--out", t], "--out"),
        ] {
            if force {
                args.push("--force");
            }
            let out = cairn_bounded(&args);
            refused(&out, &[flag, t, says], &format!("{args:?}"));
        }
    }
    // A checkpoint's bank: its own copy is a store too.
    let c = f.checkpoint.to_str().unwrap();
    let copy = std::fs::read(&checkpoint_bank).unwrap();
    let out = cairn_bounded(&[
        "bank",
        "export",
        c,
        "--out",
        checkpoint_bank.to_str().unwrap(),
        "--force",
    ]);
    refused(&out, &["a store of the run"], "the checkpoint's bank");
    assert_eq!(std::fs::read(&checkpoint_bank).unwrap(), copy);
    f.assert_untouched(&before);

    // An existing empty file is a file: --force replaces it; a new path needs nothing.
    let empty = f.dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let e = empty.to_str().unwrap();
    let out = cairn_bounded(&["bank", "export", run, "--out", e]);
    refused(
        &out,
        &["the file exists (0 bytes); pass --force"],
        "an empty file",
    );
    let out = cairn_bounded(&["bank", "export", run, "--out", e, "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&empty).unwrap().lines().count(), 1);
    let new = f.dir.join("new.json");
    let out = cairn_bounded(&[
        "pool",
        "export",
        run,
        "--format",
        "batch",
        "-o",
        new.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let batch: cairn_plugin_sdk::Batch =
        serde_json::from_str(&std::fs::read_to_string(&new).unwrap()).unwrap();
    assert!(batch.rows.is_empty());
}

/// Finding 3: `pool exclude` on a 0-byte `pool.sqlite` turned it into a pool while `query`
/// refused it; now both refuse it alike and the file stays empty.
#[test]
fn pool_exclude_refuses_an_empty_pool_file_as_query_does() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = pool_path(tmp.path());
    std::fs::write(&pool, "").unwrap();
    let r = tmp.path().to_str().unwrap();
    for args in [
        vec!["pool", "query", r],
        vec!["pool", "exclude", r, "--task", "t", "--reason", "bad"],
        vec!["pool", "include", r, "--task", "t"],
    ] {
        let out = cairn_bounded(&args);
        refused(
            &out,
            &[pool.to_str().unwrap(), "an empty file, not a data pool"],
            &format!("{args:?}"),
        );
    }
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), 0, "left empty");
}

/// `serve --record` is opened once, before serving: a new file, or an existing one with
/// --append; never a special file, link or store (the config's run directory's), with or
/// without --append.
#[test]
fn serve_record_refuses_special_files_stores_and_existing_files_without_append() {
    let f = Fixture::new();
    let before = f.snapshot();
    let cfg = f.run.join("config.toml");
    let cfg = cfg.to_str().unwrap();
    for (target, append, says) in f.refusals() {
        let t = target.to_str().unwrap();
        let mut args = vec!["serve", cfg, "--bind", "127.0.0.1:0", "--record", t];
        if append {
            args.push("--append");
        }
        let says = if says == "--force" {
            "the file exists (5 bytes); pass --append"
        } else {
            says
        };
        let out = cairn_bounded(&args);
        refused(&out, &["--record", t, says], &format!("{args:?}"));
    }
    f.assert_untouched(&before);
}

/// Three finished runs' worth of files for `plot` and `compare` (no training).
fn fake_run(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let metrics: String = (0..4)
        .map(|s| format!("{{\"phase\":\"rl\",\"step\":{s},\"success_rate\":0.{s}}}\n"))
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    std::fs::write(
        dir.join("eval.jsonl"),
        "{\"label\":\"after_warm_start\",\"step\":0,\"success_rate\":0.25}\n\
         {\"label\":\"after_rl\",\"step\":4,\"success_rate\":0.5}\n",
    )
    .unwrap();
}

/// `cairn plot` replaces the run's own `curves.png` (its purpose), but never through a link
/// nor into a FIFO or directory there; `cairn compare --out` is refused on an existing file
/// without --force and on every special file even with it.
#[test]
fn plot_and_compare_write_pngs_only_where_allowed() {
    let f = Fixture::new();
    let before = f.snapshot();
    fake_run(&f.run);
    let run = f.run.to_str().unwrap();
    let curves = f.run.join("curves.png");

    // curves.png: drawn new, then redrawn over itself.
    for _ in 0..2 {
        let out = cairn_bounded(&["plot", run]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(std::fs::metadata(&curves).unwrap().len() > 1000);
    }
    // A FIFO, a link (to the notes) and a directory put there are refused and left.
    std::fs::remove_file(&curves).unwrap();
    mkfifo(&curves);
    refused(
        &cairn_bounded(&["plot", run]),
        &["a FIFO"],
        "plot onto a FIFO",
    );
    assert!(is_fifo(&curves));
    std::fs::remove_file(&curves).unwrap();
    std::os::unix::fs::symlink(&f.notes, &curves).unwrap();
    refused(
        &cairn_bounded(&["plot", run]),
        &["a symbolic link"],
        "plot onto a link",
    );
    std::fs::remove_file(&curves).unwrap();
    std::fs::create_dir(&curves).unwrap();
    refused(
        &cairn_bounded(&["plot", run]),
        &["a directory"],
        "plot onto a directory",
    );

    let pair = format!("grpo={run}");
    for (target, force, says) in f.refusals() {
        let t = target.to_str().unwrap();
        let mut args = vec!["compare", &pair, "--out", t];
        if force {
            args.push("--force");
        }
        refused(
            &cairn_bounded(&args),
            &["--out", t, says],
            &format!("{args:?}"),
        );
    }
    f.assert_untouched(&before);
    let png = f.dir.join("comparison.png");
    let p = png.to_str().unwrap();
    let out = cairn_bounded(&["compare", &pair, "--out", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let drawn = std::fs::read(&png).unwrap();
    assert!(drawn.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(&png, "mine").unwrap();
    refused(
        &cairn_bounded(&["compare", &pair, "--out", p]),
        &["--force"],
        "compare onto an existing file",
    );
    assert_eq!(std::fs::read(&png).unwrap(), b"mine");
    let out = cairn_bounded(&["compare", &pair, "--out", p, "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
}

/// `import gguf OUT_DIR` takes only a new or empty directory: a FIFO, a file, a non-empty
/// directory and a link (even to an empty directory) are refused before the GGUF is read, and
/// left as they were.
#[test]
fn import_refuses_anything_but_a_new_or_empty_directory() {
    let f = Fixture::new();
    let before = f.snapshot();
    let empty = f.dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let link = f.dir.join("link-to-empty");
    std::os::unix::fs::symlink(&empty, &link).unwrap();
    let missing_gguf = f.dir.join("missing.gguf");
    for (out_dir, says) in [
        (&f.fifo, "not a directory"),
        (&f.notes, "not a directory"),
        (&f.run, "not empty"),
        (&link, "a symbolic link"),
    ] {
        let o = out_dir.to_str().unwrap();
        let out = cairn_bounded(&["import", "gguf", missing_gguf.to_str().unwrap(), o]);
        refused(&out, &[o, says], o);
        assert!(!Path::new(&format!("{o}.partial")).exists());
    }
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());
    f.assert_untouched(&before);
}
