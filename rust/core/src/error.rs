//! The one error type of the core; the binding maps each variant to one Python exception class.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CoreError {
    #[error("unknown encoding {0:?}: expected \"o200k_base\" or \"cl100k_base\"")]
    UnknownEncoding(String),
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    #[error("invalid event stream: {0}")]
    InvalidEventStream(String),
    #[error("invalid HTTP answer: {0}")]
    InvalidHttp(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Io(String),
}

pub type Result<T> = std::result::Result<T, CoreError>;
