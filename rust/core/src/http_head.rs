//! The head of an upstream's HTTP/1.x answer (its status line and header lines), parsed by
//! httparse for the gateway's own upstream client (python/gateway/providers/http.py).
//!
//! In Python the head was split, partitioned and stripped line by line: ~0.6 µs a header line,
//! ~12 µs for the two dozen lines a provider such as OpenAI sends with every answer. Here the bytes
//! are checked as RFC 9112 says (tokens for names, no control bytes in values, CRLF or LF line
//! ends) in one pass, and the client gets the lines it needs as (name, value) pairs.

use crate::error::{CoreError, Result};

/// The most header lines an answer may have; more is refused, not truncated.
pub const MAX_HEADERS: usize = 256;

/// A whole answer head.
#[derive(Debug, PartialEq, Eq)]
pub struct ResponseHead<'a> {
    /// HTTP/1.1 (else HTTP/1.0: its connection is not kept alive unless it says so).
    pub http11: bool,
    pub status: u16,
    /// Each header line in order: its name as sent and its value without surrounding blanks,
    /// both still bytes (values may hold obs-text, read as Latin-1 by the binding).
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// The head's length in bytes, its closing blank line included: the body starts here.
    pub length: usize,
}

/// The head at the start of `buf`: None while it is incomplete; InvalidHttp when the bytes are
/// not an HTTP/1.x answer head.
pub fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead<'_>>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let length = match response.parse(buf) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(invalid(err, buf)),
    };
    let (Some(version), Some(status)) = (response.version, response.code) else {
        return Err(CoreError::InvalidHttp("the status line is incomplete".into()));
    };
    let headers = response.headers.iter().map(|header| (header.name, trim_blanks(header.value))).collect();
    Ok(Some(ResponseHead { http11: version == 1, status, headers, length }))
}

fn invalid(err: httparse::Error, buf: &[u8]) -> CoreError {
    let what = match err {
        httparse::Error::TooManyHeaders => format!("more than {MAX_HEADERS} header lines"),
        httparse::Error::Version | httparse::Error::Status => {
            let end = memchr::memchr(b'\n', buf).unwrap_or(buf.len()).min(80);
            let line = String::from_utf8_lossy(&buf[..end]);
            format!("not an HTTP/1.x status line: {:?}", line.trim_end())
        }
        other => format!("{other}"),
    };
    CoreError::InvalidHttp(what)
}

/// A value without the spaces and tabs around it (RFC 9112's OWS).
fn trim_blanks(value: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !blank(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(buf: &[u8]) -> ResponseHead<'_> {
        match parse_response_head(buf) {
            Ok(Some(head)) => head,
            other => unreachable!("not a whole head: {other:?}"),
        }
    }

    #[test]
    fn a_whole_head_gives_its_status_headers_and_length() {
        let buf = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length:  2 \r\n\r\n{}";
        let parsed = head(buf);
        assert!(parsed.http11);
        assert_eq!(parsed.status, 200);
        assert_eq!(parsed.headers, vec![("Content-Type", &b"application/json"[..]), ("Content-Length", &b"2"[..])]);
        assert_eq!(&buf[parsed.length..], b"{}");
    }

    #[test]
    fn http_1_0_bare_line_feeds_and_empty_reasons_are_answers_too() {
        let parsed = head(b"HTTP/1.0 204\nX-A: b\n\n");
        assert!(!parsed.http11);
        assert_eq!(parsed.status, 204);
        assert_eq!(parsed.headers, vec![("X-A", &b"b"[..])]);
        assert_eq!(parsed.length, 21);
    }

    #[test]
    fn every_prefix_of_a_head_is_incomplete() {
        let buf = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
        for end in 0..buf.len() {
            assert_eq!(parse_response_head(&buf[..end]), Ok(None), "{end}");
        }
        assert_eq!(head(buf).status, 103);
    }

    #[test]
    fn values_keep_obs_text_and_repeated_names() {
        let parsed = head(b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-N: caf\xe9\r\nset-cookie: b=2\r\n\r\n");
        assert_eq!(
            parsed.headers,
            vec![("Set-Cookie", &b"a=1"[..]), ("X-N", &b"caf\xe9"[..]), ("set-cookie", &b"b=2"[..])]
        );
    }

    #[test]
    fn what_is_not_an_answer_head_is_refused() {
        for bad in [
            &b"SPDY/3 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 two hundred\r\n\r\n",
            b"HTTP/2 200\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
        ] {
            assert!(
                matches!(parse_response_head(bad), Err(CoreError::InvalidHttp(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_status_line_that_is_not_one_is_quoted_in_the_error() {
        let Err(CoreError::InvalidHttp(why)) = parse_response_head(b"SPDY/3 200 OK\r\n\r\n") else {
            unreachable!("refused")
        };
        assert!(why.contains("SPDY/3 200 OK"), "{why}");
    }

    #[test]
    fn too_many_header_lines_are_refused_not_cut() {
        let mut buf = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            buf.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        buf.extend_from_slice(b"\r\n");
        assert!(matches!(parse_response_head(&buf), Err(CoreError::InvalidHttp(_))));
    }

    #[test]
    fn blanks_around_values_go_and_inner_ones_stay() {
        assert_eq!(trim_blanks(b" \t a b \t"), b"a b");
        assert_eq!(trim_blanks(b"   "), b"");
        assert_eq!(trim_blanks(b""), b"");
    }
}
