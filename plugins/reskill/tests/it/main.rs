//! In-process tests of the `reskill` plugin through the `Algorithm` hooks, with the test
//! host of `lab.rs`.

mod ffi;
mod lab;
mod pipeline;
mod resume;
mod serving;
