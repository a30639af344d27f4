//! The Raft transport between nodes over gRPC: [`network`] dials peers for openraft,
//! [`service`] receives their RPCs. Payloads are postcard-encoded openraft types.

pub mod network;
pub mod service;
