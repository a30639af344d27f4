//! lock-jepsen: fault injection against real `lockd` processes, a recorded history, a checker
//! for the promises of docs/DESIGN.md §5, and a report a person can read.
//!
//! # Layout
//!
//! - [`history`] — the JSON Lines history: op types, the [`history::Recorder`], the reader.
//! - [`checker`] — pairs the history and checks one property per module.
//! - [`report`] — `results.json` and `index.html` (timeline, latency, throughput as SVG).
//! - [`stats`] — counts of operations and faults, shared by the report and the progress line.
//! - [`net`] — the network mode: a namespace with per-node uids, addresses and iptables cuts,
//!   or the proxies; the [`net::Firewall`] the nemeses cut links through.
//! - [`proxy`] — the per-link TCP proxies that cut links without root.
//! - [`lockd_bin`] — the `lockd` binary: found, and copied where the nodes' uids can run it.
//! - [`pki`] — the run's throwaway CA and certificates: the nodes serve TLS by default.
//! - [`cluster`] — the `lockd` processes: start, kill, restart, pause, clock offsets.
//! - [`admin`] — membership changes through lockd's `AdminService`, at the leader.
//! - [`resources`] — each node's CPU, RSS and log bytes, sampled from `/proc` during the run.
//! - [`workload`] — the clients and the fenced register they write to.
//! - [`nemesis`] — the faults and their schedule.
//! - [`runner`] — one `lock-jepsen run`, from start to report.
//!
//! The pure part (history, checker, report) never touches a cluster; `lock-jepsen check
//! --history FILE` re-checks a history (and the `resources.jsonl` beside it) from any run.

#![forbid(unsafe_code)]

pub mod admin;
pub mod args;
pub mod checker;
pub mod cluster;
pub mod history;
pub mod lockd_bin;
pub mod nemesis;
pub mod net;
pub mod pki;
pub mod proxy;
pub mod report;
pub mod resources;
pub mod runner;
pub mod stats;
pub mod workload;
