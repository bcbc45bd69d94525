//! ECDHE on NIST P-521 (secp521r1) for rustls, which the ring provider does
//! not have: exporter-toolkit's `curve_preferences` names `CurveP521`, and a
//! web configuration that lists it alone must still serve (Go's TLS stack
//! has it). The curve arithmetic is RustCrypto's `p521`; the random scalar
//! comes from ring's system generator, as the other groups' do.

use rustls::crypto::{ActiveKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::{Error, NamedGroup, PeerIncompatible, PeerMisbehaved};

use ring::rand::SecureRandom;

/// Bytes of a P-521 field element and scalar: 521 bits rounded up.
const FIELD_BYTES: usize = 66;
/// An uncompressed point: 0x04, then x and y. TLS allows no other
/// encoding (RFC 8446 §4.2.8.2, RFC 8422 §5.4.1 as updated by RFC 8996).
const POINT_BYTES: usize = 1 + 2 * FIELD_BYTES;

#[derive(Debug)]
pub(crate) struct P521;

pub(crate) static SECP521R1: &dyn SupportedKxGroup = &P521;

impl SupportedKxGroup for P521 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let rng = ring::rand::SystemRandom::new();
        // Rejection sampling: 521 random bits are below the group order
        // with probability close to 1, so this loop ends at once.
        for _ in 0..64 {
            let mut bytes = zeroize::Zeroizing::new([0u8; FIELD_BYTES]);
            rng.fill(bytes.as_mut_slice())
                .map_err(|_| Error::FailedToGetRandomBytes)?;
            bytes[0] &= 0x01;
            if let Ok(secret) = p521::SecretKey::from_slice(bytes.as_slice()) {
                let public = secret.public_key().to_sec1_bytes().into_vec();
                if public.len() != POINT_BYTES {
                    return Err(Error::General("P-521 public key of the wrong size".into()));
                }
                return Ok(Box::new(Active { secret, public }));
            }
        }
        Err(Error::FailedToGetRandomBytes)
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::secp521r1
    }
}

struct Active {
    secret: p521::SecretKey,
    public: Vec<u8>,
}

impl ActiveKeyExchange for Active {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        if peer.len() != POINT_BYTES || peer.first() != Some(&0x04) {
            return Err(PeerMisbehaved::InvalidKeyShare.into());
        }
        // Checks that the point is on the curve (and not the identity).
        let peer = p521::PublicKey::from_sec1_bytes(peer)
            .map_err(|_| Error::from(PeerIncompatible::NoKxGroupsInCommon))?;
        let shared = p521::ecdh::diffie_hellman(self.secret.to_nonzero_scalar(), peer.as_affine());
        // The x coordinate, full width: the shared secret of ECDHE in both
        // TLS 1.2 (RFC 8422 §5.10) and TLS 1.3 (RFC 8446 §7.4.2).
        Ok(SharedSecret::from(shared.raw_secret_bytes().as_slice()))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::secp521r1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_agree() {
        let a = SECP521R1.start().unwrap();
        let b = SECP521R1.start().unwrap();
        let b_pub = b.pub_key().to_vec();
        let a_pub = a.pub_key().to_vec();
        assert_eq!(a_pub.len(), POINT_BYTES);
        let s1 = a.complete(&b_pub).unwrap();
        let s2 = b.complete(&a_pub).unwrap();
        assert_eq!(s1.secret_bytes(), s2.secret_bytes());
        assert_eq!(s1.secret_bytes().len(), FIELD_BYTES);
    }

    #[test]
    fn a_bad_point_is_refused() {
        let a = SECP521R1.start().unwrap();
        let mut bad = vec![0x04; POINT_BYTES];
        bad[1] = 0x01;
        assert!(a.complete(&bad).is_err());
        let a = SECP521R1.start().unwrap();
        assert!(a.complete(&[0x04; 10]).is_err());
    }
}
