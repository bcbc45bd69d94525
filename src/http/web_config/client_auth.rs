//! Client certificates, with exporter-toolkit's `client_auth_type` policies
//! (Go's `tls.ClientAuthType`) and its `client_allowed_sans` check.
//!
//! rustls's [`WebPkiClientVerifier`] verifies chains; this wraps it so that
//! each of Go's five policies has its meaning:
//!
//! | policy | asks | requires | verifies |
//! | --- | --- | --- | --- |
//! | `NoClientCert` | no | no | no (no verifier at all) |
//! | `RequestClientCert` | yes | no | no |
//! | `RequireAnyClientCert` | yes | yes | no |
//! | `VerifyClientCertIfGiven` | yes | no | yes, when one is sent |
//! | `RequireAndVerifyClientCert` | yes | yes | yes |
//!
//! Two further points follow Go's `x509.Verify`: a client certificate that
//! is itself listed in the CA file is accepted as it stands (a self-signed
//! client certificate "pinned" that way, which webpki alone would refuse
//! when it is marked as a CA), within its validity period; and without a
//! CA file the verifying policies use the system's CA store.
//!
//! `client_allowed_sans`, as the toolkit's `VerifyPeerCertificate`: the
//! client's certificate must carry one of the listed names among its DNS,
//! e-mail, IP and URI subject alternative names, compared as text; a client
//! without a certificate is then refused (the toolkit's check indexes the
//! first certificate, so its handshake fails too).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, RootCertStore,
    SignatureScheme,
};
use x509_cert::der::Decode;
use x509_cert::der::oid::AssociatedOid;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

/// exporter-toolkit's `client_auth_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    /// The toolkit's spellings; `RequireClientCert` is its older name for
    /// `RequireAnyClientCert`, still accepted there.
    pub(crate) fn parse(s: &str) -> Option<ClientAuth> {
        Some(match s {
            "" | "NoClientCert" => ClientAuth::NoClientCert,
            "RequestClientCert" => ClientAuth::RequestClientCert,
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ClientAuth::NoClientCert => "NoClientCert",
            ClientAuth::RequestClientCert => "RequestClientCert",
            ClientAuth::RequireAnyClientCert => "RequireAnyClientCert",
            ClientAuth::VerifyClientCertIfGiven => "VerifyClientCertIfGiven",
            ClientAuth::RequireAndVerifyClientCert => "RequireAndVerifyClientCert",
        }
    }

    pub(crate) fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }

    fn requires(self) -> bool {
        matches!(
            self,
            ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// The client-certificate side of the TLS settings.
#[derive(Debug)]
pub(crate) struct ClientCerts {
    policy: ClientAuth,
    /// The chain verifier, for the verifying policies; None when there is
    /// no trust anchor at all (no CA file and an empty system store), in
    /// which case every certificate is refused, as Go's empty pool does.
    chains: Option<Arc<dyn ClientCertVerifier>>,
    /// The CA file's certificates, compared byte for byte with the
    /// client's (see the module doc).
    pinned: Vec<CertificateDer<'static>>,
    hints: Vec<DistinguishedName>,
    allowed_sans: Option<Vec<String>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCerts {
    /// `cas` are the CA file's (or inline `client_ca`'s) certificates, or
    /// None when neither is set. `policy` is not `NoClientCert`.
    pub(crate) fn new(
        policy: ClientAuth,
        cas: Option<Vec<CertificateDer<'static>>>,
        allowed_sans: Option<Vec<String>>,
        provider: &Arc<CryptoProvider>,
    ) -> anyhow::Result<ClientCerts> {
        let mut roots = RootCertStore::empty();
        let pinned = cas.clone().unwrap_or_default();
        match cas {
            Some(cas) => {
                let (_, ignored) = roots.add_parsable_certificates(cas);
                if ignored > 0 {
                    tracing::warn!(
                        ignored,
                        "tls_server_config: client CA certificates that cannot be a trust anchor \
                         are left out"
                    );
                }
            }
            None if policy.verifies() => {
                // Go's x509.Verify with no CA pool uses the system's.
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
            }
            None => {}
        }
        let chains = if policy.verifies() && !roots.is_empty() {
            Some(
                WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots.clone()),
                    provider.clone(),
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| anyhow::anyhow!("client certificate verifier: {e}"))?,
            )
        } else {
            None
        };
        Ok(ClientCerts {
            policy,
            chains,
            pinned,
            hints: roots.subjects(),
            allowed_sans,
            algorithms: provider.signature_verification_algorithms,
        })
    }

    fn check_sans(&self, cert: &CertificateDer<'_>) -> Result<(), Error> {
        let Some(allowed) = &self.allowed_sans else {
            return Ok(());
        };
        let names = subject_alt_names(cert)
            .map_err(|()| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if names.iter().any(|n| allowed.contains(n)) {
            Ok(())
        } else {
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
        }
    }
}

impl ClientCertVerifier for ClientCerts {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.policy.requires() || self.allowed_sans.is_some()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        if self.policy.verifies() {
            if self
                .pinned
                .iter()
                .any(|p| p.as_ref() == end_entity.as_ref())
            {
                check_validity(end_entity, now)?;
            } else {
                match &self.chains {
                    Some(v) => {
                        v.verify_client_cert(end_entity, intermediates, now)?;
                    }
                    None => return Err(Error::InvalidCertificate(CertificateError::UnknownIssuer)),
                }
            }
        }
        self.check_sans(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    // The signature over the handshake is checked under every policy: a
    // client that presents a certificate proves it holds its key, as Go's
    // server requires too.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A pinned certificate is accepted only within its validity period, as
/// Go checks the leaf's even when it is in the pool.
fn check_validity(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), Error> {
    let parsed = x509_cert::Certificate::from_der(cert.as_ref())
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let v = &parsed.tbs_certificate.validity;
    let now = now.as_secs();
    if now < v.not_before.to_unix_duration().as_secs() {
        return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
    }
    if now > v.not_after.to_unix_duration().as_secs() {
        return Err(Error::InvalidCertificate(CertificateError::Expired));
    }
    Ok(())
}

/// The certificate's DNS names, e-mail addresses, IP addresses and URIs,
/// as text, in the order Go's toolkit collects them. IP addresses print as
/// Go's `net.IP.String` does for 4- and 16-byte addresses.
pub(crate) fn subject_alt_names(cert: &CertificateDer<'_>) -> Result<Vec<String>, ()> {
    let parsed = x509_cert::Certificate::from_der(cert.as_ref()).map_err(|_| ())?;
    let mut dns = Vec::new();
    let mut email = Vec::new();
    let mut ip = Vec::new();
    let mut uri = Vec::new();
    for ext in parsed.tbs_certificate.extensions.iter().flatten() {
        if ext.extn_id != SubjectAltName::OID {
            continue;
        }
        let san = SubjectAltName::from_der(ext.extn_value.as_bytes()).map_err(|_| ())?;
        for name in san.0 {
            match name {
                GeneralName::DnsName(s) => dns.push(s.to_string()),
                GeneralName::Rfc822Name(s) => email.push(s.to_string()),
                GeneralName::UniformResourceIdentifier(s) => uri.push(s.to_string()),
                GeneralName::IpAddress(o) => {
                    let b = o.as_bytes();
                    if let Ok(v4) = <[u8; 4]>::try_from(b) {
                        ip.push(std::net::Ipv4Addr::from(v4).to_string());
                    } else if let Ok(v6) = <[u8; 16]>::try_from(b) {
                        let v6 = std::net::Ipv6Addr::from(v6);
                        // Go prints an IPv4-mapped address as IPv4.
                        ip.push(match v6.to_ipv4_mapped() {
                            Some(v4) => v4.to_string(),
                            None => v6.to_string(),
                        });
                    }
                }
                _ => {}
            }
        }
    }
    dns.extend(email);
    dns.extend(ip);
    dns.extend(uri);
    Ok(dns)
}
