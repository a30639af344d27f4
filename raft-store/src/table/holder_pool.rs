//! The holders decoded so far while a snapshot's table decodes on this thread, so that every
//! grant of a session points at one [`Holder`] from the moment it is decoded.
//!
//! A snapshot repeats a session's ids in each of its grants (the encoding is the one earlier
//! releases wrote). Decoded one by one, a million grants held a million holders of their own
//! until [`LockTable::share_holders`](super::LockTable::share_holders) replaced them: about
//! 150 MiB that lived only for the decode, on top of the table being built (session 14's
//! install peak, docs/PERFORMANCE.md). The pool keeps one holder per session id instead, for
//! the duration of [`sharing_holders`] only; outside it every grant gets a holder of its own,
//! as before. It is a thread-local because serde's derived decoders pass no context down.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

use super::held::{BySession, Holder};

thread_local! {
    /// The pool of the decode running on this thread, if one is.
    static POOL: RefCell<Option<HashSet<BySession>>> = const { RefCell::new(None) };
}

/// Empties this thread's pool when the decode ends, by return or by panic.
struct Scope;

impl Drop for Scope {
    fn drop(&mut self) {
        POOL.with_borrow_mut(|pool| *pool = None);
    }
}

/// Runs `decode` with a pool on this thread: the grants and sessions it decodes share one
/// holder per session id. The pool is freed when `decode` returns.
pub(crate) fn sharing_holders<R>(decode: impl FnOnce() -> R) -> R {
    POOL.with_borrow_mut(|pool| *pool = Some(HashSet::new()));
    let _scope = Scope;
    decode()
}

/// The holder of session `session_id` of owner `owner_id`: the pooled one while a decode
/// runs and one with these ids is pooled, else a new one (pooled if its session id is not
/// yet). A holder whose owner differs from the pooled one's is not shared: the table's
/// invariant check reports the mismatch. The ids are only borrowed: a decode reads them into
/// a buffer of its own, and they are allocated only for a new holder.
pub(crate) fn holder_of(session_id: &str, owner_id: &str) -> Arc<Holder> {
    let new = || Holder::new(session_id.to_owned(), owner_id.to_owned());
    POOL.with_borrow_mut(|pool| {
        let Some(pool) = pool else {
            return new();
        };
        match pool.get(session_id) {
            Some(pooled) if pooled.0.owner_id == owner_id => pooled.0.clone(),
            Some(_) => new(),
            None => {
                let holder = new();
                pool.insert(BySession(holder.clone()));
                holder
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooled(session_id: &str, owner_id: &str) -> Arc<Holder> {
        holder_of(session_id, owner_id)
    }

    #[test]
    fn a_decode_shares_one_holder_per_session_and_only_while_it_runs() {
        let (a, b, other_owner, other_session) = sharing_holders(|| {
            (
                pooled("s1", "o1"),
                pooled("s1", "o1"),
                pooled("s1", "o2"),
                pooled("s2", "o1"),
            )
        });
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other_owner));
        assert_eq!(other_owner.owner_id, "o2");
        assert!(!Arc::ptr_eq(&a, &other_session));
        assert_eq!(other_session.session_id, "s2");
        // After the decode, nothing is pooled any more.
        assert!(!Arc::ptr_eq(&pooled("s1", "o1"), &pooled("s1", "o1")));
        assert!(POOL.with_borrow(|pool| pool.is_none()));
    }

    #[test]
    fn a_panicking_decode_leaves_no_pool_behind() {
        let panicked = std::panic::catch_unwind(|| {
            sharing_holders(|| {
                pooled("s1", "o1");
                panic!("the decode failed half-way");
            })
        });
        assert!(panicked.is_err());
        assert!(POOL.with_borrow(|pool| pool.is_none()));
    }
}
