//! TLS for the gRPC and REST listeners, with rustls (ring provider; no OpenSSL, no C toolchain
//! beyond the `cc` build of ring).
//!
//! Triton's flags set gRPC TLS (`--grpc-use-ssl`, `--grpc-server-cert`, `--grpc-server-key`,
//! `--grpc-root-cert`, `--grpc-use-ssl-mutual`); kiln's `--http-*` flags of the same shape do the
//! same for REST, which Triton leaves to a proxy. With mutual TLS, clients must present a
//! certificate signed by the root certificate; without it, the root certificate is not used (as
//! Triton, whose gRPC server then does not request client certificates).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

/// A client that has not finished its handshake by then is dropped, so that slow or idle
/// connections cannot pile up half-open.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Certificate files for one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain of the server, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM root certificate(s) that client certificates must chain to (mutual TLS).
    pub root: Option<PathBuf>,
    /// Require and verify a client certificate.
    pub mutual: bool,
}

/// Why TLS cannot be set up; names the file, never its contents.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl TlsFiles {
    /// Checks the combination of flags (`flag` is `grpc` or `http`).
    ///
    /// # Errors
    /// [`TlsError`] when a certificate or key is missing, or mutual TLS has no root certificate.
    pub fn from_flags(
        flag: &str,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        root: Option<PathBuf>,
        mutual: bool,
    ) -> Result<TlsFiles, TlsError> {
        let need = |value: Option<PathBuf>, what: &str| {
            value.ok_or_else(|| TlsError(format!("--{flag}-use-ssl needs --{flag}-server-{what}")))
        };
        let files = TlsFiles {
            cert: need(cert, "cert")?,
            key: need(key, "key")?,
            root,
            mutual,
        };
        if files.mutual && files.root.is_none() {
            return Err(TlsError(format!(
                "--{flag}-use-ssl-mutual needs --{flag}-root-cert to verify client certificates"
            )));
        }
        Ok(files)
    }

    /// The gRPC server's TLS settings (tonic builds the rustls configuration itself).
    ///
    /// # Errors
    /// [`TlsError`] naming a file that cannot be read.
    pub fn grpc_config(&self) -> Result<tonic::transport::ServerTlsConfig, TlsError> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let read =
            |path: &PathBuf, what: &str| std::fs::read(path).map_err(|e| file_error(path, what, e));
        let identity = Identity::from_pem(
            read(&self.cert, "certificate")?,
            read(&self.key, "private key")?,
        );
        let mut config = ServerTlsConfig::new()
            .identity(identity)
            .timeout(HANDSHAKE_TIMEOUT);
        if let (Some(root), true) = (&self.root, self.mutual) {
            config = config
                .client_ca_root(Certificate::from_pem(read(root, "root certificate")?))
                .client_auth_optional(false);
        }
        Ok(config)
    }

    /// The rustls configuration, offering HTTP/2 and HTTP/1.1 by ALPN.
    ///
    /// # Errors
    /// [`TlsError`] naming the file that cannot be read or used.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| file_error(&self.cert, "certificate", e))?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| file_error(&self.key, "private key", e))?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = match (&self.root, self.mutual) {
            (Some(root), true) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(root)
                    .map_err(|e| file_error(root, "root certificate", e))?
                {
                    let cert = cert.map_err(|e| file_error(root, "root certificate", e))?;
                    roots
                        .add(cert)
                        .map_err(|e| file_error(root, "root certificate", e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| file_error(root, "root certificate", e))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| TlsError(format!("server certificate and key do not fit: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn file_error(path: &std::path::Path, what: &str, error: impl std::fmt::Display) -> TlsError {
    TlsError(format!(
        "cannot use {what} file {}: {error}",
        path.display()
    ))
}

/// A listener whose connections arrive with their TLS handshake done. Handshakes run on their
/// own tasks (with [`HANDSHAKE_TIMEOUT`]), so one slow client never holds up the others.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`; the accept task ends when this listener is dropped.
    ///
    /// # Errors
    /// The OS error when the listener has no local address.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    () = done.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors and the like: back off, keep serving.
                            warn!("cannot accept an HTTPS connection: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                if let Err(e) = stream.set_nodelay(true) {
                    debug!("cannot set TCP_NODELAY on an HTTPS connection: {e}");
                }
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => debug!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task only ends after this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
