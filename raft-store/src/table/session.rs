//! A session as the replicated state records it: its lease, the keys it holds and waits on, and
//! its window of remembered answers (D-idempotency). Owns no logic beyond keeping those three
//! consistent with each other; the lock table decides what changes.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::Response;

/// One live session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The owner the session acts for; every grant of the session carries it.
    pub owner_id: String,
    /// Session lease length.
    pub ttl_ms: u64,
    /// Stamp-clock expiry as last recorded in the log (open, `Promote`). Informational, like a
    /// grant's: the leader keeps the live deadline and applies `ExpireSession` (D-lease).
    pub expires_at_ms: u64,
    /// Stamp of the `OpenSession`.
    pub opened_at_ms: u64,
    /// The principal that opened the session (`Command::AsCaller`), `None` for a session
    /// opened without one (unbound: an `--insecure` node). Never changes while the session
    /// lives. Not in the session's own encoding, which stays the one earlier snapshots used:
    /// the snapshot data carries the principals beside the table (`storage::snapshot`).
    #[serde(skip)]
    pub(crate) principal: Option<String>,
    /// Keys this session holds a grant on.
    pub(crate) locks: BTreeSet<String>,
    /// Keys this session has a waiter queued on, with the request id of the `Acquire` that
    /// queued it. A session waits at most once per key.
    pub(crate) waits: BTreeMap<String, u64>,
    /// Remembered answers by request id; at most the table's `request_window`, smallest id evicted
    /// first.
    pub(crate) answers: BTreeMap<u64, Remembered>,
}

/// What the window remembers about one request id.
///
/// `CancelWait` names the `Acquire` it withdraws by that acquire's request id, so both answers
/// live under one id: `answer` is the acquire's (or release's, renew's) answer, kept up to date
/// when a queued acquire is later granted or dropped; `cancel` is the answer of a `CancelWait`
/// for that id, returned again if the cancel is retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Remembered {
    pub(crate) answer: Response,
    pub(crate) cancel: Option<Response>,
}

/// Whether a request id can be acted on, per the session's window.
pub(crate) enum WindowCheck<'a> {
    /// The id is remembered: this is a retry.
    Seen(&'a Remembered),
    /// The id is older than everything in a full window: its outcome can no longer be told.
    Stale,
    /// A new request.
    New,
}

impl Session {
    pub(crate) fn new(
        owner_id: String,
        principal: Option<String>,
        ttl_ms: u64,
        stamp_ms: u64,
    ) -> Self {
        Session {
            owner_id,
            ttl_ms,
            expires_at_ms: stamp_ms.saturating_add(ttl_ms),
            opened_at_ms: stamp_ms,
            principal,
            locks: BTreeSet::new(),
            waits: BTreeMap::new(),
            answers: BTreeMap::new(),
        }
    }

    /// The principal the session is bound to, `None` if it is unbound.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// Keys this session holds a grant on, in key order.
    pub fn locks(&self) -> &BTreeSet<String> {
        &self.locks
    }

    /// Keys this session waits on, in key order, each with the request id of the `Acquire` that
    /// queued the waiter.
    pub fn waits(&self) -> impl Iterator<Item = (&str, u64)> {
        self.waits.iter().map(|(key, id)| (key.as_str(), *id))
    }

    /// Number of waits this session has queued.
    pub fn wait_count(&self) -> usize {
        self.waits.len()
    }

    /// The remembered answer of request `request_id`, if it is still in the window. For a
    /// queued acquire this is `Queued` until it is granted (`Granted`) or leaves the queue
    /// ungranted (`NotGranted`).
    pub fn remembered(&self, request_id: u64) -> Option<&Response> {
        self.answers.get(&request_id).map(|r| &r.answer)
    }

    /// Request ids currently remembered, smallest first.
    pub fn remembered_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.answers.keys().copied()
    }

    /// Where `request_id` stands in a window of `window` answers (the table's limit).
    pub(crate) fn check_window(&self, request_id: u64, window: usize) -> WindowCheck<'_> {
        if let Some(r) = self.answers.get(&request_id) {
            return WindowCheck::Seen(r);
        }
        match self.answers.first_key_value() {
            Some((&smallest, _)) if self.answers.len() >= window && request_id < smallest => {
                WindowCheck::Stale
            }
            _ => WindowCheck::New,
        }
    }

    /// Remembers `answer` for `request_id` (keeping a cancel answer already recorded), evicting
    /// the smallest id when the window of `window` answers overflows.
    pub(crate) fn remember(&mut self, request_id: u64, answer: Response, window: usize) {
        match self.answers.get_mut(&request_id) {
            Some(r) => r.answer = answer,
            None => {
                self.answers.insert(
                    request_id,
                    Remembered {
                        answer,
                        cancel: None,
                    },
                );
                while self.answers.len() > window {
                    self.answers.pop_first();
                }
            }
        }
    }

    /// Records the answer of a `CancelWait` for `request_id` next to the acquire's answer.
    pub(crate) fn remember_cancel(
        &mut self,
        request_id: u64,
        answer: Response,
        cancel: Response,
        window: usize,
    ) {
        self.remember(request_id, answer, window);
        if let Some(r) = self.answers.get_mut(&request_id) {
            r.cancel = Some(cancel);
        }
    }

    /// Updates the remembered answer of a queued acquire that was granted or dropped, if the
    /// window still holds it (an evicted id is answered `StaleRequest` anyway).
    pub(crate) fn settle(&mut self, request_id: u64, answer: Response) {
        if let Some(r) = self.answers.get_mut(&request_id) {
            r.answer = answer;
        }
    }
}
