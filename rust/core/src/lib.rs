//! The gateway's hot path, free of Python so that it builds, tests and benchmarks with plain cargo.
//! `rust/py` exposes it to Python as `gateway._core`.

pub mod append_file;
pub mod bpe;
pub mod chat_stream;
pub mod error;
pub mod idempotency;
pub mod json;
pub mod messages_stream;
pub mod multipart;
pub mod ratelimit;
pub mod responses_stream;
pub mod shared_buckets;
pub mod sse;
pub mod tokens;

pub use error::CoreError;
