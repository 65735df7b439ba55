//! Shared helpers of the HTTPS server tests: test CAs written with `mpi_webhook::certs`, a client
//! that trusts only given CAs and reports the certificate it was served, and sample reviews.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use mpi_webhook::certs::{self, GeneratedCerts};
use mpi_webhook::tls::TlsFiles;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Installs the aws-lc-rs provider once per test binary, as main does.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        mpi_webhook::tls::install_crypto_provider();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// The repository root.
/// The listening address `serve` logs at start-up (`... https_addr=127.0.0.1:PORT ...`).
pub fn https_addr(log_line: &str) -> SocketAddr {
    log_line
        .split("https_addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no https_addr in {log_line:?}"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A sample review from manifests/samples/reviews/.
pub fn sample(name: &str) -> Vec<u8> {
    std::fs::read(repo().join("manifests/samples/reviews").join(name)).unwrap()
}

/// A sample review as JSON, for tests that edit it.
pub fn sample_json(name: &str) -> Value {
    serde_json::from_slice(&sample(name)).unwrap()
}

/// A CA and a serving certificate for localhost/127.0.0.1, written into `dir`.
pub struct TestCa {
    /// The generated PEMs.
    pub certs: GeneratedCerts,
    /// The serving pair's files.
    pub files: TlsFiles,
}

impl TestCa {
    /// Generates and writes into `dir`.
    pub fn write(dir: &Path) -> Self {
        let certs =
            certs::generate(&["localhost".to_string()], &[IpAddr::from([127, 0, 0, 1])]).unwrap();
        let files = certs::write(dir, &certs).unwrap();
        Self { certs, files }
    }

    /// The serving certificate's DER.
    pub fn leaf_der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.certs.cert_pem.as_bytes()).unwrap()
    }
}

/// A client configuration trusting only the given CA PEMs, limited to `versions`, with ALPN.
pub fn client_config_with(
    ca_pems: &[&str],
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Like the apiserver's Go client: no session resumption, so every connection sees the
    // certificate currently served (a resumed session reports the original one).
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// HTTP/1.1 over TLS 1.2 or 1.3, trusting `ca_pems`.
pub fn client_config(ca_pems: &[&str]) -> Arc<rustls::ClientConfig> {
    client_config_with(ca_pems, rustls::DEFAULT_VERSIONS, &[b"http/1.1".as_slice()])
}

/// One HTTP exchange.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Bytes,
    /// The leaf certificate the server presented.
    pub leaf: CertificateDer<'static>,
    /// The negotiated TLS version.
    pub version: rustls::ProtocolVersion,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Opens a TLS connection to `addr` as `localhost`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Sends one request on a new connection (HTTP/2 if ALPN picked it, else HTTP/1.1).
pub async fn request(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Reply, String> {
    let tls = connect(addr, config).await.map_err(|e| e.to_string())?;
    let (_, session) = tls.get_ref();
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or("no peer certificate")?;
    let version = session.protocol_version().ok_or("no TLS version")?;
    let h2 = session.alpn_protocol() == Some(b"h2");
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let io = TokioIo::new(tls);
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    }
    .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        body,
        leaf,
        version,
    })
}

/// POSTs `body` to `path`.
pub async fn post(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    body: Vec<u8>,
) -> Reply {
    request(addr, config, "POST", path, body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// GETs a plain-HTTP URL path (the metrics listener) and returns status and body.
pub async fn get_plain(addr: SocketAddr, path: &str) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::builder()
        .uri(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The `response` of an AdmissionReview reply, checked to carry `uid`.
pub fn response_for(reply: &Reply, uid: &str) -> Value {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let json = reply.json();
    assert_eq!(json["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(json["kind"], "AdmissionReview");
    let response = json["response"].clone();
    assert_eq!(response["uid"], uid, "the response uid is the request's");
    response
}

/// Polls `check` every 50 ms until it returns `Some`, failing after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The request half of a kept-alive client connection.
enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// A client connection kept open across requests, as the apiserver's transport keeps one to a
/// webhook: HTTP/2 if ALPN picked it, else HTTP/1.1.
pub struct KeptConnection {
    sender: Sender,
    /// The leaf certificate the server presented.
    pub leaf: CertificateDer<'static>,
    driver: tokio::task::JoinHandle<()>,
}

/// One answer on a [`KeptConnection`].
#[derive(Debug)]
pub struct KeptReply {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Bytes,
    /// The response told an HTTP/1.1 client to close the connection (`Connection: close`).
    pub close: bool,
}

/// Why a request on a [`KeptConnection`] got no answer.
#[derive(Debug)]
pub enum KeptError {
    /// The connection was already closing and the request was never written: a client may send
    /// it again on a new connection (what Go's transport does too).
    Unsent(String),
    /// The request may have reached the server: a failed review.
    Failed(String),
}

impl KeptConnection {
    /// Opens a TLS connection to `addr` as `localhost` and does the HTTP handshake.
    ///
    /// # Errors
    /// What failed: TCP, TLS or HTTP handshake.
    pub async fn open(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Self, String> {
        let tls = connect(addr, config).await.map_err(|e| e.to_string())?;
        let (_, session) = tls.get_ref();
        let leaf = session
            .peer_certificates()
            .and_then(|c| c.first())
            .cloned()
            .ok_or("no peer certificate")?;
        let h2 = session.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        let (sender, driver) = if h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            let driver = tokio::spawn(async move {
                let _ = conn.await;
            });
            (Sender::Http2(sender), driver)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            let driver = tokio::spawn(async move {
                let _ = conn.await;
            });
            (Sender::Http1(sender), driver)
        };
        Ok(Self {
            sender,
            leaf,
            driver,
        })
    }

    /// Whether a new request may be sent (the connection is open and not going away).
    pub fn is_usable(&self) -> bool {
        match &self.sender {
            Sender::Http1(sender) => !sender.is_closed(),
            Sender::Http2(sender) => !sender.is_closed() && sender.is_ready(),
        }
    }

    /// Whether the connection has ended (the server closed it or sent GOAWAY and finished).
    pub fn has_ended(&self) -> bool {
        self.driver.is_finished()
    }

    /// Sends one request and reads the whole answer.
    ///
    /// # Errors
    /// [`KeptError`]: whether the request may have reached the server.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<KeptReply, KeptError> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"))
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| KeptError::Failed(e.to_string()))?;
        let answer = match &mut self.sender {
            Sender::Http1(sender) => {
                if sender.ready().await.is_err() {
                    return Err(KeptError::Unsent("connection closed".to_string()));
                }
                sender.try_send_request(request).await
            }
            Sender::Http2(sender) => {
                if sender.ready().await.is_err() {
                    return Err(KeptError::Unsent("connection closed".to_string()));
                }
                sender.try_send_request(request).await
            }
        };
        let response = answer.map_err(|mut e| {
            if e.take_message().is_some() {
                KeptError::Unsent(e.into_error().to_string())
            } else {
                KeptError::Failed(e.into_error().to_string())
            }
        })?;
        let status = response.status().as_u16();
        let close = response
            .headers()
            .get_all(hyper::header::CONNECTION)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| KeptError::Failed(e.to_string()))?
            .to_bytes();
        Ok(KeptReply {
            status,
            body,
            close,
        })
    }
}

impl Drop for KeptConnection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A Secret volume: `..<version>/` dirs, `..data -> ..<version>`, `tls.* -> ..data/tls.*`.
pub struct SecretVolume {
    /// The volume's directory.
    pub dir: PathBuf,
    /// The current version (`..v<version>`).
    pub version: usize,
}

impl SecretVolume {
    /// A volume in `dir` with a first version (a fresh CA and certificate).
    pub fn new(dir: &Path) -> (Self, TestCa) {
        let mut volume = Self {
            dir: dir.to_path_buf(),
            version: 0,
        };
        let ca = volume.publish(None);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        (volume, ca)
    }

    /// Writes a new version (a fresh CA and certificate, or a broken pair) and swaps `..data` to
    /// it atomically, as the kubelet does.
    pub fn publish(&mut self, mismatched_key_from: Option<&TestCa>) -> TestCa {
        self.version += 1;
        let version = format!("..v{}", self.version);
        let ca = TestCa::write(&self.dir.join(&version));
        if let Some(other) = mismatched_key_from {
            std::fs::write(
                self.dir.join(&version).join("tls.key"),
                &other.certs.key_pem,
            )
            .unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        ca
    }

    /// Swaps in a new version holding copies of `from`'s `tls.crt` and `tls.key`.
    pub fn publish_files(&mut self, from: &Path) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        for name in ["tls.crt", "tls.key"] {
            std::fs::copy(from.join(name), self.dir.join(&version).join(name)).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }

    /// The `tls.crt` / `tls.key` paths a server is given.
    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.dir.join("tls.crt"),
            key: self.dir.join("tls.key"),
        }
    }
}
