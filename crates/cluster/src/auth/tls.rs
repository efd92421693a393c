//! TLS for the coordinator's Flight SQL port (rustls through tonic) and for the nodes
//! and clients that dial it.

use std::path::Path;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A server's certificate chain and private key, both PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity(..)")
    }
}

impl TlsIdentity {
    /// Reads a certificate chain and its key; an error names the file at fault.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let read = |p: &Path, what: &str| {
            let bytes = std::fs::read(p)
                .map_err(|e| format!("cannot read the TLS {what} {}: {e}", p.display()))?;
            if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
                return Err(format!("the TLS {what} {} is not PEM", p.display()));
            }
            Ok(bytes)
        };
        Ok(Self {
            cert: read(cert, "certificate")?,
            key: read(key, "key")?,
        })
    }

    pub fn from_pem(cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
        }
    }

    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key))
    }
}

/// A client's TLS settings trusting the CA certificates in `ca_pem` only.
pub fn trusting(ca_pem: &[u8]) -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem))
}
