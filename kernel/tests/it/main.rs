//! Integration tests of `cairn-kernel`: one binary, one module per area (style.md).

mod bank;
mod fuzz;
mod gateway;
mod pipeline;
mod plugins;
mod skills;
mod text;
mod tidy;
mod tools;
