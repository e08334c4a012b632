//! Integration tests of `cairn-kernel`: one binary, one module per area (style.md).

mod gateway;
mod plugins;
mod text;
