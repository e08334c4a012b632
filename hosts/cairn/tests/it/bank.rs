//! `cairn bank list|show|export` on a bank written through the kernel's `Bank`, and the errors
//! for a directory without one and for an unknown entry.

use cairn_plugin_sdk::bank::{BankEntry, EntryKind, NewEntry, Provenance, StatsUpdate};
use cairn_stores::bank::{bank_path, Bank};

use crate::{cairn, stderr, stdout};

fn write_bank(dir: &std::path::Path) {
    let mut bank = Bank::open(&bank_path(dir)).unwrap();
    let defaults = Provenance {
        step: 12,
        policy_version: 12,
        source_trajectories: vec![],
        writer: "edge".into(),
    };
    bank.put(
        &[
            NewEntry {
                text: "clean the mug in the sink first".into(),
                ..Default::default()
            },
            NewEntry {
                kind: EntryKind::Skill,
                text: "open the fridge, then take the apple".into(),
                trigger: Some("fridge".into()),
                provenance: Provenance {
                    source_trajectories: vec![4, 5],
                    ..Default::default()
                },
                ..Default::default()
            },
        ],
        &defaults,
    )
    .unwrap();
    bank.update(&[StatsUpdate {
        id: 1,
        add_exposures: 3,
        add_successes: 2,
        ..Default::default()
    }])
    .unwrap();
}

#[test]
fn bank_commands_list_show_and_export_a_runs_bank() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path();
    write_bank(run);
    let run_arg = run.to_str().unwrap();

    let out = cairn(&["bank", "list", run_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<String> = stdout(&out).lines().map(String::from).collect();
    assert_eq!(
        lines,
        [
            "    id  kind           status      ver   utility  exposures  text",
            "     1  experience     active        1     0.000          3  \
             clean the mug in the sink first",
            "     2  skill          active        1     0.000          0  \
             open the fridge, then take the apple",
        ]
    );
    let out = cairn(&["bank", "list", run_arg, "--kind", "skill"]);
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));

    let out = cairn(&["bank", "show", run_arg, "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    for line in [
        "trigger             fridge",
        "written by          edge",
        "at                  step 12, policy version 12",
        "from trajectories   4, 5",
    ] {
        assert!(shown.contains(line), "{line:?} not in\n{shown}");
    }

    let file = run.join("bank.jsonl");
    let out = cairn(&["bank", "export", run_arg, "--out", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported: Vec<BankEntry> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let listed = Bank::open_read_only(&bank_path(run))
        .unwrap()
        .list(&Default::default())
        .unwrap();
    assert_eq!(exported, listed);
    let out = cairn(&["bank", "export", run_arg, "--status", "retired"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");

    // --out never overwrites the bank (nor any SQLite file); another file only with --force.
    let bank_file = bank_path(run);
    let before = std::fs::read(&bank_file).unwrap();
    let out = cairn(&[
        "bank",
        "export",
        run_arg,
        "--out",
        bank_file.to_str().unwrap(),
        "--force",
    ]);
    assert!(!out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&bank_file).unwrap(), before);
    let out = cairn(&["bank", "export", run_arg, "--out", file.to_str().unwrap()]);
    assert!(
        !out.status.success() && stderr(&out).contains("--force"),
        "{}",
        stderr(&out)
    );
    let out = cairn(&[
        "bank",
        "export",
        run_arg,
        "--out",
        file.to_str().unwrap(),
        "--force",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A closed stdout (`cairn bank list RUN | head -0`) ends quietly, status 0.
    for args in [
        vec!["bank", "list", run_arg],
        vec!["bank", "show", run_arg, "2"],
        vec!["bank", "export", run_arg],
    ] {
        for stderr_too in [false, true] {
            let (code, err) = crate::pool::with_closed_stdout(&args, stderr_too);
            assert_eq!((code, err.as_str()), (Some(0), ""), "{args:?} {stderr_too}");
        }
    }
}

#[test]
fn bank_commands_name_the_missing_bank_or_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let run_arg = tmp.path().to_str().unwrap();
    let out = cairn(&["bank", "list", run_arg]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains(&format!("no experience bank in {run_arg}"))
            && e.contains(&format!("{run_arg}/bank.sqlite does not exist")),
        "{e}"
    );

    write_bank(tmp.path());
    let out = cairn(&["bank", "show", run_arg, "7"]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("no entry 7 in the experience bank") && e.contains("cairn bank list"),
        "{e}"
    );
    let out = cairn(&["bank", "list", run_arg, "--kind", "lesson"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no entry kind `lesson`"),
        "{}",
        stderr(&out)
    );
}
