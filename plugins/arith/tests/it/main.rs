//! Integration tests for the arith plugin, in one binary (see `style.md`).
//!
//! Most tests drive [`Arith`] in-process through the SDK's [`Environment`] trait; `ffi` also
//! loads the built `cdylib`, as the kernel does.

mod episodes;
mod examples;
mod ffi;
mod replies;
mod tasks;

use cairn_arith::{Arith, ArithConfig};
use cairn_plugin_sdk::{Split, TaskRef};

pub fn env() -> Arith {
    Arith::new(ArithConfig::default()).expect("the default config is valid")
}

pub fn train(index: u64) -> TaskRef {
    TaskRef {
        split: Split::Train,
        index,
    }
}

pub fn test(index: u64) -> TaskRef {
    TaskRef {
        split: Split::Test,
        index,
    }
}
