//! The gateway's hot path, free of Python so that it builds, tests and benchmarks with plain cargo.
//! `rust/py` exposes it to Python as `gateway._core`.

pub mod append_file;
pub mod bpe;
pub mod error;
pub mod http_head;
pub mod idempotency;
pub mod ids;
pub mod json;
pub mod key_digest;
pub mod media;
pub mod multipart;
pub mod pretokenize;
pub mod ratelimit;
pub mod shared_buckets;
pub mod stream;
pub mod telemetry;
pub mod tokens;

pub use error::CoreError;
