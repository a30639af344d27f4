//! The slow-net and flaky-net nemeses: links between nodes degraded instead of cut.
//!
//! - `slow-net`: latency with jitter on every link of one node (a slow host) or on a random
//!   half of the links.
//! - `flaky-net`: the same links lose and duplicate packets, stall and break.
//!
//! How a link is degraded depends on the network mode, and every fault's value says which
//! (`model`): in the namespace, `tc netem` on the packets a node sends to the peer's address
//! (loss and duplication at the IP level, which TCP repairs), or on a kernel without netem
//! iptables' random drop and `TEE` duplication of those packets (flaky-net only: latency needs
//! netem, so slow-net is left out there); through the proxies, the stream
//! model of [`crate::proxy::Shape`] (latency and jitter per chunk in order, stalls standing for
//! retransmissions, connection resets standing for what heavy loss ends in), since a relay of a
//! byte stream cannot drop a packet without corrupting the stream. Both kinds run on one
//! schedule, alongside the node faults; clients are never degraded.

use std::sync::Arc;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::json;

use super::{Ctx, HOLD_MS, Kind, QUIET_MS, between};
use crate::history::{F, Outcome, Phase};
use crate::net::{PACKET_DUPLICATION, PACKET_LOSS};
use crate::proxy::Shape;

/// Latency range of a slow link, in ms: a cross-zone to a cross-region round trip, well under
/// the election timeout (400–800 ms) so a slow link slows Raft without cutting it.
pub const SLOW_DELAY_MS: (u64, u64) = (20, 120);

/// Flaky links, in the namespace: netem's loss and duplication per packet, over some delay.
pub const FLAKY_NETEM: [&str; 7] = ["delay", "10ms", "10ms", "loss", "5%", "duplicate", "1%"];

/// Flaky links through the proxy: a stall (a retransmission timeout: TCP's minimum is 200 ms,
/// and a second loss doubles it) in 5 % of chunks, a reset in 0.5 % (Raft's heartbeats make
/// about ten chunks a second per direction, so a link breaks every ten seconds or so).
pub const FLAKY_SHAPE: Shape = Shape {
    delay_ms: 5,
    jitter_ms: 20,
    stall_per_mille: 50,
    stall_ms: (200, 1_000),
    reset_per_mille: 5,
    seed: 0,
};

/// The links one fault degrades: every link of one node, or a random half of all links.
fn pick_links(nodes: &[u64], rng: &mut StdRng) -> (&'static str, Vec<(u64, u64)>) {
    let mut all = Vec::new();
    for (i, &a) in nodes.iter().enumerate() {
        for &b in &nodes[i + 1..] {
            all.push((a.min(b), a.max(b)));
        }
    }
    if nodes.is_empty() || rng.gen_bool(0.5) {
        all.shuffle(rng);
        all.truncate(all.len().div_ceil(2));
        all.sort_unstable();
        return ("some-links", all);
    }
    let node = nodes[rng.gen_range(0..nodes.len())];
    all.retain(|&(a, b)| a == node || b == node);
    ("one-node", all)
}

/// Runs degradations of the enabled `kinds` (slow-net, flaky-net) until stopped, one at a
/// time, restoring the last.
pub async fn run(ctx: Arc<Ctx>, kinds: Vec<Kind>, mut rng: StdRng) -> anyhow::Result<()> {
    if kinds.is_empty() {
        return Ok(());
    }
    loop {
        if !ctx.sleep(between(&mut rng, QUIET_MS)).await {
            return Ok(());
        }
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let f = if kind == Kind::SlowNet {
            F::SlowNet
        } else {
            F::FlakyNet
        };
        let (shape_name, links) = pick_links(&ctx.nodes(), &mut rng);
        let seed = rng.r#gen::<u64>();
        let (shape, netem): (Shape, Vec<String>) = if kind == Kind::SlowNet {
            let delay = rng.gen_range(SLOW_DELAY_MS.0..=SLOW_DELAY_MS.1);
            let shape = Shape {
                delay_ms: delay,
                jitter_ms: delay / 2,
                seed,
                ..Shape::default()
            };
            let netem = vec![
                "delay".to_owned(),
                format!("{delay}ms"),
                format!("{}ms", delay / 2),
            ];
            (shape, netem)
        } else {
            let shape = Shape {
                seed,
                ..FLAKY_SHAPE
            };
            (shape, FLAKY_NETEM.iter().map(|s| (*s).to_owned()).collect())
        };
        let netem_args: Vec<&str> = netem.iter().map(String::as_str).collect();
        let mut value = json!({
            "links": links,
            "shape": shape_name,
            "model": ctx.firewall.degrade_model(),
        });
        if ctx.firewall.mode() == crate::net::NetMode::Proxy {
            value["proxy"] = json!(shape);
        } else if ctx.firewall.degrades_latency() {
            value["netem"] = json!(netem.join(" "));
        } else {
            value["iptables"] = json!({"loss": PACKET_LOSS, "duplicate": PACKET_DUPLICATION});
        }
        let before = ctx.firewall.shape_counts();
        let loses_packets = kind == Kind::FlakyNet;
        match ctx
            .firewall
            .degrade(&links, shape, &netem_args, loses_packets)
            .await
        {
            Ok(()) => ctx.record(f, Phase::Start, Outcome::Installed, value),
            Err(e) => {
                value["error"] = json!(format!("{e:#}"));
                ctx.record(f, Phase::Start, Outcome::Indeterminate, value);
            }
        }
        ctx.sleep(between(&mut rng, HOLD_MS)).await;
        // A degradation that cannot be removed leaves the rest of the run on a network the
        // harness no longer controls: a harness failure, as for cuts.
        let after = ctx.firewall.shape_counts();
        // The iptables model's counters belong to this fault's rules alone (restore drops them).
        let packets = ctx.firewall.packet_counts().await;
        ctx.firewall.restore().await?;
        let mut healed = json!({"links": links.len()});
        if let (Some(before), Some(after)) = (before, after) {
            // What the proxies did under this fault: chunks held, stalls, resets.
            healed["did"] = json!(after.since(before));
        } else if let Some(packets) = packets {
            // What the kernel did under this fault: packets dropped and duplicated.
            healed["did"] = json!(packets);
        }
        ctx.record(f, Phase::Heal, Outcome::Installed, healed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn links_are_one_nodes_or_about_half() {
        let mut rng = StdRng::seed_from_u64(5);
        let nodes = [1, 2, 3, 4];
        let (mut one, mut some) = (0, 0);
        for _ in 0..50 {
            match pick_links(&nodes, &mut rng) {
                ("one-node", links) => {
                    one += 1;
                    assert_eq!(links.len(), 3);
                    let shared = links
                        .iter()
                        .flat_map(|&(a, b)| [a, b])
                        .filter(|n| links.iter().all(|&(a, b)| a == *n || b == *n))
                        .count();
                    assert!(shared >= 3, "{links:?}");
                }
                (_, links) => {
                    some += 1;
                    assert_eq!(links.len(), 3, "half of 6 links");
                }
            }
        }
        assert!(one > 0 && some > 0);
    }
}
