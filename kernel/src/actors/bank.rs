//! The experience-bank actor: owns the run's [`Bank`] (SQLite, `<run>/bank.sqlite`) and
//! answers plugins' queries, puts and statistics updates (through the kernel's `Host`), and
//! the trainer's checkpoint and restore. (Trajectories go to the data pool's actor,
//! [`crate::actors::pool`].)
//!
//! It runs on a `SyncArbiter` with one thread rather than on the async arbiter: every request
//! is blocking SQLite I/O (a commit, a snapshot of the whole file), which would stall the
//! trainer and the other async actors sharing that thread; one thread also serialises the
//! requests on the bank's single connection, in arrival order. Callers on a sync actor's
//! thread (the optimizer, inside a plugin's `signals`) block on the reply; async callers
//! `send().await`.

use std::path::PathBuf;

use actix::prelude::*;
use cairn_plugin_sdk::bank::{BankQuery, NewEntry, Provenance, Retrieved, StatsUpdate};

use crate::error::{Error, Result};
use cairn_stores::bank::{snapshot_path, Bank};

pub struct ExperienceBankActor {
    bank: Bank,
}

impl ExperienceBankActor {
    pub fn new(bank: Bank) -> Self {
        ExperienceBankActor { bank }
    }
}

impl Actor for ExperienceBankActor {
    type Context = SyncContext<Self>;
}

/// Top-k entries for a query, best first ([`Bank::query`]).
#[derive(Message)]
#[rtype(result = "Result<Vec<Retrieved>>")]
pub struct QueryBank(pub BankQuery);

impl Handler<QueryBank> for ExperienceBankActor {
    type Result = Result<Vec<Retrieved>>;
    fn handle(&mut self, msg: QueryBank, _: &mut Self::Context) -> Self::Result {
        self.bank.query(&msg.0).map_err(Into::into)
    }
}

/// Insert entries in one transaction; returns their ids, in order ([`Bank::put`]). `step`,
/// `policy_version` and `writer` fill the provenance fields an entry leaves empty.
#[derive(Message)]
#[rtype(result = "Result<Vec<u64>>")]
pub struct PutEntries {
    pub entries: Vec<NewEntry>,
    /// The training step the put happens at.
    pub step: u64,
    /// The policy version at that step.
    pub policy_version: u64,
    /// The plugin making the put (or `skill-creator:<reflector>`).
    pub writer: String,
}

impl Handler<PutEntries> for ExperienceBankActor {
    type Result = Result<Vec<u64>>;
    fn handle(&mut self, msg: PutEntries, _: &mut Self::Context) -> Self::Result {
        let defaults = Provenance {
            step: msg.step,
            policy_version: msg.policy_version,
            source_trajectories: Vec::new(),
            writer: msg.writer,
        };
        self.bank.put(&msg.entries, &defaults).map_err(Into::into)
    }
}

/// Apply statistics and status updates in one transaction; a missing id changes nothing
/// ([`Bank::update`]). Retiring is an update with `status: Some(Retired)`.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct UpdateEntries(pub Vec<StatsUpdate>);

impl Handler<UpdateEntries> for ExperienceBankActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: UpdateEntries, _: &mut Self::Context) -> Self::Result {
        self.bank.update(&msg.0).map_err(Into::into)
    }
}

/// Write a consistent snapshot of the bank to `dir/bank.sqlite` (a checkpoint directory,
/// created if needed), atomically ([`Bank::snapshot_to`]).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct CheckpointBank {
    pub dir: PathBuf,
}

impl Handler<CheckpointBank> for ExperienceBankActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: CheckpointBank, _: &mut Self::Context) -> Self::Result {
        std::fs::create_dir_all(&msg.dir).map_err(|e| Error::io(&msg.dir, e))?;
        self.bank
            .snapshot_to(&snapshot_path(&msg.dir))
            .map_err(Into::into)
    }
}

/// Make the live bank exactly the snapshot in `dir/bank.sqlite` ([`Bank::restore_from`]); a
/// checkpoint without one is an error naming the file (nothing is changed).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RestoreBank {
    pub dir: PathBuf,
    /// The run the checkpoint belongs to (`TrainerState::run_id`); a snapshot stamped with
    /// another run is refused. `None` (a checkpoint from before run ids): not checked.
    pub run_id: Option<String>,
}

impl Handler<RestoreBank> for ExperienceBankActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RestoreBank, _: &mut Self::Context) -> Self::Result {
        let path = snapshot_path(&msg.dir);
        if let Some(expected) = &msg.run_id {
            // Checked on the snapshot itself, before anything is copied into the run's bank.
            let found = Bank::open_read_only(&path)?.run_id()?;
            if let Some(found) = found.filter(|f| f != expected) {
                return Err(Error::Other(format!(
                    "{}: this bank snapshot belongs to run `{found}`, but the checkpoint's \
                     trainer state is run `{expected}`: the bank was copied from another run. \
                     Put back this checkpoint's own bank.sqlite, or start over with \
                     --no-resume; the run's bank was left as it was",
                    path.display()
                )));
            }
        }
        self.bank.restore_from(&path).map_err(Into::into)
    }
}

/// Empty the bank and restart ids at 1 ([`Bank::reset`]): for a run that starts over, with no
/// checkpoint to restore.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ResetBank {
    /// Stamped on the emptied bank (`TrainerState::run_id`).
    pub run_id: Option<String>,
}

impl Handler<ResetBank> for ExperienceBankActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: ResetBank, _: &mut Self::Context) -> Self::Result {
        self.bank.reset()?;
        if let Some(id) = &msg.run_id {
            self.bank.set_run_id(id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::bank::{EntryKind, EntryStatus};

    use super::*;
    use cairn_stores::bank::{bank_path, EntryFilter};

    fn entry(text: &str) -> NewEntry {
        NewEntry {
            kind: EntryKind::Experience,
            text: text.into(),
            ..Default::default()
        }
    }

    fn put(texts: &[&str], step: u64) -> PutEntries {
        PutEntries {
            entries: texts.iter().map(|t| entry(t)).collect(),
            step,
            policy_version: step + 100,
            writer: "edge".into(),
        }
    }

    /// The messages a plugin and the trainer send, through a running actor: put, query,
    /// update, checkpoint, more writes, restore.
    #[test]
    fn messages_reach_the_bank_and_a_restore_undoes_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        let checkpoint = run.join("checkpoints/step-000004");
        let bank = Bank::open(&bank_path(&run)).unwrap();
        actix::System::new().block_on(async move {
            let bank = std::sync::Mutex::new(Some(bank));
            let addr = SyncArbiter::start(1, move || {
                let bank = bank
                    .lock()
                    .expect("the factory runs on one thread")
                    .take()
                    .expect("the bank actor is built once");
                ExperienceBankActor::new(bank)
            });
            let ids = addr
                .send(put(&["rinse the mug", "heat the potato"], 4))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(ids, [1, 2]);
            let found = addr
                .send(QueryBank(BankQuery {
                    text: "mug".into(),
                    ..Default::default()
                }))
                .await
                .unwrap()
                .unwrap();
            let found: Vec<(u64, u64, u64, String)> = found
                .into_iter()
                .map(|r| {
                    let p = r.entry.provenance;
                    (r.entry.id, p.step, p.policy_version, p.writer)
                })
                .collect();
            assert_eq!(found, [(1, 4, 104, "edge".to_string())]);
            addr.send(UpdateEntries(vec![StatsUpdate {
                id: 2,
                add_exposures: 1,
                ..Default::default()
            }]))
            .await
            .unwrap()
            .unwrap();
            addr.send(CheckpointBank {
                dir: checkpoint.clone(),
            })
            .await
            .unwrap()
            .unwrap();

            addr.send(put(&["later"], 5)).await.unwrap().unwrap();
            let err = addr
                .send(UpdateEntries(vec![StatsUpdate {
                    id: 9,
                    status: Some(EntryStatus::Retired),
                    ..Default::default()
                }]))
                .await
                .unwrap()
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Store(cairn_stores::Error::BankNoEntry { id: 9, .. })
                ),
                "{err}"
            );
            addr.send(RestoreBank {
                dir: checkpoint.clone(),
                run_id: None,
            })
            .await
            .unwrap()
            .unwrap();
            let missing = addr
                .send(RestoreBank {
                    dir: run.join("checkpoints/none"),
                    run_id: None,
                })
                .await
                .unwrap()
                .unwrap_err();
            assert!(
                matches!(
                    missing,
                    Error::Store(cairn_stores::Error::FileNotFound { .. })
                ),
                "{missing}"
            );
            actix::System::current().stop();
        });
        let bank = Bank::open(&bank_path(dir.path())).unwrap();
        let got: Vec<(u64, u64)> = bank
            .list(&EntryFilter::default())
            .unwrap()
            .into_iter()
            .map(|e| (e.id, e.stats.exposures))
            .collect();
        assert_eq!(got, [(1, 0), (2, 1)]);
    }

    /// A fresh start stamps the bank with its run id; a resume refuses a snapshot stamped with
    /// another run, before it copies anything, and takes its own.
    #[test]
    fn a_snapshot_from_another_run_is_refused_and_the_bank_is_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        let checkpoint = run.join("checkpoints/step-000001");
        let bank = Bank::open(&bank_path(&run)).unwrap();
        actix::System::new().block_on(async move {
            let bank = std::sync::Mutex::new(Some(bank));
            let addr = SyncArbiter::start(1, move || {
                let bank = bank.lock().expect("one thread").take().expect("built once");
                ExperienceBankActor::new(bank)
            });
            let reset = |id: &str| ResetBank {
                run_id: Some(id.into()),
            };
            addr.send(reset("run-a")).await.unwrap().unwrap();
            addr.send(put(&["from run a"], 1)).await.unwrap().unwrap();
            addr.send(CheckpointBank {
                dir: checkpoint.clone(),
            })
            .await
            .unwrap()
            .unwrap();
            // Run b starts fresh in the same bank file and writes its own entry.
            addr.send(reset("run-b")).await.unwrap().unwrap();
            addr.send(put(&["from run b"], 1)).await.unwrap().unwrap();
            let restore = |id: &str| RestoreBank {
                dir: checkpoint.clone(),
                run_id: Some(id.into()),
            };
            let err = addr.send(restore("run-b")).await.unwrap().unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("belongs to run `run-a`")
                    && message.contains("trainer state is run `run-b`"),
                "{message}"
            );
            let texts = |found: Vec<Retrieved>| -> Vec<String> {
                found.into_iter().map(|r| r.entry.text).collect()
            };
            let all = BankQuery {
                k: 10,
                ..Default::default()
            };
            let left = addr.send(QueryBank(all.clone())).await.unwrap().unwrap();
            assert_eq!(
                texts(left),
                ["from run b"],
                "the refused restore copied nothing"
            );
            addr.send(restore("run-a")).await.unwrap().unwrap();
            let back = addr.send(QueryBank(all)).await.unwrap().unwrap();
            assert_eq!(texts(back), ["from run a"]);
            actix::System::current().stop();
        });
    }
}
