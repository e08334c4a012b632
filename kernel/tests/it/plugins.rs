//! Loading real plugin `.so` files through the loader: the two spine plugins (grpo,
//! household), a plugin that panics, a plugin built for another ABI, and a foreign library.
//!
//! The `.so` files come from the workspace build (`cargo build --workspace`, which
//! `scripts/test.sh` runs before the tests).

use std::path::{Path, PathBuf};

use cairn_kernel::plugins::PluginRegistry;
use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::{
    Algorithm, Batch, Environment, ErrorKind, GroupRequest, OfflineHost, Split, TaskRef, TurnRow,
};

/// The build directory holding the workspace's plugin `.so` files.
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    deps.parent().expect("target/<profile>").to_path_buf()
}

/// Copies the named plugins into a fresh directory (so each test controls its directory).
pub fn plugin_dir(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in names {
        let file = format!("lib{name}.so");
        let src = [
            build_dir().join("deps").join(&file),
            build_dir().join(&file),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{file} is not built; run `cargo build --workspace` (scripts/test.sh does)")
        });
        std::fs::copy(&src, dir.path().join(&file)).expect("copy plugin");
    }
    dir
}

fn scan(dir: &Path) -> PluginRegistry {
    PluginRegistry::scan(&[dir.to_path_buf()]).expect("scan")
}

#[test]
fn grpo_and_household_load_and_run_through_the_abi() {
    let dir = plugin_dir(&["cairn_grpo", "cairn_household"]);
    let reg = scan(dir.path());
    assert!(reg.failures().is_empty(), "{:?}", reg.failures());
    let kinds: Vec<(String, PluginKind)> = reg
        .plugins()
        .iter()
        .map(|p| (p.info.name.clone(), p.info.kind))
        .collect();
    assert!(
        kinds.contains(&("grpo".into(), PluginKind::Algorithm)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("household".into(), PluginKind::Environment)),
        "{kinds:?}"
    );

    // The environment: an expert episode through the FFI solves its task.
    let env = reg
        .environment("household")
        .unwrap()
        .create_environment("{}")
        .unwrap();
    let info = env.try_info().unwrap();
    assert!(info.train_tasks > 0 && info.test_tasks > 0 && info.anchor_keys);
    let task = TaskRef {
        split: Split::Train,
        index: 3,
    };
    let mut episode = env.start(task, 0, &Default::default()).unwrap();
    let mut solved = false;
    for _ in 0..info.max_turns {
        let Some(action) = episode.expert_action() else {
            break;
        };
        let outcome = episode.step(&action).unwrap();
        if outcome.done {
            solved = outcome.success;
            break;
        }
    }
    assert!(solved, "the expert solves {task:?} through the FFI");

    // The algorithm: the §1e worked example through the FFI.
    let mut grpo = reg
        .algorithm("grpo")
        .unwrap()
        .create_algorithm("{}")
        .unwrap();
    let rows = [1.0f32, 0.0, 0.5, 0.0]
        .iter()
        .enumerate()
        .map(|(i, &r)| TurnRow {
            group_id: 7,
            trajectory_id: i as u64,
            response_ids: vec![1, 2],
            response_logprobs: vec![-0.5, -0.5],
            response_mask: vec![1, 1],
            episode_reward: r,
            last_turn: true,
            ..Default::default()
        })
        .collect();
    let signals = grpo
        .signals(&Batch { step: 0, rows }, &OfflineHost::default())
        .unwrap();
    let first: Vec<f32> = signals.advantages.iter().map(|a| a[0]).collect();
    let expected = [1.3056f32, -0.7833, 0.2611, -0.7833];
    for (a, e) in first.iter().zip(expected) {
        assert!((a - e).abs() < 1e-4, "{first:?}");
    }
    let plan = grpo
        .plan_group(
            &GroupRequest {
                task_id: "t".into(),
                group_size: 3,
                ..Default::default()
            },
            &OfflineHost::default(),
        )
        .unwrap();
    assert_eq!(plan.len(), 3);
}

#[test]
fn a_panicking_plugin_yields_an_error_not_an_abort() {
    let dir = plugin_dir(&["cairn_faulty"]);
    let reg = scan(dir.path());
    let faulty = reg.algorithm("faulty").unwrap();
    let e = faulty
        .create_algorithm(r#"{"panic_in": "create"}"#)
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Panic);
    assert!(
        e.message.contains("plugin `faulty`") && e.message.contains("injected panic"),
        "{e}"
    );

    let mut algo = faulty
        .create_algorithm(r#"{"panic_in": "signals"}"#)
        .unwrap();
    let batch = Batch {
        step: 0,
        rows: vec![TurnRow::default()],
    };
    let e = algo.signals(&batch, &OfflineHost::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Panic, "{e}");
    // The host is still alive and the plugin still answers other calls.
    let plan = algo.plan_group(
        &GroupRequest {
            task_id: "t".into(),
            group_size: 2,
            ..Default::default()
        },
        &OfflineHost::default(),
    );
    assert_eq!(plan.unwrap().len(), 2);

    let e = faulty
        .create_algorithm(r#"{"error_in": "plan"}"#)
        .unwrap()
        .plan_group(
            &GroupRequest {
                task_id: "t".into(),
                group_size: 2,
                ..Default::default()
            },
            &OfflineHost::default(),
        );
    assert_eq!(e.unwrap_err().kind, ErrorKind::Internal);

    let e = faulty
        .create_algorithm(r#"{"panic_inn": "create"}"#)
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Config);
    assert!(e.message.contains("panic_inn"), "{e}");
}

#[test]
fn mismatched_and_foreign_libraries_are_reported_by_path() {
    let dir = plugin_dir(&["cairn_old_abi", "cairn_grpo"]);
    // A real shared library that is not a plugin.
    let foreign = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.is_file());
    if let Some(lib) = foreign {
        std::fs::copy(lib, dir.path().join("libz.so")).unwrap();
    }
    std::fs::write(dir.path().join("libtruncated.so"), b"\x7fELF garbage").unwrap();
    let reg = scan(dir.path());
    let failures: Vec<String> = reg.failures().iter().map(|f| f.to_string()).collect();
    let old = failures
        .iter()
        .find(|f| f.contains("libcairn_old_abi.so"))
        .expect("old-abi reported");
    assert!(old.contains("ABI 0") && old.contains("rebuild"), "{old}");
    assert!(
        failures.iter().any(|f| f.contains("libtruncated.so")),
        "{failures:?}"
    );
    if foreign.is_some() {
        let z = failures
            .iter()
            .find(|f| f.contains("libz.so"))
            .expect("libz reported");
        assert!(z.contains("not a Cairn plugin"), "{z}");
    }
    // The good plugin next to them still loads.
    assert!(reg.algorithm("grpo").is_ok());
    // Asking for a plugin that is not there names it and lists what failed.
    let e = reg.environment("household").unwrap_err().to_string();
    assert!(e.contains("no environment plugin named `household`"), "{e}");
    assert!(e.contains("libcairn_old_abi.so"), "{e}");
}

#[test]
fn each_file_is_opened_once_even_with_duplicate_dirs() {
    let dir = plugin_dir(&["cairn_grpo", "cairn_household"]);
    let reg = PluginRegistry::scan(&[dir.path().to_path_buf(), dir.path().to_path_buf()]).unwrap();
    assert_eq!(reg.plugins().len(), 2);
}
