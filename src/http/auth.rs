//! HTTP basic authentication against bcrypt hashes, as exporter-toolkit does
//! it: every path is protected, a failure is a 401 with
//! `WWW-Authenticate: Basic`.
//!
//! # The cache
//!
//! Prometheus sends the same credentials on every scrape, so successful
//! checks are cached. The cache key is an HMAC, under a key drawn at start
//! and never stored, of user, hash and password: a memory dump shows neither
//! the password nor anything an attacker can test guesses against offline.
//! A scraper pays for one bcrypt check after a start or a reload, never
//! again.
//!
//! # Floods: the wait queue
//!
//! bcrypt is slow on purpose: one check keeps a core busy for about 60 ms
//! at cost 10 and 250 ms at cost 12 (each step doubles it), and a wrong
//! password is never cached, so whoever reaches the port buys that much
//! CPU per request. Every uncached check therefore goes through one queue
//! per process ([`gate`]), which outlives reloads:
//!
//! - At most 2 checks run at once, on blocking threads.
//! - A check ranks by the recent failures (wrong password or unknown user)
//!   of its client address, counted per IPv4 address or IPv6 /64: fewest
//!   first, arrival order among equals. Ranks are read at each decision,
//!   so a flood's waiting checks drop behind as soon as its first check
//!   fails. A failure is forgotten 15 minutes after the address's last one,
//!   and at its next success; at most 1,024 addresses are remembered, the
//!   one whose last failure is the oldest is forgotten first.
//! - Addresses with failures get at most one of the two slots; the other is
//!   kept for addresses without failures. Once a flood's first check has
//!   failed, a scraper with the right password at another address no
//!   longer waits behind it: it waits only for checks from addresses
//!   without failures, then for its own hash (about 0.25 s at cost 12
//!   while the flood keeps the other core).
//! - Waiting is bounded: 4 checks per address, 16 in all. Beyond that the
//!   request is answered at once without a hash: 429 when its own address
//!   already has 4 waiting, 503 when the queue is full of checks that rank
//!   as high (an arrival that ranks higher takes the place of the lowest
//!   one, which gets the 503 instead). Both carry `Retry-After`, are
//!   counted in `pgstorage_http_auth_skipped_total`, and an overload is
//!   logged once when it begins and once when it ends.
//! - A request whose client hangs up leaves the queue: hyper's HTTP/1
//!   server keeps reading the socket while a request without a body waits
//!   for its answer (its mid-message EOF detection; axum leaves
//!   `half_close` off), so the client's FIN or RST ends the connection with
//!   an error, axum's task for the connection ends, and the request's
//!   future, with its place in the queue, is dropped. A check that was
//!   given a slot but whose hash has not begun is skipped
//!   (`client_gone`). A hash already running cannot be stopped (bcrypt has
//!   no point at which to stop) and keeps its slot until it ends: that core
//!   is spent either way, and the slot count stays true.
//!
//! What this cannot do, and what the port then is: a trust boundary where
//! anyone who reaches it can keep a core busy with hashes (both, from
//! addresses that have not failed yet). A flood from
//! Prometheus's own address (or its IPv6 /64, or the same NAT or proxy)
//! shares its rank and its 4 places: Prometheus's uncached checks wait
//! among the flood's or get 429 until the flood stops (its cached scrapes
//! are not affected). Many addresses that each fail once rank as clean
//! until they fail, and can fill the queue ahead of a scraper. It is no
//! rate limit: put a reverse proxy with one in front of a port that the
//! whole network can reach.
//!
//! # Timing and user names
//!
//! An unknown user is checked against a stand-in hash, so the answer takes
//! as long as for a known user with a wrong password (exporter-toolkit does
//! the same): the hash of a configured user with the cost that most users
//! have (the higher on a tie). When the users' costs differ, the time of a
//! wrong answer tells a user of one cost from a user of another and from an
//! unknown name; the web configuration warns of it when it is loaded.

mod gate;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ring::hmac;
use zeroize::Zeroizing;

pub(crate) use self::gate::{ClientKey, Gate};
use crate::exposition::http_auth::Skipped;
use crate::http::serve::ClientAddr;

/// Cached successful verifications before the cache is emptied. Far more
/// than the handful of scrapers an exporter has; the bound only keeps a
/// stream of distinct valid logins from growing memory.
const CACHE_CAP: usize = 1024;

/// The highest bcrypt cost loaded without a second warning. One check
/// takes about 250 ms of a core at cost 12 (release build, 2-vCPU VM), 1 s
/// at 14, 2 s at 15, and 36 hours at 31, the most the format allows: each
/// step doubles it. At 14 a first scrape still fits Prometheus's default
/// 10 s scrape timeout on a vCPU three times slower or busier, with room
/// to wait for another check; at 15 it would not. A higher cost is still
/// accepted up to [`REFUSED_ABOVE`], as exporter-toolkit accepts it (its
/// own test file has a user at 18), so that its files load here; the
/// warning names the users.
pub(crate) const MAX_COST: u32 = 14;

/// The highest bcrypt cost loaded at all: exporter-toolkit's own test file
/// goes up to 18 (about 16 s of a core per check). Above it a wrong
/// password would hold one of the two check slots for half a minute or,
/// at 31, the format's most, 36 hours: a blocking thread cannot be
/// stopped once it runs, so two such guesses would shut every user out.
pub(crate) const REFUSED_ABOVE: u32 = 18;

/// exporter-toolkit's default (Go's `bcrypt.DefaultCost`), and what
/// `htpasswd -nBC 10` makes: a higher cost is accepted with a warning.
pub(crate) const USUAL_COST: u32 = 10;

pub(crate) struct BasicAuth {
    /// User name to bcrypt hash.
    users: BTreeMap<String, Arc<str>>,
    /// Hash that unknown users are checked against, so that the response
    /// time does not tell which user names exist. A configured hash of the
    /// cost most users have (module doc).
    decoy: Arc<str>,
    cache_key: hmac::Key,
    cache: Mutex<HashSet<[u8; 32]>>,
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
pub(crate) enum AuthSetupError {
    #[error("no users")]
    NoUsers,
    #[error("cannot draw a random key for the verification cache")]
    Random,
}

/// The outcome of [`BasicAuth::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Fail,
    /// Not checked: the wait queue refused it.
    Busy(Skipped),
}

/// The cost of a bcrypt hash; 0 if it is not one (the web configuration
/// has refused those before they get here).
pub(crate) fn cost(hash: &str) -> u32 {
    hash.parse::<bcrypt::HashParts>()
        .map(|p| p.get_cost())
        .unwrap_or(0)
}

/// The cost most of `costs` have, the higher on a tie.
pub(crate) fn usual_cost(costs: impl IntoIterator<Item = u32>) -> Option<u32> {
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for c in costs {
        *count.entry(c).or_default() += 1;
    }
    count
        .into_iter()
        .max_by_key(|&(c, n)| (n, c))
        .map(|(c, _)| c)
}

/// Set to false when the request that asked for a check is dropped, so a
/// blocking task that has not begun yet skips the hash.
struct Wanted(Arc<AtomicBool>);

impl Drop for Wanted {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl BasicAuth {
    /// `users` maps user names to bcrypt hashes already checked for format.
    pub(crate) fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, AuthSetupError> {
        let users: BTreeMap<String, Arc<str>> =
            users.into_iter().map(|(u, h)| (u, Arc::from(h))).collect();
        let decoy_cost =
            usual_cost(users.values().map(|h| cost(h))).ok_or(AuthSetupError::NoUsers)?;
        let decoy = users
            .values()
            .find(|h| cost(h) == decoy_cost)
            .cloned()
            .ok_or(AuthSetupError::NoUsers)?;
        let cache_key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| AuthSetupError::Random)?;
        Ok(BasicAuth {
            users,
            decoy,
            cache_key,
            cache: Mutex::new(HashSet::new()),
        })
    }

    pub(crate) fn users(&self) -> usize {
        self.users.len()
    }

    /// Whether an `Authorization` header carries a valid user and
    /// password. An uncached check waits in `gate` for a slot, counted
    /// against `client`.
    pub(crate) async fn check(
        &self,
        gate: &Arc<Gate>,
        client: ClientKey,
        authorization: Option<&HeaderValue>,
    ) -> Verdict {
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return Verdict::Fail;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (self.decoy.clone(), false),
        };
        let key = self.cache_key(&user, &hash, &password);
        if known && self.cache_contains(&key) {
            gate.tick();
            return Verdict::Pass;
        }
        let slot = match gate.enter(client).await {
            Ok(slot) => slot,
            Err(why) => return Verdict::Busy(why),
        };
        let wanted = Wanted(Arc::new(AtomicBool::new(true)));
        let still_wanted = wanted.0.clone();
        // Off the async workers: a bcrypt check at cost 10+ would stall every
        // scrape on the two-thread runtime. The slot goes along and is
        // freed when the hash ends, not when the client hangs up: the core
        // stays busy until then.
        let ok = tokio::task::spawn_blocking(move || {
            if !still_wanted.load(Ordering::Acquire) {
                slot.abandon();
                return false;
            }
            let ok = bcrypt::verify(&*password, &hash).unwrap_or(false) && known;
            slot.finish(ok);
            ok
        })
        .await
        .unwrap_or(false);
        drop(wanted);
        if ok {
            self.cache_insert(key);
            Verdict::Pass
        } else {
            Verdict::Fail
        }
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
pub(crate) type AuthSlot = Arc<std::sync::RwLock<Option<Arc<BasicAuth>>>>;

/// What the middleware needs: the users in force and the one wait queue.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) users: AuthSlot,
    pub(crate) gate: Arc<Gate>,
}

/// Middleware: lets the request through only with valid credentials, when
/// the web configuration in force has users.
pub(crate) async fn require(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let current = guard.users.read().ok().and_then(|a| a.clone());
    let Some(auth) = current else {
        return next.run(req).await;
    };
    let client = req
        .extensions()
        .get::<ConnectInfo<ClientAddr>>()
        .map_or_else(ClientKey::unknown, |c| ClientKey::of(c.0.0.ip()));
    let verdict = auth
        .check(
            &guard.gate,
            client,
            req.headers().get(header::AUTHORIZATION),
        )
        .await;
    match verdict {
        Verdict::Pass => next.run(req).await,
        Verdict::Fail => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic")],
            "Unauthorized\n",
        )
            .into_response(),
        Verdict::Busy(why) => {
            let status = match why {
                Skipped::AddressBusy => StatusCode::TOO_MANY_REQUESTS,
                Skipped::QueueFull | Skipped::ClientGone => StatusCode::SERVICE_UNAVAILABLE,
            };
            (
                status,
                // A check takes a fraction of a second; the queue moves
                // within a second or two.
                [(header::RETRY_AFTER, "1")],
                "Too many password checks waiting; retry later\n",
            )
                .into_response()
        }
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

    fn gate() -> Arc<Gate> {
        let mut r = prometheus_client::registry::Registry::default();
        Arc::new(Gate::new(
            crate::exposition::http_auth::AuthMetrics::register(&mut r),
        ))
    }

    async fn passes(a: &BasicAuth, g: &Arc<Gate>, h: Option<&HeaderValue>) -> bool {
        match a.check(g, ClientKey::unknown(), h).await {
            Verdict::Pass => true,
            Verdict::Fail => false,
            Verdict::Busy(why) => panic!("refused: {why:?}"),
        }
    }

    #[tokio::test]
    async fn right_password_passes_and_is_cached() {
        let (a, g) = (auth(), gate());
        assert!(passes(&a, &g, Some(&header("alice", "s3cret:x"))).await);
        assert_eq!(a.cached(), 1);
        assert!(passes(&a, &g, Some(&header("alice", "s3cret:x"))).await);
        assert_eq!(a.cached(), 1);
        let lower = HeaderValue::from_str(
            header("alice", "s3cret:x")
                .to_str()
                .unwrap()
                .replace("Basic", "basic")
                .as_str(),
        )
        .unwrap();
        assert!(passes(&a, &g, Some(&lower)).await);
    }

    #[tokio::test]
    async fn wrong_credentials_fail_and_are_not_cached() {
        let (a, g) = (auth(), gate());
        assert!(!passes(&a, &g, None).await);
        assert!(!passes(&a, &g, Some(&header("alice", "wrong"))).await);
        assert!(!passes(&a, &g, Some(&header("alice", "other"))).await);
        // Bob's password is no good for an unknown user checked against the
        // decoy, nor for alice.
        assert!(!passes(&a, &g, Some(&header("carol", "s3cret:x"))).await);
        assert!(!passes(&a, &g, Some(&header("", ""))).await);
        assert!(!passes(&a, &g, Some(&HeaderValue::from_static("Bearer abc"))).await);
        assert!(!passes(&a, &g, Some(&HeaderValue::from_static("Basic !!!"))).await);
        assert_eq!(a.cached(), 0);
        // A success for one user does not open the door for another.
        assert!(passes(&a, &g, Some(&header("bob", "other"))).await);
        assert!(!passes(&a, &g, Some(&header("alice", "other"))).await);
    }

    /// Unknown names are checked at the cost most users have, so the time
    /// of a 401 does not tell them from those users' names.
    #[test]
    fn the_stand_in_has_the_users_cost() {
        // Made from a cost-4 hash: only the cost field is read here.
        let h = bcrypt::hash("pw", 4).unwrap();
        let at = |c: u32| h.replacen("$04$", &format!("${c:02}$"), 1);
        let users = |costs: &[u32]| {
            costs
                .iter()
                .enumerate()
                .map(|(i, &c)| (format!("u{i}"), at(c)))
                .collect::<BTreeMap<_, _>>()
        };
        for (costs, want) in [
            (&[4][..], 4),
            (&[12], 12),
            (&[10, 10], 10),
            (&[12, 10, 12], 12),
            (&[10, 12, 10], 10),
            // A tie: the higher, so no unknown name answers faster than
            // the slower users.
            (&[10, 12], 12),
            (&[12, 10], 12),
        ] {
            let a = BasicAuth::new(users(costs)).unwrap();
            assert_eq!(cost(&a.decoy), want, "{costs:?}");
        }
        assert_eq!(usual_cost([]), None);
    }

    /// A request dropped after its check got a slot but before its hash
    /// began (all blocking threads busy): the hash never runs and the slot
    /// comes back.
    #[test]
    fn a_check_dropped_before_its_hash_begins_is_skipped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut registry = prometheus_client::registry::Registry::default();
            let g = Arc::new(Gate::new(
                crate::exposition::http_auth::AuthMetrics::register(&mut registry),
            ));
            let series = |name: &str| {
                let mut text = String::new();
                prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                    .unwrap()
            };
            let a = auth();
            // The one blocking thread is busy until told otherwise.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let blocker = tokio::task::spawn_blocking(move || rx.recv().ok());
            let h = header("alice", "wrong");
            let check = a.check(&g, ClientKey::unknown(), Some(&h));
            let timed_out = tokio::time::timeout(std::time::Duration::from_millis(50), check);
            assert!(timed_out.await.is_err(), "the check cannot have run");
            tx.send(()).unwrap();
            blocker.await.unwrap();
            for _ in 0..1000 {
                if series("pgstorage_http_auth_skipped_total{reason=\"client_gone\"}") == 1.0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(
                series("pgstorage_http_auth_skipped_total{reason=\"client_gone\"}"),
                1.0
            );
            assert_eq!(
                series("pgstorage_http_auth_checks_total{result=\"failure\"}"),
                0.0
            );
            assert_eq!(
                series("pgstorage_http_auth_checks_in_flight{state=\"running\"}"),
                0.0
            );
        });
    }

    #[test]
    fn debug_prints_no_hash() {
        let a = auth();
        let s = format!("{a:?}");
        assert!(!s.contains("$2"), "{s}");
    }
}
