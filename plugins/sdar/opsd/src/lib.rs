//! `cairn-opsd`: the on-policy self-distillation (OPSD) teacher that the `sdar` and `icsd`
//! plugins share (docs/algorithms/sdar.md, docs/algorithms/icsd.md).
//!
//! The teacher is the policy itself with a skill-conditioned context: for each trainable row,
//! 1. [`teacher::retrieve`] asks the bank ([`cairn_plugin_sdk::Host::bank_query`], BM25) for
//!    the top-`skills.k` active [`cairn_plugin_sdk::EntryKind::Skill`] entries of the row's
//!    task (task-specific and general), with the row's observation as the query;
//! 2. [`teacher::teacher_variant`] injects them into the row's own context variant, and the
//!    kernel's prompt builder renders the row's observation under it
//!    ([`cairn_plugin_sdk::Host::render_prompt`], [`cairn_plugin_sdk::RenderRequest::for_row`]);
//! 3. one batched [`cairn_plugin_sdk::Host::score`] call scores the row's sampled response
//!    after that context with the current weights (the weights that computed the row's
//!    `ℓ_old`), giving `ℓ^T [L]` (and the teacher's top-k with `top_k > 0`).
//!
//! With the student's `ℓ^S = ℓ_old` the per-token gap is `Δ_l = ℓ^T_l − ℓ^S_l` ([`gap`]) and
//! SDAR's gate is `σ(β Δ_l)` ([`gate()`]). Rows without a retrieved skill get no teacher.
//!
//! The skills come from the bank, and [`creator`] writes them: in `observe`, it asks the
//! kernel's skill creator ([`cairn_plugin_sdk::Host::reflect`]) for a skill from a successful
//! trajectory of each task that has fewer than `skills.max_per_task` skills, at most
//! `skills.max_reflections_per_step` per step, so a run that starts from an empty bank builds
//! one.
//!
//! This crate is a library, not a plugin: a plugin library holds one plugin (one linking both
//! plugin crates would register two, and the host refuses it), so `sdar` and `icsd` both
//! depend on this one.

pub mod config;
pub mod creator;
pub mod gate;
pub mod teacher;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use config::{Scope, SkillConfig};
pub use creator::{Creator, CreatorStep};
pub use gate::{gap, gate};
pub use teacher::{retrieve, teacher_variant, RowTeacher, TeacherCounts, Teachers};
