//! The SQLite file behind each of the kernel's two stores, the experience bank
//! ([`crate::bank`]) and the data pool ([`crate::pool`]): opening one (read-write, read-only or
//! in memory), the checks made before anything is written, the pragmas, the schema version and
//! the migrations that bring an older file up to it.
//!
//! A store describes itself with a [`Schema`] (its tables, the `meta` key of its version, its
//! migration steps) and gets its own typed errors through [`Store`]. Opening for writing:
//!
//! 1. The file's first bytes are read: a non-empty file without SQLite's header is refused
//!    before SQLite opens it, so nothing but a read ever touches a foreign file.
//! 2. SQLite opens it and the busy timeout is set (how long a write waits for another
//!    connection's lock).
//! 3. Read-only checks: `PRAGMA quick_check` where the store asks for it, then the file is
//!    either empty (no tables), or a store whose `meta` table holds a version from
//!    [`Schema::oldest_readable`] to [`Schema::version`]. Another program's database and a
//!    file of a newer (or unknown) version are refused, and left byte for byte as they were.
//! 4. The pragmas: WAL (readers never block the writer), `synchronous = NORMAL` (a killed
//!    process loses no committed write), foreign keys on.
//! 5. In one `IMMEDIATE` transaction, which takes the write lock at open (a file another
//!    process is writing fails here, before any compute, not at the first write): an empty
//!    file gets the tables and its `meta` rows; an older one is migrated.
//!
//! A read-only opening makes the checks of 1 to 3 and never migrates: it reads an older file
//! as it is, so a store that reads older versions must know their columns.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result};

/// The first 16 bytes of every SQLite 3 database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// `meta.created_by` of a new file.
const CREATED_BY: &str = concat!("cairn-kernel ", env!("CARGO_PKG_VERSION"));

/// Which store a file is: picks its typed errors and their wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// The experience bank: busy → [`Error::BankLocked`], a file that is not a bank →
    /// [`Error::BankCorrupt`], another version → [`Error::BankSchema`], else [`Error::Bank`].
    Bank,
    /// The data pool: another version → [`Error::PoolSchema`], everything else
    /// [`Error::Pool`].
    Pool,
}

/// Why a file was refused at open (it is left as it was).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Refusal {
    /// Its first bytes are not SQLite's header.
    NotSqlite,
    /// SQLite's integrity check failed (the verdict).
    Damaged(String),
    /// An SQLite database without this store's `meta` version.
    Foreign,
    /// No tables at all, where a reader needs a store.
    Empty,
}

impl Store {
    /// Maps an SQLite error to this store's error, saying what it was `doing`.
    pub fn sql<'a>(
        self,
        path: &'a Path,
        doing: &'static str,
    ) -> impl Fn(rusqlite::Error) -> Error + 'a {
        move |e| {
            let path = path.to_path_buf();
            let detail = e.to_string();
            match (self, e.sqlite_error_code()) {
                (Store::Bank, Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)) => {
                    Error::BankLocked { path, detail }
                }
                (Store::Bank, Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)) => {
                    Error::BankCorrupt { path, detail }
                }
                (store, _) => store.error(&path, doing, detail),
            }
        }
    }

    /// Any other failure: [`Error::Bank`] or [`Error::Pool`].
    fn error(self, path: &Path, doing: &'static str, detail: String) -> Error {
        let path = path.to_path_buf();
        match self {
            Store::Bank => Error::Bank {
                path,
                doing,
                detail,
            },
            Store::Pool => Error::Pool {
                path,
                doing,
                detail,
            },
        }
    }

    fn refused(self, path: &Path, why: Refusal) -> Error {
        let path = path.to_path_buf();
        match self {
            Store::Bank => Error::BankCorrupt {
                path,
                detail: match why {
                    Refusal::NotSqlite => {
                        "not an SQLite database: its first bytes are not the SQLite header".into()
                    }
                    Refusal::Damaged(verdict) => format!("SQLite integrity check: {verdict}"),
                    Refusal::Foreign => {
                        "an SQLite database, but not a Cairn experience bank (no `meta` table)"
                            .into()
                    }
                    Refusal::Empty => "an empty file, not a bank".into(),
                },
            },
            Store::Pool => {
                const LEFT: &str = "the file was left as it is: move it aside and the next run \
                                    starts an empty pool";
                Error::Pool {
                    path,
                    doing: "opening",
                    detail: match why {
                        Refusal::NotSqlite => format!(
                            "not an SQLite database (its first bytes are not the SQLite header); \
                             {LEFT}"
                        ),
                        Refusal::Damaged(verdict) => {
                            format!("SQLite integrity check: {verdict}; {LEFT}")
                        }
                        Refusal::Foreign => format!(
                            "an SQLite database, but not a Cairn data pool (no pool schema \
                             version); {LEFT}"
                        ),
                        Refusal::Empty => "an empty file, not a data pool".into(),
                    },
                }
            }
        }
    }

    fn other_version(self, path: &Path, found: String, expected: u32) -> Error {
        let path = path.to_path_buf();
        match self {
            Store::Bank => Error::BankSchema {
                path,
                found,
                expected,
            },
            Store::Pool => Error::PoolSchema {
                path,
                found,
                expected,
            },
        }
    }
}

/// One migration step: brings a file of version `to - 1` up to `to`.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    pub to: u32,
    /// What it does, for errors (`migrating the bank to schema version 2`).
    pub doing: &'static str,
    /// The statements, run as one batch inside the opening's transaction.
    pub sql: &'static str,
}

/// What a store's file holds, and how it is checked.
#[derive(Clone, Copy, Debug)]
pub struct Schema {
    pub store: Store,
    /// The `meta` key holding the version (`schema_version`, `pool_schema_version`): a file of
    /// one store is never taken for the other's.
    pub version_key: &'static str,
    /// The version [`Schema::tables`] creates; bump it with any change to the tables, with a
    /// [`Migration`] to it.
    pub version: u32,
    /// The statements that create every table, index and trigger, `meta` included.
    pub tables: &'static str,
    /// The steps from [`Schema::oldest_readable`] up to [`Schema::version`], in order, one per
    /// version.
    pub migrations: &'static [Migration],
    /// Run `PRAGMA quick_check` before anything else (it reads the whole file: right for the
    /// bank's few megabytes, not for a pool that grows by every step's tokens).
    pub quick_check: bool,
}

/// What [`Schema::check`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// No tables at all: a new (or zero-length) file, to be given the schema.
    Empty,
    /// A store of this version ([`Schema::oldest_readable`] ..= [`Schema::version`]).
    Version(u32),
}

impl Schema {
    /// The oldest version the migrations bring up to [`Schema::version`].
    pub fn oldest_readable(&self) -> u32 {
        self.migrations.first().map_or(self.version, |m| m.to - 1)
    }

    /// Opens the file at `path` for writing, creating it (and the tables) when it is absent
    /// or empty, migrating it when it is older; see the module documentation for the checks.
    /// The returned connection holds a store of [`Schema::version`].
    pub fn open(&self, path: &Path, busy_timeout: Duration) -> Result<Connection> {
        let sql = |doing| self.store.sql(path, doing);
        self.check_header(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(sql("opening"))?;
        conn.busy_timeout(busy_timeout).map_err(sql("opening"))?;
        let found = self.check(&conn, path)?;
        self.configure(&conn, path)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("taking the write lock"))?;
        match found {
            Found::Empty => self.create(&tx, path)?,
            Found::Version(version) => self.migrate(&tx, path, version)?,
        }
        tx.commit().map_err(sql("creating the schema"))?;
        Ok(conn)
    }

    /// Opens an existing file for reading only, with its version: never creates, writes or
    /// migrates. A missing file is [`Error::FileNotFound`], an empty one is refused.
    pub fn open_read_only(&self, path: &Path, busy_timeout: Duration) -> Result<(Connection, u32)> {
        if let Err(error) = std::fs::metadata(path) {
            return Err(Error::FileNotFound {
                path: path.to_path_buf(),
                error,
            });
        }
        let sql = |doing| self.store.sql(path, doing);
        self.check_header(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(sql("opening"))?;
        conn.busy_timeout(busy_timeout).map_err(sql("opening"))?;
        match self.check(&conn, path)? {
            Found::Version(version) => Ok((conn, version)),
            Found::Empty => Err(self.store.refused(path, Refusal::Empty)),
        }
    }

    /// A store in memory only, with the tables and foreign keys on. Errors name `:memory:`.
    pub fn open_in_memory(&self) -> Result<Connection> {
        let path = Path::new(":memory:");
        let sql = |doing| self.store.sql(path, doing);
        let mut conn = Connection::open_in_memory().map_err(sql("opening"))?;
        conn.execute_batch("PRAGMA foreign_keys = ON;")
            .map_err(sql("opening"))?;
        let tx = conn.transaction().map_err(sql("creating the schema"))?;
        self.create(&tx, path)?;
        tx.commit().map_err(sql("creating the schema"))?;
        Ok(conn)
    }

    /// Refuses a non-empty file that does not start with SQLite's header. A missing or
    /// zero-length file passes (a new store).
    fn check_header(&self, path: &Path) -> Result<()> {
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path, e)),
        };
        let mut head = Vec::with_capacity(SQLITE_MAGIC.len());
        (&mut file)
            .take(SQLITE_MAGIC.len() as u64)
            .read_to_end(&mut head)
            .map_err(|e| Error::io(path, e))?;
        if head.is_empty() || head == SQLITE_MAGIC {
            Ok(())
        } else {
            Err(self.store.refused(path, Refusal::NotSqlite))
        }
    }

    /// Checks an open database, reading only: intact (when [`Schema::quick_check`]), and
    /// either empty or a store of a version this kernel reads.
    pub fn check(&self, conn: &Connection, path: &Path) -> Result<Found> {
        let sql = |doing| self.store.sql(path, doing);
        if self.quick_check {
            let verdict: String = conn
                .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                .map_err(sql("checking the file"))?;
            if verdict != "ok" {
                return Err(self.store.refused(path, Refusal::Damaged(verdict)));
            }
        }
        let count = |query: &str| -> Result<i64> {
            conn.query_row(query, [], |r| r.get(0))
                .map_err(sql("reading the schema"))
        };
        if count("SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'")? == 0 {
            return Ok(Found::Empty);
        }
        if count("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'meta'")? == 0
        {
            return Err(self.store.refused(path, Refusal::Foreign));
        }
        let found: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = ?1",
                [self.version_key],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading the schema version"))?;
        let Some(found) = found else {
            return Err(self.store.refused(path, Refusal::Foreign));
        };
        match found.parse::<u32>() {
            Ok(v) if (self.oldest_readable()..=self.version).contains(&v) => Ok(Found::Version(v)),
            _ => Err(self.store.other_version(path, found, self.version)),
        }
    }

    /// The pragmas of a file opened for writing: WAL, `synchronous = NORMAL`, foreign keys.
    /// (The bank calls it again after a restore has copied a snapshot's pages over its file.)
    pub fn configure(&self, conn: &Connection, path: &Path) -> Result<()> {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(self.store.sql(path, "switching to WAL mode"))?;
        if mode != "wal" {
            return Err(self.store.error(
                path,
                "switching to WAL mode",
                format!("SQLite kept journal mode `{mode}`"),
            ));
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
            .map_err(self.store.sql(path, "opening"))
    }

    /// Creates the tables and the `meta` rows in an empty database (inside the caller's
    /// transaction).
    fn create(&self, conn: &Connection, path: &Path) -> Result<()> {
        let sql = |doing| self.store.sql(path, doing);
        conn.execute_batch(self.tables)
            .map_err(sql("creating the schema"))?;
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2), ('created_by', ?3)",
            (self.version_key, self.version.to_string(), CREATED_BY),
        )
        .map_err(sql("creating the schema"))?;
        Ok(())
    }

    /// Brings a store of version `from` up to [`Schema::version`] (inside the caller's
    /// transaction): each migration step above `from`, in order, then the version in `meta`.
    /// A store already at the current version is left alone.
    pub fn migrate(&self, conn: &Connection, path: &Path, from: u32) -> Result<()> {
        for step in self.migrations.iter().filter(|m| m.to > from) {
            conn.execute_batch(step.sql)
                .map_err(self.store.sql(path, step.doing))?;
        }
        if from < self.version {
            conn.execute(
                "UPDATE meta SET value = ?2 WHERE key = ?1",
                (self.version_key, self.version.to_string()),
            )
            .map_err(
                self.store
                    .sql(path, "recording the migrated schema version"),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of version 3 whose version 1 had `notes(body)`, version 2 added `notes.tag`,
    /// and version 3 the `tags` table; each step also counts itself in `log`, so a step run
    /// twice shows.
    const TABLES: &str = "
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE log (step INTEGER NOT NULL);
        CREATE TABLE notes (body TEXT NOT NULL, tag TEXT);
        CREATE TABLE tags (name TEXT PRIMARY KEY);
        CREATE TABLE children (parent TEXT NOT NULL REFERENCES tags(name));
    ";
    const STEPS: &[Migration] = &[
        Migration {
            to: 2,
            doing: "migrating to 2",
            sql: "ALTER TABLE notes ADD COLUMN tag TEXT; INSERT INTO log VALUES (2);",
        },
        Migration {
            to: 3,
            doing: "migrating to 3",
            sql: "CREATE TABLE tags (name TEXT PRIMARY KEY);
                  CREATE TABLE children (parent TEXT NOT NULL REFERENCES tags(name));
                  INSERT INTO log VALUES (3);",
        },
    ];
    const SCHEMA: Schema = Schema {
        store: Store::Pool,
        version_key: "test_version",
        version: 3,
        tables: TABLES,
        migrations: STEPS,
        quick_check: true,
    };
    const WAIT: Duration = Duration::from_millis(100);

    /// Writes a version-1 file at `path`, as version 1 made them.
    fn write_version_1(path: &Path) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE log (step INTEGER NOT NULL);
             CREATE TABLE notes (body TEXT NOT NULL);
             INSERT INTO notes VALUES ('kept');
             INSERT INTO meta VALUES ('test_version', '1');",
        )
        .unwrap();
    }

    fn meta(conn: &Connection, key: &str) -> Option<String> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .unwrap()
    }

    fn steps_run(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT step FROM log ORDER BY rowid").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn a_new_file_gets_the_tables_the_version_and_the_pragmas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.sqlite");
        let conn = SCHEMA.open(&path, WAIT).unwrap();
        assert_eq!(meta(&conn, "test_version").as_deref(), Some("3"));
        assert!(meta(&conn, "created_by")
            .unwrap()
            .starts_with("cairn-kernel "));
        assert_eq!(steps_run(&conn), Vec::<i64>::new());
        let pragma = |name: &str| -> String {
            conn.query_row(&format!("PRAGMA {name}"), [], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map(|v| match v {
                rusqlite::types::Value::Text(t) => t,
                rusqlite::types::Value::Integer(i) => i.to_string(),
                other => format!("{other:?}"),
            })
            .unwrap()
        };
        assert_eq!(pragma("journal_mode"), "wal");
        // NORMAL is 1.
        assert_eq!(pragma("synchronous"), "1");
        assert_eq!(pragma("foreign_keys"), "1");
        assert_eq!(pragma("busy_timeout"), "100");
        // Foreign keys are enforced.
        let err = conn
            .execute("INSERT INTO children VALUES ('nobody')", [])
            .unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(ErrorCode::ConstraintViolation)
        );
        // A second opening finds the same version and changes nothing.
        drop(conn);
        let conn = SCHEMA.open(&path, WAIT).unwrap();
        assert_eq!(SCHEMA.check(&conn, &path).unwrap(), Found::Version(3));
        let (_, version) = SCHEMA.open_read_only(&path, WAIT).unwrap();
        assert_eq!(version, 3);
    }

    #[test]
    fn an_in_memory_store_has_the_tables_and_foreign_keys() {
        let conn = SCHEMA.open_in_memory().unwrap();
        assert_eq!(meta(&conn, "test_version").as_deref(), Some("3"));
        assert!(conn
            .execute("INSERT INTO children VALUES ('nobody')", [])
            .is_err());
    }

    #[test]
    fn an_older_file_is_migrated_once_and_read_as_it_is_by_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite");
        write_version_1(&path);
        let before = std::fs::read(&path).unwrap();
        let (reader, version) = SCHEMA.open_read_only(&path, WAIT).unwrap();
        assert_eq!(version, 1);
        drop(reader);
        assert_eq!(std::fs::read(&path).unwrap(), before, "a reader migrated");

        let conn = SCHEMA.open(&path, WAIT).unwrap();
        assert_eq!(meta(&conn, "test_version").as_deref(), Some("3"));
        assert_eq!(steps_run(&conn), [2, 3]);
        let kept: (String, Option<String>) = conn
            .query_row("SELECT body, tag FROM notes", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(kept, ("kept".to_string(), None));
        drop(conn);
        let conn = SCHEMA.open(&path, WAIT).unwrap();
        assert_eq!(steps_run(&conn), [2, 3], "a migration step ran twice");
    }

    #[test]
    fn a_migration_starts_after_the_files_version() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE log (step INTEGER NOT NULL);
             CREATE TABLE notes (body TEXT NOT NULL, tag TEXT);
             INSERT INTO meta VALUES ('test_version', '2');",
        )
        .unwrap();
        SCHEMA.migrate(&conn, Path::new("v2.sqlite"), 2).unwrap();
        assert_eq!(steps_run(&conn), [3]);
        assert_eq!(meta(&conn, "test_version").as_deref(), Some("3"));
        assert_eq!(SCHEMA.oldest_readable(), 1);
    }

    #[test]
    fn a_failed_migration_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite");
        write_version_1(&path);
        // Version 3's table already there: step 3 fails after step 2 ran.
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE tags (name TEXT); PRAGMA journal_mode = DELETE;")
            .unwrap();
        let err = SCHEMA.open(&path, WAIT).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Pool {
                    doing: "migrating to 3",
                    ..
                }
            ),
            "{err}"
        );
        let conn = Connection::open(&path).unwrap();
        assert_eq!(meta(&conn, "test_version").as_deref(), Some("1"));
        assert_eq!(steps_run(&conn), Vec::<i64>::new());
        let columns: i64 = conn
            .query_row("SELECT count(*) FROM pragma_table_info('notes')", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(columns, 1, "step 2 was kept");
    }

    /// Opens `path` for writing and reading; both must fail with `check`, the file unchanged.
    fn expect_refused(path: &Path, check: impl Fn(&Error) -> bool) {
        let before = std::fs::read(path).unwrap();
        for err in [
            SCHEMA.open(path, WAIT).unwrap_err(),
            SCHEMA.open_read_only(path, WAIT).unwrap_err(),
        ] {
            assert!(check(&err), "{err}");
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
            assert_eq!(
                std::fs::read(path).unwrap(),
                before,
                "a refused file was changed"
            );
        }
    }

    #[test]
    fn a_newer_file_is_refused_naming_it_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("future.sqlite");
        drop(SCHEMA.open(&path, WAIT).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "UPDATE meta SET value = '4' WHERE key = 'test_version';
                 PRAGMA journal_mode = DELETE;",
            )
            .unwrap();
        expect_refused(&path, |e| {
            matches!(e, Error::PoolSchema { found, expected: 3, .. } if found == "4")
                && e.to_string()
                    .contains("open it with the cairn that wrote it")
        });
        // Older than the oldest step, or not a number: the same.
        for bad in ["0", "three"] {
            Connection::open(&path)
                .unwrap()
                .execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'test_version'",
                    [bad],
                )
                .unwrap();
            expect_refused(
                &path,
                |e| matches!(e, Error::PoolSchema { found, .. } if found == bad),
            );
        }
    }

    #[test]
    fn a_foreign_damaged_or_empty_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text.sqlite");
        std::fs::write(&text, "not a database at all").unwrap();
        expect_refused(&text, |e| e.to_string().contains("not an SQLite database"));

        // Another program's database, and one whose `meta` has no version of this store.
        for (name, tables) in [
            ("other.sqlite", "CREATE TABLE t (x);"),
            (
                "bank.sqlite",
                "CREATE TABLE meta (key, value); INSERT INTO meta VALUES ('schema_version', '2');",
            ),
        ] {
            let path = dir.path().join(name);
            Connection::open(&path)
                .unwrap()
                .execute_batch(tables)
                .unwrap();
            expect_refused(&path, |e| e.to_string().contains("not a Cairn data pool"));
        }

        // A store whose pages after the header were overwritten.
        let path = dir.path().join("damaged.sqlite");
        {
            let conn = SCHEMA.open(&path, WAIT).unwrap();
            for i in 0..400 {
                conn.execute(
                    "INSERT INTO notes (body) VALUES (?1)",
                    [format!("note number {i}")],
                )
                .unwrap();
            }
            conn.query_row("PRAGMA journal_mode = DELETE", [], |r| {
                r.get::<_, String>(0)
            })
            .unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 3 * 4096);
        bytes[4096..3 * 4096].fill(0xA5);
        std::fs::write(&path, &bytes).unwrap();
        expect_refused(&path, |e| matches!(e, Error::Pool { .. }));

        // An empty file: a reader refuses it (and does not create one where none is); a
        // writer makes it a store.
        let empty = dir.path().join("empty.sqlite");
        std::fs::write(&empty, "").unwrap();
        let err = SCHEMA.open_read_only(&empty, WAIT).unwrap_err();
        assert!(err.to_string().contains("an empty file"), "{err}");
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
        let missing = dir.path().join("missing.sqlite");
        let err = SCHEMA.open_read_only(&missing, WAIT).unwrap_err();
        assert!(matches!(err, Error::FileNotFound { .. }), "{err}");
        assert!(!missing.exists());
        SCHEMA.open(&empty, WAIT).unwrap();
    }

    #[test]
    fn each_store_gets_its_own_errors() {
        let path = Path::new("x.sqlite");
        let failure = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        let busy = || failure(rusqlite::ffi::SQLITE_BUSY);
        assert!(matches!(
            Store::Bank.sql(path, "writing")(busy()),
            Error::BankLocked { .. }
        ));
        assert!(matches!(
            Store::Pool.sql(path, "writing")(busy()),
            Error::Pool {
                doing: "writing",
                ..
            }
        ));
        let not_db = failure(rusqlite::ffi::SQLITE_NOTADB);
        assert!(matches!(
            Store::Bank.sql(path, "reading")(not_db),
            Error::BankCorrupt { .. }
        ));
        assert!(matches!(
            Store::Bank.other_version(path, "9".into(), 2),
            Error::BankSchema { expected: 2, .. }
        ));
    }
}
