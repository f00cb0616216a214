//! Incremental parser of AWS's binary event stream (`application/vnd.amazon.eventstream`), the
//! framing of Bedrock's ConverseStream and InvokeModelWithResponseStream answers.
//!
//! A message is a 12-byte prelude (total length, headers length, both big-endian u32, and the
//! CRC-32 of those 8 bytes), the headers, the payload and the CRC-32 of everything before it.
//! A header is a name (u8 length, UTF-8), a type byte and a value: 0/1 boolean true/false, 2 byte,
//! 3 short, 4 integer, 5 long, 6 bytes (u16 length), 7 string (u16 length), 8 timestamp (i64
//! milliseconds), 9 UUID (16 bytes). Feed it chunks split anywhere; it returns whole messages. A
//! message that breaks the framing (a CRC mismatch, lengths that do not add up, a header of an
//! unknown type, a message past MAX_MESSAGE_BYTES) is an error, and the parser then stays failed:
//! after a framing error the byte boundaries of the rest of the stream cannot be trusted.

use crate::error::{CoreError, Result};

/// AWS's limit for one message; a larger total length is a broken stream, not a big event.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// AWS's limit for a message's headers.
pub const MAX_HEADERS_BYTES: usize = 128 << 10;
const PRELUDE: usize = 12;
/// Prelude and message CRC: the size of a message with no headers and no payload.
const OVERHEAD: usize = PRELUDE + 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Bool(bool),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Bytes(Vec<u8>),
    String(String),
    Timestamp(i64),
    Uuid([u8; 16]),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub headers: Vec<(String, HeaderValue)>,
    pub payload: Vec<u8>,
}

impl Message {
    /// A string header's value (`:message-type`, `:event-type`, `:exception-type` ...).
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|(n, v)| match v {
            HeaderValue::String(s) if n == name => Some(s.as_str()),
            _ => None,
        })
    }
}

#[derive(Debug, Default)]
pub struct EventStreamParser {
    pending: Vec<u8>,
    failed: bool,
}

fn broken(why: String) -> CoreError {
    CoreError::InvalidEventStream(why)
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(b.get(at..at + 4).unwrap_or(&[0; 4]));
    u32::from_be_bytes(word)
}

impl EventStreamParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse `chunk`, appending every message it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Message>) -> Result<()> {
        if self.failed {
            return Err(broken("the stream broke earlier".into()));
        }
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        let result = loop {
            let rest = self.pending.get(start..).unwrap_or_default();
            match next_message(rest) {
                Ok(Some((message, used))) => {
                    out.push(message);
                    start += used;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.pending.drain(..start);
        if result.is_err() {
            self.failed = true;
            self.pending.clear();
        }
        result
    }

    /// End of input: bytes of a message not yet whole are an error (the stream was cut).
    pub fn finish(&mut self) -> Result<()> {
        if self.failed || self.pending.is_empty() {
            return Ok(());
        }
        let left = self.pending.len();
        self.pending.clear();
        Err(broken(format!("the stream ended inside a message ({left} bytes of it)")))
    }
}

/// The first whole message of `b` and the bytes it took, or None while it is incomplete.
fn next_message(b: &[u8]) -> Result<Option<(Message, usize)>> {
    if b.len() < PRELUDE {
        return Ok(None);
    }
    let total = be_u32(b, 0) as usize;
    let headers_len = be_u32(b, 4) as usize;
    let prelude_crc = be_u32(b, 8);
    let computed = crc32fast::hash(b.get(..8).unwrap_or_default());
    if computed != prelude_crc {
        return Err(broken(format!("prelude CRC {prelude_crc:#010x} does not match {computed:#010x}")));
    }
    if !(OVERHEAD..=MAX_MESSAGE_BYTES).contains(&total) {
        return Err(broken(format!("a message of {total} bytes (from {OVERHEAD} to {MAX_MESSAGE_BYTES})")));
    }
    if headers_len > MAX_HEADERS_BYTES || headers_len > total - OVERHEAD {
        return Err(broken(format!("{headers_len} bytes of headers in a message of {total}")));
    }
    let Some(whole) = b.get(..total) else {
        return Ok(None);
    };
    let message_crc = be_u32(whole, total - 4);
    let computed = crc32fast::hash(whole.get(..total - 4).unwrap_or_default());
    if computed != message_crc {
        return Err(broken(format!("message CRC {message_crc:#010x} does not match {computed:#010x}")));
    }
    let headers = parse_headers(whole.get(PRELUDE..PRELUDE + headers_len).unwrap_or_default())?;
    let payload = whole.get(PRELUDE + headers_len..total - 4).unwrap_or_default().to_vec();
    Ok(Some((Message { headers, payload }, total)))
}

/// Reads headers one field at a time, failing on a field that runs past their end.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let piece = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| broken(format!("a header runs past the headers' end (at byte {})", self.at)))?;
        self.at += n;
        Ok(piece)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn text(&mut self, n: usize) -> Result<String> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| broken("a header that is not UTF-8".into()))
    }
}

fn parse_headers(b: &[u8]) -> Result<Vec<(String, HeaderValue)>> {
    let mut r = Reader { b, at: 0 };
    let mut headers = Vec::new();
    while r.at < b.len() {
        let [name_len] = r.array::<1>()?;
        let name = r.text(name_len as usize)?;
        let [kind] = r.array::<1>()?;
        let value = match kind {
            0 => HeaderValue::Bool(true),
            1 => HeaderValue::Bool(false),
            2 => HeaderValue::Byte(i8::from_be_bytes(r.array()?)),
            3 => HeaderValue::Short(i16::from_be_bytes(r.array()?)),
            4 => HeaderValue::Int(i32::from_be_bytes(r.array()?)),
            5 => HeaderValue::Long(i64::from_be_bytes(r.array()?)),
            6 => {
                let n = u16::from_be_bytes(r.array()?) as usize;
                HeaderValue::Bytes(r.take(n)?.to_vec())
            }
            7 => {
                let n = u16::from_be_bytes(r.array()?) as usize;
                HeaderValue::String(r.text(n)?)
            }
            8 => HeaderValue::Timestamp(i64::from_be_bytes(r.array()?)),
            9 => HeaderValue::Uuid(r.array()?),
            other => return Err(broken(format!("header {name:?} has unknown type {other}"))),
        };
        headers.push((name, value));
    }
    Ok(headers)
}

/// One message as AWS frames it (the simulator and the tests write streams with it).
pub fn encode(headers: &[(String, HeaderValue)], payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    for (name, value) in headers {
        head.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        head.extend_from_slice(name.as_bytes().get(..usize::from(u8::MAX)).unwrap_or(name.as_bytes()));
        match value {
            HeaderValue::Bool(true) => head.push(0),
            HeaderValue::Bool(false) => head.push(1),
            HeaderValue::Byte(v) => {
                head.push(2);
                head.extend_from_slice(&v.to_be_bytes());
            }
            HeaderValue::Short(v) => {
                head.push(3);
                head.extend_from_slice(&v.to_be_bytes());
            }
            HeaderValue::Int(v) => {
                head.push(4);
                head.extend_from_slice(&v.to_be_bytes());
            }
            HeaderValue::Long(v) => {
                head.push(5);
                head.extend_from_slice(&v.to_be_bytes());
            }
            HeaderValue::Bytes(v) => {
                head.push(6);
                head.extend_from_slice(&u16::try_from(v.len()).unwrap_or(u16::MAX).to_be_bytes());
                head.extend_from_slice(v.get(..usize::from(u16::MAX)).unwrap_or(v));
            }
            HeaderValue::String(v) => {
                head.push(7);
                head.extend_from_slice(&u16::try_from(v.len()).unwrap_or(u16::MAX).to_be_bytes());
                head.extend_from_slice(v.as_bytes().get(..usize::from(u16::MAX)).unwrap_or(v.as_bytes()));
            }
            HeaderValue::Timestamp(v) => {
                head.push(8);
                head.extend_from_slice(&v.to_be_bytes());
            }
            HeaderValue::Uuid(v) => {
                head.push(9);
                head.extend_from_slice(v);
            }
        }
    }
    let total = OVERHEAD + head.len() + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_be_bytes());
    let prelude_crc = crc32fast::hash(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(kind: &str, payload: &str) -> Vec<u8> {
        encode(
            &[
                (":event-type".into(), HeaderValue::String(kind.into())),
                (":content-type".into(), HeaderValue::String("application/json".into())),
                (":message-type".into(), HeaderValue::String("event".into())),
            ],
            payload.as_bytes(),
        )
    }

    fn parse_all(bytes: &[u8], step: usize) -> Result<Vec<Message>> {
        let mut parser = EventStreamParser::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(step.max(1)) {
            parser.feed(piece, &mut out)?;
        }
        parser.finish()?;
        Ok(out)
    }

    /// A message from AWS's documentation of the format: the bytes of `{'foo':'bar'}` with one
    /// string header, as the AWS SDKs' own tests frame it.
    #[test]
    fn aws_reference_message() -> Result<()> {
        let bytes: &[u8] = &[
            0x00, 0x00, 0x00, 0x3D, 0x00, 0x00, 0x00, 0x20, 0x07, 0xFD, 0x83, 0x96, 0x0C, b'c', b'o', b'n', b't', b'e',
            b'n', b't', b'-', b't', b'y', b'p', b'e', 0x07, 0x00, 0x10, b'a', b'p', b'p', b'l', b'i', b'c', b'a', b't',
            b'i', b'o', b'n', b'/', b'j', b's', b'o', b'n', b'{', b'\'', b'f', b'o', b'o', b'\'', b':', b'\'', b'b',
            b'a', b'r', b'\'', b'}', 0x8D, 0x9C, 0x08, 0xB1,
        ];
        let messages = parse_all(bytes, 7)?;
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].header_str("content-type"), Some("application/json"));
        assert_eq!(messages[0].payload, b"{'foo':'bar'}");
        assert_eq!(encode(&messages[0].headers, &messages[0].payload), bytes);
        Ok(())
    }

    #[test]
    fn messages_split_anywhere() -> Result<()> {
        let stream = [event("messageStart", r#"{"role":"assistant"}"#), event("messageStop", "{}")].concat();
        for step in 1..stream.len() {
            let messages = parse_all(&stream, step)?;
            assert_eq!(messages.len(), 2);
            assert_eq!(messages[1].header_str(":event-type"), Some("messageStop"));
        }
        Ok(())
    }

    #[test]
    fn a_corrupt_byte_is_an_error_and_the_parser_stays_failed() {
        let mut bytes = event("contentBlockDelta", r#"{"delta":{"text":"hi"}}"#);
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        let mut parser = EventStreamParser::new();
        let mut out = Vec::new();
        assert!(matches!(parser.feed(&bytes, &mut out), Err(CoreError::InvalidEventStream(_))));
        assert!(parser.feed(&event("messageStop", "{}"), &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn a_cut_stream_is_an_error_at_the_end() {
        let bytes = event("messageStop", "{}");
        let mut parser = EventStreamParser::new();
        let mut out = Vec::new();
        assert!(parser.feed(&bytes[..bytes.len() - 1], &mut out).is_ok());
        assert!(out.is_empty());
        assert!(matches!(parser.finish(), Err(CoreError::InvalidEventStream(_))));
    }

    #[test]
    fn lengths_that_cannot_be_are_refused_before_buffering() {
        let mut huge = Vec::new();
        huge.extend_from_slice(&(u32::MAX).to_be_bytes());
        huge.extend_from_slice(&0u32.to_be_bytes());
        let crc = crc32fast::hash(&huge);
        huge.extend_from_slice(&crc.to_be_bytes());
        let mut out = Vec::new();
        assert!(EventStreamParser::new().feed(&huge, &mut out).is_err());
    }

    fn header_value() -> impl Strategy<Value = HeaderValue> {
        prop_oneof![
            any::<bool>().prop_map(HeaderValue::Bool),
            any::<i8>().prop_map(HeaderValue::Byte),
            any::<i16>().prop_map(HeaderValue::Short),
            any::<i32>().prop_map(HeaderValue::Int),
            any::<i64>().prop_map(HeaderValue::Long),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(HeaderValue::Bytes),
            ".{0,30}".prop_map(HeaderValue::String),
            any::<i64>().prop_map(HeaderValue::Timestamp),
            any::<[u8; 16]>().prop_map(HeaderValue::Uuid),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        (
            proptest::collection::vec(("[:a-z-]{1,20}", header_value()), 0..5),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(headers, payload)| Message { headers, payload })
    }

    proptest! {
        #[test]
        fn encoded_messages_parse_back_whatever_the_split(
            messages in proptest::collection::vec(message(), 1..6),
            step in 1usize..64,
        ) {
            let stream: Vec<u8> = messages.iter().flat_map(|m| encode(&m.headers, &m.payload)).collect();
            let parsed = parse_all(&stream, step).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(parsed, messages);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), step in 1usize..50) {
            let _ = parse_all(&bytes, step);
        }
    }
}
