//! `echo` as the per-turn context hook of the kernel's episode loop
//! (`cairn_kernel::rollout::play`), with a scripted policy on a tiny lookup environment: every
//! turn's prompt is echo's reconstruction rendered by the kernel's prompt builder, each row
//! records the shown records in `extra`, the records land in the bank scoped to their
//! trajectory, and the credit walk reads the rows the kernel wrote.

use std::sync::Arc;

use cairn_echo::testing::{memory_records, Toy};
use cairn_echo::Echo;
use cairn_kernel::backend::{Generation, SamplingParams};
use cairn_kernel::rollout::prompt::{PlainPrompt, PromptBuilder, TextCodec};
use cairn_kernel::rollout::{play, EpisodeSpec, PlayParams};
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, Environment, EnvironmentInfo, Episode, FinishReason,
    Observation, PluginError, Result, Split, StepOutcome, TaskInfo, TaskRef, TurnContextRequest,
};
use serde_json::json;

/// The stop id (outside the toy vocabulary) and the "answer now" separator id.
const STOP: u32 = 99_999;
const SEPARATOR: u32 = 99_998;

/// The toy tokenizer, as the kernel's text codec.
#[derive(Clone)]
struct Codec(Toy);

impl TextCodec for Codec {
    fn encode(&self, text: &str) -> cairn_kernel::Result<Vec<u32>> {
        Ok(self.0.ids(text))
    }
    fn decode(&self, ids: &[u32]) -> cairn_kernel::Result<String> {
        Ok(self.0.text(ids))
    }
}

/// One task: "atomic number of iron". `search[x]` shows a fact about `x`; `answer[26]` wins
/// (reward 1), any other answer loses; both end the episode.
struct Lookup;

struct LookupEpisode {
    observation: String,
}

impl Environment for Lookup {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: 1,
            test_tasks: 1,
            max_turns: 8,
            ..EnvironmentInfo::default()
        }
    }
    fn task(&self, _: TaskRef) -> Result<TaskInfo> {
        Ok(TaskInfo {
            id: "iron".into(),
            kind: "lookup".into(),
            goal: "atomic number of iron".into(),
        })
    }
    fn start(&self, _: TaskRef, _: u64, _: &ContextVariant) -> Result<Box<dyn Episode>> {
        Ok(Box::new(LookupEpisode {
            observation: "Question: what is the atomic number of iron?".into(),
        }))
    }
}

impl Episode for LookupEpisode {
    fn observation(&self) -> Observation {
        Observation {
            text: self.observation.clone(),
            ..Observation::default()
        }
    }
    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        let inner = |key: &str| {
            let at = action.find(key)? + key.len();
            let end = action[at..].find(']')?;
            Some(action[at..at + end].to_string())
        };
        if let Some(answer) = inner("answer[") {
            let win = answer == "26";
            return Ok(StepOutcome {
                reward: f32::from(u8::from(win)),
                done: true,
                success: win,
                info_json: "{}".into(),
                ..StepOutcome::default()
            });
        }
        let fact = match inner("search[").as_deref() {
            Some("iron") => "Iron: atomic number 26.",
            Some(other) => return Ok(self.result(format!("Nothing about {other}."))),
            None => "Unknown action.",
        };
        Ok(self.result(fact.to_string()))
    }
    fn expert_action(&self) -> Option<String> {
        None
    }
}

impl LookupEpisode {
    fn result(&mut self, text: String) -> StepOutcome {
        self.observation = text.clone();
        StepOutcome {
            observation: Observation {
                text,
                ..Observation::default()
            },
            info_json: "{}".into(),
            ..StepOutcome::default()
        }
    }
}

/// The scripted responses of trajectory 0 (wins, keeping record 0 alive with selections) and
/// trajectory 1 (cites record 0 too, answers wrong).
const WIN: [&str; 5] = [
    "search[iron]",
    "search[gold]",
    "select[0] search[tin]",
    "select[0] search[lead]",
    "select[0] answer[26]",
];
const LOSE: [&str; 5] = [
    "search[iron]",
    "search[gold]",
    "search[tin]",
    "search[lead]",
    "select[0] answer[27]",
];

#[test]
fn echo_drives_the_kernels_episode_loop_and_credits_what_the_rows_recorded() {
    let toy = Toy::default();
    let builder = PlainPrompt {
        codec: Codec(toy.clone()),
        separator: vec![SEPARATOR],
        stop_ids: vec![STOP],
    };
    // Echo's host: the toy tokenizer and the mock bank, with the kernel's own prompt builder.
    let kernel_builder = PlainPrompt {
        codec: Codec(toy.clone()),
        separator: vec![SEPARATOR],
        stop_ids: vec![STOP],
    };
    let host = toy.host().with_renderer(move |r| {
        kernel_builder
            .render(&r.variant, &r.observation, &r.history)
            .map_err(|e| PluginError::host(e.to_string()))
    });
    let mut echo = Echo::from_config_json(r#"{"header": "Memory:"}"#).unwrap();
    let env: Arc<dyn Environment> = Arc::new(Lookup);
    let specs: Vec<EpisodeSpec> = (0..2)
        .map(|t| EpisodeSpec {
            group_id: 0,
            trajectory_id: t,
            task: TaskRef {
                split: Split::Train,
                index: 0,
            },
            task_id: "iron".into(),
            seed: t,
            variant: ContextVariant::default(),
        })
        .collect();
    let params = PlayParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 16,
            stop_ids: vec![STOP],
            seed: 0,
        },
        max_turns: 8,
        step: 0,
        context_window: Some(512),
        env_timeout: None,
        env_name: "lookup".into(),
    };
    let mut turn = 0;
    let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
        assert_eq!(prompts.len(), 2, "both episodes live at turn {turn}");
        let out = [WIN[turn], LOSE[turn]]
            .iter()
            .map(|text| {
                let mut ids = toy.ids(text);
                ids.push(STOP);
                Generation {
                    logprobs: vec![-0.5; ids.len()],
                    ids,
                    finish_reason: FinishReason::Stop,
                }
            })
            .collect();
        turn += 1;
        Ok((out, 0))
    };
    let mut hook = |r: &TurnContextRequest| {
        echo.next_context(r, &host)
            .map_err(|e| cairn_kernel::Error::Other(e.to_string()))
    };
    let hook: &mut cairn_kernel::rollout::TurnHook<'_> = &mut hook;
    let out = play(&env, &builder, &specs, &params, &mut generate, Some(hook)).unwrap();
    assert!(out.failed.is_empty());
    assert_eq!(out.rows.len(), 10);
    let row = |traj: u64, t: u32| {
        out.rows
            .iter()
            .find(|r| r.trajectory_id == traj && r.turn == t)
            .unwrap()
    };

    // Turn 4 of the winner: its prompt is the kernel builder's rendering of echo's block.
    let inject = "Task: Question: what is the atomic number of iron?\nMemory:\n\
                  [0] search[iron] => Iron: atomic number 26.\n[3] search[lead] =>";
    let mut expected = toy.ids(&format!("{inject}\nNothing about lead."));
    expected.push(SEPARATOR);
    assert_eq!(row(0, 4).prompt_ids, expected);
    assert_eq!(
        serde_json::Value::Object(row(0, 4).extra.clone()),
        json!({"echo_selected": [0], "echo_default": false,
               "echo_record_tokens": toy.ids("[0] search[iron] => Iron: atomic number 26.").len(),
               "prompt_override": true})
    );
    // The loser never selected: default windows of the most recent records.
    assert_eq!(row(1, 4).extra["echo_selected"], json!([0, 1, 2]));
    assert_eq!(row(1, 4).extra["echo_default"], json!(true));
    assert!(row(0, 0).extra.is_empty());

    // Records of turns 0..3 of each trajectory, scoped to it.
    for traj in [0, 1] {
        let records = memory_records(&host, traj);
        assert_eq!(records.len(), 4, "trajectory {traj}");
        assert!(records
            .iter()
            .all(|r| r.provenance.source_trajectories == [traj]));
    }
    assert_eq!(
        memory_records(&host, 0)[2].text,
        "[2] search[tin] => Nothing about tin."
    );

    // Credit: the winner's answer turn cites 0 (and is credited whole); selections at turns
    // 3 and 2 kept it alive (shown at 4 and 3), turn 1 made none. The loser gets nothing.
    let batch = Batch {
        step: 0,
        rows: out.rows.clone(),
    };
    let s = echo.signals(&batch, &host).unwrap();
    let factors = |traj: u64, t: u32| {
        let i = batch
            .rows
            .iter()
            .position(|r| r.trajectory_id == traj && r.turn == t)
            .unwrap();
        s.advantage_scale[i].clone()
    };
    let run = toy.ids("select[0]").len();
    let with_run = |t: u32| {
        let mut v = vec![1.5; run];
        v.resize(row(0, t).response_ids.len(), 1.0);
        v
    };
    assert_eq!(factors(0, 0), vec![1.5; row(0, 0).response_ids.len()]);
    assert_eq!(factors(0, 1), vec![1.0; row(0, 1).response_ids.len()]);
    for t in 2..4 {
        assert_eq!(factors(0, t), with_run(t), "turn {t}");
    }
    // The answer turn: every token.
    assert_eq!(factors(0, 4), vec![1.5; row(0, 4).response_ids.len()]);
    for t in 0..5 {
        assert!(factors(1, t).iter().all(|&x| x == 1.0));
    }

    // The last turns' records come at observe.
    echo.observe(
        &cairn_plugin_sdk::StepReport {
            batch,
            ..Default::default()
        },
        &host,
    )
    .unwrap();
    assert_eq!(
        memory_records(&host, 0)[4].text,
        "[4] answer[26] => (episode ended)"
    );
    assert_eq!(memory_records(&host, 1).len(), 5);
}
