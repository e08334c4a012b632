//! The plugin loader: scans plugin directories, opens every `.so` once, and indexes the
//! plugins by kind and name.
//!
//! Files that fail to load (a foreign library, a plugin built for another ABI) do not stop the
//! scan: they are kept as [`LoadError`]s, reported by path by `cairn plugins list`, and named
//! in the error when the plugin a pipeline asks for is missing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::host::foreign::{load_plugin, LoadError, LoadedPlugin};

use crate::error::{Error, Result};

/// Every plugin found in a set of directories.
#[derive(Debug, Default)]
pub struct PluginRegistry {
    dirs: Vec<PathBuf>,
    plugins: Vec<LoadedPlugin>,
    failures: Vec<LoadError>,
}

impl PluginRegistry {
    /// Scans `dirs` for `*.so` files and loads each one (one `dlopen` per file, in name order
    /// within a directory). A directory that does not exist is an error naming it.
    pub fn scan(dirs: &[PathBuf]) -> Result<Self> {
        let mut registry = PluginRegistry {
            dirs: dirs.to_vec(),
            ..Default::default()
        };
        let mut seen = BTreeSet::new();
        for dir in dirs {
            let entries = std::fs::read_dir(dir).map_err(|e| Error::Config {
                file: "plugins.dirs".into(),
                message: format!(
                    "plugin directory {}: {e}; build the plugins (cargo build --release) or fix `plugins.dirs`",
                    dir.display()
                ),
            })?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "so") && p.is_file())
                .collect();
            files.sort();
            for path in files {
                let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
                if !seen.insert(canonical) {
                    continue;
                }
                match load_plugin(&path) {
                    Ok(p) => {
                        if let Some(first) = registry.find(p.info.kind, &p.info.name) {
                            tracing::warn!(
                                plugin = %p.info.name,
                                kept = %first.path.display(),
                                ignored = %p.path.display(),
                                "duplicate plugin name, keeping the first"
                            );
                        } else {
                            registry.plugins.push(p);
                        }
                    }
                    Err(e) => registry.failures.push(e),
                }
            }
        }
        Ok(registry)
    }

    /// The directories scanned.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Loaded plugins, in scan order.
    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.plugins
    }

    /// Files that could not be loaded, with why.
    pub fn failures(&self) -> &[LoadError] {
        &self.failures
    }

    fn find(&self, kind: PluginKind, name: &str) -> Option<&LoadedPlugin> {
        self.plugins
            .iter()
            .find(|p| p.info.kind == kind && p.info.name == name)
    }

    /// The algorithm plugin called `name`, or an error listing what is available.
    pub fn algorithm(&self, name: &str) -> Result<&LoadedPlugin> {
        self.get(PluginKind::Algorithm, name)
    }

    /// The environment plugin called `name`, or an error listing what is available.
    pub fn environment(&self, name: &str) -> Result<&LoadedPlugin> {
        self.get(PluginKind::Environment, name)
    }

    fn get(&self, kind: PluginKind, name: &str) -> Result<&LoadedPlugin> {
        if let Some(other) = self
            .plugins
            .iter()
            .find(|p| p.info.kind != kind && p.info.name == name)
        {
            if self.find(kind, name).is_none() {
                return Err(Error::WrongPluginKind {
                    name: name.to_string(),
                    is: other.info.kind.as_str(),
                    wanted: kind.as_str(),
                });
            }
        }
        self.find(kind, name).ok_or_else(|| {
            let available: Vec<&str> = self
                .plugins
                .iter()
                .filter(|p| p.info.kind == kind)
                .map(|p| p.info.name.as_str())
                .collect();
            let mut available = if available.is_empty() {
                "none".to_string()
            } else {
                available.join(", ")
            };
            if !self.failures.is_empty() {
                let failed: Vec<String> = self.failures.iter().map(|f| f.to_string()).collect();
                available.push_str(&format!(
                    "; files that failed to load: {}",
                    failed.join("; ")
                ));
            }
            Error::MissingPlugin {
                kind: kind.as_str(),
                name: name.to_string(),
                dirs: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                available,
            }
        })
    }
}

/// The default plugin directories: `$CAIRN_PLUGIN_DIR` (colon-separated) when set, then the
/// directory holding the running executable (where cargo puts the workspace's plugin `.so`s).
pub fn default_dirs(exe: Option<&Path>, env_dirs: Option<&str>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env_dirs
        .map(|s| {
            s.split(':')
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push(dir.to_path_buf());
    }
    dirs
}

/// `configured` (a config's `plugins.dirs` or a `--dir` list) when non-empty, else
/// [`default_dirs`] of this process (its executable and `$CAIRN_PLUGIN_DIR`).
pub fn dirs_or_default(configured: &[PathBuf]) -> Vec<PathBuf> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let exe = std::env::current_exe().ok();
    default_dirs(
        exe.as_deref(),
        std::env::var("CAIRN_PLUGIN_DIR").ok().as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_directory_is_named() {
        let e = PluginRegistry::scan(&[PathBuf::from("/nonexistent/cairn-plugins")]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/cairn-plugins"), "{e}");
    }

    #[test]
    fn non_plugin_files_are_reported_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("libbogus.so");
        std::fs::write(&bogus, b"not an ELF file").unwrap();
        std::fs::write(dir.path().join("README.txt"), b"ignored").unwrap();
        let reg = PluginRegistry::scan(&[dir.path().to_path_buf()]).unwrap();
        assert!(reg.plugins().is_empty());
        assert_eq!(reg.failures().len(), 1);
        let msg = reg.failures()[0].to_string();
        assert!(msg.contains("libbogus.so"), "{msg}");
        let e = reg.algorithm("grpo").unwrap_err().to_string();
        assert!(
            e.contains("no algorithm plugin named `grpo`") && e.contains("libbogus.so"),
            "{e}"
        );
    }

    #[test]
    fn default_dirs_prefer_env_then_exe_dir() {
        let dirs = default_dirs(Some(Path::new("/opt/cairn/bin/cairn")), Some("/a:/b"));
        assert_eq!(
            dirs,
            vec![
                PathBuf::from("/a"),
                PathBuf::from("/b"),
                PathBuf::from("/opt/cairn/bin")
            ]
        );
    }
}
