//! The gRPC conformance suite (`conformance_grpc`, issue 18) against the Raft backend: a
//! one-node cluster and a three-node cluster, each case a test of its own
//! (`raft_1::…`, `raft_3::…`). These are the reference answers the other backends must match.

mod conformance_grpc;

cases!(raft_1, Target::raft(1));
cases!(raft_3, Target::raft(3));
