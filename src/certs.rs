//! Dev certificates (rcgen, ECDSA P-256): a CA and a serving certificate it signs. Used by the
//! `certs` subcommand and by `serve` when no certificate files are given.
//!
//! Files written into the output directory: `ca.crt`, `ca.key`, `tls.crt`, `tls.key` (the names
//! a `kubernetes.io/tls` Secret uses). Keys are written with mode 0600; every file is written to a
//! temporary name and renamed, so a reader never sees half a file.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::tls::{TlsFiles, crypto_provider};

/// File name of the CA certificate (the webhook configurations' `caBundle`).
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key.
pub const CA_KEY_FILE: &str = "ca.key";
/// File name of the serving certificate.
pub const TLS_CERT_FILE: &str = "tls.crt";
/// File name of the serving certificate's private key.
pub const TLS_KEY_FILE: &str = "tls.key";

/// Default directory of `serve`'s dev certificates, relative to the working directory.
pub const DEV_CERTS_DIR: &str = "certs";

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// How long the CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// How long a serving certificate is valid; `serve` regenerates expired dev certificates.
const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Generating or writing certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// rcgen refused a name or failed to sign.
    #[error("generating the certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file or directory could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Neither a DNS name nor an IP address was given.
    #[error("a serving certificate needs at least one --dns name or --ip address")]
    NoNames,
}

/// A CA and a serving certificate, PEM encoded.
pub struct GeneratedCerts {
    /// CA certificate.
    pub ca_cert_pem: String,
    /// CA private key.
    pub ca_key_pem: String,
    /// Serving certificate, signed by the CA.
    pub cert_pem: String,
    /// Serving certificate's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for GeneratedCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCerts").finish_non_exhaustive()
    }
}

impl GeneratedCerts {
    /// The CA certificate as a webhook configuration's `caBundle` (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_cert_pem.as_bytes())
    }
}

/// Generates a new CA and a serving certificate for `dns` names and `ips`.
///
/// # Errors
/// [`CertsError::NoNames`] without any name; [`CertsError::Generate`] if rcgen refuses a name.
pub fn generate(dns: &[String], ips: &[IpAddr]) -> Result<GeneratedCerts, CertsError> {
    if dns.is_empty() && ips.is_empty() {
        return Err(CertsError::NoNames);
    }
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();

    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "mpi-webhook dev CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = now - DAY;
    ca.not_after = now + CA_VALIDITY;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(dns.to_vec())?;
    leaf.subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    leaf.distinguished_name = rcgen::DistinguishedName::new();
    let common_name = dns
        .first()
        .cloned()
        .or_else(|| ips.first().map(ToString::to_string))
        .unwrap_or_default();
    leaf.distinguished_name
        .push(DnType::CommonName, common_name);
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = now - DAY;
    leaf.not_after = now + SERVING_VALIDITY;
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;

    Ok(GeneratedCerts {
        ca_cert_pem: ca_cert.pem(),
        ca_key_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The `certs` subcommand: generates a CA and a serving certificate for the flags' names,
/// writes them into `--out` and returns the `caBundle` to print.
///
/// # Errors
/// [`CertsError`] if a name is refused or a file cannot be written.
pub fn run(args: &crate::cli::CertsArgs) -> Result<String, CertsError> {
    let certs = generate(&args.dns, &args.ip)?;
    write(&args.out, &certs)?;
    tracing::info!(
        out = %args.out.display(),
        "wrote {CA_CERT_FILE}, {CA_KEY_FILE}, {TLS_CERT_FILE} and {TLS_KEY_FILE}; the caBundle follows on stdout"
    );
    Ok(certs.ca_bundle())
}

/// Writes the four files into `dir` (created if missing) and returns the serving pair's paths.
///
/// # Errors
/// [`CertsError::Write`] naming the path.
pub fn write(dir: &Path, certs: &GeneratedCerts) -> Result<TlsFiles, CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    write_file(&dir.join(CA_CERT_FILE), &certs.ca_cert_pem, 0o644)?;
    write_file(&dir.join(CA_KEY_FILE), &certs.ca_key_pem, 0o600)?;
    // Key first: a reloading server that sees the new certificate finds its key already there.
    write_file(&dir.join(TLS_KEY_FILE), &certs.key_pem, 0o600)?;
    write_file(&dir.join(TLS_CERT_FILE), &certs.cert_pem, 0o644)?;
    Ok(TlsFiles {
        cert: dir.join(TLS_CERT_FILE),
        key: dir.join(TLS_KEY_FILE),
    })
}

fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), CertsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let error = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(error)?;
    file.write_all(content.as_bytes()).map_err(error)?;
    file.sync_all().map_err(error)?;
    std::fs::rename(&tmp, path).map_err(error)
}

/// The dev certificate `serve` uses without `--tls-cert-file`: `dir/tls.crt` and `dir/tls.key`
/// for `localhost` and `127.0.0.1`, signed by `dir/ca.crt`. Reused when present, still valid and
/// signed by that CA; otherwise (first start, expiry, a broken file) all four are generated anew.
///
/// # Errors
/// [`CertsError`] if they have to be generated and cannot be written.
pub fn dev_certs(dir: &Path) -> Result<TlsFiles, CertsError> {
    match reusable(dir) {
        Ok(files) => {
            tracing::info!(dir = %dir.display(), "using the dev certificate (trust {}/{CA_CERT_FILE})", dir.display());
            Ok(files)
        }
        Err(reason) => {
            if dir.join(TLS_CERT_FILE).exists() {
                tracing::warn!(dir = %dir.display(), %reason, "regenerating the dev CA and certificate");
            }
            let certs = generate(&["localhost".to_string()], &[IpAddr::from([127, 0, 0, 1])])?;
            let files = write(dir, &certs)?;
            tracing::info!(dir = %dir.display(), "created a dev CA and certificate for localhost and 127.0.0.1 (trust {}/{CA_CERT_FILE})", dir.display());
            Ok(files)
        }
    }
}

/// Whether `dir` holds a serving certificate for `localhost` and `127.0.0.1` that chains to
/// `dir/ca.crt` and is valid now. Only certificates are read here; the key is checked by the
/// server when it loads the pair.
fn reusable(dir: &Path) -> Result<TlsFiles, String> {
    let read = |name: &str| -> Result<Vec<CertificateDer<'static>>, String> {
        let path = dir.join(name);
        CertificateDer::pem_file_iter(&path)
            .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let ca = read(CA_CERT_FILE)?;
    let chain = read(TLS_CERT_FILE)?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(format!("{TLS_CERT_FILE} holds no certificate"));
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(ca);
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        crypto_provider(),
    )
    .build()
    .map_err(|e| format!("{CA_CERT_FILE}: {e}"))?;
    for name in ["localhost", "127.0.0.1"] {
        let server_name = ServerName::try_from(name).map_err(|e| e.to_string())?;
        verifier
            .verify_server_cert(leaf, intermediates, &server_name, &[], UnixTime::now())
            .map_err(|e| format!("{TLS_CERT_FILE} for {name}: {e}"))?;
    }
    if !dir.join(TLS_KEY_FILE).is_file() {
        return Err(format!("{TLS_KEY_FILE} is missing"));
    }
    Ok(TlsFiles {
        cert: dir.join(TLS_CERT_FILE),
        key: dir.join(TLS_KEY_FILE),
    })
}
