//! Plugin files: random bytes, truncated copies of a real plugin and copies with a damaged ELF
//! identification, in a plugin directory, through the loader (`PluginRegistry::scan`, what
//! every command that loads plugins runs). The scan must finish, load nothing from the file
//! and report one failure naming it.
//!
//! A truncated library used to crash the process: the dynamic loader maps segments past the
//! end of the file and the first touch is a SIGBUS. The loader now checks the segments
//! against the file's length before `dlopen`; a crash here kills the whole test binary.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cairn_kernel::plugins::PluginRegistry;
use proptest::prelude::*;

use super::{bounded, run, CASE_LIMIT};
use crate::plugins::plugin_dir;

/// A real plugin's bytes, and where its last segment ends (cuts before it must be refused;
/// after it only section data such as symbols is lost, and the library still loads).
fn real_plugin() -> &'static (Vec<u8>, usize) {
    static PLUGIN: OnceLock<(Vec<u8>, usize)> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let dir = plugin_dir(&["cairn_grpo"]);
        let bytes = std::fs::read(dir.path().join("libcairn_grpo.so")).expect("read plugin");
        let end = segments_end(&bytes);
        (bytes, end)
    })
}

/// The end of the last segment of an ELF64 little-endian file.
fn segments_end(bytes: &[u8]) -> usize {
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let phoff = u64_at(32);
    let phnum = u16::from_le_bytes([bytes[56], bytes[57]]) as usize;
    (0..phnum)
        .map(|i| u64_at(phoff + i * 56 + 8) + u64_at(phoff + i * 56 + 32))
        .max()
        .expect("program headers")
}

/// What is written as `libfuzz.so`.
#[derive(Clone, Debug)]
enum File {
    Random(Vec<u8>),
    /// ELF magic, then random bytes.
    ElfPrefixed(Vec<u8>),
    /// The first `n` bytes of the real plugin, `n` before the end of its last segment.
    Truncated(prop::sample::Index),
    /// The real plugin with one byte of its identification (`e_ident`) changed, cut short.
    BadIdent {
        at: usize,
        value: u8,
        cut: prop::sample::Index,
    },
}

impl File {
    fn bytes(&self) -> Vec<u8> {
        let (plugin, end) = real_plugin();
        match self {
            File::Random(b) => b.clone(),
            File::ElfPrefixed(b) => [&b"\x7fELF"[..], b].concat(),
            File::Truncated(cut) => plugin[..cut.index(*end)].to_vec(),
            File::BadIdent { at, value, cut } => {
                let mut b = plugin[..cut.index(*end)].to_vec();
                if let Some(byte) = b.get_mut(*at) {
                    *byte = *value;
                }
                b
            }
        }
    }
}

fn file() -> impl Strategy<Value = File> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..4096).prop_map(File::Random),
        1 => prop::collection::vec(any::<u8>(), 0..4096).prop_map(File::ElfPrefixed),
        4 => any::<prop::sample::Index>().prop_map(File::Truncated),
        1 => (0usize..16, any::<u8>(), any::<prop::sample::Index>())
            .prop_map(|(at, value, cut)| File::BadIdent { at, value, cut }),
    ]
}

fn scan(dir: PathBuf) -> Result<(usize, Vec<String>), String> {
    let registry = PluginRegistry::scan(&[dir]).map_err(|e| e.to_string())?;
    Ok((
        registry.plugins().len(),
        registry.failures().iter().map(|f| f.to_string()).collect(),
    ))
}

#[test]
fn damaged_plugin_files_are_reported_by_path() {
    run("plugin-files", file!(), 300, file(), |file| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("libfuzz.so");
        std::fs::write(&path, file.bytes()).expect("write");
        let outcome = bounded("scan", CASE_LIMIT, {
            let dir = dir.path().to_path_buf();
            move || scan(dir)
        });
        let (loaded, failures) = outcome.map_err(TestCaseError::fail)?;
        prop_assert_eq!(loaded, 0);
        prop_assert_eq!(failures.len(), 1, "{:?}", failures);
        prop_assert!(
            failures[0].contains(&path.display().to_string()),
            "{}",
            failures[0]
        );
        Ok(())
    });
}

/// The crash the fuzzer found: a plugin cut short in the middle of its code segment. Before
/// the loader's segment check this scan died with SIGBUS inside `dlopen`.
#[test]
fn a_truncated_plugin_is_a_load_failure_naming_it() {
    let (plugin, end) = real_plugin();
    let dir = tempfile::tempdir().expect("temp dir");
    let path: &Path = &dir.path().join("libcairn_grpo.so");
    std::fs::write(path, &plugin[..end / 2]).expect("write");
    let (loaded, failures) = scan(dir.path().to_path_buf()).expect("scan");
    assert_eq!(loaded, 0);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains(&path.display().to_string()) && failures[0].contains("truncated"),
        "{}",
        failures[0]
    );
}
