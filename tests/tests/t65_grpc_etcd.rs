//! The gRPC conformance suite (`conformance_grpc`, issue 18) against two stateless
//! `lockd run --backend etcd` nodes on the etcd cluster named by `LOCKD_TEST_ETCD_ENDPOINTS`
//! (scripts/test-services.sh starts a private one). Every case fails, naming `scripts/test`,
//! when the variable is unset: it never passes untested.

mod conformance_grpc;

cases!(etcd, Target::etcd());
