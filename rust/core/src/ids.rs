//! Identifiers made on every request: the response's and the request's ids, and the request's W3C
//! trace context. In Python each cost several thousand instructions (a format spec parsed per
//! `:012x`, a slice, `.hex()`, `random.getrandbits`), about 4 % of a request's event-loop work
//! (benches/instructions.py); here each is a few hundred.
//!
//! An id is its prefix, its creation time (milliseconds, 12 hex digits: ids made one after another
//! sit next to each other in the store's indexes) and 80 random bits (unguessable: with the key,
//! an id gates usage lookups). The random bits are the operating system's, read 4 KiB at a time
//! into a pool (one system call per ~400 ids); a forked child must forget the pool it inherited
//! (`RandomPool::forget`), or it would hand out its parent's ids.

use crate::error::{CoreError, Result};

/// The random bytes of one id.
pub const ID_RANDOM_BYTES: usize = 10;
const POOL_BYTES: usize = 4096;
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Random bytes read ahead from the operating system.
#[derive(Debug)]
pub struct RandomPool {
    buffer: [u8; POOL_BYTES],
    at: usize,
}

impl Default for RandomPool {
    fn default() -> Self {
        Self::new()
    }
}

impl RandomPool {
    /// An empty pool: the first take reads.
    pub const fn new() -> Self {
        Self { buffer: [0; POOL_BYTES], at: POOL_BYTES }
    }

    /// The next `N` random bytes (N at most the pool's size).
    pub fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.at + N > POOL_BYTES {
            getrandom::fill(&mut self.buffer)
                .map_err(|e| CoreError::Io(format!("the system's random source failed: {e}")))?;
            self.at = 0;
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buffer[self.at..self.at + N]);
        self.at += N;
        Ok(out)
    }

    /// Drop what was read ahead (in a forked child: its parent hands out the same bytes).
    pub fn forget(&mut self) {
        self.buffer = [0; POOL_BYTES];
        self.at = POOL_BYTES;
    }
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}

/// `prefix`, then `millis` as 12 lowercase hex digits (its low 48 bits: until the year 10889),
/// then `random` in hex: the format python/gateway/ids.py has always made.
pub fn id(prefix: &str, millis: u64, random: &[u8; ID_RANDOM_BYTES]) -> String {
    let mut out = String::with_capacity(prefix.len() + 12 + 2 * ID_RANDOM_BYTES);
    out.push_str(prefix);
    for shift in (0..12).rev() {
        out.push(char::from(HEX[((millis >> (shift * 4)) & 0xf) as usize]));
    }
    push_hex(&mut out, random);
    out
}

/// A request's trace context, as W3C's traceparent writes its parts (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: String,
    pub flags: String,
    /// The client's span, when the trace is the client's.
    pub parent_id: Option<String>,
    /// The gateway's own span for the request.
    pub span_id: String,
}

/// The trace of a request whose `traceparent` header is `header` (None without one): the client's
/// when the header is valid (a version other than ff, ids not all zero), else a new one, sampled.
/// `random` gives the new ids: its first 16 bytes the trace's, its last 8 the gateway's span (all
/// zeros, once in 2**64, becomes ...01: all-zero ids are invalid).
pub fn trace_context(header: Option<&[u8]>, random: &[u8; 24]) -> TraceContext {
    let span_id = nonzero_hex(&random[16..]);
    if let Some((trace_id, parent_id, flags)) = header.and_then(parse_traceparent) {
        return TraceContext { trace_id, flags, parent_id: Some(parent_id), span_id };
    }
    TraceContext { trace_id: nonzero_hex(&random[..16]), flags: "01".to_owned(), parent_id: None, span_id }
}

fn nonzero_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    if bytes.iter().all(|&b| b == 0) {
        out.extend(std::iter::repeat_n('0', 2 * bytes.len() - 1));
        out.push('1');
    } else {
        push_hex(&mut out, bytes);
    }
    out
}

/// (trace id, parent span id, flags) of a valid traceparent: `version-trace-parent-flags` in hex,
/// after surrounding whitespace is stripped and letters lowered (as Python's bytes.strip and
/// lower do), with version ff and all-zero ids refused.
pub fn parse_traceparent(value: &[u8]) -> Option<(String, String, String)> {
    let value = strip_python_whitespace(value);
    if value.len() != 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let field = |range: std::ops::Range<usize>| -> Option<String> {
        let part = &value[range];
        part.iter()
            .all(u8::is_ascii_hexdigit)
            .then(|| part.iter().map(|b| char::from(b.to_ascii_lowercase())).collect())
    };
    let (version, trace_id, parent_id, flags) = (field(0..2)?, field(3..35)?, field(36..52)?, field(53..55)?);
    let zero = |text: &str| text.bytes().all(|b| b == b'0');
    if version == "ff" || zero(&trace_id) || zero(&parent_id) {
        return None;
    }
    Some((trace_id, parent_id, flags))
}

/// `value` without the ASCII whitespace Python's bytes.strip() removes (vertical tab included,
/// which Rust's trim_ascii keeps).
fn strip_python_whitespace(value: &[u8]) -> &[u8] {
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let start = value.iter().position(|b| !space(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !space(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_prefix_time_and_random_bits_in_hex() {
        let random = [0x00, 0x01, 0xab, 0xcd, 0xef, 0x10, 0x20, 0x30, 0x40, 0xff];
        assert_eq!(id("chatcmpl-", 0x0190_abcd_ef12, &random), "chatcmpl-0190abcdef120001abcdef10203040ff");
        assert_eq!(id("req_", 5, &[0; 10]), "req_00000000000500000000000000000000");
    }

    #[test]
    fn a_pool_gives_fresh_bytes_and_reads_again_when_spent() -> Result<()> {
        let mut pool = RandomPool::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            // 20,000 bytes: the pool is read five times over; no two takes alike.
            assert!(seen.insert(pool.take::<ID_RANDOM_BYTES>()?));
        }
        pool.forget();
        assert!(seen.insert(pool.take::<ID_RANDOM_BYTES>()?));
        Ok(())
    }

    #[test]
    fn a_valid_traceparent_is_taken_up() {
        let header = b" 00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01\x0b";
        let trace = trace_context(Some(header), &[7; 24]);
        assert_eq!(trace.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(trace.parent_id.as_deref(), Some("b7ad6b7169203331"));
        assert_eq!(trace.flags, "01");
        assert_eq!(trace.span_id, "0707070707070707");
    }

    #[test]
    fn an_invalid_traceparent_starts_a_new_trace() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let bad = [
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
            format!("00-{}-b7ad6b7169203331-01", "0".repeat(32)),
            format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", "0".repeat(16)),
            format!("{good}-extra"),
            good.replace('-', "_"),
            good.replace('a', "g"),
            good[1..].to_owned(),
            String::new(),
        ];
        for header in bad {
            let trace = trace_context(Some(header.as_bytes()), &[0x11; 24]);
            assert_eq!(trace.parent_id, None, "{header}");
            assert_eq!(trace.trace_id, "11".repeat(16));
            assert_eq!(trace.flags, "01");
        }
    }

    #[test]
    fn all_zero_draws_become_one() {
        let trace = trace_context(None, &[0; 24]);
        assert_eq!(trace.trace_id, format!("{}1", "0".repeat(31)));
        assert_eq!(trace.span_id, format!("{}1", "0".repeat(15)));
    }
}
