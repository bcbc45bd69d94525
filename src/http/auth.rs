//! HTTP basic authentication against bcrypt hashes, as exporter-toolkit does
//! it: every path is protected, a failure is a 401 with
//! `WWW-Authenticate: Basic`.
//!
//! bcrypt is slow on purpose (tens of milliseconds at the usual cost), and
//! Prometheus sends the same credentials on every scrape, so successful
//! checks are cached. The cache key is an HMAC, under a key drawn at start
//! and never stored, of user, hash and password: a memory dump shows neither
//! the password nor anything an attacker can test guesses against offline.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ring::hmac;
use tokio::sync::Semaphore;
use zeroize::Zeroizing;

/// Cached successful verifications before the cache is emptied. Far more
/// than the handful of scrapers an exporter has; the bound only keeps a
/// stream of distinct valid logins from growing memory.
const CACHE_CAP: usize = 1024;

/// bcrypt checks running at once. Each one occupies a blocking thread for
/// the whole hash; a flood of wrong passwords (never cached) must not take
/// every core from the probes.
const CONCURRENT_VERIFICATIONS: usize = 2;

pub struct BasicAuth {
    /// User name to bcrypt hash.
    users: BTreeMap<String, Arc<str>>,
    /// Hash that unknown users are checked against, so that the response
    /// time does not tell which user names exist (exporter-toolkit does the
    /// same). One of the configured hashes, so its cost matches theirs.
    decoy: Arc<str>,
    cache_key: hmac::Key,
    cache: Mutex<HashSet<[u8; 32]>>,
    permits: Arc<Semaphore>,
}

// By hand: never print hashes or the cache key.
impl fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuth")
            .field("users", &self.users.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("no users")]
    NoUsers,
    #[error("cannot draw a random key for the verification cache")]
    Random,
}

impl BasicAuth {
    /// `users` maps user names to bcrypt hashes already checked for format.
    pub fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, AuthSetupError> {
        let users: BTreeMap<String, Arc<str>> =
            users.into_iter().map(|(u, h)| (u, Arc::from(h))).collect();
        let decoy = users
            .values()
            .next()
            .cloned()
            .ok_or(AuthSetupError::NoUsers)?;
        let cache_key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| AuthSetupError::Random)?;
        Ok(BasicAuth {
            users,
            decoy,
            cache_key,
            cache: Mutex::new(HashSet::new()),
            permits: Arc::new(Semaphore::new(CONCURRENT_VERIFICATIONS)),
        })
    }

    pub fn users(&self) -> usize {
        self.users.len()
    }

    /// Whether an `Authorization` header carries a valid user and password.
    pub async fn check(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (self.decoy.clone(), false),
        };
        let key = self.cache_key(&user, &hash, &password);
        if known && self.cache_contains(&key) {
            return true;
        }
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            // Only a closed semaphore fails, and this one is never closed.
            return false;
        };
        // Off the async workers: a bcrypt check at cost 10+ would stall every
        // scrape on the two-thread runtime. The permit goes along, so a client
        // that hangs up does not free it while the hash is still running.
        let ok = tokio::task::spawn_blocking(move || {
            let ok = bcrypt::verify(&*password, &hash).unwrap_or(false);
            drop(permit);
            ok
        })
        .await
        .unwrap_or(false);
        if ok && known {
            self.cache_insert(key);
        }
        ok && known
    }

    fn cache_key(&self, user: &str, hash: &str, password: &[u8]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.cache_key);
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        for part in [user.as_bytes(), hash.as_bytes(), password] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    fn cache_contains(&self, key: &[u8; 32]) -> bool {
        // A poisoned lock only means another request panicked mid-insert; the
        // set itself is still a valid set.
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.contains(key)
    }

    fn cache_insert(&self, key: [u8; 32]) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_CAP {
            cache.clear();
        }
        cache.insert(key);
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// `Basic base64(user:password)` to (user, password). The password stays
/// bytes: RFC 7617 does not force UTF-8 on it and bcrypt hashes bytes. Its
/// copies are wiped when dropped, so freed memory does not keep it.
fn parse_basic(v: &HeaderValue) -> Option<(String, Zeroizing<Vec<u8>>)> {
    let v = v.as_bytes();
    let scheme = v.get(..6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(v.get(6..)?.trim_ascii())
            .ok()?,
    );
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded.get(..colon)?.to_vec()).ok()?;
    let password = Zeroizing::new(decoded.get(colon + 1..)?.to_vec());
    Some((user, password))
}

/// The users in force, swapped by a reload of the web configuration; None
/// lets every request through (a web configuration without
/// `basic_auth_users`).
pub type AuthSlot = Arc<std::sync::RwLock<Option<Arc<BasicAuth>>>>;

/// Middleware: lets the request through only with valid credentials, when
/// the web configuration in force has users.
pub async fn require(State(slot): State<AuthSlot>, req: Request, next: Next) -> Response {
    let current = slot.read().ok().and_then(|a| a.clone());
    let Some(auth) = current else {
        return next.run(req).await;
    };
    if auth.check(req.headers().get(header::AUTHORIZATION)).await {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic")],
            "Unauthorized\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> HeaderValue {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {b}")).unwrap()
    }

    fn auth() -> BasicAuth {
        let mut users = BTreeMap::new();
        users.insert("alice".to_string(), bcrypt::hash("s3cret:x", 4).unwrap());
        users.insert("bob".to_string(), bcrypt::hash("other", 4).unwrap());
        BasicAuth::new(users).unwrap()
    }

    #[tokio::test]
    async fn right_password_passes_and_is_cached() {
        let a = auth();
        assert!(a.check(Some(&header("alice", "s3cret:x"))).await);
        assert_eq!(a.cached(), 1);
        assert!(a.check(Some(&header("alice", "s3cret:x"))).await);
        assert_eq!(a.cached(), 1);
        let lower = HeaderValue::from_str(
            header("alice", "s3cret:x")
                .to_str()
                .unwrap()
                .replace("Basic", "basic")
                .as_str(),
        )
        .unwrap();
        assert!(a.check(Some(&lower)).await);
    }

    #[tokio::test]
    async fn wrong_credentials_fail_and_are_not_cached() {
        let a = auth();
        assert!(!a.check(None).await);
        assert!(!a.check(Some(&header("alice", "wrong"))).await);
        assert!(!a.check(Some(&header("alice", "other"))).await);
        // Bob's password is no good for an unknown user checked against the
        // decoy, nor for alice.
        assert!(!a.check(Some(&header("carol", "s3cret:x"))).await);
        assert!(!a.check(Some(&header("", ""))).await);
        assert!(!a.check(Some(&HeaderValue::from_static("Bearer abc"))).await);
        assert!(!a.check(Some(&HeaderValue::from_static("Basic !!!"))).await);
        assert_eq!(a.cached(), 0);
        // A success for one user does not open the door for another.
        assert!(a.check(Some(&header("bob", "other"))).await);
        assert!(!a.check(Some(&header("alice", "other"))).await);
    }

    #[test]
    fn debug_prints_no_hash() {
        let a = auth();
        let s = format!("{a:?}");
        assert!(!s.contains("$2"), "{s}");
    }
}
