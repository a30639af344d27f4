//! The process around a node: how it is started and configured, and whose data dir it owns.
//! Nothing here serves a request or touches Raft's state.

pub mod cli;
pub mod config;
pub mod dev;
pub mod dev_tls;
pub mod huge_pages;
pub mod identity;
