//! Restricted APIs and bearer tokens, as Triton spells them.
//!
//! `--grpc-restricted-protocol` and `--http-restricted-api` take `<apis>:<key>=<value>`: every API
//! in the comma-separated group list then requires the header `<key>` (on gRPC
//! `triton-grpc-protocol-<key>`) with exactly `<value>`. Triton's groups are `health`, `metadata`,
//! `inference`, `shared-memory`, `model-config`, `model-repository`, `statistics`, `trace` and
//! `logging`; a group may appear in one restriction only. `--inference-bearer-token` additionally
//! requires `Authorization: Bearer <token>` on the `inference` group of both protocols.
//!
//! Values are compared in constant time and never logged, printed or echoed: a refusal names the
//! header it expected (as Triton's does), never a value. [`grpc`] and [`http`] apply a policy to
//! each protocol's requests before any handler runs.
//!
//! Every policy also holds a [`BrowserPolicy`]: which web pages may call, and under which Host
//! names (`--http-allowed-origin`, `--http-allowed-host`, `--grpc-web-cors-origin`).

pub mod browser;
pub mod grpc;
pub mod http;

use axum::http::{header, HeaderMap, Method};
pub use browser::BrowserPolicy;
use std::fmt;

/// Triton's API groups, the unit a restriction applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiGroup {
    Health,
    Metadata,
    Inference,
    SharedMemory,
    ModelConfig,
    ModelRepository,
    Statistics,
    Trace,
    Logging,
}

impl ApiGroup {
    pub const ALL: [ApiGroup; 9] = [
        ApiGroup::Health,
        ApiGroup::Metadata,
        ApiGroup::Inference,
        ApiGroup::SharedMemory,
        ApiGroup::ModelConfig,
        ApiGroup::ModelRepository,
        ApiGroup::Statistics,
        ApiGroup::Trace,
        ApiGroup::Logging,
    ];

    /// The name Triton's flags use.
    pub fn name(self) -> &'static str {
        match self {
            ApiGroup::Health => "health",
            ApiGroup::Metadata => "metadata",
            ApiGroup::Inference => "inference",
            ApiGroup::SharedMemory => "shared-memory",
            ApiGroup::ModelConfig => "model-config",
            ApiGroup::ModelRepository => "model-repository",
            ApiGroup::Statistics => "statistics",
            ApiGroup::Trace => "trace",
            ApiGroup::Logging => "logging",
        }
    }

    pub fn from_name(name: &str) -> Option<ApiGroup> {
        ApiGroup::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// A credential. It never appears in `Debug` output, logs or error messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// Whether `candidate` is exactly this secret, in time that depends only on the secret's length.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), candidate)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Compares `expected` with `candidate` without returning early: every byte of `expected` is
/// always visited, so the time taken does not tell how much of a guess was right.
pub fn constant_time_eq(expected: &[u8], candidate: &[u8]) -> bool {
    let mut difference = expected.len() ^ candidate.len();
    for (i, &byte) in expected.iter().enumerate() {
        let other = candidate.get(i).copied().unwrap_or(!byte);
        difference |= usize::from(byte ^ other);
    }
    std::hint::black_box(difference) == 0
}

/// The header one restriction requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restriction {
    /// The full header name, lowercase (on gRPC with Triton's `triton-grpc-protocol-` prefix).
    pub header: String,
    pub value: Secret,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The API's group is restricted and the request lacks the header or has another value.
    Restricted { header: String },
    /// Inference requires a bearer token and the request has none or another one.
    Unauthenticated,
    /// `--http-allowed-host` is given and does not name the request's Host.
    Host { host: String },
    /// A web page's request under a Host name a rebinding page could have.
    UntrustedHost {
        host: String,
        origin_flag: &'static str,
    },
    /// A web page of another origin tried to change state (load a model, run inference...).
    CrossOrigin {
        origin: String,
        origin_flag: &'static str,
    },
}

impl Denied {
    /// The refusal as clients read it, in Triton's words for restrictions (`api` is "protocol" on
    /// gRPC and "API" on HTTP).
    pub fn message(&self, api: &str) -> String {
        match self {
            Denied::Restricted { header } => {
                format!("This {api} is restricted, expecting header '{header}'")
            }
            Denied::Unauthenticated => {
                "This API requires the header 'authorization: Bearer <token>' with a valid token"
                    .to_string()
            }
            Denied::Host { host } => format!(
                "Host '{host}' is not served here: --http-allowed-host lists the names this \
                 server answers (besides IP addresses and localhost)"
            ),
            Denied::UntrustedHost { host, origin_flag } => format!(
                "Browser request refused: web pages may reach this server under an IP address, \
                 localhost or a name --http-allowed-host lists, not '{host}' (or come from an \
                 origin {origin_flag} lists)"
            ),
            Denied::CrossOrigin {
                origin,
                origin_flag,
            } => format!(
                "Cross-origin request refused: a page of origin '{origin}' may not change this \
                 server's state or run inference (allow it with {origin_flag})"
            ),
        }
    }
}

/// What one protocol requires of each API group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    restrictions: Vec<(ApiGroup, Restriction)>,
    bearer_token: Option<Secret>,
    browsers: BrowserPolicy,
}

/// The header prefix Triton puts before a gRPC restriction's key.
pub const GRPC_HEADER_PREFIX: &str = "triton-grpc-protocol-";

impl AccessPolicy {
    /// Parses the values of a repeated `--grpc-restricted-protocol` or `--http-restricted-api`
    /// flag (`flag` names it in messages; `prefix` goes before each key).
    ///
    /// # Errors
    /// Triton's messages for an unknown group or a group in two restrictions; a message naming
    /// the flag and the expected form otherwise. None of them contains a value.
    pub fn parse(specs: &[String], flag: &str, prefix: &str) -> Result<AccessPolicy, String> {
        let kind = if prefix.is_empty() { "api" } else { "protocol" };
        let malformed = || {
            format!("--{flag} expects <{kind}s>:<key>=<value>, e.g. model-repository,statistics:admin-key=<secret>")
        };
        let mut restrictions: Vec<(ApiGroup, Restriction)> = Vec::new();
        for spec in specs {
            let (groups, credential) = spec.split_once(':').ok_or_else(malformed)?;
            let (key, value) = credential.split_once('=').ok_or_else(malformed)?;
            let key = key.trim().to_ascii_lowercase();
            let valid_key = !key.is_empty()
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !valid_key || value.is_empty() {
                return Err(malformed());
            }
            let restriction = Restriction {
                header: format!("{prefix}{key}"),
                value: Secret::new(value),
            };
            for name in groups.split(',').map(str::trim) {
                let group = ApiGroup::from_name(name)
                    .ok_or_else(|| format!("unknown restricted {kind} '{name}'"))?;
                if restrictions.iter().any(|(g, _)| *g == group) {
                    return Err(format!(
                        "{kind} '{name}' can not be specified in multiple config groups"
                    ));
                }
                restrictions.push((group, restriction.clone()));
            }
        }
        Ok(AccessPolicy {
            restrictions,
            bearer_token: None,
            browsers: BrowserPolicy::default(),
        })
    }

    /// Also requires `Authorization: Bearer <token>` for the `inference` group.
    pub fn with_bearer_token(mut self, token: Option<Secret>) -> AccessPolicy {
        self.bearer_token = token;
        self
    }

    /// Which web pages may call, under which Host names.
    pub fn with_browsers(mut self, browsers: BrowserPolicy) -> AccessPolicy {
        self.browsers = browsers;
        self
    }

    /// Checks what a web page may do (see [`browser`]): `authority` is HTTP/2's `:authority`,
    /// when the request has one.
    ///
    /// # Errors
    /// [`Denied::Host`], [`Denied::UntrustedHost`] or [`Denied::CrossOrigin`].
    pub fn check_browser(
        &self,
        method: &Method,
        authority: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<(), Denied> {
        self.browsers.check(method, authority, headers)
    }

    /// Whether nothing is restricted (the check can be skipped altogether; the browser check
    /// is not one of these).
    pub fn is_open(&self) -> bool {
        self.restrictions.is_empty() && self.bearer_token.is_none()
    }

    /// The groups that are restricted, with the header each requires (for the start-up log).
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .restrictions
            .iter()
            .map(|(g, r)| format!("{} requires header '{}'", g.name(), r.header))
            .collect();
        if self.bearer_token.is_some() {
            lines.push("inference requires a bearer token".into());
        }
        lines.extend(self.browsers.describe());
        lines
    }

    /// Checks one request to an API of `group`.
    ///
    /// # Errors
    /// [`Denied`] when a required header is missing or wrong.
    pub fn check(&self, group: ApiGroup, headers: &HeaderMap) -> Result<(), Denied> {
        if let Some((_, restriction)) = self.restrictions.iter().find(|(g, _)| *g == group) {
            let given = headers.get(restriction.header.as_str());
            if !given.is_some_and(|v| restriction.value.matches(v.as_bytes())) {
                return Err(Denied::Restricted {
                    header: restriction.header.clone(),
                });
            }
        }
        if group == ApiGroup::Inference {
            if let Some(token) = &self.bearer_token {
                let given = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| bearer_token(v.as_bytes()));
                if !given.is_some_and(|t| token.matches(t)) {
                    return Err(Denied::Unauthenticated);
                }
            }
        }
        Ok(())
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

#[cfg(test)]
mod tests;
