//! The experience-bank actor: records every finalised batch (the trajectory recorder) and keeps
//! the most recent trajectories for plugins that replay or mine them.
//!
//! Recorded batches use the documented JSON form of the SDK's [`Batch`] (`docs/batch-json.md`),
//! so `cairn signals` and `cairn loss` can read them back.

use std::collections::VecDeque;
use std::path::PathBuf;

use actix::prelude::*;
use cairn_plugin_sdk::{Batch, TurnRow};

use crate::error::{Error, Result};

pub struct ExperienceBankActor {
    /// Where batches are written (`<run>/trajectories`); `None`: not recorded.
    pub record_dir: Option<PathBuf>,
    /// Most recent rows kept in memory (0: none).
    pub capacity: usize,
    pub recent: VecDeque<TurnRow>,
}

impl Actor for ExperienceBankActor {
    type Context = Context<Self>;
}

/// Record a finalised batch.
#[derive(Message)]
#[rtype(result = "Result<Option<PathBuf>>")]
pub struct RecordBatch {
    pub batch: Batch,
}

impl Handler<RecordBatch> for ExperienceBankActor {
    type Result = Result<Option<PathBuf>>;
    fn handle(&mut self, msg: RecordBatch, _: &mut Self::Context) -> Self::Result {
        let written = match &self.record_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                let path = dir.join(format!("step-{:06}.json", msg.batch.step));
                let text = serde_json::to_string(&msg.batch)
                    .map_err(|e| Error::Other(format!("serialising batch: {e}")))?;
                crate::run::write_atomic(&path, text.as_bytes())?;
                Some(path)
            }
            None => None,
        };
        if self.capacity > 0 {
            for row in msg.batch.rows {
                if self.recent.len() == self.capacity {
                    self.recent.pop_front();
                }
                self.recent.push_back(row);
            }
        }
        Ok(written)
    }
}

/// The most recent rows held by the bank.
#[derive(Message)]
#[rtype(result = "Vec<TurnRow>")]
pub struct RecentRows;

impl Handler<RecentRows> for ExperienceBankActor {
    type Result = MessageResult<RecentRows>;
    fn handle(&mut self, _: RecentRows, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.recent.iter().cloned().collect())
    }
}
