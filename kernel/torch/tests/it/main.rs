//! Integration tests of `cairn-torch` on tiny random models (CPU, f32, seconds each), and on
//! the committed transformers fixtures (`tests/fixtures/fidelity/`).

// `&[0..n]` is a list of micro-batches holding one range, not a mistyped `Vec` of indices.
#![allow(clippy::single_range_in_vec_init)]

mod bad_input;
mod checkpoint;
mod common;
mod export;
mod fidelity;
mod forward;
mod generation;
mod loading;
mod reference;
mod smollm2;
mod teacher;
mod training;
