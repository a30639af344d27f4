//! The applied-state counters: an [`ApplyObserver`] that counts the [`Event`]s of every applied
//! batch. It runs where commands are applied, on every replica, so the counters agree on every
//! node once the same log is applied (docs/METRICS.md has the counting rules).
//!
//! Owns counting only; never blocks the apply path beyond a few atomic adds. Entries replayed
//! after a restart are applied, and counted, again: the counters restart with the process, as
//! Prometheus counters do.

use std::sync::Arc;

use lock_raft_store::storage::ApplyObserver;
use lock_raft_store::{Event, FreeCause};

use super::families::{Families, LeaseKind, LeaseLabels};

/// Counts grants, hand-offs, releases, expirations and revocations as they are applied, and
/// passes every batch on to the observer it wraps (the lease keeper and the waiters).
pub struct CountingObserver {
    families: Arc<Families>,
    inner: Arc<dyn ApplyObserver>,
}

impl std::fmt::Debug for CountingObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingObserver").finish_non_exhaustive()
    }
}

impl CountingObserver {
    /// Counts into `families`, then hands each batch to `inner`.
    pub fn new(families: Arc<Families>, inner: Arc<dyn ApplyObserver>) -> Self {
        Self { families, inner }
    }
}

/// What one batch of events adds to the counters.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Grants made, hand-offs included.
    pub grants: u64,
    /// Grants made by a hand-off.
    pub handoffs: u64,
    /// Grants given up by their holder.
    pub releases: u64,
    /// Grants whose own lease lapsed.
    pub grant_expirations: u64,
    /// Sessions whose lease lapsed.
    pub session_expirations: u64,
    /// Revokes that deleted a grant.
    pub revocations: u64,
}

impl Counts {
    /// Counts `events` (one applied batch, in apply order) by the rules of docs/METRICS.md.
    ///
    /// A session's end frees its grants before it reports the end (`Freed { SessionEnded }`
    /// events, then `SessionEnded`), so the grants are held back until the end says whether
    /// the client closed the session (each grant a release) or its lease lapsed (one session
    /// expiry, its grants not counted again).
    pub fn of(events: &[Event]) -> Self {
        let mut c = Counts::default();
        let mut freed_by_session_end = 0;
        for event in events {
            match event {
                Event::Granted { handed_off, .. } => {
                    c.grants += 1;
                    c.handoffs += u64::from(*handed_off);
                }
                Event::Freed { cause, .. } => match cause {
                    FreeCause::Released => c.releases += 1,
                    FreeCause::Expired => c.grant_expirations += 1,
                    FreeCause::Revoked => c.revocations += 1,
                    FreeCause::SessionEnded => freed_by_session_end += 1,
                },
                Event::SessionEnded { expired: true, .. } => {
                    c.session_expirations += 1;
                    freed_by_session_end = 0;
                }
                Event::SessionEnded { expired: false, .. } => {
                    c.releases += freed_by_session_end;
                    freed_by_session_end = 0;
                }
                Event::WaiterDropped { .. }
                | Event::SessionOpened { .. }
                | Event::Promoted { .. } => {}
            }
        }
        c
    }
}

impl ApplyObserver for CountingObserver {
    fn applied(&self, log_index: u64, events: &[Event]) {
        if !events.is_empty() {
            let c = Counts::of(events);
            let f = &self.families;
            // Adding zero is still an atomic write on a shared cache line: skip it.
            for (counter, n) in [
                (&f.grants, c.grants),
                (&f.handoffs, c.handoffs),
                (&f.releases, c.releases),
                (&f.revocations, c.revocations),
            ] {
                if n > 0 {
                    counter.inc_by(n);
                }
            }
            for (kind, n) in [
                (LeaseKind::grant, c.grant_expirations),
                (LeaseKind::session, c.session_expirations),
            ] {
                if n > 0 {
                    f.lease_expirations
                        .get_or_create(&LeaseLabels { kind })
                        .inc_by(n);
                }
            }
        }
        self.inner.applied(log_index, events);
    }
}

#[cfg(test)]
mod tests {
    use lock_raft_store::Grant;

    use super::*;

    fn granted(handed_off: bool) -> Event {
        Event::Granted {
            shared_key: "k".into(),
            grant: Grant {
                key: "k".into(),
                owner_id: "o".into(),
                session_id: "s".into(),
                request_id: 1,
                token: 1,
                ttl_ms: 1000,
                acquired_at_ms: 0,
                expires_at_ms: 1000,
            },
            handed_off,
        }
    }

    fn freed(cause: FreeCause) -> Event {
        Event::Freed {
            key: "k".into(),
            token: 1,
            cause,
        }
    }

    fn ended(expired: bool) -> Event {
        Event::SessionEnded {
            session_id: "s".into(),
            expired,
        }
    }

    #[test]
    fn a_handoff_is_a_grant_and_a_revoke_is_not_a_release() {
        let c = Counts::of(&[
            granted(false),
            freed(FreeCause::Revoked),
            granted(true),
            freed(FreeCause::Released),
            freed(FreeCause::Expired),
        ]);
        assert_eq!(
            c,
            Counts {
                grants: 2,
                handoffs: 1,
                releases: 1,
                grant_expirations: 1,
                session_expirations: 0,
                revocations: 1,
            }
        );
    }

    #[test]
    fn an_expired_session_counts_once_and_its_grants_not_as_grant_expirations() {
        let c = Counts::of(&[
            freed(FreeCause::SessionEnded),
            freed(FreeCause::SessionEnded),
            ended(true),
        ]);
        assert_eq!(c.session_expirations, 1);
        assert_eq!(c.grant_expirations, 0);
        assert_eq!(c.releases, 0);
    }

    #[test]
    fn a_closed_session_releases_each_grant_it_held() {
        let c = Counts::of(&[
            freed(FreeCause::SessionEnded),
            freed(FreeCause::SessionEnded),
            ended(false),
            // A second session in the same batch, expired: its grant is not a release.
            freed(FreeCause::SessionEnded),
            ended(true),
        ]);
        assert_eq!(c.releases, 2);
        assert_eq!(c.session_expirations, 1);
    }
}
