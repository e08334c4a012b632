//! `cairn-kernel`: the actor kernel of Cairn.
//!
//! It wires the pipeline's actix actors (the policy, two rollout actors, reward, optimizer,
//! experience bank, data pool and skill creator; [`actors`] lists them) around a policy backend
//! from a TOML pipeline config, loads algorithm and environment plugins from `.so` files, and
//! owns the RL objective. It builds and tests without libtorch: the tch backend lives in
//! `cairn-torch` and plugs in through [`backend::PolicyBackend`]. The stores it writes are
//! `cairn-stores`; the gateway and the external engine (`cairn-gateway`) build on it.

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
