//! [`FencedRegister`]: a stand-in for a protected resource, used to check that a displaced
//! holder's write is rejected.
//!
//! It applies [`lock_api::Fence`] (accept iff the presented token is greater than the stored
//! one) and records every accepted write, so a test can assert who wrote what and in which
//! order. It talks to no node; it is the resource side only.

use std::sync::{Arc, Mutex, MutexGuard};

use lock_api::{Fence, LockError};

/// One accepted write: the token that authorised it and the value written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedWrite {
    /// The fencing token presented with the write.
    pub token: u64,
    /// The value written.
    pub value: String,
}

#[derive(Debug)]
struct State {
    fence: Fence,
    writes: Vec<FencedWrite>,
}

/// A register guarded by a fence: [`FencedRegister::write`] succeeds only with a token greater
/// than every token accepted before. Cheap to clone; clones share the register, so holders in
/// different tasks write to the same resource.
#[derive(Clone, Debug)]
pub struct FencedRegister {
    state: Arc<Mutex<State>>,
}

impl FencedRegister {
    /// A register for the lock `key` that has accepted nothing yet (stored token 0).
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                fence: Fence::new(key),
                writes: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another test task while it held the lock leaves consistent data: every
        // mutation below is a single push or assignment.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes `value` under fencing token `token`: accepted (and the fence advanced to `token`)
    /// iff `token` is greater than the stored token; otherwise [`LockError::FencedOut`] naming
    /// both tokens, and nothing changes.
    pub fn write(&self, token: u64, value: impl Into<String>) -> Result<(), LockError> {
        let mut state = self.lock();
        state.fence.admit(token)?;
        state.writes.push(FencedWrite {
            token,
            value: value.into(),
        });
        Ok(())
    }

    /// The highest token accepted so far (0 if none).
    pub fn stored_token(&self) -> u64 {
        self.lock().fence.stored()
    }

    /// The last value written, if any.
    pub fn value(&self) -> Option<String> {
        self.lock().writes.last().map(|w| w.value.clone())
    }

    /// Every accepted write, oldest first. Their tokens strictly increase.
    pub fn history(&self) -> Vec<FencedWrite> {
        self.lock().writes.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_increasing_tokens() {
        let register = FencedRegister::new("k");
        assert_eq!(register.write(3, "a"), Ok(()));
        assert_eq!(
            register.write(3, "b"),
            Err(LockError::FencedOut {
                key: "k".into(),
                presented: 3,
                stored: 3
            })
        );
        assert!(register.write(2, "c").is_err());
        assert_eq!(register.write(7, "d"), Ok(()));
        assert_eq!(register.stored_token(), 7);
        assert_eq!(register.value().as_deref(), Some("d"));
        assert_eq!(
            register.history(),
            vec![
                FencedWrite {
                    token: 3,
                    value: "a".into()
                },
                FencedWrite {
                    token: 7,
                    value: "d".into()
                }
            ]
        );
    }
}
