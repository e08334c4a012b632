//! Integration tests of `echo` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, and the kernel's episode loop with `echo` as its per-turn hook.

mod play;
mod stack;
