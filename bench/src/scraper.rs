//! The metrics scraper of the scrape-cost comparison (issue 20): a task that GETs every node's
//! `/metrics` once a second, as a Prometheus server would, while a workload runs; and the
//! comparison itself, W3 and W1 with and without it in alternating order, so the cost of
//! metrics under scraping is measured in one run on one cluster.
//!
//! Owns the polling and the comparison's bookkeeping; the workloads are `workload`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::system::LockSystem;
use crate::workload::{self, LoopResult, LoopSpec};

/// How often each node is scraped: Prometheus' usual interval is 15–60 s; once a second is
/// the pessimistic end of what anyone configures.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// How long one scrape may take before it counts as failed.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest scrape read; a node's is tens of KiB.
const SCRAPE_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// What the scraper did while it ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScrapeStats {
    /// Scrapes answered 200.
    pub scrapes: u64,
    /// Scrapes that failed or answered otherwise.
    pub failures: u64,
    /// Bytes of the answers, headers included.
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    scrapes: AtomicU64,
    failures: AtomicU64,
    bytes: AtomicU64,
}

/// A running scraper; [`Scraper::stop`] ends it.
#[derive(Debug)]
pub struct Scraper {
    task: tokio::task::JoinHandle<()>,
    counters: Arc<Counters>,
}

impl Scraper {
    /// Scrapes every `host:port` in `targets` each [`SCRAPE_INTERVAL`].
    pub fn start(targets: Vec<String>) -> Self {
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn({
            let counters = counters.clone();
            async move {
                let mut tick = tokio::time::interval(SCRAPE_INTERVAL);
                loop {
                    tick.tick().await;
                    for target in &targets {
                        match tokio::time::timeout(SCRAPE_TIMEOUT, scrape(target)).await {
                            Ok(Ok(bytes)) => {
                                counters.scrapes.fetch_add(1, Ordering::Relaxed);
                                counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                            }
                            Ok(Err(_)) | Err(_) => {
                                counters.failures.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
        });
        Self { task, counters }
    }

    /// Stops scraping and answers what it did.
    pub fn stop(self) -> ScrapeStats {
        self.task.abort();
        ScrapeStats {
            scrapes: self.counters.scrapes.load(Ordering::Relaxed),
            failures: self.counters.failures.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
        }
    }
}

/// One `GET /metrics` over HTTP/1.0: the answer's size if it was a 200.
async fn scrape(target: &str) -> std::io::Result<u64> {
    let mut stream = TcpStream::connect(target).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    stream
        .take(SCRAPE_BYTES_MAX)
        .read_to_end(&mut answer)
        .await?;
    if answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200") {
        Ok(answer.len() as u64)
    } else {
        Err(std::io::Error::other("not a 200 answer"))
    }
}

/// One workload measured without and with the scraper.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    /// Every round's slice without the scraper, combined.
    pub without: LoopResult,
    /// Every round's slice with it, combined.
    pub with: LoopResult,
    /// Pairs/s of each round without the scraper, in round order.
    pub without_rounds: Vec<f64>,
    /// Pairs/s of each round with it.
    pub with_rounds: Vec<f64>,
    /// What the scraper did over every slice with it.
    pub scraped: ScrapeStats,
}

impl Compared {
    /// How much pairs/s the scraper cost, in percent of the figure without it (negative: it
    /// measured faster).
    pub fn cost_pct(&self) -> f64 {
        if self.without.pairs_per_sec > 0.0 {
            100.0 * (1.0 - self.with.pairs_per_sec / self.without.pairs_per_sec)
        } else {
            0.0
        }
    }
}

/// W3 and W1 with and without a scraper.
#[derive(Debug, Clone, Serialize)]
pub struct ScrapeComparison {
    /// Rounds; each runs one slice without and one with, the order alternating by round.
    pub rounds: usize,
    /// W3 (one client).
    pub w3: Compared,
    /// W1 (uncontended, many workers).
    pub w1: Compared,
}

/// Runs `rounds` rounds of `spec` without and with a scraper of `targets`, alternating which
/// comes first (round 0: without, with; round 1: with, without; …) so a drift of the machine
/// over the run falls on both sides alike.
async fn compare<S: LockSystem>(
    system: &S,
    spec: &LoopSpec,
    targets: &[String],
    rounds: usize,
) -> Result<Compared> {
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut scraped = ScrapeStats::default();
    for round in 0..rounds {
        for scraping in [round % 2 == 1, round % 2 == 0] {
            if scraping {
                let scraper = Scraper::start(targets.to_vec());
                let result = workload::run_loop(system, spec).await;
                let stats = scraper.stop();
                scraped.scrapes += stats.scrapes;
                scraped.failures += stats.failures;
                scraped.bytes += stats.bytes;
                with.push(result?);
            } else {
                without.push(workload::run_loop(system, spec).await?);
            }
        }
    }
    let rates = |v: &[LoopResult]| v.iter().map(|r| r.pairs_per_sec).collect();
    Ok(Compared {
        without_rounds: rates(&without),
        with_rounds: rates(&with),
        without: LoopResult::combine(without).expect("at least one round"),
        with: LoopResult::combine(with).expect("at least one round"),
        scraped,
    })
}

/// The comparison: W3 then W1, each over `rounds` interleaved rounds.
pub async fn run<S: LockSystem>(
    system: &S,
    w3: &LoopSpec,
    w1: &LoopSpec,
    targets: &[String],
    rounds: usize,
) -> Result<ScrapeComparison> {
    let rounds = rounds.max(1);
    eprintln!("lock-bench: scrape cost: W3 with and without a 1 s scraper, {rounds} rounds");
    let w3 = compare(system, w3, targets, rounds).await?;
    eprintln!("lock-bench: scrape cost: W1 with and without a 1 s scraper, {rounds} rounds");
    let w1 = compare(system, w1, targets, rounds).await?;
    Ok(ScrapeComparison { rounds, w3, w1 })
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// The comparison as a markdown table.
pub fn markdown(c: &ScrapeComparison) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nScrape cost ({} interleaved rounds; a scrape of every node each second)\n",
        c.rounds
    );
    let _ = writeln!(
        out,
        "| workload | without: pairs/s | with: pairs/s | cost | acquire p50 without / with (ms) | acquire p99 without / with (ms) | per round without | per round with | scrapes (failed) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for (name, w) in [("W3", &c.w3), ("W1", &c.w1)] {
        let rounds = |v: &[f64]| {
            v.iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:+.1} % | {} / {} | {} / {} | {} | {} | {} ({}) |",
            w.without.pairs_per_sec,
            w.with.pairs_per_sec,
            w.cost_pct(),
            ms(w.without.acquire.p50_ms),
            ms(w.with.acquire.p50_ms),
            ms(w.without.acquire.p99_ms),
            ms(w.with.acquire.p99_ms),
            rounds(&w.without_rounds),
            rounds(&w.with_rounds),
            w.scraped.scrapes,
            w.scraped.failures,
        );
    }
    out
}
