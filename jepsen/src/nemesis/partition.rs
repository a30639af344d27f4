//! The partition nemesis: cuts node-to-node links (clients stay connected to every node) in
//! one of three shapes — random halves, the leader isolated, or a majority ring in which every
//! node still sees a majority but no two see the same one.
//!
//! Owns the choice of links; the cutting is [`crate::net::Firewall`]'s, by iptables rules or
//! by the harness's proxies — this module does not know which.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::json;

use super::Ctx;
use crate::history::{F, Outcome, Phase};

/// A partition in force (or attempted): what to heal.
#[derive(Debug)]
pub struct Cut {
    attempted: bool,
}

/// The links cut by each shape, over `nodes`.
pub fn links(mode: &str, nodes: &[u64], leader: Option<u64>, rng: &mut StdRng) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    match mode {
        "halves" => {
            let mut shuffled = nodes.to_vec();
            shuffled.shuffle(rng);
            let (minority, majority) = shuffled.split_at(nodes.len() / 2);
            for &a in minority {
                for &b in majority {
                    out.push((a.min(b), a.max(b)));
                }
            }
        }
        "isolate-leader" => {
            if let Some(l) = leader {
                for &b in nodes.iter().filter(|&&b| b != l) {
                    out.push((l.min(b), l.max(b)));
                }
            }
        }
        _ => {
            // Majority ring: keep the links between ring neighbours within distance k, where
            // k is the smallest that lets every node see a majority; cut the rest. With three
            // nodes every link is "near", so one random link is cut: the middle node sees
            // both others, each end sees a majority of two.
            let n = nodes.len();
            if n == 3 {
                let i = rng.gen_range(0..3);
                let (a, b) = (nodes[i], nodes[(i + 1) % 3]);
                out.push((a.min(b), a.max(b)));
            } else {
                let k = (n / 2).div_ceil(2);
                for i in 0..n {
                    for j in (i + 1)..n {
                        let d = (j - i).min(n - (j - i));
                        if d > k {
                            out.push((nodes[i].min(nodes[j]), nodes[i].max(nodes[j])));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Installs a partition of a random shape.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Cut {
    let modes = ["halves", "isolate-leader", "majority-ring"];
    let mode = modes[rng.gen_range(0..modes.len())];
    let leader = ctx.probe.leader().await;
    let cut = links(mode, &ctx.nodes(), leader, rng);
    if cut.is_empty() {
        ctx.record(
            F::Partition,
            Phase::Start,
            Outcome::Skipped,
            json!({"mode": mode, "reason": "no leader to isolate"}),
        );
        return Cut { attempted: false };
    }
    let value = json!({"mode": mode, "leader": leader, "cut": cut});
    match ctx.firewall.cut(&cut).await {
        Ok(()) => ctx.record(F::Partition, Phase::Start, Outcome::Installed, value),
        Err(e) => {
            let mut value = value;
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::Partition, Phase::Start, Outcome::Indeterminate, value);
        }
    }
    Cut { attempted: true }
}

/// Removes every cut. Failing to is a harness failure: the rest of the run would be judged
/// on a network the harness no longer controls.
pub async fn heal(ctx: &Ctx, cut: Cut) -> anyhow::Result<()> {
    if !cut.attempted {
        return Ok(());
    }
    ctx.firewall.heal().await?;
    ctx.record(F::Partition, Phase::Heal, Outcome::Installed, json!({}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn sees_majority(n: usize, cut: &[(u64, u64)], node: u64) -> bool {
        let nodes: Vec<u64> = (1..=n as u64).collect();
        let seen = nodes
            .iter()
            .filter(|&&o| o == node || !cut.contains(&(node.min(o), node.max(o))))
            .count();
        seen > n / 2
    }

    #[test]
    fn shapes_cut_what_they_say() {
        let mut rng = StdRng::seed_from_u64(7);
        for n in [3usize, 5, 7] {
            let nodes: Vec<u64> = (1..=n as u64).collect();
            let ring = links("majority-ring", &nodes, None, &mut rng);
            assert!(!ring.is_empty(), "n={n}");
            for &node in &nodes {
                assert!(sees_majority(n, &ring, node), "n={n} node={node} {ring:?}");
            }
            let isolated = links("isolate-leader", &nodes, Some(2), &mut rng);
            assert_eq!(isolated.len(), n - 1);
            assert!(!sees_majority(n, &isolated, 2));
            let halves = links("halves", &nodes, None, &mut rng);
            assert_eq!(halves.len(), (n / 2) * (n - n / 2));
        }
    }
}
