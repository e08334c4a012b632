//! `cairn-plugin-sdk`: the stable ABI between Cairn and its plugins.
//!
//! A plugin is a `cdylib` that depends on this crate alone, implements [`Algorithm`] or
//! [`Environment`], and exports itself with [`export_algorithm!`] or [`export_environment!`].
//! The host opens it at run time with [`host::foreign::load_plugin`] and drives it through
//! [`host::foreign::ForeignAlgorithm`] / [`host::foreign::ForeignEnvironment`], which implement
//! the same traits. Neither side names an `abi_stable` type: the `repr(C)` mirrors live in
//! [`host::ffi`], which an author never opens.
//!
//! Main types: [`TurnRow`] and [`Batch`] (what rollouts produce), [`Signals`] (what an
//! algorithm returns: per-token advantages, auxiliary coefficients, dropped groups, metrics),
//! [`Host`] (callbacks into the policy backend), [`PluginError`].
//!
//! [`stats`] has the group statistics every advantage estimator needs (docs/algorithms/kernel-contract.md, P8).
//!
//! No tch type appears here or in any plugin: data crosses as token ids, `f32` arrays and JSON.

pub mod algorithm;
pub mod bank;
pub mod batch;
pub mod config;
pub mod env;
pub mod error;
pub mod export;
pub mod host;
pub mod services;
pub mod stack;
pub mod state;
pub mod stats;
pub mod testing;

pub use algorithm::{
    Algorithm, GroupRequest, Requirements, Role, StepReport, TurnContext, TurnContextRequest,
    TurnSummary,
};
pub use bank::{
    BankEntry, BankQuery, EntryKind, EntryStats, EntryStatus, NewEntry, Provenance,
    ReflectionRequest, Retrieved, StatsUpdate,
};
pub use batch::{
    AuxTerm, Batch, ContextVariant, FinishReason, Signals, TeacherForm, TeacherSource,
    TeacherTarget, TeacherTerm, TurnRow,
};
pub use env::{
    Environment, EnvironmentInfo, Episode, Observation, Split, StepOutcome, TaskInfo, TaskRef,
};
pub use error::{ErrorKind, PluginError, Result};
pub use services::{
    GenerateRequest, Generation, HistoryTurn, Host, OfflineHost, RenderRequest, ScoreRequest,
    ScoreWeights, Scored,
};
pub use stack::{Member, Stack, StackError};

/// The author's guide, `README.md`: its Rust example (a whole estimator plugin) compiles as a
/// doctest, so the guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct Guide;

/// The plugin ABI this SDK speaks. Bumped on any change to a `repr(C)` type or FFI trait in
/// [`host::ffi`]; the host refuses plugins built for another number. 4: `signals` takes `&self`.
pub const ABI_VERSION: u32 = 4;
