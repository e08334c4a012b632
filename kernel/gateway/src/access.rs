//! The access keys of `[source]` (API and control keys, allowed Host and Origin values, weight
//! roots, request limits): their checks at config load, and where a weight directory may be.
//!
//! Enforcement is the host's (its HTTP layer reads the keys' environment variables and files
//! and checks every request); this module only says whether the values are usable, so
//! `cairn check` and `cairn train` refuse a bad `[source]` before anything starts.

use std::path::{Path, PathBuf};

use super::GatewayConfig;

/// A message naming the bad access key of `config`, or `None` when the values are usable.
pub fn problem(config: &GatewayConfig) -> Option<(&'static str, String)> {
    let keys = [
        (
            "source.api_key_env",
            &config.api_key_env,
            &config.api_key_file,
        ),
        (
            "source.control_key_env",
            &config.control_key_env,
            &config.control_key_file,
        ),
    ];
    for (key, env, file) in keys {
        if env.is_some() && file.is_some() {
            return Some((
                key,
                format!(
                    "give the key by an environment variable or by a file, not both (remove \
                     `{}` or `{}`)",
                    &key["source.".len()..],
                    key["source.".len()..].replace("_env", "_file")
                ),
            ));
        }
        if let Some(name) = env {
            if name.is_empty() || name.contains(['=', '\0']) || name.contains(char::is_whitespace) {
                return Some((
                    key,
                    format!("`{name}` is not an environment variable name (e.g. CAIRN_API_KEY)"),
                ));
            }
        }
        if file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            return Some((key, "the key file path is empty".into()));
        }
    }
    if !(config.body_timeout_s.is_finite() && config.body_timeout_s > 0.0) {
        return Some((
            "source.body_timeout_s",
            "must be > 0 (seconds a request body may take to arrive; default 60)".into(),
        ));
    }
    if config.max_connections_per_client == 0 {
        return Some((
            "source.max_connections_per_client",
            "must be at least 1 (default 256)".into(),
        ));
    }
    for host in &config.allowed_hosts {
        if let Err(why) = check_host(host) {
            return Some(("source.allowed_hosts", format!("`{host}`: {why}")));
        }
    }
    for origin in &config.allowed_origins {
        if let Err(why) = check_origin(origin) {
            return Some(("source.allowed_origins", format!("`{origin}`: {why}")));
        }
    }
    if config.weight_roots.iter().any(|r| r.as_os_str().is_empty()) {
        return Some(("source.weight_roots", "an empty path".into()));
    }
    None
}

/// `name` or `name:port`, as a `Host` header carries it (an IPv6 address in brackets).
fn check_host(host: &str) -> Result<(), &'static str> {
    let bad = |c: char| c.is_whitespace() || matches!(c, '/' | '@' | '?' | '#' | ',');
    if host.is_empty() || host.contains(bad) {
        return Err("give a host name or address, optionally with `:port` (no scheme or path)");
    }
    let port = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((_, "")) => None,
            Some((_, tail)) => Some(tail.strip_prefix(':').ok_or("expected `:port` after `]`")?),
            None => return Err("an IPv6 address needs its closing `]`"),
        },
        None => host.split_once(':').map(|(_, p)| p),
    };
    match port {
        Some(p) if p.parse::<u16>().is_err() => Err("the port is not a number up to 65535"),
        _ => Ok(()),
    }
}

/// `http://host[:port]` or `https://host[:port]`, as browsers send `Origin`.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or("an origin is `http://host:port` or `https://host:port` (no `*`)")?;
    check_host(rest.trim_end_matches('/'))
        .map_err(|_| "an origin is a scheme, a host and an optional port, no path")
}

/// Where a weight load may read: `dir` with its symlinks resolved, when that lies under one of
/// `roots` (themselves resolved); `None` for a directory outside them or one that is not there
/// (the same answer for both, so a client cannot probe the disk).
pub fn weight_dir_under(roots: &[PathBuf], dir: &Path) -> Option<PathBuf> {
    let resolved = std::fs::canonicalize(dir).ok()?;
    (resolved.is_dir() && roots.iter().any(|root| resolved.starts_with(root))).then_some(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(edit: impl FnOnce(&mut GatewayConfig), key: Option<&str>) {
        let mut config = GatewayConfig::default();
        edit(&mut config);
        assert_eq!(problem(&config).map(|(k, _)| k), key, "{config:?}");
    }

    #[test]
    fn access_keys_are_checked() {
        check(|_| {}, None);
        check(
            |c| {
                c.api_key_env = Some("CAIRN_API_KEY".into());
                c.control_key_file = Some("control.key".into());
                c.allowed_hosts = vec!["gpu-box".into(), "gpu-box:8400".into(), "[::1]:80".into()];
                c.allowed_origins = vec!["http://localhost:3000".into()];
            },
            None,
        );
        check(
            |c| {
                c.api_key_env = Some("A".into());
                c.api_key_file = Some("a.key".into());
            },
            Some("source.api_key_env"),
        );
        check(
            |c| c.control_key_env = Some("BAD NAME".into()),
            Some("source.control_key_env"),
        );
        check(|c| c.body_timeout_s = 0.0, Some("source.body_timeout_s"));
        check(
            |c| c.body_timeout_s = f64::NAN,
            Some("source.body_timeout_s"),
        );
        check(
            |c| c.max_connections_per_client = 0,
            Some("source.max_connections_per_client"),
        );
        for host in ["", "http://x", "x:99999", "[::1", "a b"] {
            check(
                |c| c.allowed_hosts = vec![host.into()],
                Some("source.allowed_hosts"),
            );
        }
        for origin in ["*", "localhost:3000", "http://x/path", "null"] {
            check(
                |c| c.allowed_origins = vec![origin.into()],
                Some("source.allowed_origins"),
            );
        }
    }

    #[test]
    fn weight_dirs_must_resolve_under_a_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("weights");
        std::fs::create_dir_all(root.join("v1")).unwrap();
        std::fs::create_dir_all(tmp.path().join("elsewhere")).unwrap();
        let roots = vec![std::fs::canonicalize(&root).unwrap()];
        assert!(weight_dir_under(&roots, &root.join("v1")).is_some());
        assert!(weight_dir_under(&roots, &root.join("v1/../../elsewhere")).is_none());
        assert!(weight_dir_under(&roots, &tmp.path().join("elsewhere")).is_none());
        assert!(weight_dir_under(&roots, &root.join("missing")).is_none());
        assert!(weight_dir_under(&[], &root.join("v1")).is_none());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("elsewhere"), root.join("link")).unwrap();
            assert!(weight_dir_under(&roots, &root.join("link")).is_none());
        }
    }
}
