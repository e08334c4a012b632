//! Integration tests of `echo` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, the kernel's episode loop with `echo` as its per-turn hook, and the
//! library header with three plugin crates linked.

mod export;
mod play;
mod stack;
