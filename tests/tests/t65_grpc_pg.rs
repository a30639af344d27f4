//! The gRPC conformance suite (`conformance_grpc`, issue 18) against two stateless
//! `lockd run --backend pg` nodes on the database named by `LOCKD_TEST_PG_URL`
//! (scripts/test-services.sh starts a private one). Every case fails, naming `scripts/test`,
//! when the variable is unset: it never passes untested.

mod conformance_grpc;

cases!(pg, Target::pg());
