//! `cairn-bench bank`: experience-bank retrieval latency at several bank sizes.
//!
//! For each size N a fresh file bank (WAL, as in a run) is filled with N synthetic entries, then
//! `--queries` top-k queries are timed one by one; the JSON line reports the median and p95 per
//! size, with the put cost per entry, the snapshot (checkpoint) time and the file size.
//!
//! The corpus is deterministic (a fixed xorshift seed): words drawn from a Zipf(1.1)
//! distribution over a 5,000-word synthetic vocabulary, 8 to 30 words an entry (the length of
//! a lesson or a skill), 10 to 25 words a query (an observation). Zipf because natural text is:
//! a few words are in most entries (`the`), most are rare, which is what makes BM25 work, and
//! what the FTS5 index's cost depends on (the posting lists of the common words are long).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use cairn_plugin_sdk::bank::{BankQuery, NewEntry, Provenance};
use cairn_stores::bank::{Bank, EntryFilter};
use serde_json::json;

use crate::measure::median;

#[derive(Debug, clap::Args)]
pub struct BankArgs {
    /// Bank sizes (entries), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    sizes: Vec<usize>,
    /// Timed queries per size (after 20 untimed warm-up queries).
    #[arg(long, default_value_t = 500)]
    queries: usize,
    /// Entries returned per query.
    #[arg(long, default_value_t = 8)]
    k: usize,
    /// Directory for the bank files (created; each size's bank is deleted after it).
    #[arg(long, default_value = "target/bench/bank")]
    dir: PathBuf,
}

/// xorshift64*: a small deterministic generator (no dependency for a benchmark corpus).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

const VOCABULARY: usize = 5000;

/// Word `i` of the synthetic vocabulary: consonant-vowel syllables spelling `i` in base 100,
/// so words are distinct, pronounceable, and of 2 to 6 letters.
fn word(i: usize) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut n = i + 1;
    let mut out = String::new();
    while n > 0 {
        let s = n % 70;
        out.push(C[s % C.len()] as char);
        out.push(V[s / C.len()] as char);
        n /= 70;
    }
    out
}

struct Corpus {
    words: Vec<String>,
    /// Cumulative Zipf(1.1) probabilities over `words`.
    cdf: Vec<f64>,
    rng: Rng,
}

impl Corpus {
    fn new(seed: u64) -> Self {
        let weights: Vec<f64> = (1..=VOCABULARY)
            .map(|r| 1.0 / (r as f64).powf(1.1))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Corpus {
            words: (0..VOCABULARY).map(word).collect(),
            cdf,
            rng: Rng(seed),
        }
    }

    fn text(&mut self, min_words: usize, max_words: usize) -> String {
        let n = self.rng.range(min_words, max_words);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let u = self.rng.unit();
            let i = self.cdf.partition_point(|&c| c < u).min(VOCABULARY - 1);
            out.push(self.words[i].as_str());
        }
        out.join(" ")
    }
}

/// The `q`-quantile of `xs` (nearest rank).
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn run(args: &BankArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
    let mut results = Vec::new();
    for &size in &args.sizes {
        let path = args.dir.join(format!("bank-{size}.sqlite"));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let mut bank = Bank::open(&path)?;
        let mut corpus = Corpus::new(0x5EED_0000 + size as u64);
        let writer = Provenance {
            step: 1,
            policy_version: 1,
            source_trajectories: Vec::new(),
            writer: "cairn-bench".into(),
        };
        let t = Instant::now();
        let mut left = size;
        while left > 0 {
            let n = left.min(10_000);
            let entries: Vec<NewEntry> = (0..n)
                .map(|_| NewEntry {
                    text: corpus.text(8, 30),
                    ..Default::default()
                })
                .collect();
            bank.put(&entries, &writer)?;
            left -= n;
        }
        let put_s = t.elapsed().as_secs_f64();
        assert_eq!(bank.count(&EntryFilter::default())? as usize, size);

        let queries: Vec<BankQuery> = (0..args.queries + 20)
            .map(|_| BankQuery {
                text: corpus.text(10, 25),
                k: args.k,
                ..Default::default()
            })
            .collect();
        let mut latencies_us = Vec::with_capacity(args.queries);
        let mut returned = 0usize;
        for (i, query) in queries.iter().enumerate() {
            let t = Instant::now();
            let found = bank.query(query)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if i >= 20 {
                latencies_us.push(us);
                returned += found.len();
            }
        }

        let snapshot = args.dir.join(format!("snapshot-{size}.sqlite"));
        let t = Instant::now();
        bank.snapshot_to(&snapshot)?;
        let snapshot_s = t.elapsed().as_secs_f64();
        let file_bytes = std::fs::metadata(&snapshot).map(|m| m.len()).unwrap_or(0);
        drop(bank);
        for p in [
            snapshot.display().to_string(),
            path.display().to_string(),
            format!("{}-wal", path.display()),
            format!("{}-shm", path.display()),
        ] {
            let _ = std::fs::remove_file(p);
        }

        results.push(json!({
            "entries": size,
            "median_us": median(&latencies_us).unwrap_or(f64::NAN),
            "p95_us": quantile(&latencies_us, 0.95),
            "mean_returned": returned as f64 / args.queries.max(1) as f64,
            "put_us_per_entry": put_s * 1e6 / size.max(1) as f64,
            "snapshot_ms": snapshot_s * 1e3,
            "file_mb": file_bytes as f64 / 1e6,
        }));
    }
    println!(
        "{}",
        json!({
            "bench": "bank_retrieval",
            "k": args.k,
            "queries": args.queries,
            "results": results,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_is_deterministic_and_zipfian() {
        assert_eq!(word(0), "da");
        assert_ne!(word(1), word(71));
        let mut a = Corpus::new(1);
        let mut b = Corpus::new(1);
        assert_eq!(a.text(8, 30), b.text(8, 30));
        assert_eq!(quantile(&[5.0, 1.0, 3.0, 2.0, 4.0], 0.95), 5.0);
        assert_eq!(quantile(&[5.0, 1.0, 3.0, 2.0, 4.0], 0.4), 2.0);
    }
}
