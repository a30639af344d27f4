//! `lockd_proposer_batch_commands`: a [`LogWriter`] around the leader's real writer that
//! observes how many commands each entry carries before handing it on (D-batch's group
//! commit at work: 1 on an idle leader, up to `BATCH_COMMANDS_MAX` under load).
//!
//! Owns that one observation; changes no entry and no answer.

use std::sync::Arc;

use lock_raft_store::{Command, Request};

use super::families::Families;
use crate::leader::proposer::{LogWriter, OnApplied};

/// Observes each submitted entry's command count, then submits it through `inner`.
#[derive(Debug)]
pub struct MeteredWriter<W> {
    inner: W,
    families: Arc<Families>,
}

impl<W> MeteredWriter<W> {
    /// Meters `inner` into `families`.
    pub fn new(inner: W, families: Arc<Families>) -> Self {
        Self { inner, families }
    }
}

impl<W: LogWriter> LogWriter for MeteredWriter<W> {
    async fn submit(&self, request: Request, on_applied: OnApplied) {
        let commands = match &request.command {
            Command::Batch(commands) => commands.len(),
            _ => 1,
        };
        self.families
            .proposer_batch_commands
            .observe(commands as f64);
        self.inner.submit(request, on_applied).await
    }
}
