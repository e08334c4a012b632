//! Word-level tokenizers trained on household text: round trips, determinism, reload, and a
//! multi-call episode merged by ids with the trained tokenizer.

use cairn_gateway::{SampledChoice, Segment};
use cairn_kernel::text::{train_word_level, ChatFormat, Tokenizer, WordLevelConfig};
use cairn_plugin_sdk::FinishReason;

use super::msg;

const CORPUS: &[&str] = &[
    "you are in the kitchen. you see a fridge 1, a countertop 2, and a sink 1.",
    "your task is to: put a clean apple in the fridge.",
    "> go to countertop 2",
    "you arrive at countertop 2. on the countertop 2, you see an apple 3 and a mug 12.",
    "> take apple 3 from countertop 2",
    "you pick up the apple 3 from the countertop 2.",
    "nothing happens.\n\n> open fridge 1",
    "the fridge 1 is open. in it, you see nothing; done!",
];

fn train(corpus: &[&str]) -> Tokenizer {
    train_word_level(corpus.iter().copied(), &WordLevelConfig::default()).expect("trains")
}

#[test]
fn round_trips_household_text() {
    let tokenizer = train(CORPUS);
    for text in CORPUS
        .iter()
        .copied()
        .chain(["Apple", "you see a mug 907.", "take apple\n\n  3"])
    {
        let ids = tokenizer.encode(text).expect("encodes");
        let decoded = tokenizer.decode(&ids).expect("decodes");
        assert_eq!(
            tokenizer.encode(&decoded).expect("encodes"),
            ids,
            "{text:?}"
        );
        if text != "Apple" {
            assert_eq!(decoded, text);
        }
    }
    // Words keep their leading space; unseen words are [UNK]; digits are single tokens.
    let ids = tokenizer.encode("take Apple 12").expect("encodes");
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.id_to_token(id).expect("token"))
        .collect();
    assert_eq!(tokens, ["take", "[UNK]", " 1", "2"]);
    // A word seen only mid-sentence encodes at the start of a line too.
    assert!(
        tokenizer.token_to_id("fridge").is_some() && tokenizer.token_to_id(" fridge").is_some()
    );

    let specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<pad>",
        "[UNK]",
    ];
    for (id, token) in specials.iter().enumerate() {
        assert_eq!(tokenizer.token_to_id(token), Some(id as u32));
    }
    assert_eq!(tokenizer.eos_ids(), [2]);
    assert_eq!(tokenizer.pad_token_id(), Some(3));
    assert_eq!(
        tokenizer.decode_skip_special(&[1, 7, 2]).expect("decodes"),
        tokenizer.id_to_token(7).expect("token")
    );
}

#[test]
fn training_is_deterministic_and_reloads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    train(CORPUS).save(&a).expect("saves");
    let mut shuffled = CORPUS.to_vec();
    shuffled.reverse();
    train(&shuffled).save(&b).expect("saves");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let (x, y) = (
            std::fs::read(a.join(file)).expect("read"),
            std::fs::read(b.join(file)).expect("read"),
        );
        assert!(x == y, "{file} differs between runs");
    }

    let trained = train(CORPUS);
    let reloaded = Tokenizer::from_dir(&a).expect("reloads");
    assert_eq!(reloaded.vocab_size(), trained.vocab_size());
    assert_eq!(reloaded.eos_ids(), trained.eos_ids());
    for text in CORPUS {
        assert_eq!(
            reloaded.encode(text).expect("encodes"),
            trained.encode(text).expect("encodes")
        );
    }
    let template = reloaded.chat_template().expect("chat template saved");
    let rendered = template
        .render(
            &[msg("user", "go to sink 1")],
            &cairn_kernel::text::RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .expect("renders");
    assert_eq!(
        rendered,
        "<|im_start|>user\ngo to sink 1<|im_end|>\n<|im_start|>assistant\n"
    );

    let small = train_word_level(
        CORPUS.iter().copied(),
        &WordLevelConfig {
            max_vocab_size: 40,
            ..Default::default()
        },
    )
    .expect("trains");
    assert_eq!(small.vocab_size(), 40);
    let bad = WordLevelConfig {
        unk_token: "<unk>".into(),
        ..Default::default()
    };
    assert!(train_word_level(CORPUS.iter().copied(), &bad).is_err());
}

/// A multi-call episode with the trained tokenizer: each request rendered from the template,
/// sampled ids verbatim, merged into one segment because the template is append-only here.
#[test]
fn trained_tokenizer_merges_a_multi_call_episode() {
    let tokenizer = train(CORPUS);
    let format = ChatFormat::from_tokenizer(tokenizer.clone()).expect("format");
    let mut messages = vec![
        msg(
            "system",
            "your task is to: put a clean apple in the fridge.",
        ),
        msg("user", CORPUS[0]),
    ];
    let mut prompt = format.prompt_ids(&messages, None).expect("renders");
    let mut segment: Option<Segment> = None;
    for (call, (action, observation)) in [
        ("go to countertop 2", CORPUS[3]),
        ("take apple 3 from countertop 2", CORPUS[5]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut ids = tokenizer.encode(action).expect("encodes");
        ids.push(format.end_of_turn());
        let choice = SampledChoice {
            logprobs: vec![-1.0; ids.len()],
            ids,
            finish_reason: FinishReason::Stop,
            tool_calls: 0,
        };
        match segment.as_mut() {
            None => {
                segment = Some(Segment::start(
                    &prompt,
                    &choice,
                    (0, 0),
                    0,
                    None,
                    String::new(),
                ))
            }
            Some(s) => s.extend(&prompt, &choice, (call as u32, 0)),
        }
        messages.push(msg("assistant", action));
        messages.push(msg("user", observation));
        prompt = format.prompt_ids(&messages, None).expect("renders");
        let s = segment.as_ref().expect("segment");
        assert_eq!(s.prefix_of(&prompt), Ok(()), "call {call} merges");
    }
    let segment = segment.expect("segment");
    let trainable = segment.sampled_tokens();
    assert_eq!(
        trainable,
        tokenizer
            .encode("go to countertop 2")
            .expect("encodes")
            .len()
            + 1
            + tokenizer
                .encode(CORPUS[4].trim_start_matches("> "))
                .expect("encodes")
                .len()
            + 1
    );
}
