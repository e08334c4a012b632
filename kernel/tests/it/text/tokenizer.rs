//! The Qwen3 tokenizer against llama.cpp's golden ids, special-token ids, model-directory
//! metadata and file errors.

use cairn_kernel::text::{train_word_level, Tokenizer, WordLevelConfig};
use cairn_kernel::Error;

use super::{fixture, qwen3};

/// llama.cpp's `test-tokenizer-0` format: inputs separated by `\n__ggml_vocab_test__\n` (the
/// file ends with one, so the last input is empty), one line of ids per input.
#[test]
fn qwen3_reproduces_llama_cpp_golden_ids() {
    let inputs = std::fs::read_to_string(fixture("qwen2-golden/ggml-vocab-qwen2.gguf.inp"))
        .expect("golden inputs");
    let outputs = std::fs::read_to_string(fixture("qwen2-golden/ggml-vocab-qwen2.gguf.out"))
        .expect("golden ids");
    let inputs: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<&str> = outputs.split('\n').collect();
    assert_eq!((inputs.len(), outputs.len()), (47, 47));

    let tokenizer = qwen3();
    let mut failures = Vec::new();
    for (input, line) in inputs.iter().zip(&outputs) {
        let expected: Vec<u32> = line
            .split_whitespace()
            .map(|id| id.parse().expect("golden id"))
            .collect();
        let ids = tokenizer.encode(input).expect("encodes");
        if ids != expected {
            failures.push(format!("{input:?}: got {ids:?}, want {expected:?}"));
        }
        assert_eq!(
            tokenizer.decode(&ids).expect("decodes"),
            *input,
            "decode round trip"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// agent-lightning #326: control tokens are single ids, and text -> ids is not the inverse of
/// ids -> text unless special tokens are matched.
#[test]
fn agentlightning_326_special_token_ids() {
    let tokenizer = qwen3();
    let text = "<tool_call>\n{\"name\": \"f\"}\n</tool_call>";
    let ids = tokenizer.encode(text).expect("encodes");
    assert_eq!(ids, [151657, 198, 4913, 606, 788, 330, 69, 16707, 151658]);
    assert_ne!(
        ids,
        [27, 14172, 13429, 397, 4913, 606, 788, 330, 69, 16707, 522, 14172, 13429, 29]
    );
    assert_eq!(tokenizer.token_to_id("<tool_call>"), Some(151657));
    assert_eq!(tokenizer.token_to_id("</tool_call>"), Some(151658));
    assert_eq!(
        tokenizer.id_to_token(151657).as_deref(),
        Some("<tool_call>")
    );

    let decoded = tokenizer.decode(&ids).expect("decodes");
    assert_eq!(decoded, text);
    assert_eq!(tokenizer.encode(&decoded).expect("encodes"), ids);
    // <tool_call> is an added token but not flagged special: skipping specials keeps it.
    assert_eq!(tokenizer.decode_skip_special(&ids).expect("decodes"), text);
    // Every special token decodes to its text and re-encodes to its own single id.
    for id in 151643..=151668 {
        let token = tokenizer.decode(&[id]).expect("decodes");
        assert_eq!(tokenizer.encode(&token).expect("encodes"), [id], "{token}");
        assert_eq!(tokenizer.token_to_id(&token), Some(id));
    }
    assert_eq!(
        tokenizer
            .decode_skip_special(&[151644, 872, 151645])
            .expect("decodes"),
        "user"
    );
    assert_eq!(
        tokenizer
            .encode_with_special_tokens("user")
            .expect("encodes"),
        [872],
        "Qwen adds no BOS"
    );
}

#[test]
fn qwen3_directory_metadata() {
    let tokenizer = qwen3();
    assert_eq!(tokenizer.vocab_size(), 151_669);
    assert_eq!(tokenizer.special_token("eos_token"), Some("<|im_end|>"));
    assert_eq!(tokenizer.eos_token_id(), Some(151645));
    assert_eq!(tokenizer.pad_token_id(), Some(151643));
    assert_eq!(tokenizer.bos_token_id(), None);
    assert_eq!(
        tokenizer.eos_ids(),
        [151645, 151643],
        "tokenizer eos, then generation_config's list"
    );
    assert_eq!(tokenizer.require_id("<think>").ok(), Some(151667));
    assert!(tokenizer.require_id("<nope>").is_err());
    let template = tokenizer
        .chat_template()
        .expect("tokenizer_config.json has a chat template");
    assert!(
        template
            .name()
            .ends_with("qwen3/tokenizer_config.json:chat_template"),
        "{}",
        template.name()
    );
    assert_eq!(
        template.special_tokens().get("eos_token"),
        Some(&serde_json::json!("<|im_end|>"))
    );
}

#[test]
fn missing_and_bad_files_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Tokenizer::from_dir(dir.path())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let want = format!(
        "{} not found: ",
        dir.path().join("tokenizer.json").display()
    );
    assert!(err.starts_with(&want), "{err}");

    std::fs::write(dir.path().join("tokenizer.json"), "{").expect("write");
    let err = Tokenizer::from_dir(dir.path()).err();
    assert!(
        matches!(&err, Some(Error::BadFile { path, .. }) if path.ends_with("tokenizer.json")),
        "{err:?}"
    );

    // A valid tokenizer.json with broken companions.
    let small =
        train_word_level(["go to the kitchen"], &WordLevelConfig::default()).expect("trains");
    small.save(dir.path()).expect("saves");
    let config_path = dir.path().join("tokenizer_config.json");
    let config = std::fs::read_to_string(&config_path).expect("config");
    std::fs::write(
        &config_path,
        config.replace(
            "\"eos_token\": \"<|im_end|>\"",
            "\"eos_token\": \"<|eot|>\"",
        ),
    )
    .expect("write");
    let err = Tokenizer::from_dir(dir.path())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        format!(
            "{}: eos_token `<|eot|>` is not in the vocabulary",
            config_path.display()
        )
    );

    std::fs::write(
        &config_path,
        config.replace("{%- for message", "{%- for message in"),
    )
    .expect("write");
    let err = Tokenizer::from_dir(dir.path()).err();
    assert!(
        matches!(&err, Some(Error::Template { name, line: Some(1), .. }) if name.ends_with(":chat_template")),
        "{err:?}"
    );

    std::fs::write(&config_path, &config).expect("write");
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": "x"}"#,
    )
    .expect("write");
    let err = Tokenizer::from_dir(dir.path())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("generation_config.json: eos_token_id must be an id or a list of ids"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .expect("write");
    let tokenizer = Tokenizer::from_dir(dir.path()).expect("loads");
    assert_eq!(tokenizer.eos_ids(), [2, 0]);
}
