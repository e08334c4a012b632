//! Integration tests of `cairn-kernel`: one binary, one module per area (style.md).

mod plugins;
mod text;
