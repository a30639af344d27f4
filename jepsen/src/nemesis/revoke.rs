//! The revoke nemesis: force-revokes a random key every few seconds (FR-08). The displaced
//! holder still believes it holds the key until its deadline; the raised token floor must
//! fence its write out. Each revoke is an operation with a three-valued outcome.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

use super::{Ctx, QUIET_MS, between};
use crate::history::{F, Op, OpType, Process};
// The nemesis client presents the admin certificate over TLS, and a revoke may record only
// its caller's own name (docs/SECURITY.md §4); without TLS the name is just recorded.
use crate::pki::ADMIN_IDENTITY;

/// Longest wait for one revoke; the SDK retries within its own budget (10 s) under one
/// request id, so a revoke is applied at most once.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs revokes until stopped.
pub async fn run(ctx: Arc<Ctx>, mut rng: StdRng) -> anyhow::Result<()> {
    loop {
        if !ctx.sleep(between(&mut rng, QUIET_MS)).await {
            return Ok(());
        }
        let key = format!("k{}", rng.gen_range(0..ctx.keys.max(1)));
        ctx.recorder
            .record(Op::new(Process::Nemesis, OpType::Invoke, F::Revoke).key(&key));
        let answer = tokio::time::timeout(
            REVOKE_TIMEOUT,
            ctx.lock_client
                .force_revoke(&key, ADMIN_IDENTITY, "nemesis: force-revoke under test"),
        )
        .await;
        let op = match answer {
            Ok(Ok(outcome)) => {
                let mut op = Op::new(Process::Nemesis, OpType::Ok, F::Revoke).key(&key);
                op.revoked = Some(outcome.revoked);
                op.previous_token = outcome.previous_token;
                op.previous_owner = outcome.previous_owner_id;
                op.new_token_floor = Some(outcome.new_token_floor);
                op
            }
            Ok(Err(e)) => Op::new(Process::Nemesis, OpType::Info, F::Revoke)
                .key(&key)
                .error(e.to_string()),
            Err(_) => Op::new(Process::Nemesis, OpType::Info, F::Revoke)
                .key(&key)
                .error(format!("no answer within {REVOKE_TIMEOUT:?}")),
        };
        ctx.recorder.record(op);
    }
}
