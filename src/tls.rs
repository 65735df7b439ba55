//! TLS for `serve`: PEM loading, a rustls server configuration (TLS 1.2 and 1.3 only, the
//! `aws-lc-rs` provider) and a serving certificate that is swapped without a restart when its files change.
//!
//! The files are reloaded by content through the shell's [`Reloader`](crate::shell::Reloader)
//! (see `serve`'s `reload`): a new pair is switched in only when both files parse and the key
//! matches the certificate. Key material is never logged: errors name the file and the kind of
//! problem only.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::shell::Live;

/// Installs `aws-lc-rs` as the process-wide rustls provider.
///
/// It is the binary's one crypto provider (kube's client, rcgen and the SSH keys use it too); were
/// a crate to pull in a second, rustls would panic when it must pick a default among several.
/// Idempotent: a provider already installed is kept.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed (e.g. a second test in one process).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The provider every config of this crate is built with (never the implicit default).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Loading or using the serving certificate failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM section of the expected type.
    #[error("{path}: {problem}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the content).
        problem: String,
    },
    /// The key does not belong to the certificate, or is of an unsupported type.
    #[error("{key} does not fit {cert}: {problem}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// rustls refused the configuration.
    #[error("building the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// The certificate (chain) and key files of the serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A parsed, matching certificate and key.
#[derive(Clone)]
pub struct LoadedPair {
    key: Arc<CertifiedKey>,
}

impl fmt::Debug for LoadedPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("LoadedPair")
            .field("chain_len", &self.key.cert.len())
            .finish_non_exhaustive()
    }
}

impl LoadedPair {
    /// The leaf certificate (DER), e.g. for tests that compare what is served.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.key.cert.first()
    }
}

/// The bytes of both files (read as close together as possible).
#[derive(Debug)]
pub struct PairBytes {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl PairBytes {
    /// Reads both files (blocking).
    ///
    /// # Errors
    /// [`TlsError::Read`] naming the file.
    pub fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        Ok(Self {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
        })
    }

    /// A hash of both files' content.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.cert.hash(&mut hasher);
        self.key.hash(&mut hasher);
        hasher.finish()
    }

    /// The pair, if both files parse and the key fits the certificate.
    ///
    /// # Errors
    /// [`TlsError`] naming the file and the problem (never the key's content).
    pub fn parse(&self, files: &TlsFiles) -> Result<LoadedPair, TlsError> {
        let pem_error = |path: &Path, problem: String| TlsError::Pem {
            path: path.to_path_buf(),
            problem,
        };
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&files.cert, format!("not a PEM certificate chain ({e})")))?;
        if chain.is_empty() {
            return Err(pem_error(&files.cert, "no CERTIFICATE section".into()));
        }
        // Only the error's kind is reported for the key file, never its content.
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| {
            pem_error(
                &files.key,
                format!("no PEM private key ({})", pem_error_kind(&e)),
            )
        })?;
        let pair_error = |problem: String| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            problem,
        };
        let signing_key = crypto_provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| pair_error(format!("unsupported private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified
            .keys_match()
            .map_err(|e| pair_error(format!("{e}")))?;
        Ok(LoadedPair {
            key: Arc::new(certified),
        })
    }
}

fn pem_error_kind(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::NoItemsFound => "no PRIVATE KEY section",
        Error::MissingSectionEnd { .. } => "a section has no END line",
        Error::IllegalSectionStart { .. } => "malformed BEGIN line",
        Error::Base64Decode(_) => "invalid base64",
        Error::Io(_) => "read error",
        _ => "malformed PEM",
    }
}

/// Reads and parses both files.
///
/// # Errors
/// [`TlsError`] naming the file and the problem.
pub async fn load_pair(files: &TlsFiles) -> Result<LoadedPair, TlsError> {
    PairBytes::read(files)?.parse(files)
}

/// The certificate resolver of the server: hands out whatever pair is current (lock-free
/// reads); [`serve`](crate::serve) keeps it in step with the files through the shell's
/// [`Reloader`](crate::shell::Reloader).
pub type ReloadingCert = Live<LoadedPair>;

impl ResolvesServerCert for Live<LoadedPair> {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.with(|pair| Arc::clone(&pair.key)))
    }
}

/// A rustls server configuration: `aws-lc-rs`, TLS 1.3 and 1.2 only, no client certificates, ALPN h2
/// and http/1.1, the certificate from `resolver`.
///
/// # Errors
/// [`TlsError::Config`] if rustls refuses the protocol versions (not expected with `aws-lc-rs`).
pub fn server_config(resolver: Arc<ReloadingCert>) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
