//! The one way `cairn` writes a file a command was asked to write: `eval --record`,
//! `pool export -o`, `bank export --out`, `serve --record`, `compare --out` and `plot`'s
//! `curves.png` all go through an [`Output`].
//!
//! Before anything is written, [`Output::check`] looks at the path without opening it (so a
//! FIFO never blocks): it must be a new path in an existing directory, or an existing regular
//! file. Refused always, `--force` or not: a directory, a device, a FIFO, a socket, a symbolic
//! link (`cairn` never writes through a link to somewhere else, nor replaces the link: give
//! the file's own path), any SQLite database, and the run's own stores ([`Output::stores`]:
//! the data pool, the bank), recognised by identity (device and inode, so also through a hard
//! link or another spelling of the path) and, with their `-wal`, `-shm` and `-journal` files,
//! by canonical path. An existing regular file is refused unless the command was told what to
//! do with it ([`Existing`]: `--force` replaces it, `serve --record --append` adds to it).
//!
//! [`Output::write`] writes a temporary file in the same directory (created new, never through
//! a link), syncs it, checks the path again and renames it over the path: the file is written
//! whole or not at all, and a refused or failed write leaves the path as it was.
//! [`Output::open_append`] opens the path once for a long-running command that appends.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};

/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The files SQLite keeps beside a database; writing one of them corrupts the database.
const STORE_COMPANIONS: [&str; 4] = ["", "-wal", "-shm", "-journal"];

/// What may happen to an existing regular file at the output path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Refused, with an error that names `--force`.
    Refuse,
    /// Replaced whole (`--force`, or a file the command owns, such as `RUN_DIR/curves.png`).
    Replace,
    /// Appended to (`cairn serve --record FILE --append`).
    Append,
}

impl Existing {
    /// [`Existing::Replace`] with `--force`, else [`Existing::Refuse`].
    pub fn replace_if(force: bool) -> Existing {
        if force {
            Existing::Replace
        } else {
            Existing::Refuse
        }
    }
}

/// A file a command was asked to write.
pub struct Output<'a> {
    /// How the command names the path in errors: its flag (`--record`, `-o`) or, for a fixed
    /// path, what it is.
    pub flag: &'a str,
    pub path: &'a Path,
    /// Databases this output must never be (the run's pool and bank, the store the command
    /// reads); they need not exist.
    pub stores: &'a [PathBuf],
    pub existing: Existing,
}

/// What [`Output::check`] found at the path.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing: the file will be created.
    New,
    /// A regular file that [`Output::existing`] allows to replace or append to.
    File,
}

impl Output<'_> {
    /// Refuses a path this output must not be written to (see the module docs); reads
    /// nothing but metadata and, for an existing regular file, its first 16 bytes.
    pub fn check(&self) -> Result<Found> {
        self.check_with("pass --force to replace it")
    }

    /// [`Output::check`]; `hint` says how to allow an existing file.
    fn check_with(&self, hint: &str) -> Result<Found> {
        let (flag, path) = (self.flag, self.path.display());
        let Some(name) = self.path.file_name() else {
            bail!("{flag} {path}: not a file name; give the path of a file");
        };
        let dir = parent(self.path);
        let canonical_dir = dir.canonicalize().with_context(|| {
            format!(
                "{flag} {path}: its directory {} cannot be used; create it or give another \
                 path",
                dir.display()
            )
        })?;
        if !canonical_dir.is_dir() {
            bail!(
                "{flag} {path}: {} is not a directory; give another path",
                dir.display()
            );
        }
        let link = match std::fs::symlink_metadata(self.path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("{flag} {path}")),
        };
        // The metadata of what the path reaches (through a link too).
        let target = match &link {
            Some(meta) if meta.file_type().is_symlink() => std::fs::metadata(self.path).ok(),
            other => other.clone(),
        };
        self.check_stores(&canonical_dir.join(name), target.as_ref())?;
        let Some(link) = link else {
            return Ok(Found::New);
        };
        if link.file_type().is_symlink() {
            let to = std::fs::read_link(self.path)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".into());
            bail!(
                "{flag} {path}: a symbolic link (to {to}); cairn never writes through a link nor \
                 replaces one: give the path of the file itself, or of a new file"
            );
        }
        if !link.is_file() {
            bail!(
                "{flag} {path}: {}, not a regular file; cairn writes only regular files: give \
                 the path of a new file",
                kind(&link)
            );
        }
        let mut head = Vec::with_capacity(SQLITE_HEADER.len());
        // Non-blocking and not through a link, in case the path changed since the look above.
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(self.path)
            .and_then(|f| f.take(SQLITE_HEADER.len() as u64).read_to_end(&mut head))
            .with_context(|| format!("{flag} {path}: reading its first bytes"))?;
        if head == SQLITE_HEADER {
            bail!(
                "{flag} {path}: an existing SQLite database (a data pool or a bank?); it is \
                 never overwritten, even with --force: give another output path"
            );
        }
        match self.existing {
            Existing::Refuse => bail!(
                "{flag} {path}: the file exists ({} bytes); {hint}, or give another path",
                link.len()
            ),
            Existing::Replace | Existing::Append => Ok(Found::File),
        }
    }

    /// Refuses the path when it is one of [`Output::stores`] (or one of their SQLite
    /// companion files): by identity when both exist, else by canonical path.
    fn check_stores(&self, lexical: &Path, target: Option<&Metadata>) -> Result<()> {
        let resolved = self.path.canonicalize().ok();
        for store in self.stores {
            let same_file = match (target, std::fs::metadata(store)) {
                (Some(out), Ok(db)) => out.dev() == db.dev() && out.ino() == db.ino(),
                _ => false,
            };
            let same_name = canonical_store(store).is_some_and(|(dir, name)| {
                STORE_COMPANIONS.iter().any(|suffix| {
                    let companion = dir.join(format!("{name}{suffix}"));
                    companion == lexical || resolved.as_ref() == Some(&companion)
                })
            });
            if same_file || same_name {
                bail!(
                    "{} {}: that is {} (or one of its -wal/-shm/-journal files), a store of \
                     the run that this command must not write, even with --force; give another \
                     output path",
                    self.flag,
                    self.path.display(),
                    store.display()
                );
            }
        }
        Ok(())
    }

    /// Writes what `write` writes to the path, whole or not at all (see the module docs).
    pub fn write(&self, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
        self.write_via_path(|tmp| {
            let file = OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(tmp)
                .with_context(|| format!("opening {}", tmp.display()))?;
            let mut w = BufWriter::new(file);
            write(&mut w)?;
            w.into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", tmp.display()))?;
            Ok(())
        })
    }

    /// Like [`Output::write`], for a writer that wants a path (plotters): `write` writes the
    /// temporary file it is given, a new empty regular file with the path's extension.
    pub fn write_via_path(&self, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        debug_assert_ne!(
            self.existing,
            Existing::Append,
            "an appended output is opened with open_append"
        );
        self.check()?;
        let tmp = self.temporary();
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| {
                format!(
                    "{} {}: creating the temporary file {}",
                    self.flag,
                    self.path.display(),
                    tmp.display()
                )
            })?;
        let result = (|| -> Result<()> {
            write(&tmp)?;
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("writing {}", tmp.display()))?;
            // The path may have changed while the output was made (a long evaluation).
            self.check()?;
            std::fs::rename(&tmp, self.path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), self.path.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.with_context(|| format!("writing {} (left as it was)", self.path.display()))?;
        // Best effort: the rename is durable once the directory is synced.
        if let Ok(dir) = File::open(parent(self.path)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// Opens the path once for appending ([`Existing::Append`]) or as a new file, after
    /// [`Output::check`]; never through a link, and never blocking on a FIFO put there since.
    pub fn open_append(&self) -> Result<File> {
        let found = self.check_with("pass --append to add to it")?;
        let mut options = OpenOptions::new();
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        match found {
            Found::New => options.write(true).create_new(true),
            Found::File => options.append(true),
        };
        let file = options
            .open(self.path)
            .with_context(|| format!("{} {}: opening it", self.flag, self.path.display()))?;
        let meta = file
            .metadata()
            .with_context(|| format!("{} {}", self.flag, self.path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} {}: {} appeared there; give the path of a regular file",
                self.flag,
                self.path.display(),
                kind(&meta)
            );
        }
        self.check_stores(self.path, Some(&meta))?;
        Ok(file)
    }

    /// `.NAME.PID-N.tmp.EXT` beside the path: hidden, unique in this process, and with the
    /// path's extension (plotters picks the image format from it).
    fn temporary(&self) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let ext = self
            .path
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        parent(self.path).join(format!(
            ".{name}.{}-{}.tmp{ext}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

/// The stores of a run (or checkpoint) directory that no output may be: its data pool and its
/// bank.
pub fn run_stores(run_dir: &Path) -> Vec<PathBuf> {
    vec![
        cairn_stores::pool::pool_path(run_dir),
        cairn_stores::bank::bank_path(run_dir),
    ]
}

/// The directory of `path` (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The canonical directory and the file name of a store (which need not exist).
fn canonical_store(store: &Path) -> Option<(PathBuf, String)> {
    let canonical = store.canonicalize().ok();
    let (dir, name) = match &canonical {
        Some(c) => (c.parent()?.to_path_buf(), c.file_name()?),
        None => (parent(store).canonicalize().ok()?, store.file_name()?),
    };
    Some((dir, name.to_string_lossy().into_owned()))
}

/// What a non-regular file is, for errors.
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory with a store (`pool.sqlite`, a real SQLite header) and a text file.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("pool.sqlite");
        let mut bytes = SQLITE_HEADER.to_vec();
        bytes.extend_from_slice(&[0; 84]);
        std::fs::write(&store, &bytes).unwrap();
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, "mine\n").unwrap();
        (dir, store, notes)
    }

    /// The error of writing "new\n" to `path`, or `None` when it was written.
    fn check(path: &Path, stores: &[PathBuf], existing: Existing) -> Option<String> {
        Output {
            flag: "-o",
            path,
            stores,
            existing,
        }
        .write(|w| Ok(w.write_all(b"new\n")?))
        .err()
        .map(|e| format!("{e:#}"))
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_new_path_is_written_and_no_temporary_file_is_left() {
        let (dir, store, _) = setup();
        let out = dir.path().join("out.jsonl");
        assert_eq!(check(&out, &[store], Existing::Refuse), None);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new\n");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["notes.txt", "out.jsonl", "pool.sqlite"]);
    }

    #[test]
    fn an_existing_file_is_replaced_only_when_allowed() {
        let (_dir, store, notes) = setup();
        let stores = [store];
        let err = check(&notes, &stores, Existing::Refuse).unwrap();
        assert!(
            err.contains("the file exists (5 bytes); pass --force"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
        // An empty file is a file too.
        std::fs::write(&notes, "").unwrap();
        assert!(check(&notes, &stores, Existing::Refuse).is_some());
        assert_eq!(check(&notes, &stores, Existing::Replace), None);
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "new\n");
    }

    #[test]
    fn stores_are_refused_by_identity_and_by_name_even_when_forced() {
        let (dir, store, _) = setup();
        let before = std::fs::read(&store).unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&store, &link).unwrap();
        let hard = dir.path().join("hard.jsonl");
        std::fs::hard_link(&store, &hard).unwrap();
        let dotted = dir.path().join(".").join("pool.sqlite");
        let wal = dir.path().join("pool.sqlite-wal");
        // A store that does not exist yet is refused by name.
        let bank = dir.path().join("bank.sqlite");
        let stores = [store.clone(), bank.clone()];
        for path in [&store, &link, &hard, &dotted, &wal, &bank] {
            let err = check(path, &stores, Existing::Replace).unwrap();
            assert!(
                err.contains("a store of the run") && err.contains("another output path"),
                "{path:?}: {err}"
            );
        }
        assert_eq!(std::fs::read(&store).unwrap(), before);
        assert!(!wal.exists() && !bank.exists());
        // Another SQLite database: never overwritten either.
        let copy = dir.path().join("copy.sqlite");
        std::fs::write(&copy, &before).unwrap();
        let err = check(&copy, &stores, Existing::Replace).unwrap();
        assert!(err.contains("SQLite database"), "{err}");
    }

    #[test]
    fn links_directories_and_special_files_are_refused_even_when_forced() {
        let (dir, _, notes) = setup();
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink(&notes, &link).unwrap();
        let dangling = dir.path().join("dangling.txt");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let null = Path::new("/dev/null");
        for (path, says) in [
            (&*link, "a symbolic link (to "),
            (&*dangling, "a symbolic link (to "),
            (&*fifo, "a FIFO (named pipe), not a regular file"),
            (&*socket, "a socket, not a regular file"),
            (dir.path(), "a directory, not a regular file"),
            (null, "a character device, not a regular file"),
        ] {
            for existing in [Existing::Replace, Existing::Append] {
                let output = Output {
                    flag: "--out",
                    path,
                    stores: &[],
                    existing,
                };
                let err = format!("{:#}", output.check().unwrap_err());
                assert!(err.contains(says), "{path:?}: {err}");
                let err = format!("{:#}", output.open_append().unwrap_err());
                assert!(err.contains(says), "{path:?}: {err}");
            }
            assert!(check(path, &[], Existing::Replace).is_some());
        }
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(std::fs::metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn a_missing_directory_or_no_file_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = check(&dir.path().join("no/such/x.json"), &[], Existing::Refuse).unwrap();
        assert!(err.contains("-o ") && err.contains("no/such"), "{err}");
        let err = check(Path::new("/"), &[], Existing::Replace).unwrap();
        assert!(err.contains("not a file name"), "{err}");
    }

    #[test]
    fn a_failed_write_leaves_the_file_as_it_was() {
        let (dir, _, notes) = setup();
        let err = Output {
            flag: "-o",
            path: &notes,
            stores: &[],
            existing: Existing::Replace,
        }
        .write(|w| {
            w.write_all(b"half")?;
            bail!("the source failed")
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("the source failed"), "{err:#}");
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
        // No temporary file left beside the pool and the notes.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn append_adds_to_an_existing_file_or_creates_one() {
        let (dir, store, notes) = setup();
        let output = |path, existing| Output {
            flag: "--record",
            path,
            stores: std::slice::from_ref(&store),
            existing,
        };
        let err = format!(
            "{:#}",
            output(&notes, Existing::Refuse).open_append().unwrap_err()
        );
        assert!(
            err.contains("the file exists (5 bytes); pass --append"),
            "{err}"
        );
        let mut f = output(&notes, Existing::Append).open_append().unwrap();
        f.write_all(b"more\n").unwrap();
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\nmore\n");
        let new = dir.path().join("episodes.jsonl");
        let mut f = output(&new, Existing::Refuse).open_append().unwrap();
        f.write_all(b"one\n").unwrap();
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "one\n");
        assert!(output(&store, Existing::Append).open_append().is_err());
    }
}
