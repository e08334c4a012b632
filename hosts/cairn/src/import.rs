//! `cairn import gguf FILE OUT_DIR [--dtype f32|bf16]`: a llama.cpp GGUF file to a Hugging
//! Face model directory (`cairn_gguf::import_gguf`), with a progress bar over the tensors and
//! a one-line summary on stdout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use cairn_gguf::{import_gguf_with_progress, ImportOptions, OutDtype};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Subcommand)]
pub enum ImportCommand {
    /// A llama GGUF (F32, F16, BF16, Q8_0, Q4_0 or Q4_1 tensors) to a new Hugging Face model
    /// directory: config.json, model.safetensors, tokenizer files, generation_config.json.
    Gguf {
        /// The GGUF file.
        file: PathBuf,
        /// The directory to write: a new or empty one (missing parents are created), never a
        /// symbolic link. It is written as OUT_DIR.partial and renamed at the end.
        out_dir: PathBuf,
        /// Dtype of the written weights: f32 | bf16 (rounded to nearest even).
        #[arg(long, default_value = "f32")]
        dtype: OutDtype,
    },
}

pub fn run(command: ImportCommand) -> Result<()> {
    match command {
        ImportCommand::Gguf {
            file,
            out_dir,
            dtype,
        } => gguf(&file, &out_dir, dtype),
    }
}

fn gguf(file: &Path, out_dir: &Path, dtype: OutDtype) -> Result<()> {
    // The importer refuses a file, a special file or a non-empty directory at OUT_DIR, and
    // renames the finished directory into place; a link would be followed by the first check
    // and not by the rename, so it is refused here, before the GGUF is read.
    if std::fs::symlink_metadata(out_dir).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "{}: a symbolic link; give the output directory itself (a new or empty one)",
            out_dir.display()
        );
    }
    let start = Instant::now();
    // Reading and checking the whole file comes first (no count yet), then one step per tensor.
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{elapsed_precise}] checking {msg}")
            .expect("the progress template is valid"),
    );
    bar.set_prefix("import");
    bar.set_message(file.display().to_string());
    let counting = std::cell::Cell::new(false);
    let report = import_gguf_with_progress(file, out_dir, &ImportOptions { dtype }, &|p| {
        if !counting.replace(true) {
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>10} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}",
                )
                .expect("the progress template is valid")
                .progress_chars("=> "),
            );
            bar.set_length(p.total as u64);
        }
        bar.set_position(p.done as u64);
        bar.set_message(p.name.to_string());
    });
    bar.finish_and_clear();
    let report = report?;
    let types: Vec<String> = report
        .source_types
        .iter()
        .map(|(ty, n)| format!("{ty} {n}"))
        .collect();
    println!(
        "imported {} tensors ({} parameters; GGUF types {}) as {}{} into {} in {:.1} s",
        report.tensors,
        report.parameters,
        types.join(", "),
        report.dtype.name(),
        if report.tied_embeddings {
            ", head tied to the embedding"
        } else {
            ""
        },
        report.out_dir.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
