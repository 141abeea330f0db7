//! HTTPS for the fake API server, as a kubeadm cluster's API server
//! serves it: a CA of its own (made with the `openssl` CLI), a server
//! certificate for 127.0.0.1, and mutual TLS where a client certificate is
//! optional at the TLS layer (bearer tokens still work) but, when
//! presented, must be signed by the CA. Client certificates are issued
//! for an identity (user = CN, groups = O, as the API server's x509
//! authenticator reads them).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::authn::Identity;

/// The CA, the server's certificate and the TLS settings.
pub(super) struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    acceptor: TlsAcceptor,
    issued: AtomicU64,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl req` arguments for a new P-256 key without a passphrase.
const NEW_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl Pki {
    pub(super) fn new() -> Self {
        let dir = tempfile::tempdir().expect("a directory for the test CA");
        let d = dir.path();
        let mut args = vec!["req", "-x509"];
        args.extend(NEW_KEY);
        args.extend([
            "-days",
            "2",
            "-subj",
            "/CN=fake-api CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&args, d);
        let ca_pem = std::fs::read_to_string(d.join("ca.pem")).expect("CA certificate");
        let (cert, key) = sign(
            d,
            0,
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        let acceptor = TlsAcceptor::from(Arc::new(server_config(&ca_pem, &cert, &key)));
        Self {
            dir,
            ca_pem,
            acceptor,
            issued: AtomicU64::new(1),
        }
    }

    /// A client certificate for `identity` (CN = user, one O per group)
    /// and its key, PEM.
    pub(super) fn issue(&self, identity: &Identity) -> (String, String) {
        let mut subject = format!("/CN={}", identity.user);
        for g in &identity.groups {
            subject.push_str(&format!("/O={g}"));
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        sign(
            self.dir.path(),
            n,
            &subject,
            "extendedKeyUsage=clientAuth\n",
        )
    }

    pub(super) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub(super) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }
}

fn server_config(ca_pem: &str, cert: &str, key: &str) -> rustls::ServerConfig {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.expect("CA PEM")).expect("CA certificate");
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .expect("client certificate verifier");
    let chain: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.expect("server certificate PEM"))
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("server key PEM");
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server certificate");
    // The server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A new key and a certificate for `subject` signed by the CA, with
/// the extensions `ext` (openssl's extension file syntax); PEM.
fn sign(d: &Path, n: u64, subject: &str, ext: &str) -> (String, String) {
    let name = |suffix: &str| format!("leaf{n}{suffix}");
    let (key, csr, cert, extfile) = (name(".key"), name(".csr"), name(".pem"), name(".ext"));
    let mut args = vec!["req"];
    args.extend(NEW_KEY);
    args.extend(["-subj", subject, "-keyout", &key, "-out", &csr]);
    openssl(&args, d);
    std::fs::write(
        d.join(&extfile),
        format!("basicConstraints=critical,CA:FALSE\n{ext}"),
    )
    .expect("extension file");
    let serial = format!("{}", 1000 + n);
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-days",
            "1",
            "-extfile",
            &extfile,
            "-out",
            &cert,
        ],
        d,
    );
    let read = |f: &str| std::fs::read_to_string(d.join(f)).expect("issued PEM");
    (read(&cert), read(&key))
}

/// The DER of the first certificate in `pem`: how issued certificates are
/// told apart.
pub(super) fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("certificate PEM")
        .to_vec()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
