//! The flags of what kiln serves to browsers: the status page and gRPC-Web.

use super::bool_value;

#[derive(Debug, Clone, clap::Args)]
pub struct BrowserFlags {
    /// Serve the status page (`/console`: models, states, request rates and latencies, a "try it"
    /// form) and the API's documentation (`/console/docs`) on the REST listener. `false` turns
    /// both off (`/v2/openapi.json` stays).
    #[arg(long, env = "KILN_CONSOLE", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub console: bool,

    /// Answer gRPC-Web (`application/grpc-web`, `application/grpc-web-text`) on the gRPC
    /// listener, which then accepts HTTP/1.1 too. Off by default: Triton's gRPC port speaks
    /// HTTP/2 only, and browsers on other origins need --grpc-web-cors-origin.
    #[arg(long, env = "KILN_GRPC_WEB", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub grpc_web: bool,

    /// An origin (`scheme://host[:port]`, or `*` for any) whose pages may call gRPC-Web
    /// (repeatable): CORS headers are sent to these only. The status page's origin is the REST
    /// listener's, e.g. `http://localhost:8000`.
    #[arg(long = "grpc-web-cors-origin", value_name = "ORIGIN")]
    pub grpc_web_cors_origins: Vec<String>,

    /// An origin (`scheme://host[:port]`, or `*` for any) whose web pages may change state on the
    /// REST listeners (load and unload models, settings, shared memory, inference; repeatable).
    /// A page of another origin is refused with 403; clients that send no `Origin` (tritonclient,
    /// curl, the SDKs) and the status page (same-origin) are not affected. `*` is Triton's
    /// behaviour.
    #[arg(long = "http-allowed-origin", value_name = "ORIGIN")]
    pub http_allowed_origins: Vec<String>,

    /// A Host name the REST listeners answer (repeatable; `*.domain` for its subdomains, `*` for
    /// any). Given, every request under another name is refused with 403 (IP addresses and
    /// localhost are always answered); not given, any Host is answered, but web pages only
    /// under an IP address, localhost or a listed name (against DNS rebinding).
    #[arg(long = "http-allowed-host", value_name = "HOST")]
    pub http_allowed_hosts: Vec<String>,
}
