//! Mutual TLS between daemons: this host's certificate and key, the CA that signs its
//! peers', and identities pinned to configured names.
//!
//! Only TLS 1.3 is offered, with `ring`'s primitives. A GPU host requires a client
//! certificate that its CA signed and that names one of its configured peers; a VM
//! host checks that the GPU host's certificate names the GPU host it meant to reach.
//! There is no plaintext mode.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::TlsFiles;

/// Why the TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("CA certificate {}: {source}", path.display())]
    Ca {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot check peers against the CA: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{0:?} is not a name a certificate can hold")]
    Name(String),
}

/// This host's side of mutual TLS, both as a GPU host (server) and as a VM host
/// (client).
#[derive(Debug, Clone)]
pub struct Tls {
    /// The name this host's certificate holds.
    pub name: String,
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

impl Tls {
    /// Loads the files; any unreadable or unusable one is an error naming it.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates("certificate", &files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::Read {
            what: "key",
            path: files.key.clone(),
            source,
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in certificates("CA certificate", &files.ca)? {
            roots.add(ca).map_err(|source| TlsError::Ca {
                path: files.ca.clone(),
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(Tls {
            name: files.name.clone(),
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The server name a GPU host's certificate must hold.
pub fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_string()).map_err(|_| TlsError::Name(name.to_string()))
}

/// Which of `peers` the verified end-entity certificate `cert` names, if any.
pub fn peer_named<'a>(
    cert: &CertificateDer<'_>,
    peers: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let ee = webpki::EndEntityCert::try_from(cert).ok()?;
    peers
        .into_iter()
        .find(|p| server_name(p).is_ok_and(|n| ee.verify_is_valid_for_subject_name(&n).is_ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, name: &str) -> TlsFiles {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &rcgen::Issuer::from_params(&ca, &ca_key))
            .unwrap();
        let f = TlsFiles {
            name: name.to_string(),
            cert: dir.join("c.pem"),
            key: dir.join("k.pem"),
            ca: dir.join("ca.pem"),
        };
        std::fs::write(&f.cert, cert.pem()).unwrap();
        std::fs::write(&f.key, key.serialize_pem()).unwrap();
        std::fs::write(&f.ca, ca_cert.pem()).unwrap();
        f
    }

    #[test]
    fn a_peer_is_the_configured_name_its_certificate_holds() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path(), "host-a");
        assert_eq!(Tls::load(&f).unwrap().name, "host-a");
        let der = CertificateDer::pem_file_iter(&f.cert)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(peer_named(&der, ["host-b", "host-a"]), Some("host-a"));
        assert_eq!(peer_named(&der, ["host-b", "host-a.example"]), None);
        assert_eq!(peer_named(&der, ["not a name"]), None);
    }

    #[test]
    fn unusable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = files(dir.path(), "host-a");
        f.key = dir.path().join("missing.pem");
        let e = Tls::load(&f).unwrap_err().to_string();
        assert!(e.contains("key") && e.contains("missing.pem"), "{e}");
        let mut f = files(dir.path(), "host-a");
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        f.ca = dir.path().join("empty.pem");
        let e = Tls::load(&f).unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
