//! What a web page may do with the server: the defence against cross-site requests and DNS
//! rebinding, which neither Triton nor the restricted APIs cover (a restriction's header is one
//! a page cannot send, but an unrestricted API needs none).
//!
//! A browser sends any page's `POST` with `Content-Type: text/plain` to any address without
//! asking first (a CORS "simple request"): without this check a site its user opens could load
//! and unload models, change the log settings or run inference on a server on the user's
//! machine or network. And a page whose name the attacker points at the server's address (DNS
//! rebinding) is same-origin with it, so it may read the answers too.
//!
//! Non-browser clients (tritonclient, curl, the SDKs, probes) send neither `Origin` nor
//! `Sec-Fetch-Site` and are never refused here. A browser's request is refused when:
//!
//! - it reaches the server under a Host name that is not trusted: trusted are IP addresses,
//!   `localhost` (and `*.localhost`), and the names `--http-allowed-host` lists; no rebinding
//!   page can have one of those as its origin's host; or
//! - it is not a read (a method other than GET, HEAD or OPTIONS) and comes from another origin
//!   than the server's own (the status page at `/console` is same-origin).
//!
//! An origin the allow-list names (`--http-allowed-origin` on REST, `--grpc-web-cors-origin` on
//! gRPC; `*` for any, Triton's behaviour) passes both. `--http-allowed-host`, when given, also
//! refuses every request, browser or not, whose Host is not trusted.

use super::Denied;
use axum::http::{header, HeaderMap, HeaderValue, Method};

/// The origins and Host names a listener trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrowserPolicy {
    /// Origins whose pages may call (lowercase `scheme://host[:port]`).
    origins: Vec<String>,
    /// `*` among the origins: any page may call, as on Triton.
    any_origin: bool,
    /// Host names beside IP addresses and `localhost` (lowercase; `*.suffix` for subdomains).
    hosts: Vec<String>,
    /// The flag that lists origins, for the refusal's text.
    origin_flag: &'static str,
}

impl Default for BrowserPolicy {
    fn default() -> BrowserPolicy {
        BrowserPolicy {
            origins: Vec::new(),
            any_origin: false,
            hosts: Vec::new(),
            origin_flag: "--http-allowed-origin",
        }
    }
}

/// Whether `origin` is a valid allow-list entry: `*`, or `scheme://host[:port]` with no path.
pub fn valid_origin(origin: &str) -> bool {
    let scheme_less = origin.split_once("://").map(|(_, rest)| rest);
    origin == "*"
        || (HeaderValue::from_str(origin).is_ok()
            && scheme_less.is_some_and(|rest| !rest.is_empty() && !rest.contains('/')))
}

impl BrowserPolicy {
    /// The policy of `origins` (each checked by [`valid_origin`]; `origin_flag` names the flag
    /// in messages) and `hosts` (`--http-allowed-host`: names, `*.suffix`, or `*` for any).
    ///
    /// # Errors
    /// A message naming the entry that is not an origin or a host name.
    pub fn new(
        origins: &[String],
        origin_flag: &'static str,
        hosts: &[String],
    ) -> Result<BrowserPolicy, String> {
        if let Some(bad) = origins.iter().find(|o| !valid_origin(o)) {
            return Err(format!(
                "{origin_flag} {bad:?}: expected scheme://host[:port] or *"
            ));
        }
        for host in hosts {
            let name = host.strip_prefix("*.").unwrap_or(host);
            let valid = host == "*"
                || (!name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
            if !valid {
                return Err(format!(
                    "--http-allowed-host {host:?}: expected a host name (no port), *.domain or *"
                ));
            }
        }
        Ok(BrowserPolicy {
            origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            any_origin: origins.iter().any(|o| o == "*"),
            hosts: hosts
                .iter()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            origin_flag,
        })
    }

    /// The start-up log's lines about this policy.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.any_origin {
            lines.push(format!(
                "pages of any origin may call ({} *)",
                self.origin_flag
            ));
        } else if !self.origins.is_empty() {
            lines.push(format!("pages of {} may call", self.origins.join(", ")));
        }
        if !self.hosts.is_empty() {
            lines.push(format!(
                "answers Host {} (and IP addresses, localhost)",
                self.hosts.join(", ")
            ));
        }
        lines
    }

    /// Checks one request: its `method`, the `authority` it was sent to (HTTP/2's `:authority`,
    /// else the `Host` header) and its headers.
    ///
    /// # Errors
    /// [`Denied::Host`], [`Denied::UntrustedHost`] or [`Denied::CrossOrigin`].
    pub fn check(
        &self,
        method: &Method,
        authority: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<(), Denied> {
        let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
        let from_page = site.is_some_and(|site| {
            [&b"same-origin"[..], b"same-site", b"cross-site"]
                .iter()
                .any(|kind| site.eq_ignore_ascii_case(kind))
        });
        let listed = !self.hosts.is_empty() && !self.hosts.iter().any(|h| h == "*");
        // What nearly every request is (a client that is not a browser), without allocating.
        let no_page = !headers.contains_key(header::ORIGIN) && !from_page;
        if !listed && (self.any_origin || no_page) {
            return Ok(());
        }
        let host = authority
            .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()))
            .unwrap_or("")
            .to_ascii_lowercase();
        if listed && !self.trusts_host(&host) {
            return Err(Denied::Host { host: shown(&host) });
        }
        let origin = headers
            .get(header::ORIGIN)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase());
        if self.any_origin || origin.as_ref().is_some_and(|o| self.origins.contains(o)) {
            return Ok(());
        }
        if no_page {
            return Ok(());
        }
        if !self.trusts_host(&host) {
            return Err(Denied::UntrustedHost {
                host: shown(&host),
                origin_flag: self.origin_flag,
            });
        }
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return Ok(());
        }
        let same_origin = match &origin {
            Some(origin) => same_authority(origin, &host),
            None => site.is_some_and(|site| site.eq_ignore_ascii_case(b"same-origin")),
        };
        if same_origin {
            return Ok(());
        }
        Err(Denied::CrossOrigin {
            origin: shown(origin.as_deref().unwrap_or("(none)")),
            origin_flag: self.origin_flag,
        })
    }

    /// Whether `host` (a Host header: name or address, with or without a port) is trusted.
    fn trusts_host(&self, host: &str) -> bool {
        let name = host_name(host);
        if name.parse::<std::net::IpAddr>().is_ok() || name == "localhost" {
            return true;
        }
        if name.ends_with(".localhost") {
            return true;
        }
        self.hosts
            .iter()
            .any(|allowed| match allowed.strip_prefix('*') {
                Some("") => true,
                Some(suffix) => name.ends_with(suffix) && name.len() > suffix.len(),
                None => name == allowed,
            })
    }
}

/// The name or address of a Host value, without its port, brackets or a trailing dot.
fn host_name(host: &str) -> &str {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.trim_end_matches('.')
}

/// Whether the origin `scheme://authority` names the same authority as `host`, a default port
/// given or not.
fn same_authority(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    let bare = |a: &'_ str| -> String {
        let a = a.trim_end_matches('.');
        match a.strip_suffix(default_port) {
            Some(stripped) if !default_port.is_empty() => stripped.to_string(),
            _ => a.to_string(),
        }
    };
    !authority.is_empty() && bare(authority) == bare(host)
}

/// A client's value as a refusal names it: at most 100 characters.
fn shown(value: &str) -> String {
    value.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        policy: &BrowserPolicy,
        method: Method,
        pairs: &[(&str, &str)],
    ) -> Result<(), Denied> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        policy.check(&method, None, &headers)
    }

    fn policy(origins: &[&str], hosts: &[&str]) -> BrowserPolicy {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        BrowserPolicy::new(&list(origins), "--http-allowed-origin", &list(hosts)).unwrap()
    }

    #[test]
    fn clients_without_browser_headers_pass() {
        let open = BrowserPolicy::default();
        for host in ["127.0.0.1:8000", "triton.default.svc:8000", "anything", ""] {
            assert_eq!(
                request(&open, Method::POST, &[("host", host)]),
                Ok(()),
                "{host}"
            );
        }
        // Sec-Fetch-Site: none is a navigation the user made (typed, bookmarked).
        let typed = [("host", "kiln.internal:8000"), ("sec-fetch-site", "none")];
        assert_eq!(request(&open, Method::GET, &typed), Ok(()));
    }

    #[test]
    fn cross_origin_writes_are_refused_reads_pass() {
        let open = BrowserPolicy::default();
        let evil = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://evil.example"),
        ];
        assert!(matches!(
            request(&open, Method::POST, &evil),
            Err(Denied::CrossOrigin { .. })
        ));
        assert!(request(&open, Method::DELETE, &evil).is_err());
        assert!(request(&open, Method::PUT, &evil).is_err());
        assert_eq!(request(&open, Method::GET, &evil), Ok(()));
        let null = [("host", "127.0.0.1:8000"), ("origin", "null")];
        assert!(request(&open, Method::POST, &null).is_err());
        let no_origin = [("host", "127.0.0.1:8000"), ("sec-fetch-site", "cross-site")];
        assert!(request(&open, Method::POST, &no_origin).is_err());
        let same_site = [("host", "127.0.0.1:8000"), ("sec-fetch-site", "same-site")];
        assert!(request(&open, Method::POST, &same_site).is_err());
    }

    #[test]
    fn the_servers_own_origin_may_write_under_a_trusted_host() {
        let open = BrowserPolicy::default();
        for (host, origin) in [
            ("127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("localhost:8000", "http://LOCALHOST:8000"),
            ("[::1]:8000", "http://[::1]:8000"),
            ("10.0.0.7", "http://10.0.0.7"),
            ("10.0.0.7:80", "http://10.0.0.7"),
            ("10.0.0.7", "https://10.0.0.7:443"),
            ("app.localhost:8000", "http://app.localhost:8000"),
        ] {
            let pairs = [("host", host), ("origin", origin)];
            assert_eq!(
                request(&open, Method::POST, &pairs),
                Ok(()),
                "{host} {origin}"
            );
        }
        let other_port = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://127.0.0.1:8001"),
        ];
        assert!(request(&open, Method::POST, &other_port).is_err());
        let fetch = [
            ("host", "127.0.0.1:8000"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(request(&open, Method::POST, &fetch), Ok(()));
    }

    #[test]
    fn rebinding_pages_are_refused_until_their_name_is_listed() {
        let open = BrowserPolicy::default();
        // Same-origin, but under a name the attacker's DNS answers.
        let rebound = [
            ("host", "rebind.evil.example:8000"),
            ("origin", "http://rebind.evil.example:8000"),
        ];
        assert!(matches!(
            request(&open, Method::POST, &rebound),
            Err(Denied::UntrustedHost { .. })
        ));
        let read = [
            ("host", "rebind.evil.example:8000"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert!(request(&open, Method::GET, &read).is_err());
        let listed = policy(&[], &["*.evil.example"]);
        assert_eq!(request(&listed, Method::POST, &rebound), Ok(()));
        assert_eq!(request(&listed, Method::GET, &read), Ok(()));
        // *.domain is subdomains only.
        let apex = [("host", "evil.example"), ("origin", "http://evil.example")];
        assert!(request(&listed, Method::POST, &apex).is_err());
    }

    #[test]
    fn a_host_list_refuses_other_names_to_everyone() {
        let listed = policy(&[], &["kiln.internal"]);
        for host in [
            "kiln.internal:8000",
            "KILN.internal.",
            "127.0.0.1:1",
            "localhost",
        ] {
            assert_eq!(
                request(&listed, Method::POST, &[("host", host)]),
                Ok(()),
                "{host}"
            );
        }
        assert!(matches!(
            request(&listed, Method::GET, &[("host", "other.example")]),
            Err(Denied::Host { .. })
        ));
        let any = policy(&[], &["*"]);
        assert_eq!(
            request(&any, Method::GET, &[("host", "other.example")]),
            Ok(())
        );
    }

    #[test]
    fn listed_origins_pass_and_star_is_tritons_behaviour() {
        let listed = policy(&["https://App.example"], &[]);
        let app = [("host", "kiln.internal"), ("origin", "https://app.example")];
        assert_eq!(request(&listed, Method::POST, &app), Ok(()));
        let evil = [
            ("host", "kiln.internal"),
            ("origin", "https://evil.example"),
        ];
        assert!(request(&listed, Method::POST, &evil).is_err());
        let any = policy(&["*"], &[]);
        assert_eq!(request(&any, Method::POST, &evil), Ok(()));
    }

    #[test]
    fn flags_are_checked_and_refusals_name_the_flag() {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in ["evil.example", "http://a.example/page", "http://"] {
            let error =
                BrowserPolicy::new(&list(&[bad]), "--http-allowed-origin", &[]).unwrap_err();
            assert!(error.contains("--http-allowed-origin"), "{error}");
        }
        for bad in ["kiln:8000", "", "a/b", "*.", "http://a"] {
            let error = BrowserPolicy::new(&[], "--x", &list(&[bad])).unwrap_err();
            assert!(error.contains("--http-allowed-host"), "{error}");
        }
        let open = BrowserPolicy::default();
        let evil = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://evil.example"),
        ];
        let message = request(&open, Method::POST, &evil)
            .unwrap_err()
            .message("API");
        assert!(
            message.contains("http://evil.example") && message.contains("--http-allowed-origin"),
            "{message}"
        );
    }
}
