//! Who may call the gateway and the dashboard: API keys, Host and Origin checks, the request
//! body's deadline and size, and a cap on the connections of one client (docs/gateway.md,
//! "Security").
//!
//! [`Access`] is built at start-up from `[source]` and `cairn serve`'s key flags
//! ([`Access::gateway`]) or from `cairn ui`'s flags ([`Access::dashboard`]); it reads the
//! keys' environment variables and files there, and refuses to serve off loopback without a
//! key. [`guard`] runs before every route, in this
//! order, answering an OpenAI-style error and running no handler when a check fails:
//!
//! 1. the client's connection count ([`Access::on_connect`] counts them per peer address): 429;
//! 2. `Host` is the bound address, `localhost`, `127.0.0.1` or `[::1]` at the bound port (or
//!    without a port), the address the client connected to, or an `allowed_hosts` entry: a
//!    page of another domain that resolves to this machine (DNS rebinding) gets 403;
//! 3. `Origin`, when sent, is the server's own or an `allowed_origins` entry (a web page in
//!    the user's browser posting to a local gateway): 403. Allowed origins get CORS headers
//!    and their preflights are answered; no CORS header otherwise;
//! 4. the key: `Authorization: Bearer KEY`, `x-api-key: KEY` or HTTP Basic with KEY as the
//!    password (browsers, for the dashboard), compared in constant time as SHA-256 digests.
//!    The control routes ([`Tier::Control`]) take only the control key: 401 without a known
//!    key, 403 with the API key;
//! 5. a POST is `Content-Type: application/json` (no form or `text/plain` post): 415;
//! 6. the body is read whole within `body_timeout_s` and [`BODY_LIMIT`]: 408 or 413, and the
//!    connection is closed.
//!
//! With no key configured and a loopback bind every route is open, as before keys existed;
//! the Host, Origin, Content-Type and body checks apply always.

use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{Extensions, ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{HttpMessage, HttpResponse};
use anyhow::{Context, Result};
use base64::Engine as _;
use cairn_gateway::{ApiError, ApiErrorKind, GatewayConfig};
use futures::StreamExt;
use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// Largest request body, bytes.
pub const BODY_LIMIT: usize = 32 << 20;

/// Shortest key accepted: a guessable key is no key.
const MIN_KEY_CHARS: usize = 16;

/// Where a key comes from.
#[derive(Clone, Debug)]
pub enum KeySource {
    /// An environment variable, by name.
    Env(String),
    /// A file holding the key on its first line.
    File(PathBuf),
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Sampling and reading the model: the API key or the control key.
    Inference,
    /// Changing what is trained on or served, or reading the episodes and runs (weight
    /// loading, episode open, reward, close and view, the dashboard): the control key only.
    Control,
}

/// The tier of a request path. Only the inference routes are listed; every other path (the
/// control routes, the dashboard, unknown paths) needs the control key.
pub fn tier(path: &str) -> Tier {
    const INFERENCE: [&str; 5] = [
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/health",
        "/tokenize",
    ];
    let in_episode = path
        .strip_prefix("/episodes/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(id, rest)| {
            !id.is_empty() && INFERENCE[..3].contains(&format!("/{rest}").as_str())
        });
    if in_episode || INFERENCE.contains(&path) {
        Tier::Inference
    } else {
        Tier::Control
    }
}

type KeyDigest = [u8; 32];

/// Which server an [`Access`] guards: decides how its messages name the settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Gateway,
    Dashboard,
}

/// The access rules of one server (module docs).
pub struct Access {
    server: Server,
    api: Option<KeyDigest>,
    control: Option<KeyDigest>,
    /// Allowed `Host` values, lower-case: name and port (`None`: any port).
    hosts: Vec<(String, Option<u16>)>,
    /// Allowed `Origin` values, lower-case, without a trailing `/`.
    origins: Vec<String>,
    body_timeout: Duration,
    max_connections: usize,
    /// Open connections per client address.
    connections: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// `cairn serve --api-key-env NAME --control-key-env NAME`: key variables given on the
/// command line, which take the place of `[source]`'s (so a config whose source is the
/// environment can be served off loopback unedited).
#[derive(Clone, Debug, Default)]
pub struct KeyFlags {
    pub api_key_env: Option<String>,
    pub control_key_env: Option<String>,
}

impl Access {
    /// The gateway's rules from `[source]` and `flags`, for a server about to bind `bind`
    /// (checked before the socket is opened; [`Access::serving_at`] then adds the bound
    /// address). Errors: a key's variable is unset or its file unreadable, a key is too short,
    /// or an address of `bind` is not loopback and no key is configured.
    pub fn gateway(
        config: &GatewayConfig,
        flags: &KeyFlags,
        bind: &[SocketAddr],
    ) -> Result<Access> {
        let source = |flag: &Option<String>,
                      flag_name: &'static str,
                      env: &Option<String>,
                      file: &Option<PathBuf>,
                      setting: &'static str| {
            match (flag, env, file) {
                (Some(name), _, _) => Some((KeySource::Env(name.clone()), flag_name)),
                (None, Some(name), _) => Some((KeySource::Env(name.clone()), setting)),
                (None, None, Some(path)) => Some((KeySource::File(path.clone()), setting)),
                (None, None, None) => None,
            }
        };
        let api = source(
            &flags.api_key_env,
            "--api-key-env",
            &config.api_key_env,
            &config.api_key_file,
            "[source] api_key_env / api_key_file",
        )
        .map(|(s, setting)| load_key(&s, setting))
        .transpose()?;
        let control = source(
            &flags.control_key_env,
            "--control-key-env",
            &config.control_key_env,
            &config.control_key_file,
            "[source] control_key_env / control_key_file",
        )
        .map(|(s, setting)| load_key(&s, setting))
        .transpose()?;
        let open = bind.iter().find(|a| !a.ip().is_loopback());
        if let Some(addr) = open.filter(|_| api.is_none() && control.is_none()) {
            anyhow::bail!(
                "gateway: refusing to serve on {addr} without an API key: it is not a loopback \
                 address, so anyone who can reach the port could sample, post rewards and load \
                 weights. Export two keys (`export CAIRN_API_KEY=$(openssl rand -hex 32) \
                 CAIRN_CONTROL_KEY=$(openssl rand -hex 32)`) and name them: `cairn serve ... \
                 --api-key-env CAIRN_API_KEY --control-key-env CAIRN_CONTROL_KEY` (any \
                 config), or in a gateway source (`cairn train`, or `cairn serve` of such a \
                 config): `[source]` with `kind = \"gateway\"`, `api_key_env = \
                 \"CAIRN_API_KEY\"` and `control_key_env = \"CAIRN_CONTROL_KEY\"` \
                 (docs/gateway.md, \"Security\"). Or bind 127.0.0.1 (`--bind \
                 127.0.0.1:PORT`, `source.bind`)"
            );
        }
        Access::new(
            Server::Gateway,
            api,
            control,
            &config.allowed_hosts,
            &config.allowed_origins,
            Duration::from_secs_f64(config.body_timeout_s),
            config.max_connections_per_client,
        )
    }

    /// `cairn ui`'s rules: `key` guards every page (`--key-env` or `--key-file`), `hosts` are
    /// the `--allow-host` values. Off loopback a key is required.
    pub fn dashboard(
        key: Option<KeySource>,
        hosts: &[String],
        bind: &[SocketAddr],
    ) -> Result<Access> {
        let control = key
            .map(|s| load_key(&s, "--key-env / --key-file"))
            .transpose()?;
        let open = bind.iter().find(|a| !a.ip().is_loopback());
        if let Some(addr) = open.filter(|_| control.is_none()) {
            anyhow::bail!(
                "dashboard: refusing to serve on {addr} without a key: it is not a loopback \
                 address, so anyone who can reach the port could read the runs. Give \
                 `--key-env CAIRN_UI_KEY` (and `export CAIRN_UI_KEY=$(openssl rand -hex 32)`; \
                 the browser asks for it as the password) or `--key-file PATH`, or serve on \
                 `--host 127.0.0.1`"
            );
        }
        Access::new(
            Server::Dashboard,
            None,
            control,
            hosts,
            &[],
            Duration::from_secs(60),
            256,
        )
    }

    fn new(
        server: Server,
        api: Option<KeyDigest>,
        control: Option<KeyDigest>,
        extra_hosts: &[String],
        origins: &[String],
        body_timeout: Duration,
        max_connections: usize,
    ) -> Result<Access> {
        let hosts = extra_hosts
            .iter()
            .map(|extra| {
                parse_host(extra).with_context(|| {
                    format!(
                        "allowed host `{extra}`: give a host name or address, optionally with \
                         `:port`"
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok(Access {
            server,
            api,
            control,
            hosts,
            origins: origins.iter().map(|o| normalise_origin(o)).collect(),
            body_timeout,
            max_connections,
            connections: Arc::default(),
        })
    }

    /// These rules for the server bound at `addr`: its address, `localhost`, `127.0.0.1` and
    /// `[::1]` at its port are served `Host` values.
    pub fn serving_at(mut self, addr: SocketAddr) -> Access {
        let port = addr.port();
        let mut local = vec![host_of(addr.ip())];
        local.retain(|_| !addr.ip().is_unspecified());
        local.extend(["localhost", "127.0.0.1", "[::1]"].map(String::from));
        self.hosts
            .extend(local.into_iter().map(|h| (h, Some(port))));
        self
    }

    /// The `on_connect` hook of the server: counts the connection of its peer address for as
    /// long as it is open (the count drops with the connection's state).
    pub fn on_connect(&self) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync + 'static {
        let connections = self.connections.clone();
        let max = self.max_connections;
        move |conn, extensions| {
            let Some(stream) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() else {
                return;
            };
            let Ok(peer) = stream.peer_addr() else { return };
            let open = {
                let mut counts = connections.lock();
                let n = counts.entry(peer.ip()).or_insert(0);
                *n += 1;
                *n
            };
            extensions.insert(Connection {
                peer: peer.ip(),
                local: stream.local_addr().ok(),
                over_cap: open > max,
                connections: connections.clone(),
            });
        }
    }

    fn setting(&self, key: &str) -> String {
        match self.server {
            Server::Gateway => format!("`[source] {key}`"),
            Server::Dashboard => match key {
                "allowed_hosts" => "`--allow-host`".into(),
                "api_key_env" | "control_key_env" => "`--key-env` / `--key-file`".into(),
                _ => format!("the dashboard's fixed `{key}`"),
            },
        }
    }

    /// Steps 1–5 of the module docs. `Ok(origin)`: the request may go on, and gets CORS
    /// headers for `origin` when that is an allowed cross-origin page.
    fn check(&self, req: &ServiceRequest) -> Result<Option<String>, ApiError> {
        let connection = req.conn_data::<Connection>();
        if let Some(c) = connection.filter(|c| c.over_cap) {
            return Err(ApiError::new(
                ApiErrorKind::TooManyRequests,
                format!(
                    "more than {} open connections from {}: close idle ones or raise {}",
                    self.max_connections,
                    c.peer,
                    self.setting("max_connections_per_client")
                ),
            )
            .with_code("too_many_connections"));
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !self.host_allowed(host, connection.and_then(|c| c.local)) {
            return Err(ApiError::new(
                ApiErrorKind::Forbidden,
                format!(
                    "Host `{host}` is not served here: call the address the server printed \
                     (or localhost), or list the name in {}",
                    self.setting("allowed_hosts")
                ),
            )
            .with_code("host_not_allowed"));
        }
        let mut cors = None;
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let origin = normalise_origin(origin.to_str().unwrap_or("(not text)"));
            let same = origin == format!("http://{}", host.to_ascii_lowercase());
            if self.origins.contains(&origin) {
                cors = Some(origin);
            } else if !same {
                return Err(ApiError::new(
                    ApiErrorKind::Forbidden,
                    format!(
                        "requests from the web page at {origin} are refused (a page in a \
                         browser must not drive this server); list its origin in {} to allow it",
                        self.setting("allowed_origins")
                    ),
                )
                .with_code("origin_not_allowed"));
            }
        }
        if cors.is_some() && req.method() == Method::OPTIONS {
            return Ok(cors);
        }
        self.check_key(req)?;
        if req.method() == Method::POST && !is_json(req) {
            return Err(ApiError::new(
                ApiErrorKind::UnsupportedMediaType,
                "send the body as JSON with the header `Content-Type: application/json`",
            )
            .with_code("unsupported_media_type"));
        }
        Ok(cors)
    }

    fn check_key(&self, req: &ServiceRequest) -> Result<(), ApiError> {
        if self.api.is_none() && self.control.is_none() {
            return Ok(());
        }
        let presented = presented_key(req).map(|k| digest(k.as_bytes()));
        let matches = |key: &Option<KeyDigest>| match (key, &presented) {
            (Some(key), Some(p)) => bool::from(key.ct_eq(p)),
            _ => false,
        };
        let (is_api, is_control) = (matches(&self.api), matches(&self.control));
        let keys = self.setting("api_key_env");
        match tier(req.path()) {
            _ if is_control => Ok(()),
            Tier::Inference if is_api => Ok(()),
            Tier::Control if is_api => Err(ApiError::new(
                ApiErrorKind::Forbidden,
                format!(
                    "{} {} is a control route: it takes the control key ({}), not the API key",
                    req.method(),
                    req.path(),
                    self.setting("control_key_env")
                ),
            )
            .with_code("control_key_required")),
            _ if presented.is_none() => Err(ApiError::new(
                ApiErrorKind::Unauthorized,
                format!(
                    "no API key: send `Authorization: Bearer KEY` or `x-api-key: KEY` (the key \
                     is the value {keys} names)"
                ),
            )
            .with_code("missing_api_key")),
            _ => Err(ApiError::new(
                ApiErrorKind::Unauthorized,
                format!("the API key is not one this server takes (see {keys})"),
            )
            .with_code("invalid_api_key")),
        }
    }

    fn host_allowed(&self, host: &str, local: Option<SocketAddr>) -> bool {
        let Ok((name, port)) = parse_host(host) else {
            return false;
        };
        // A `Host` without a port is matched by name: browsers always send the port of a
        // non-default one, so only other clients leave it out (a rebinding page's `Host` is its
        // own domain's name, refused by name).
        let fits =
            |h: &str, p: Option<u16>| h == name && (port.is_none() || p.is_none() || p == port);
        local.is_some_and(|a| fits(&host_of(a.ip()), Some(a.port())))
            || self.hosts.iter().any(|(h, p)| fits(h, *p))
    }

    /// The CORS answer to a preflight from an allowed origin.
    fn preflight(origin: &str) -> HttpResponse {
        HttpResponse::NoContent()
            .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin))
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST"))
            .insert_header((
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "authorization, x-api-key, content-type, x-cairn-episode, x-cairn-anchor",
            ))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, "600"))
            .insert_header((header::VARY, "Origin"))
            .finish()
    }

    /// The whole body within the deadline and [`BODY_LIMIT`].
    async fn read_body(&self, req: &mut ServiceRequest) -> Result<Bytes, ApiError> {
        let too_large = || {
            ApiError::new(
                ApiErrorKind::TooLarge,
                format!("the request body is larger than {BODY_LIMIT} bytes"),
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
            return Err(too_large());
        }
        let mut payload = req.take_payload();
        let read = async {
            let mut body = BytesMut::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|e| {
                    ApiError::invalid("body", format!("could not read the request body: {e}"))
                })?;
                if body.len() + chunk.len() > BODY_LIMIT {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body.freeze())
        };
        match actix_web::rt::time::timeout(self.body_timeout, read).await {
            Ok(read) => read,
            Err(_) => Err(ApiError::new(
                ApiErrorKind::Timeout,
                format!(
                    "the request body did not arrive within {} s ({})",
                    self.body_timeout.as_secs_f64(),
                    self.setting("body_timeout_s")
                ),
            )
            .with_code("body_timeout")),
        }
    }
}

/// A counted connection (the `on_connect` state of one TCP connection).
struct Connection {
    peer: IpAddr,
    /// The address the client connected to (the server's, on the interface it used).
    local: Option<SocketAddr>,
    /// Opened while its peer already held the most connections allowed.
    over_cap: bool,
    connections: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut counts = self.connections.lock();
        if let Some(n) = counts.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// The middleware of every route (module docs). `access` is the server's.
pub async fn guard(
    access: Arc<Access>,
    mut req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let cors = match access.check(&req) {
        Ok(cors) => cors,
        Err(e) => return Ok(refuse(req, &e)),
    };
    if let Some(origin) = cors.as_deref().filter(|_| req.method() == Method::OPTIONS) {
        let response = Access::preflight(origin);
        return Ok(req.into_response(response));
    }
    match access.read_body(&mut req).await {
        Ok(body) => req.set_payload(body.into()),
        Err(e) => return Ok(refuse(req, &e)),
    }
    let mut response = next.call(req).await?.map_into_boxed_body();
    if let Some(origin) = cors {
        let headers = response.headers_mut();
        if let Ok(value) = header::HeaderValue::from_str(&origin) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.insert(header::VARY, header::HeaderValue::from_static("Origin"));
        }
    }
    Ok(response)
}

/// The error response of a refused request. Its connection is closed when the body may be
/// left unread or the client holds too many; a 401 asks browsers for the key (HTTP Basic).
fn refuse(req: ServiceRequest, e: &ApiError) -> ServiceResponse<BoxBody> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    tracing::debug!(status = status.as_u16(), path = req.path(), error = %e.message, "request refused");
    let mut response = HttpResponse::build(status);
    if matches!(
        e.kind,
        ApiErrorKind::TooManyRequests | ApiErrorKind::Timeout | ApiErrorKind::TooLarge
    ) {
        response.force_close();
    }
    if e.kind == ApiErrorKind::Unauthorized {
        response.insert_header((header::WWW_AUTHENTICATE, "Basic realm=\"cairn\""));
    }
    let response = response.json(e.to_json());
    req.into_response(response)
}

/// The key a request carries: `Authorization: Bearer KEY`, `x-api-key: KEY`, or HTTP Basic
/// with the key as password.
fn presented_key(req: &ServiceRequest) -> Option<String> {
    let headers = req.headers();
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let (scheme, value) = auth.trim().split_once(' ')?;
        let value = value.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(value.to_owned());
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(value)
                .ok()?;
            let decoded = String::from_utf8(decoded).ok()?;
            return decoded
                .split_once(':')
                .map(|(_, password)| password.to_owned());
        }
        return None;
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
}

fn is_json(req: &ServiceRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        })
}

fn digest(bytes: &[u8]) -> KeyDigest {
    Sha256::digest(bytes).into()
}

/// Reads a key and checks it is usable in a header; `setting` names where it is configured.
fn load_key(source: &KeySource, setting: &str) -> Result<KeyDigest> {
    let (key, place) = match source {
        KeySource::Env(name) => match std::env::var(name) {
            Ok(key) => (key, format!("the environment variable {name}")),
            Err(_) => anyhow::bail!(
                "{setting}: the environment variable {name} is not set (or not UTF-8): export \
                 it before starting, e.g. `export {name}=$(openssl rand -hex 32)`, and give \
                 clients the same key"
            ),
        },
        KeySource::File(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "{setting}: reading the key file {}; write one with `openssl rand -hex 32 > \
                     {}` (readable by this user only)",
                    path.display(),
                    path.display()
                )
            })?;
            let first = text.lines().next().unwrap_or_default().to_owned();
            (first, format!("the key file {}", path.display()))
        }
    };
    let key = key.trim();
    if key.chars().count() < MIN_KEY_CHARS {
        anyhow::bail!(
            "{setting}: the key in {place} has {} characters; use at least {MIN_KEY_CHARS} \
             (e.g. `openssl rand -hex 32`)",
            key.chars().count()
        );
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!(
            "{setting}: the key in {place} has spaces or characters outside printable ASCII; \
             clients send it in an HTTP header: use e.g. `openssl rand -hex 32`"
        );
    }
    Ok(digest(key.as_bytes()))
}

/// How an address appears in a `Host` header.
fn host_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    }
}

/// `name[:port]` (IPv6 in brackets) → lower-case name and port.
fn parse_host(host: &str) -> Result<(String, Option<u16>)> {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']').context("an IPv6 address without its `]`")?;
        let (name, rest) = host.split_at(end + 1);
        match rest {
            "" => (name.to_owned(), None),
            _ => (
                name.to_owned(),
                Some(
                    rest.strip_prefix(':')
                        .context("expected `:port` after `]`")?,
                ),
            ),
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.clone(), None),
        }
    };
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || "/@?#,".contains(c)) {
        anyhow::bail!("not a host name or address");
    }
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .context("the port is not a number up to 65535")
        })
        .transpose()?;
    Ok((name, port))
}

fn normalise_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_inference_routes_take_the_api_key() {
        for path in [
            "/v1/models",
            "/v1/chat/completions",
            "/v1/completions",
            "/episodes/e1/v1/chat/completions",
            "/episodes/e1/v1/completions",
            "/episodes/e1/v1/models",
            "/health",
            "/tokenize",
        ] {
            assert_eq!(tier(path), Tier::Inference, "{path}");
        }
        for path in [
            "/update_weights_from_disk",
            "/episodes",
            "/episodes/e1",
            "/episodes/e1/reward",
            "/episodes/e1/close",
            "/episodes//v1/completions",
            "/episodes/e1/v1/completions/",
            "/ui/",
            "/ui/gateway",
            "/run",
            "/unknown",
        ] {
            assert_eq!(tier(path), Tier::Control, "{path}");
        }
    }

    #[test]
    fn hosts_parse_with_and_without_ports() {
        assert_eq!(
            parse_host("LocalHost:8400").unwrap(),
            ("localhost".into(), Some(8400))
        );
        assert_eq!(parse_host("[::1]:80").unwrap(), ("[::1]".into(), Some(80)));
        assert_eq!(parse_host("gpu-box").unwrap(), ("gpu-box".into(), None));
        for bad in ["", "a b", "x:port", "[::1", "evil.com/x"] {
            assert!(parse_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn allowed_hosts_are_the_bound_port_on_loopback_names_and_the_extras() {
        let addr: SocketAddr = "127.0.0.1:8400".parse().unwrap();
        let access = Access::new(
            Server::Gateway,
            None,
            None,
            &["gpu-box".into(), "proxy.lan:443".into()],
            &[],
            Duration::from_secs(1),
            1,
        )
        .unwrap()
        .serving_at(addr);
        for ok in [
            "localhost:8400",
            "127.0.0.1:8400",
            "[::1]:8400",
            "gpu-box:1",
            "proxy.lan:443",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(access.host_allowed(ok, None), "{ok}");
        }
        for refused in [
            "evil.example:8400",
            "localhost:8401",
            "evil.example",
            "proxy.lan:8400",
            "",
        ] {
            assert!(!access.host_allowed(refused, None), "{refused}");
        }
        // Bound to every interface: the address the client connected to is the server's.
        let local: SocketAddr = "10.1.2.3:8400".parse().unwrap();
        assert!(access.host_allowed("10.1.2.3:8400", Some(local)));
    }
}
