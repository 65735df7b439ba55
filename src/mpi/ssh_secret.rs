//! The SSH key pair and the immutable SSH auth Secret (spec D.1 and Decision 13).
//!
//! [`generate_key_pair`] is the only function of the policy that uses randomness; everything
//! else builds objects from given bytes.

use std::collections::BTreeMap;

use aws_lc_rs::encoding::AsBigEndian;
use aws_lc_rs::signature::{ECDSA_P521_SHA512_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use sec1::der::asn1::ObjectIdentifier;
use sec1::der::pem::{LineEnding, PemLabel};
use sec1::der::{Encode, zeroize::Zeroizing};

use super::{
    Owner, SSH_AUTH_SECRET_TYPE, SSH_PRIVATE_KEY, SSH_PUBLIC_KEY, owned_metadata, ssh_secret_name,
};

/// secp521r1 (RFC 5480), the curve the SEC1 private key's `parameters` name.
const SECP521R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.35");

/// Key generation or encoding failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// AWS-LC could not make a key or give its private scalar (its random source failed).
    #[error("failed to generate the key pair: {0}")]
    Generate(#[source] aws_lc_rs::error::Unspecified),
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

/// Generates a fresh ECDSA P-521 key pair with AWS-LC (the binary's one crypto provider,
/// seeded from the operating system).
///
/// AWS-LC makes the key and gives its scalar and public point; `sec1` and `ssh-key` encode them.
///
/// # Errors
/// [`KeyError::Generate`] if AWS-LC fails; [`KeyError`]'s encoding variants when an encoder
/// fails (not expected for a valid key).
pub fn generate_key_pair() -> Result<SshKeyPair, KeyError> {
    let pair =
        EcdsaKeyPair::generate(&ECDSA_P521_SHA512_ASN1_SIGNING).map_err(KeyError::Generate)?;
    // The scalar big-endian, padded to 66 bytes; AWS-LC zeroizes this buffer on drop.
    let scalar = pair
        .private_key()
        .as_be_bytes()
        .map_err(KeyError::Generate)?;
    // The uncompressed SEC1 point, 0x04 || X || Y (133 bytes).
    let point = pair.public_key().as_ref();
    // RFC 5915 with both optional fields, [0] the curve OID and [1] the public point, as Go's
    // x509.MarshalECPrivateKey writes it. Built with `sec1` from the scalar and the point, so
    // the structure is pinned here rather than by AWS-LC's encoder flags.
    let der = sec1::EcPrivateKey {
        private_key: scalar.as_ref(),
        parameters: Some(sec1::EcParameters::NamedCurve(SECP521R1)),
        public_key: Some(point),
    }
    .to_der()
    .map(Zeroizing::new)
    .map_err(KeyError::EncodePrivate)?;
    let private_key_pem =
        sec1::der::pem::encode_string(sec1::EcPrivateKey::PEM_LABEL, LineEnding::LF, &der)
            .map_err(|e| KeyError::EncodePrivate(e.into()))?;
    let ecdsa =
        ssh_key::public::EcdsaPublicKey::from_sec1_bytes(point).map_err(KeyError::EncodePublic)?;
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

    /// The private key's DER, from the PEM.
    fn private_der(keys: &SshKeyPair) -> Vec<u8> {
        let (label, der) =
            sec1::der::pem::decode_vec(keys.private_key_pem.as_bytes()).expect("pem");
        assert_eq!(label, sec1::EcPrivateKey::PEM_LABEL);
        der
    }

    /// The uncompressed point of the OpenSSH public line.
    fn line_point(keys: &SshKeyPair) -> Vec<u8> {
        let line = keys.public_key_line.trim_end();
        let public = ssh_key::PublicKey::from_openssh(line).expect("openssh");
        public
            .key_data()
            .ecdsa()
            .expect("ecdsa")
            .as_sec1_bytes()
            .to_vec()
    }

    #[test]
    fn public_key_line_matches_private_key() {
        let keys = generate_key_pair().expect("keys");
        let line = &keys.public_key_line;
        assert!(line.starts_with("ecdsa-sha2-nistp521 "));
        assert!(line.ends_with('\n') && !line.ends_with("\n\n"));
        assert_eq!(line.trim_end().split(' ').count(), 2, "no comment");
        // AWS-LC parses the SEC1 key and checks that its [1] point is the scalar's.
        let der = private_der(&keys);
        let pair = EcdsaKeyPair::from_private_key_der(&ECDSA_P521_SHA512_ASN1_SIGNING, &der)
            .expect("a valid P-521 key");
        assert_eq!(line_point(&keys), pair.public_key().as_ref());
    }

    #[test]
    fn public_point_is_derived_from_the_private_scalar_alone() {
        let keys = generate_key_pair().expect("keys");
        let der = private_der(&keys);
        let parsed = sec1::EcPrivateKey::from_der(&der).expect("sec1 der");
        // Scalar times the base point, computed without the stored [1] point.
        let scalar = aws_lc_rs::agreement::PrivateKey::from_private_key(
            &aws_lc_rs::agreement::ECDH_P521,
            parsed.private_key,
        )
        .expect("a P-521 scalar");
        let derived = scalar.compute_public_key().expect("public point");
        assert_eq!(derived.as_ref().len(), 133, "uncompressed: 0x04 || X || Y");
        assert_eq!(line_point(&keys), derived.as_ref(), "the OpenSSH line");
        assert_eq!(
            parsed.public_key,
            Some(derived.as_ref()),
            "SEC1's [1] point"
        );
    }

    #[test]
    fn private_key_der_is_what_aws_lc_itself_writes() {
        // DER is canonical: AWS-LC's own RFC 5915 encoder (BoringSSL's, the same structure as Go's
        // x509.MarshalECPrivateKey) writes the very bytes `sec1` wrote.
        let keys = generate_key_pair().expect("keys");
        let der = private_der(&keys);
        let pair = EcdsaKeyPair::from_private_key_der(&ECDSA_P521_SHA512_ASN1_SIGNING, &der)
            .expect("a valid P-521 key");
        let theirs = aws_lc_rs::encoding::AsDer::as_der(&pair.private_key()).expect("der");
        assert_eq!(theirs.as_ref(), der.as_slice());
    }

    #[test]
    fn debug_never_prints_the_private_key() {
        let keys = generate_key_pair().expect("keys");
        assert!(!format!("{keys:?}").contains("PRIVATE"));
    }
}
