//! Integration tests of `sdar` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, the distillation term through the kernel's objective, and the built
//! `.so` through the plugin ABI.

mod abi;
mod objective;
mod stack;
