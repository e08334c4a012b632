//! The host's side of the plugin boundary, which no plugin author opens.
//!
//! - [`foreign`]: the loader ([`foreign::load_plugin`]) and the wrappers that drive a plugin
//!   `.so` as a plain [`crate::Algorithm`] or [`crate::Environment`]; the kernel and the
//!   `cairn` CLI use it, and plugin tests reach it through
//!   [`crate::testing::load_test_cdylib`].
//! - [`ffi`]: the `repr(C)` mirrors and the root module both sides of the boundary share; the
//!   export macros ([`crate::export_algorithm!`]) and [`foreign`] are its only users.
//!
//! The services a plugin calls on its host ([`crate::Host`]) are in [`crate::services`].

pub mod ffi;
pub mod foreign;

mod elf;
