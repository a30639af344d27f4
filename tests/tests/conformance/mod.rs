//! The `LockStore` + `SessionRegistry` conformance suite (issue 8): C2 §2.5's "MUST honour"
//! table and docs/DESIGN.md §5 as executable checks, generic over the backend, so that the Raft,
//! PostgreSQL and etcd stores are shown "observably identical" by the same code.
//!
//! Owns the cases and the rules for when a backend may be skipped ([`backend_setting`]). Does
//! not start any backend: each `t60_conformance_*.rs` file builds its store and calls
//! [`run_suite`]. Every case uses keys unique to the run, so a database that outlives a run
//! (PostgreSQL, etcd) never leaks state between runs.
//!
//! Shared by several test binaries with `mod conformance;`; a binary that does not use every
//! helper would warn about it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod proxy;
pub mod requests;

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_api::{LockError, LockHandle, LockStore, SessionRegistry};

/// Lease of the sessions that must outlive a case.
pub const SESSION_TTL_LONG: Duration = Duration::from_secs(60);
/// Lease of a grant that must outlive a case.
pub const LOCK_TTL_LONG: Duration = Duration::from_secs(30);
/// The shortest lease the contract allows (`lock_api::limits::TTL_MIN`): the expiry cases wait
/// for it to pass. etcd rounds a lease up to its own minimum (about 2 s at default settings).
pub const TTL_SHORT: Duration = lock_api::limits::TTL_MIN;
/// How long a case waits for an expiry or a cascade it is entitled to before failing.
pub const EXPIRY_WAIT_MAX: Duration = Duration::from_secs(20);
/// How long past a grant's reported `server_expiry` a backend may still honour it. The Raft
/// leader starts its lease clock when the grant is applied, a commit after the stamp that
/// `server_expiry` is computed from (the client deadline, started before sending, is earlier
/// still, so this never lets two holders overlap).
pub const EXPIRY_GRACE: Duration = Duration::from_secs(1);
/// Pause between two polls of an expected state change.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Tasks racing `try_insert` on one key.
pub const RACERS: usize = 16;
/// Rounds of the one-winner race, each on a fresh key.
pub const RACE_ROUNDS: usize = 5;
/// Tasks cycling grant → record → release on one key in the token-order case.
pub const CYCLERS: usize = 8;
/// Grants the token-order case collects before checking their order.
pub const CYCLE_GRANTS: usize = 150;
/// How long the token-order case may run before it fails for lack of progress.
pub const CYCLE_TIME_MAX: Duration = Duration::from_secs(60);
/// Keys held by one session in the reap and close cases.
pub const KEYS_PER_SESSION: usize = 3;

/// Breaks a store's transport (the link to its database or to its peers), for the case that a
/// transient failure is never reported as "lost".
pub type Cut = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What a backend declares about itself to the suite.
pub struct Backend<S> {
    /// The store under test.
    pub store: S,
    /// `true` if the backend expires grants by itself in the background (the Raft leader's
    /// reaper), so `reap_expired` may find less than everything that expired.
    pub background_reaper: bool,
    /// A store on the same backend whose transport the suite may cut, with the cut; `None`
    /// when the backend offers no transport to cut (one in-process Raft node). Runs last.
    pub cuttable: Option<Cuttable<S>>,
}

/// A store whose transport the last case cuts.
pub struct Cuttable<S> {
    /// The store to cut off.
    pub store: S,
    /// Cuts it.
    pub cut: Cut,
    /// `true` if the cut also disables [`Backend::store`] (a Raft leader losing its quorum),
    /// so the case cannot look at the backend afterwards.
    pub shared: bool,
}

/// How a backend's connection setting is found. A backend whose variable is unset fails its
/// test, naming the command that provides it: a suite that tested nothing must never show as a
/// pass (issue 16). README's test command (`scripts/test`) starts the services and sets the
/// variables, so this arises only when the suite is run by hand without them.
pub fn backend_setting(var: &str, backend: &str) -> String {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{var} is unset, so the {backend} conformance suite cannot run. Run the tests with              `scripts/test` (README's test command: it installs and starts a private PostgreSQL              and etcd), or start them yourself with `eval \"$(scripts/test-services.sh start)\"` \
             before `cargo nextest run`"
        ),
    }
}

/// A string unique to this run, so keys never collide with a previous run's leftovers.
pub fn run_nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{}", nanos, std::process::id())
}

struct Ctx<S> {
    store: S,
    nonce: String,
    background_reaper: bool,
}

impl<S: LockStore + SessionRegistry> Ctx<S> {
    fn key(&self, case: &str, n: usize) -> String {
        format!("conf/{}/{case}/{n}", self.nonce)
    }

    async fn session(&self, owner: &str) -> String {
        self.store
            .open_session(owner, SESSION_TTL_LONG)
            .await
            .unwrap_or_else(|e| panic!("open_session({owner}): {e}"))
    }

    async fn grant(&self, key: &str, owner: &str, session: &str, ttl: Duration) -> LockHandle {
        self.store
            .try_insert(key, owner, session, ttl)
            .await
            .unwrap_or_else(|e| panic!("try_insert({key}): {e}"))
            .unwrap_or_else(|| panic!("try_insert({key}) on a free key was refused"))
    }
}

/// Runs every case against `backend`, printing each case as it passes; returns how many ran.
/// Panics (fails the test) at the first broken rule, naming the case and the rule.
pub async fn run_suite<S>(name: &str, backend: Backend<S>) -> usize
where
    S: LockStore + SessionRegistry + Clone + 'static,
{
    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        store: backend.store,
        nonce: run_nonce(),
        background_reaper: backend.background_reaper,
    });
    let mut ran = 0;
    macro_rules! case {
        ($f:ident) => {{
            let t = Instant::now();
            $f(&ctx).await;
            ran += 1;
            println!(
                "conformance[{name}] {} ok ({} ms)",
                stringify!($f),
                t.elapsed().as_millis()
            );
        }};
    }
    case!(try_insert_is_single_shot_and_exclusive);
    case!(try_insert_on_an_unknown_session_is_invalid_argument);
    case!(tokens_exceed_every_earlier_token_revoked_ones_included);
    case!(extend_is_conditional_on_key_and_token);
    case!(delete_if_owner_is_compare_and_delete);
    case!(read_is_advisory);
    case!(revoke_deletes_and_advances_the_floor);
    case!(close_session_counts_released_locks);
    case!(locks_of_lists_exactly_the_session_keys);
    case!(racing_try_insert_has_exactly_one_winner);
    case!(tokens_increase_in_grant_order_under_contention);
    case!(reap_expired_is_idempotent_and_concurrent_safe);
    case!(heartbeat_false_is_terminal_and_cascades);
    if let Some(cuttable) = backend.cuttable {
        let t = Instant::now();
        transient_failure_is_never_lost(&ctx, cuttable).await;
        ran += 1;
        println!(
            "conformance[{name}] transient_failure_is_never_lost ok ({} ms)",
            t.elapsed().as_millis()
        );
    } else {
        println!(
            "conformance[{name}] transient_failure_is_never_lost: no transport to cut on this backend"
        );
    }
    println!(
        "conformance[{name}]: {ran} cases passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    ran
}

async fn try_insert_is_single_shot_and_exclusive<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let key = c.key("exclusive", 0);
    let s1 = c.session("owner-a").await;
    let s2 = c.session("owner-b").await;
    let h = c.grant(&key, "owner-a", &s1, LOCK_TTL_LONG).await;
    assert!(h.fencing_token > 0, "a token is never zero");
    assert_eq!(h.key, key);
    assert_eq!(h.owner_id, "owner-a");
    assert_eq!(h.session_id, s1);
    // Single-shot: a held key answers "no" at once instead of waiting for the holder.
    let t = Instant::now();
    let second = c
        .store
        .try_insert(&key, "owner-b", &s2, LOCK_TTL_LONG)
        .await;
    assert_eq!(second, Ok(None), "a held key must not be granted twice");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "try_insert on a held key must not wait for the holder"
    );
    let info = c.store.read(&key).await.expect("read").expect("held");
    assert_eq!(info.fencing_token, h.fencing_token);
    assert_eq!(info.owner_id, "owner-a");
    assert!(
        c.store
            .delete_if_owner(&key, h.fencing_token)
            .await
            .expect("delete")
    );
}

async fn try_insert_on_an_unknown_session_is_invalid_argument<S: LockStore + SessionRegistry>(
    c: &Ctx<S>,
) {
    let key = c.key("unknown-session", 0);
    let s = c.session("owner-a").await;
    assert!(c.store.close_session(&s).await.is_ok());
    match c.store.try_insert(&key, "owner-a", &s, LOCK_TTL_LONG).await {
        Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("try_insert on a closed session must be InvalidArgument, got {other:?}"),
    }
    assert_eq!(c.store.read(&key).await, Ok(None));
}

async fn tokens_exceed_every_earlier_token_revoked_ones_included<S: LockStore + SessionRegistry>(
    c: &Ctx<S>,
) {
    let key = c.key("monotonic", 0);
    let s = c.session("owner-a").await;
    let t1 = c
        .grant(&key, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .fencing_token;
    assert!(c.store.delete_if_owner(&key, t1).await.expect("delete"));
    let t2 = c
        .grant(&key, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .fencing_token;
    assert!(t2 > t1, "token {t2} after a release must exceed {t1}");
    let out = c
        .store
        .revoke(&key, "op", "conformance")
        .await
        .expect("revoke");
    assert!(out.revoked);
    assert_eq!(out.previous_token, Some(t2));
    assert!(
        out.new_token_floor >= t2,
        "the floor never goes below the revoked token"
    );
    let t3 = c
        .grant(&key, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .fencing_token;
    assert!(
        t3 > out.new_token_floor && t3 > t2,
        "token {t3} after a revoke must exceed the floor {} and the revoked token {t2}",
        out.new_token_floor
    );
    // Another key's grants never lower this key's tokens either (one global sequence).
    let other = c.key("monotonic", 1);
    let o = c
        .grant(&other, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .fencing_token;
    assert!(o > t3);
    assert!(c.store.delete_if_owner(&key, t3).await.expect("delete"));
    let t4 = c
        .grant(&key, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .fencing_token;
    assert!(t4 > o && t4 > t3);
    assert_eq!(c.store.close_session(&s).await, Ok(2));
}

async fn extend_is_conditional_on_key_and_token<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let key = c.key("extend", 0);
    let s = c.session("owner-a").await;
    let h = c.grant(&key, "owner-a", &s, Duration::from_secs(5)).await;
    let e = c
        .store
        .extend(&key, h.fencing_token, LOCK_TTL_LONG)
        .await
        .expect("extend")
        .expect("the holder's extend must succeed");
    assert_eq!(e.fencing_token, h.fencing_token, "extend keeps the token");
    assert_eq!(e.key, key);
    assert!(
        e.server_expiry >= h.server_expiry,
        "extend never shortens the lease"
    );
    let info = c.store.read(&key).await.expect("read").expect("held");
    assert_eq!(info.fencing_token, h.fencing_token);
    // The pair (key, token) is the whole predicate.
    assert_eq!(
        c.store
            .extend(&key, h.fencing_token + 1_000_000, LOCK_TTL_LONG)
            .await,
        Ok(None),
        "a wrong token is lost"
    );
    assert_eq!(
        c.store
            .extend(&c.key("extend", 1), h.fencing_token, LOCK_TTL_LONG)
            .await,
        Ok(None),
        "the right token on the wrong key is lost"
    );
    assert!(
        c.store
            .delete_if_owner(&key, h.fencing_token)
            .await
            .expect("delete")
    );
    assert_eq!(
        c.store.extend(&key, h.fencing_token, LOCK_TTL_LONG).await,
        Ok(None),
        "a released grant is lost"
    );
    // A revoked grant is lost, and its successor is not extended by the old token.
    let h2 = c.grant(&key, "owner-a", &s, LOCK_TTL_LONG).await;
    c.store
        .revoke(&key, "op", "conformance")
        .await
        .expect("revoke");
    assert_eq!(
        c.store.extend(&key, h2.fencing_token, LOCK_TTL_LONG).await,
        Ok(None)
    );
    let h3 = c.grant(&key, "owner-a", &s, LOCK_TTL_LONG).await;
    assert_eq!(
        c.store.extend(&key, h2.fencing_token, LOCK_TTL_LONG).await,
        Ok(None)
    );
    assert!(
        c.store
            .extend(&key, h3.fencing_token, LOCK_TTL_LONG)
            .await
            .expect("extend")
            .is_some()
    );
    assert_eq!(c.store.close_session(&s).await, Ok(1));
}

async fn delete_if_owner_is_compare_and_delete<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let key = c.key("cad", 0);
    let s1 = c.session("owner-a").await;
    let s2 = c.session("owner-b").await;
    let h1 = c.grant(&key, "owner-a", &s1, LOCK_TTL_LONG).await;
    assert_eq!(
        c.store
            .delete_if_owner(&key, h1.fencing_token + 1_000_000)
            .await,
        Ok(false)
    );
    assert_eq!(
        c.store
            .delete_if_owner(&c.key("cad", 1), h1.fencing_token)
            .await,
        Ok(false)
    );
    let still = c
        .store
        .read(&key)
        .await
        .expect("read")
        .expect("a mismatch deletes nothing");
    assert_eq!(still.fencing_token, h1.fencing_token);
    assert_eq!(
        c.store.delete_if_owner(&key, h1.fencing_token).await,
        Ok(true)
    );
    assert_eq!(
        c.store.delete_if_owner(&key, h1.fencing_token).await,
        Ok(false),
        "only once"
    );
    // A stale holder's token never deletes the next grant.
    let h2 = c.grant(&key, "owner-b", &s2, LOCK_TTL_LONG).await;
    assert_eq!(
        c.store.delete_if_owner(&key, h1.fencing_token).await,
        Ok(false)
    );
    let info = c
        .store
        .read(&key)
        .await
        .expect("read")
        .expect("the new grant survives");
    assert_eq!(info.fencing_token, h2.fencing_token);
    assert_eq!(info.owner_id, "owner-b");
    assert_eq!(c.store.close_session(&s2).await, Ok(1));
    assert_eq!(c.store.close_session(&s1).await, Ok(0));
}

async fn read_is_advisory<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let key = c.key("read", 0);
    assert_eq!(
        c.store.read(&key).await,
        Ok(None),
        "a free key reads as none"
    );
    let s = c.session("owner-a").await;
    let before = SystemTime::now() - Duration::from_secs(5);
    let h = c.grant(&key, "owner-a", &s, LOCK_TTL_LONG).await;
    let info = c.store.read(&key).await.expect("read").expect("held");
    assert_eq!(info.key, key);
    assert_eq!(info.owner_id, "owner-a");
    assert_eq!(info.fencing_token, h.fencing_token);
    assert!(info.acquired_at <= info.expires_at);
    assert!(
        info.acquired_at >= before,
        "acquired_at is a plausible wall-clock time"
    );
    // Reading changes nothing: the grant is still extendable and the key still held.
    assert_eq!(c.store.read(&key).await.expect("read"), Some(info));
    assert!(
        c.store
            .extend(&key, h.fencing_token, LOCK_TTL_LONG)
            .await
            .expect("extend")
            .is_some()
    );
    assert_eq!(c.store.close_session(&s).await, Ok(1));
    assert_eq!(c.store.read(&key).await, Ok(None));
}

async fn revoke_deletes_and_advances_the_floor<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let key = c.key("revoke", 0);
    let s = c.session("owner-a").await;
    let h = c.grant(&key, "owner-a", &s, LOCK_TTL_LONG).await;
    let out = c
        .store
        .revoke(&key, "oncall", "stuck holder")
        .await
        .expect("revoke");
    assert_eq!(out.key, key);
    assert!(out.revoked);
    assert_eq!(out.previous_owner_id.as_deref(), Some("owner-a"));
    assert_eq!(out.previous_token, Some(h.fencing_token));
    assert!(out.new_token_floor >= h.fencing_token);
    assert_eq!(
        c.store.read(&key).await,
        Ok(None),
        "revoke deletes the grant"
    );
    assert_eq!(
        c.store.delete_if_owner(&key, h.fencing_token).await,
        Ok(false)
    );
    assert!(
        c.store.locks_of(&s).await.expect("locks_of").is_empty(),
        "a revoked grant leaves its session"
    );
    // Revoking a free key records nothing held, and the floor still advances.
    let free = c
        .store
        .revoke(&key, "oncall", "again")
        .await
        .expect("revoke");
    assert!(!free.revoked);
    assert_eq!(free.previous_token, None);
    assert_eq!(free.previous_owner_id, None);
    assert!(free.new_token_floor >= out.new_token_floor);
    let next = c.grant(&key, "owner-a", &s, LOCK_TTL_LONG).await;
    assert!(next.fencing_token > free.new_token_floor);
    // Bad arguments are caller bugs, not outcomes.
    assert!(matches!(
        c.store.revoke(&key, "", "r").await,
        Err(LockError::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.store.revoke(&key, "op", "").await,
        Err(LockError::InvalidArgument { .. })
    ));
    assert_eq!(c.store.close_session(&s).await, Ok(1));
}

async fn close_session_counts_released_locks<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let s = c.session("owner-a").await;
    let other = c.session("owner-b").await;
    for n in 0..KEYS_PER_SESSION {
        c.grant(&c.key("close", n), "owner-a", &s, LOCK_TTL_LONG)
            .await;
    }
    let kept = c
        .grant(&c.key("close", 99), "owner-b", &other, LOCK_TTL_LONG)
        .await;
    assert_eq!(c.store.close_session(&s).await, Ok(KEYS_PER_SESSION));
    for n in 0..KEYS_PER_SESSION {
        assert_eq!(c.store.read(&c.key("close", n)).await, Ok(None));
    }
    assert_eq!(
        c.store.close_session(&s).await,
        Ok(0),
        "closing twice releases nothing"
    );
    assert!(c.store.locks_of(&s).await.expect("locks_of").is_empty());
    assert_eq!(c.store.heartbeat(&s, SESSION_TTL_LONG).await, Ok(false));
    let info = c.store.read(&c.key("close", 99)).await.expect("read");
    assert_eq!(info.map(|i| i.fencing_token), Some(kept.fencing_token));
    assert_eq!(c.store.close_session(&other).await, Ok(1));
}

async fn locks_of_lists_exactly_the_session_keys<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let s = c.session("owner-a").await;
    let other = c.session("owner-b").await;
    assert!(c.store.locks_of(&s).await.expect("locks_of").is_empty());
    let a = c
        .grant(&c.key("locks-of", 0), "owner-a", &s, LOCK_TTL_LONG)
        .await;
    c.grant(&c.key("locks-of", 1), "owner-a", &s, LOCK_TTL_LONG)
        .await;
    c.grant(&c.key("locks-of", 2), "owner-b", &other, LOCK_TTL_LONG)
        .await;
    let want: BTreeSet<String> = [c.key("locks-of", 0), c.key("locks-of", 1)].into();
    assert_eq!(c.store.locks_of(&s).await, Ok(want));
    assert!(
        c.store
            .delete_if_owner(&a.key, a.fencing_token)
            .await
            .expect("delete")
    );
    let want: BTreeSet<String> = [c.key("locks-of", 1)].into();
    assert_eq!(c.store.locks_of(&s).await, Ok(want));
    assert_eq!(c.store.close_session(&s).await, Ok(1));
    assert_eq!(c.store.close_session(&other).await, Ok(1));
}

async fn racing_try_insert_has_exactly_one_winner<S>(c: &Arc<Ctx<S>>)
where
    S: LockStore + SessionRegistry + Clone + 'static,
{
    let mut sessions = Vec::new();
    for n in 0..RACERS {
        sessions.push(c.session(&format!("racer-{n}")).await);
    }
    for round in 0..RACE_ROUNDS {
        let key = c.key("race", round);
        let start = Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut tasks = tokio::task::JoinSet::new();
        for (n, s) in sessions.iter().enumerate() {
            let (store, key, s, start) = (c.store.clone(), key.clone(), s.clone(), start.clone());
            tasks.spawn(async move {
                start.wait().await;
                store
                    .try_insert(&key, &format!("racer-{n}"), &s, LOCK_TTL_LONG)
                    .await
            });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined.expect("racer task") {
                Ok(Some(h)) => winners.push(h),
                Ok(None) => {}
                // A backend may shed load as retry-safe contention; that is not a grant.
                Err(LockError::Contention { .. }) => {}
                Err(e) => panic!("racing try_insert failed: {e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one racer wins, got {winners:?}"
        );
        let info = c.store.read(&key).await.expect("read").expect("held");
        assert_eq!(info.fencing_token, winners[0].fencing_token);
    }
    for s in &sessions {
        c.store.close_session(s).await.expect("close");
    }
}

async fn tokens_increase_in_grant_order_under_contention<S>(c: &Arc<Ctx<S>>)
where
    S: LockStore + SessionRegistry + Clone + 'static,
{
    let key = c.key("order", 0);
    // Grants of one key never overlap, so the order in which holders append their token while
    // holding the key is the grant order.
    let granted: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + CYCLE_TIME_MAX;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..CYCLERS {
        let (store, key, granted) = (c.store.clone(), key.clone(), granted.clone());
        let owner = format!("cycler-{n}");
        let s = c.session(&owner).await;
        tasks.spawn(async move {
            loop {
                if granted.lock().expect("order log").len() >= CYCLE_GRANTS {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "only {} grants within {CYCLE_TIME_MAX:?}",
                    granted.lock().expect("order log").len()
                );
                match store.try_insert(&key, &owner, &s, LOCK_TTL_LONG).await {
                    Ok(Some(h)) => {
                        granted.lock().expect("order log").push(h.fencing_token);
                        let released = store.delete_if_owner(&key, h.fencing_token).await;
                        assert_eq!(released, Ok(true), "the holder releases its own grant");
                    }
                    Ok(None) | Err(LockError::Contention { .. }) => tokio::task::yield_now().await,
                    Err(e) => panic!("try_insert under contention failed: {e}"),
                }
            }
            store.close_session(&s).await.expect("close");
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("cycler task");
    }
    let granted = granted.lock().expect("order log").clone();
    for pair in granted.windows(2) {
        assert!(
            pair[0] < pair[1],
            "tokens out of grant order: {} was granted before {} on one key (grant log: {:?})",
            pair[0],
            pair[1],
            granted
        );
    }
}

/// Waits until every `(key, token)` is lost — the lease has run out — by polling `read`, which
/// on every backend stops showing a grant once it is expired or reaped.
async fn wait_expired<S: LockStore + SessionRegistry>(c: &Ctx<S>, handles: &[LockHandle]) {
    let deadline = Instant::now() + EXPIRY_WAIT_MAX;
    loop {
        let mut live = 0;
        for h in handles {
            let info = c.store.read(&h.key).await.expect("read");
            let past = SystemTime::now() > h.server_expiry + EXPIRY_GRACE;
            if info.is_some_and(|i| i.fencing_token == h.fencing_token) && !past {
                live += 1;
            }
        }
        if live == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{live} grants outlived their lease"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn reap_expired_is_idempotent_and_concurrent_safe<S>(c: &Arc<Ctx<S>>)
where
    S: LockStore + SessionRegistry + Clone + 'static,
{
    let s = c.session("owner-a").await;
    let mut handles = Vec::new();
    for n in 0..KEYS_PER_SESSION {
        handles.push(c.grant(&c.key("reap", n), "owner-a", &s, TTL_SHORT).await);
    }
    wait_expired(c, &handles).await;
    // Expiry is already true before any reaper runs: the grant cannot be extended and the key
    // can be granted again.
    for h in &handles {
        assert_eq!(
            c.store.extend(&h.key, h.fencing_token, LOCK_TTL_LONG).await,
            Ok(None)
        );
    }
    // Rounds of four concurrent reapers until every key reads free: a backend may keep a
    // grace past the deadline (the Raft leader adds its safety margin), so one round may be
    // too early; the counts of all rounds still add up to at most one per grant.
    let deadline = Instant::now() + EXPIRY_WAIT_MAX;
    let mut reaped = 0;
    loop {
        let now = SystemTime::now();
        let mut reapers = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let store = c.store.clone();
            reapers.spawn(async move { store.reap_expired(now).await });
        }
        while let Some(joined) = reapers.join_next().await {
            reaped += joined.expect("reaper task").expect("reap_expired");
        }
        let mut held = 0;
        for h in &handles {
            if c.store.read(&h.key).await.expect("read").is_some() {
                held += 1;
            }
        }
        if held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{held} expired grants were never reaped"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    if c.background_reaper {
        assert!(
            reaped <= KEYS_PER_SESSION,
            "reaped {reaped} of {KEYS_PER_SESSION}"
        );
    } else {
        assert_eq!(
            reaped, KEYS_PER_SESSION,
            "concurrent reapers reap each grant once"
        );
    }
    assert_eq!(
        c.store.reap_expired(SystemTime::now()).await,
        Ok(0),
        "idempotent"
    );
    for h in &handles {
        assert_eq!(c.store.read(&h.key).await, Ok(None));
        assert_eq!(
            c.store.delete_if_owner(&h.key, h.fencing_token).await,
            Ok(false)
        );
    }
    assert!(c.store.locks_of(&s).await.expect("locks_of").is_empty());
    let again = c.grant(&handles[0].key, "owner-a", &s, LOCK_TTL_LONG).await;
    assert!(again.fencing_token > handles[0].fencing_token);
    assert_eq!(c.store.close_session(&s).await, Ok(1));
}

async fn heartbeat_false_is_terminal_and_cascades<S: LockStore + SessionRegistry>(c: &Ctx<S>) {
    let live = c.session("owner-a").await;
    assert_eq!(c.store.heartbeat(&live, SESSION_TTL_LONG).await, Ok(true));
    let dying = c
        .store
        .open_session("owner-b", TTL_SHORT)
        .await
        .expect("open_session");
    let key = c.key("heartbeat", 0);
    let h = c.grant(&key, "owner-b", &dying, LOCK_TTL_LONG).await;
    // No heartbeat: the session's lease runs out, and its grant must go with it even though
    // the grant's own lease is long.
    let deadline = Instant::now() + EXPIRY_WAIT_MAX;
    while c.store.read(&key).await.expect("read").is_some() {
        assert!(
            Instant::now() < deadline,
            "a dead session's grant outlived it"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert_eq!(c.store.heartbeat(&dying, SESSION_TTL_LONG).await, Ok(false));
    assert_eq!(
        c.store.heartbeat(&dying, SESSION_TTL_LONG).await,
        Ok(false),
        "terminal"
    );
    assert!(c.store.locks_of(&dying).await.expect("locks_of").is_empty());
    assert_eq!(
        c.store.extend(&key, h.fencing_token, LOCK_TTL_LONG).await,
        Ok(None)
    );
    let next = c.grant(&key, "owner-a", &live, LOCK_TTL_LONG).await;
    assert!(next.fencing_token > h.fencing_token);
    assert_eq!(c.store.heartbeat(&live, SESSION_TTL_LONG).await, Ok(true));
    assert_eq!(c.store.close_session(&live).await, Ok(1));
}

/// With the transport cut, `extend` and `heartbeat` fail retry-safe — never "lost" (C2 §2.5).
async fn transient_failure_is_never_lost<S: LockStore + SessionRegistry>(
    c: &Ctx<S>,
    Cuttable {
        store: cuttable,
        cut,
        shared,
    }: Cuttable<S>,
) {
    let key = c.key("transient", 0);
    let s = cuttable
        .open_session("owner-a", SESSION_TTL_LONG)
        .await
        .expect("open_session");
    let h = cuttable
        .try_insert(&key, "owner-a", &s, LOCK_TTL_LONG)
        .await
        .expect("try_insert")
        .expect("free key");
    cut().await;
    match cuttable.extend(&key, h.fencing_token, LOCK_TTL_LONG).await {
        Err(e) if e.is_retry_safe() => {}
        other => panic!("extend over a cut transport must be retry-safe, got {other:?}"),
    }
    match cuttable.heartbeat(&s, SESSION_TTL_LONG).await {
        Err(e) if e.is_retry_safe() => {}
        other => panic!("heartbeat over a cut transport must be retry-safe, got {other:?}"),
    }
    match cuttable.delete_if_owner(&key, h.fencing_token).await {
        Err(e) if e.is_retry_safe() => {}
        other => panic!("delete_if_owner over a cut transport must be retry-safe, got {other:?}"),
    }
    if shared {
        return;
    }
    // The grant is untouched on the backend.
    let info = c.store.read(&key).await.expect("read").expect("still held");
    assert_eq!(info.fencing_token, h.fencing_token);
    assert!(
        c.store
            .delete_if_owner(&key, h.fencing_token)
            .await
            .expect("delete")
    );
    c.store.close_session(&s).await.expect("close");
}
