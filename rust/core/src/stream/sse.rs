//! Incremental server-sent-events parser following the WHATWG rules.
//!
//! Feed it byte chunks split anywhere (inside a line, between CR and LF, inside a UTF-8 sequence);
//! it returns whole events. Lines end with LF, CRLF or CR; lines starting with ':' are comments;
//! a blank line dispatches the event being built; an event without any `data:` line is dropped;
//! a UTF-8 byte order mark at the very start is skipped. An event larger than MAX_EVENT_BYTES
//! (a line without end, or data lines without a blank line) stops the parser: memory stays bounded
//! whatever an upstream sends.

use memchr::memchr2;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// The `event:` field; None when absent or empty (a plain "message" event).
    pub event: Option<String>,
    /// The data lines joined with "\n".
    pub data: String,
    /// This event's own `id:` field (not carried over from earlier events).
    pub id: Option<String>,
    pub retry: Option<u64>,
}

/// An event as the parser hands it to a callback, borrowing its buffers (no allocation per event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRef<'a> {
    pub event: Option<&'a str>,
    pub data: &'a str,
    pub id: Option<&'a str>,
    pub retry: Option<u64>,
}

impl EventRef<'_> {
    pub fn to_owned(self) -> Event {
        Event {
            event: self.event.map(str::to_owned),
            data: self.data.to_owned(),
            id: self.id.map(str::to_owned),
            retry: self.retry,
        }
    }
}

#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line not yet ended.
    pending: Vec<u8>,
    /// The previous chunk ended in CR: an LF starting the next chunk belongs to that line end.
    skip_lf: bool,
    /// A line was seen already (the BOM can only lead the first).
    started: bool,
    // The event being built; the buffers keep their capacity from one event to the next.
    data: String,
    has_data: bool,
    event: String,
    id: String,
    has_id: bool,
    retry: Option<u64>,
    /// An event grew past MAX_EVENT_BYTES: everything from there on is ignored.
    overflowed: bool,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";
/// The largest event (or line) the parser holds; model chunks are a few kilobytes at most.
pub const MAX_EVENT_BYTES: usize = 16 << 20;
/// What a stream rewriter reports as the upstream's error when an event overflowed.
pub const OVERSIZED_EVENT_ERROR: &[u8] =
    br#"{"error":{"message":"The upstream sent an event larger than 16 MiB.","type":"server_error"}}"#;
/// What a stream rewriter reports as the upstream's error when an event's data is not a JSON object
/// (a truncated chunk, text): the stream is broken there, as the clients' parsers would find it.
pub const MALFORMED_EVENT_ERROR: &[u8] =
    br#"{"error":{"message":"The upstream sent an event that is not a JSON object.","type":"server_error"}}"#;
/// What a stream rewriter reports as the upstream's error when its stream ended (`[DONE]`) without
/// a single chunk: no answer at all, not an empty one (which has its role and finish chunks).
pub const EMPTY_STREAM_ERROR: &[u8] =
    br#"{"error":{"message":"The upstream ended its stream without an answer.","type":"server_error"}}"#;

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse `chunk`, appending every event it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Event>) {
        self.feed_each(chunk, |e| out.push(e.to_owned()));
    }

    /// End of input: a last line without its end, and an event without its blank line, still count.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        self.finish_each(|e| out.push(e.to_owned()));
    }

    /// Parse `chunk`, calling `each` with every event it completes.
    pub fn feed_each(&mut self, chunk: &[u8], mut each: impl FnMut(EventRef<'_>)) {
        if self.overflowed {
            return;
        }
        let mut rest = chunk;
        if self.skip_lf && !rest.is_empty() {
            self.skip_lf = false;
            if let Some((&b'\n', tail)) = rest.split_first() {
                rest = tail;
            }
        }
        while let Some(pos) = memchr2(b'\n', b'\r', rest) {
            let (line, tail) = rest.split_at(pos);
            let is_cr = tail.first() == Some(&b'\r');
            let mut next = tail.get(1..).unwrap_or_default();
            if is_cr {
                match next.first() {
                    Some(b'\n') => next = next.get(1..).unwrap_or_default(),
                    None => self.skip_lf = true,
                    Some(_) => {}
                }
            }
            if self.pending.is_empty() {
                self.line(line, &mut each);
            } else {
                let mut whole = std::mem::take(&mut self.pending);
                whole.extend_from_slice(line);
                self.line(&whole, &mut each);
                if self.overflowed {
                    return;
                }
                whole.clear();
                self.pending = whole; // keep the allocation
            }
            if self.overflowed {
                return;
            }
            rest = next;
        }
        if self.pending.len() + rest.len() > MAX_EVENT_BYTES {
            self.overflow();
            return;
        }
        self.pending.extend_from_slice(rest);
    }

    /// True once an event grew past MAX_EVENT_BYTES; the parser then yields nothing more.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn overflow(&mut self) {
        self.overflowed = true;
        // Give the memory back: nothing more will be parsed.
        self.pending = Vec::new();
        self.data = String::new();
    }

    /// End of input (see [`finish`](Self::finish)), calling `each` with the events it completes.
    pub fn finish_each(&mut self, mut each: impl FnMut(EventRef<'_>)) {
        if self.overflowed {
            return;
        }
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line, &mut each);
        }
        self.skip_lf = false;
        self.dispatch(&mut each);
    }

    fn line(&mut self, mut line: &[u8], each: &mut impl FnMut(EventRef<'_>)) {
        if !self.started {
            self.started = true;
            if let Some(stripped) = line.strip_prefix(BOM) {
                line = stripped;
            }
        }
        if line.is_empty() {
            self.dispatch(each);
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let value = line.get(i + 1..).unwrap_or_default();
                (line.get(..i).unwrap_or_default(), value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if self.data.len() + value.len() >= MAX_EVENT_BYTES {
                    self.overflow();
                    return;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.push_str(&String::from_utf8_lossy(value));
            }
            b"id" if !value.contains(&0) => {
                self.id.clear();
                self.id.push_str(&String::from_utf8_lossy(value));
                self.has_id = true;
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                self.retry = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, each: &mut impl FnMut(EventRef<'_>)) {
        if self.has_data {
            each(EventRef {
                event: Some(self.event.as_str()).filter(|e| !e.is_empty()),
                data: &self.data,
                id: self.has_id.then_some(self.id.as_str()),
                retry: self.retry,
            });
        }
        self.has_data = false;
        self.data.clear();
        self.event.clear();
        self.has_id = false;
        self.id.clear();
        self.retry = None;
    }
}

/// Every event in `chunks`, fed one after another and finished: what a client would read.
#[cfg(test)]
pub(crate) fn parse_all(chunks: &[&[u8]]) -> Vec<Event> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut out);
    }
    p.finish(&mut out);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(events: &[Event]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn lf_crlf_and_cr_line_ends() {
        assert_eq!(data(&parse_all(&[b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n"])), ["a", "b", "c", "d"]);
    }

    #[test]
    fn cr_at_chunk_end_then_lf() {
        let events = parse_all(&[b"data: a\r", b"\n\r", b"\ndata: b\r", b"\r"]);
        assert_eq!(data(&events), ["a", "b"]);
    }

    #[test]
    fn comments_fields_and_multiline_data() {
        let events = parse_all(&[b": keep-alive\nevent: message_start\nid: 7\nretry: 300\ndata: one\ndata:two\n\n"]);
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.event.as_deref(), Some("message_start"));
        assert_eq!(e.id.as_deref(), Some("7"));
        assert_eq!(e.retry, Some(300));
        assert_eq!(e.data, "one\ntwo");
    }

    #[test]
    fn event_without_data_is_dropped_and_fields_reset() {
        let events = parse_all(&[b"event: ping\n\ndata: x\n\n"]);
        assert_eq!(events, [Event { data: "x".into(), ..Event::default() }]);
    }

    #[test]
    fn bom_at_start_and_unterminated_last_event() {
        let events = parse_all(&[b"\xEF\xBB", b"\xBFdata: a\n\ndata: b"]);
        assert_eq!(data(&events), ["a", "b"]);
    }

    #[test]
    fn field_without_colon_and_empty_data() {
        let events = parse_all(&[b"data\n\ndata:\ndata\n\n"]);
        assert_eq!(data(&events), ["", "\n"]);
    }

    #[test]
    fn empty_event_name_is_none_and_id_is_per_event() {
        let events = parse_all(&[b"event:\nid: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: x\0y\ndata: d\n\n"]);
        assert_eq!(events[0], Event { data: "a".into(), id: Some("1".into()), ..Event::default() });
        assert_eq!(events[1], Event { data: "b".into(), ..Event::default() });
        assert_eq!(events[2].id.as_deref(), Some(""));
        assert_eq!(events[3].id, None); // an id with NUL is ignored
    }

    #[test]
    fn bom_only_at_the_very_start_and_unknown_fields_ignored() {
        let events = parse_all(&[b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\nfoo: bar\ndata:  two spaces\n\n"]);
        assert_eq!(data(&events), ["a", " two spaces"]); // a later BOM is part of a field name
    }

    #[test]
    fn invalid_utf8_is_replaced_and_retry_must_be_digits() {
        let events = parse_all(&[b"retry: 12a\ndata: \xFF\xFEok\n\nretry: 99999999999999999999999\ndata: x\n\n"]);
        assert_eq!(events[0].data, "\u{FFFD}\u{FFFD}ok");
        assert_eq!(events[0].retry, None);
        assert_eq!(events[1].retry, None); // too large for u64
    }

    #[test]
    fn borrowed_events_equal_owned() {
        let bytes = include_bytes!("../../../../tests/fixtures/sse/anthropic_messages_stream.txt");
        let mut p = SseParser::new();
        let mut borrowed = Vec::new();
        p.feed_each(bytes, |e| borrowed.push(e.to_owned()));
        p.finish_each(|e| borrowed.push(e.to_owned()));
        assert_eq!(borrowed, parse_all(&[bytes]));
    }

    #[test]
    fn utf8_split_inside_a_character() {
        let text = "data: héllo 😀\n\n".as_bytes();
        let events = parse_all(&[&text[..8], &text[8..15], &text[15..]]);
        assert_eq!(data(&events), ["héllo 😀"]);
    }

    #[test]
    fn golden_fixtures_parse() {
        let openai = parse_all(&[include_bytes!("../../../../tests/fixtures/sse/openai_chat_stream.txt")]);
        assert_eq!(openai.last().map(|e| e.data.as_str()), Some("[DONE]"));
        let anthropic = parse_all(&[include_bytes!("../../../../tests/fixtures/sse/anthropic_messages_stream.txt")]);
        let names: Vec<_> = anthropic.iter().map(|e| e.event.clone().unwrap_or_default()).collect();
        assert_eq!(names.first().map(String::as_str), Some("message_start"));
        assert_eq!(names.last().map(String::as_str), Some("message_stop"));
        let mixed = parse_all(&[include_bytes!("../../../../tests/fixtures/sse/crlf_and_comments.txt")]);
        assert_eq!(data(&mixed), ["{\"a\":1}", "line one\nline two", "[DONE]"]);
    }

    fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[a-z{}\":, é😀]{0,20}".prop_map(|s| format!("data: {s}")),
            "[a-z_]{1,10}".prop_map(|s| format!("event: {s}")),
            "[ -~]{0,10}".prop_map(|s| format!(":{s}")),
            Just(String::new()),
            "[0-9]{1,4}".prop_map(|s| format!("retry: {s}")),
        ];
        let end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        proptest::collection::vec((line, end), 0..30)
            .prop_map(|lines| lines.into_iter().flat_map(|(l, e)| format!("{l}{e}").into_bytes()).collect())
    }

    proptest! {
        #[test]
        fn same_events_however_split(bytes in stream_bytes(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8)) {
            let whole = parse_all(&[&bytes]);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for p in points {
                chunks.push(&bytes[last..p]);
                last = p;
            }
            chunks.push(&bytes[last..]);
            prop_assert_eq!(parse_all(&chunks), whole);
        }

        #[test]
        fn byte_by_byte_equals_whole(bytes in stream_bytes()) {
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            prop_assert_eq!(parse_all(&singles), parse_all(&[&bytes]));
        }
    }

    #[test]
    fn an_endless_line_or_event_stops_the_parser() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let piece = vec![b'x'; 1 << 20];
        p.feed(b"data: ", &mut out);
        for _ in 0..16 {
            p.feed(&piece, &mut out);
        }
        assert!(p.overflowed() && p.pending.capacity() == 0);
        p.feed(b"\n\ndata: later\n\n", &mut out);
        p.finish(&mut out);
        assert!(out.is_empty());

        let mut p = SseParser::new();
        let line = [b"data: ", &piece[..], b"\n"].concat();
        for _ in 0..16 {
            p.feed(&line, &mut out);
        }
        assert!(p.overflowed() && out.is_empty());
    }
}
