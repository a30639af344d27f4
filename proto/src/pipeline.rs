//! The limit of `LockService.Pipeline`, shared by the server that enforces it and the client
//! that sizes its queue by it. Owns the number only; it runs no calls.

/// Most calls one `Pipeline` stream runs at once on the server.
///
/// Past it the server stops reading the stream until a call finishes, so HTTP/2 flow control
/// pushes back on the sender instead of the leader's memory growing. A call in flight holds
/// its decoded request and a waiting acquire's place in the proposer, a few hundred bytes; 1,024
/// of them is well under a megabyte, and more than the leader's proposer batches per entry
/// (`BATCH_MAX`), so one stream can keep every batch full.
pub const PIPELINE_CALLS_IN_FLIGHT_MAX: usize = 1024;
