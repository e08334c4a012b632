//! `cairn-stores`: the run's two SQLite stores, below the kernel.
//!
//! - [`bank`]: the experience bank, the text knowledge algorithms inject into prompts, with
//!   provenance, utility statistics and BM25 retrieval;
//! - [`pool`]: the data pool, every trajectory a run plays, turn by turn, with what the
//!   trainer made of it;
//! - `sqlite`: what both share (opening, the checks before any write, pragmas, the schema
//!   version and migrations).
//!
//! Both are synchronous and own one connection each; the kernel's bank and pool actors own the
//! run's stores, and the `cairn` host's commands read them. Nothing here knows about actors,
//! plugins or the model: rows come in as plain data.

pub mod bank;
pub mod error;
pub mod pool;
mod sqlite;

pub use error::{Error, Result};
