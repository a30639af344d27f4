//! The responder a client write is answered through ([`CallbackResponder`]): a function that
//! openraft calls with the write's result on the task that completes it, which for an applied
//! entry is the state machine's `apply` ([`crate::StateMachineStore`]).
//!
//! openraft's own responders send the result down a channel, and whoever waits for it runs on
//! a task of its own: one more wake-up and one more turn of the scheduler between the apply and
//! the callers' answers, on the path of every write. Here the leader's proposer hands each
//! entry's callers their answers in the call itself (`node::leader::proposer`).
//!
//! Owns nothing but the function. A responder openraft drops without completing it (its
//! entry refused before it reached the log, or the node stopping) drops the function uncalled;
//! the function's owner must treat that as an unknown outcome.

use std::fmt;

use openraft::OptionalSend;
use openraft::raft::responder::Responder;

use crate::TypeConfig;

/// Calls its function once with the result openraft completes the request with.
pub struct CallbackResponder<T>(Box<dyn FnOnce(T) + Send>);

impl<T> CallbackResponder<T> {
    /// A responder that calls `on_complete` with the result, on the completing task. It must
    /// not block: for an applied entry it runs inside the state machine's apply.
    pub fn new(on_complete: impl FnOnce(T) + Send + 'static) -> Self {
        Self(Box::new(on_complete))
    }
}

impl<T> fmt::Debug for CallbackResponder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackResponder").finish_non_exhaustive()
    }
}

impl<T> Responder<TypeConfig, T> for CallbackResponder<T>
where
    T: OptionalSend + 'static,
{
    fn on_complete(self, result: T) {
        (self.0)(result);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A responder that adds its result to `seen`.
    fn adding_to(seen: &Arc<AtomicUsize>) -> CallbackResponder<usize> {
        let seen = seen.clone();
        CallbackResponder::new(move |n| {
            seen.fetch_add(n, Ordering::SeqCst);
        })
    }

    #[test]
    fn the_function_runs_once_with_the_result_and_not_when_dropped() {
        let seen = Arc::new(AtomicUsize::new(0));
        Responder::<TypeConfig, usize>::on_complete(adding_to(&seen), 7);
        assert_eq!(seen.load(Ordering::SeqCst), 7);

        drop(adding_to(&seen));
        assert_eq!(seen.load(Ordering::SeqCst), 7);
    }
}
