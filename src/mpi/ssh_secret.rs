//! The SSH key pair and the immutable SSH auth Secret (spec D.1 and Decision 13).
//!
//! [`generate_key_pair`] is the only function of the policy that uses randomness; everything
//! else builds objects from given bytes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use p521::elliptic_curve::rand_core::OsRng;
use p521::elliptic_curve::sec1::ToEncodedPoint;
use p521::pkcs8::AssociatedOid;
use sec1::der::pem::{LineEnding, PemLabel};
use sec1::der::{Encode, zeroize::Zeroizing};

use super::{
    Owner, SSH_AUTH_SECRET_TYPE, SSH_PRIVATE_KEY, SSH_PUBLIC_KEY, owned_metadata, ssh_secret_name,
};

/// Key generation or encoding failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The private key could not be encoded as SEC1 PEM.
    #[error("failed to encode the private key: {0}")]
    EncodePrivate(#[source] sec1::der::Error),
    /// The public key could not be encoded in OpenSSH form.
    #[error("failed to encode the public key: {0}")]
    EncodePublic(#[source] ssh_key::Error),
}

/// An SSH key pair in the encodings the Secret stores.
#[derive(Clone)]
pub struct SshKeyPair {
    /// SEC1 `EC PRIVATE KEY` PEM, 64-column lines, trailing newline.
    pub private_key_pem: String,
    /// `ecdsa-sha2-nistp521 <base64>\n`, no comment.
    pub public_key_line: String,
}

impl std::fmt::Debug for SshKeyPair {
    // Never print key material, not even in debug logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshKeyPair")
            .field("public_key_line", &self.public_key_line)
            .finish_non_exhaustive()
    }
}

/// Generates a fresh ECDSA P-521 key pair from the operating system's CSPRNG.
///
/// # Errors
/// [`KeyError`] when an encoder fails (not expected for a valid key).
pub fn generate_key_pair() -> Result<SshKeyPair, KeyError> {
    let secret = p521::SecretKey::random(&mut OsRng);
    let point = secret.public_key().to_encoded_point(false);
    // RFC 5915 with both optional fields, [0] the curve OID and [1] the public point, as Go's
    // x509.MarshalECPrivateKey writes it (elliptic-curve's `to_sec1_pem` omits the OID).
    let scalar = Zeroizing::new(secret.to_bytes());
    let der = sec1::EcPrivateKey {
        private_key: &scalar,
        parameters: Some(sec1::EcParameters::NamedCurve(p521::NistP521::OID)),
        public_key: Some(point.as_bytes()),
    }
    .to_der()
    .map(Zeroizing::new)
    .map_err(KeyError::EncodePrivate)?;
    let private_key_pem =
        sec1::der::pem::encode_string(sec1::EcPrivateKey::PEM_LABEL, LineEnding::LF, &der)
            .map_err(|e| KeyError::EncodePrivate(e.into()))?;
    let ecdsa = ssh_key::public::EcdsaPublicKey::from_sec1_bytes(point.as_bytes())
        .map_err(KeyError::EncodePublic)?;
    let public = ssh_key::PublicKey::from(ssh_key::public::KeyData::Ecdsa(ecdsa));
    let mut public_key_line = public.to_openssh().map_err(KeyError::EncodePublic)?;
    public_key_line.push('\n');
    Ok(SshKeyPair {
        private_key_pem,
        public_key_line,
    })
}

/// The Secret `<owner>-mpi-ssh-auth`: immutable, type `kubernetes.io/ssh-auth`, owned by the
/// TrainJob or JobSet, labelled as managed by mpi-webhook.
pub fn ssh_secret(owner: impl Into<Owner>, keys: &SshKeyPair) -> Secret {
    let owner = owner.into();
    Secret {
        metadata: owned_metadata(&owner, ssh_secret_name(&owner.name)),
        type_: Some(SSH_AUTH_SECRET_TYPE.to_string()),
        immutable: Some(true),
        data: Some(BTreeMap::from([
            (
                SSH_PRIVATE_KEY.to_string(),
                ByteString(keys.private_key_pem.as_bytes().to_vec()),
            ),
            (
                SSH_PUBLIC_KEY.to_string(),
                ByteString(keys.public_key_line.as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sec1::der::Decode;

    #[test]
    fn private_key_is_sec1_p521_with_both_optional_fields() {
        let keys = generate_key_pair().expect("keys");
        let pem = &keys.private_key_pem;
        assert!(pem.starts_with("-----BEGIN EC PRIVATE KEY-----\n"), "{pem}");
        assert!(pem.ends_with("-----END EC PRIVATE KEY-----\n"));
        assert!(!pem.contains('\r'));
        let body: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(
            body.iter().rev().skip(1).all(|l| l.len() == 64),
            "64-column lines"
        );
        let (label, der) = sec1::der::pem::decode_vec(pem.as_bytes()).expect("pem");
        assert_eq!(label, sec1::EcPrivateKey::PEM_LABEL);
        let parsed = sec1::EcPrivateKey::from_der(&der).expect("sec1 der");
        assert_eq!(parsed.private_key.len(), 66);
        let oid = parsed
            .parameters
            .and_then(|p| p.named_curve())
            .expect("[0] curve OID");
        assert_eq!(oid.to_string(), "1.3.132.0.35");
        assert!(parsed.public_key.is_some(), "[1] public point");
    }

    #[test]
    fn public_key_line_matches_private_key() {
        let keys = generate_key_pair().expect("keys");
        let secret = p521::SecretKey::from_sec1_pem(&keys.private_key_pem).expect("parses");
        let line = &keys.public_key_line;
        assert!(line.starts_with("ecdsa-sha2-nistp521 "));
        assert!(line.ends_with('\n') && !line.ends_with("\n\n"));
        assert_eq!(line.trim_end().split(' ').count(), 2, "no comment");
        let public = ssh_key::PublicKey::from_openssh(line.trim_end()).expect("openssh");
        let ecdsa = public.key_data().ecdsa().expect("ecdsa");
        assert_eq!(
            ecdsa.as_sec1_bytes(),
            secret.public_key().to_encoded_point(false).as_bytes()
        );
    }

    #[test]
    fn debug_never_prints_the_private_key() {
        let keys = generate_key_pair().expect("keys");
        assert!(!format!("{keys:?}").contains("PRIVATE"));
    }
}
