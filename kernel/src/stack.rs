//! Composing algorithm plugins: one advantage estimator with planners and auxiliary-loss
//! plugins stacked on it (`[algorithm]` plus `[[algorithm.stack]]` in the pipeline config).
//!
//! The composition rules (which roles may stack, how credit arrays and terms merge, how state
//! is keyed) live in the SDK, [`cairn_plugin_sdk::stack`], so plugin tests compose plugins
//! without the kernel; this module re-exports them for the kernel's callers.

pub use cairn_plugin_sdk::stack::{Member, Stack, StackError};
