//! `cairn-kernel`: the actor kernel of Cairn.
//!
//! It wires five actix actors (rollout, reward, experience bank, skill creator, optimizer)
//! around a policy backend from a TOML pipeline config, loads algorithm and environment plugins
//! from `.so` files, and owns the RL objective. It builds and tests without libtorch: the tch
//! backend lives in `cairn-torch` and plugs in through [`backend::PolicyBackend`].

pub mod actors;
pub mod backend;
pub mod config;
pub mod deadline;
pub mod error;
pub mod files;
pub mod loss;
pub mod memory;
pub mod messages;
pub mod objective;
pub mod plugins;
pub mod retry;
pub mod rollout;
pub mod run;
pub mod skills;
pub mod stack;
pub mod text;
pub mod trainer;

pub use error::{Error, Result};
