//! `signals`: per-arm success rates and the optional scaffold → plain distillation term.

use cairn_pats::{Pats, DISTILL_TERM};
use cairn_plugin_sdk::{Algorithm, EntryStatus, TeacherForm, TeacherSource};

use super::{lab_host, play, wins, Lab, Play};

fn metric(metrics: &[(String, f64)], name: &str) -> Option<f64> {
    metrics.iter().find(|(n, _)| n == name).map(|m| m.1)
}

#[test]
fn signals_give_each_arm_and_distil_only_when_asked() {
    let lab = lab_host();
    lab.seed("t1", "scaffold one", EntryStatus::Active);
    lab.seed("t2", "scaffold two", EntryStatus::Active);
    lab.seed("t4", "scaffold four", EntryStatus::Active);
    let groups = [
        // The scaffolded arm did better: its plain rows 2 and 3 are distilled.
        Play {
            group: 1,
            task: "t1",
            success: vec![true, true, false, false],
        },
        // The scaffolded arm did worse: nothing distilled.
        Play {
            group: 2,
            task: "t2",
            success: vec![false, false, true, false],
        },
        // No scaffold: not an A/B group.
        Play {
            group: 3,
            task: "t3",
            success: wins(1, 2),
        },
        // A tie (1/2 against 1/2): nothing distilled.
        Play {
            group: 4,
            task: "t4",
            success: vec![true, false, true, false],
        },
    ];
    let mut off = Pats::from_config_json("").unwrap();
    let batch = play(&mut off, &lab, 0, &groups).batch;
    let before = off.save_state().unwrap();
    let s = off.signals(&batch, &lab).unwrap();
    assert_eq!(off.signals(&batch, &lab).unwrap(), s, "signals is pure");
    assert_eq!(off.save_state().unwrap(), before);
    assert!(s.advantages.is_empty() && s.teacher.is_empty() && s.aux.is_empty());
    assert_eq!(metric(&s.metrics, "pats/scaffolds_active"), Some(3.0));
    // Over the three A/B groups: with (2 + 0 + 1)/6, without (0 + 1 + 1)/6.
    assert_eq!(metric(&s.metrics, "pats/success_with"), Some(0.5));
    let without = metric(&s.metrics, "pats/success_without").unwrap();
    assert!((without - 0.3333).abs() < 5e-5, "{without}");
    assert_eq!(metric(&s.metrics, "pats/rows_distilled"), None);

    let on = Pats::from_config_json(r#"{"coef": 0.5}"#).unwrap();
    let s = on.signals(&batch, &lab).unwrap();
    s.validate_against(&batch).unwrap();
    assert_eq!(s.teacher.len(), 1);
    let term = &s.teacher[0];
    assert_eq!(
        (term.name.as_str(), term.coef, term.form),
        (DISTILL_TERM, 0.5, TeacherForm::SampledReverseKl)
    );
    let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [2, 3]);
    assert_eq!(
        term.targets[0].weights,
        [1.0, 0.0],
        "mask-0 tokens are not distilled"
    );
    assert_eq!(
        term.targets[0].source,
        TeacherSource::Context {
            context_ids: "scaffold one|obs102".bytes().map(u32::from).collect()
        }
    );
    assert_eq!(metric(&s.metrics, "pats/rows_distilled"), Some(2.0));
}

#[test]
fn a_batch_without_scaffolds_reports_none() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json(r#"{"coef": 1.0}"#).unwrap();
    let batch = play(
        &mut pats,
        &lab,
        0,
        &[Play {
            group: 1,
            task: "t",
            success: wins(1, 4),
        }],
    )
    .batch;
    let s = pats.signals(&batch, &lab).unwrap();
    assert_eq!(metric(&s.metrics, "pats/scaffolds_active"), Some(0.0));
    assert_eq!(metric(&s.metrics, "pats/success_with"), None);
    assert_eq!(metric(&s.metrics, "pats/rows_distilled"), Some(0.0));
    assert!(s.teacher[0].targets.is_empty());
}
