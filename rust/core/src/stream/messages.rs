//! Rewriting an upstream message-style (Anthropic Messages API) stream for the client.
//!
//! Events keep their names (`event: message_start` ...), which the client library dispatches on.
//! Every event's JSON gets a top-level `id` set to the gateway's response id (spec 6.1.6), and
//! `message_start` also gets it as `message.id`; the rest of each event's bytes are untouched.
//! Usage comes from `message_start` (input) and `message_delta` (cumulative output); streamed text,
//! thinking and tool-input JSON are collected for counting when no usage comes; `message_stop` ends
//! the stream, after which the gateway adds `data: [DONE]` (spec 6.1.3; the client ignores unnamed
//! events). An upstream `error` event is kept back: its raw JSON lands in `error`.

use super::events::{push_name, push_with_id, read_named_event};
use super::sse::EventRef;
use super::{StreamRewriter, StreamState, TokenUsage};
use crate::error::{CoreError, Result};
use crate::json::{for_each_member, key_is, member_is_set, starts_object, write_with_member};
use crate::json::{Count, Lenient, Text};
use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Deserialize, Default)]
struct UsageView {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
    /// The cache writes by how long they are kept; only the hour's are priced apart.
    #[serde(default)]
    cache_creation: Lenient<CacheCreationView>,
}

#[derive(Deserialize, Default)]
struct CacheCreationView {
    #[serde(default)]
    ephemeral_5m_input_tokens: Count,
    #[serde(default)]
    ephemeral_1h_input_tokens: Count,
}

#[derive(Deserialize)]
struct MessageView<'a> {
    #[serde(default, borrow)]
    model: Text<'a>,
    #[serde(default)]
    usage: Lenient<UsageView>,
    #[serde(default, borrow)]
    stop_reason: Text<'a>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default, borrow)]
    text: Text<'a>,
    #[serde(default, borrow)]
    thinking: Text<'a>,
    #[serde(default, borrow)]
    partial_json: Text<'a>,
    #[serde(default, borrow)]
    stop_reason: Text<'a>,
}

#[derive(Deserialize)]
struct BlockView<'a> {
    #[serde(default, borrow)]
    text: Text<'a>,
    #[serde(default, borrow)]
    thinking: Text<'a>,
}

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(default, borrow)]
    message: Option<MessageView<'a>>,
    #[serde(default, borrow)]
    content_block: Option<BlockView<'a>>,
    #[serde(default, borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(default)]
    usage: Lenient<UsageView>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

/// The three parts of a message's input as last reported. Counts are cumulative: `message_start`
/// gives them and `message_delta` may repeat them (the API does, with a part it has no count for
/// as null), so each report replaces only the parts it names and a repeat is never added twice.
#[derive(Default, Clone, Copy)]
struct InputParts {
    fresh: u64,
    cache_read: u64,
    cache_write: u64,
    cache_write_1h: u64,
}

/// Input as the spec's prompt_tokens: fresh input plus cache reads and writes (cache reads as cached).
fn apply_usage(total: &mut TokenUsage, parts: &mut InputParts, u: &UsageView) {
    let (input, read) = (u.input_tokens.0, u.cache_read_input_tokens.0);
    let by_ttl = u.cache_creation.as_ref();
    let write_1h = by_ttl.and_then(|c| c.ephemeral_1h_input_tokens.0);
    // The writes' total, else (an upstream that gives only the breakdown) the sum of its parts.
    let write = u.cache_creation_input_tokens.0.or_else(|| {
        let write_5m = by_ttl.and_then(|c| c.ephemeral_5m_input_tokens.0);
        (write_5m.is_some() || write_1h.is_some()).then(|| write_5m.unwrap_or(0).saturating_add(write_1h.unwrap_or(0)))
    });
    if input.is_some() || read.is_some() || write.is_some() || write_1h.is_some() {
        parts.fresh = input.unwrap_or(parts.fresh);
        parts.cache_read = read.unwrap_or(parts.cache_read);
        parts.cache_write = write.unwrap_or(parts.cache_write);
        parts.cache_write_1h = write_1h.unwrap_or(parts.cache_write_1h);
        total.prompt_tokens = parts.fresh.saturating_add(parts.cache_read).saturating_add(parts.cache_write);
        total.cached_tokens = parts.cache_read;
        total.cache_write_tokens = parts.cache_write;
        total.cache_write_1h_tokens = parts.cache_write_1h.min(parts.cache_write);
    }
    if let Some(out) = u.output_tokens.0 {
        total.completion_tokens = out;
    }
    total.total_tokens = total.prompt_tokens.saturating_add(total.completion_tokens);
}

/// `usage` of a whole (non-streamed) message, mapped as in streams; None when absent.
pub fn parse_messages_usage(body: &[u8]) -> Result<Option<TokenUsage>> {
    if !starts_object(body) {
        return Err(CoreError::InvalidJson("expected a JSON object".into()));
    }
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        usage: Lenient<UsageView>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|e| CoreError::InvalidJson(e.to_string()))?;
    Ok(parsed.usage.0.map(|u| {
        let mut total = TokenUsage::default();
        apply_usage(&mut total, &mut InputParts::default(), &u);
        total
    }))
}

/// A message_start event: the id set inside `message` as well as at the top level.
fn push_message_start(out: &mut Vec<u8>, data: &[u8], encoded_id: &[u8]) {
    let mut message = None;
    let _ = for_each_member(data, |k, span| {
        if key_is(k, "message") {
            message = Some(span);
        }
    });
    let mut nested = Vec::with_capacity(data.len() + encoded_id.len() + 8);
    let done = message.is_some_and(|span| {
        let (Some(before), Some(inner), Some(after)) =
            (data.get(..span.start), data.get(span.clone()), data.get(span.end..))
        else {
            return false;
        };
        nested.extend_from_slice(before);
        let ok = inner.first() == Some(&b'{') && write_with_member(inner, "id", encoded_id, &mut nested).is_ok();
        nested.extend_from_slice(after);
        ok
    });
    push_with_id(out, if done { &nested } else { data }, encoded_id);
}

pub struct MessagesStreamRewriter {
    state: StreamState,
    usage: TokenUsage,
    input: InputParts,
    saw_usage: bool,
}

impl MessagesStreamRewriter {
    pub fn new(response_id: &str) -> Self {
        Self {
            state: StreamState::new(response_id),
            usage: TokenUsage::default(),
            input: InputParts::default(),
            saw_usage: false,
        }
    }

    fn read(&mut self, view: EventView<'_>) {
        if let Some(message) = view.message {
            self.state.note_model(message.model);
            if let Some(u) = message.usage.as_ref() {
                apply_usage(&mut self.usage, &mut self.input, u);
                self.saw_usage = true;
            }
            if let Some(reason) = message.stop_reason.into_owned() {
                self.state.finish_reason = Some(reason);
            }
        }
        if let Some(u) = view.usage.as_ref() {
            apply_usage(&mut self.usage, &mut self.input, u);
            self.saw_usage = true;
        }
        if let Some(block) = &view.content_block {
            self.state.take_text(&block.text);
            self.state.take_reasoning(&block.thinking);
        }
        if let Some(delta) = view.delta {
            self.state.take_reasoning(&delta.thinking);
            self.state.take_text(&delta.text);
            self.state.take_text(&delta.partial_json);
            if let Some(reason) = delta.stop_reason.into_owned() {
                self.state.finish_reason = Some(reason);
            }
        }
    }
}

impl StreamRewriter for MessagesStreamRewriter {
    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.saw_usage.then_some(self.usage)
    }

    fn handle(&mut self, event: EventRef<'_>, out: &mut Vec<u8>) {
        if self.state.is_over() {
            return;
        }
        let data = event.data;
        // Valid JSON of a shape the view does not know (None) is still forwarded with the id.
        let Some(view) = read_named_event::<EventView<'_>>(event, &mut self.state) else {
            return;
        };
        let kind = view.as_ref().and_then(|v| v.kind.0.as_deref());
        let name = event.event.or(kind).unwrap_or("");
        let is_error = match &view {
            Some(v) => v.error.is_some(),
            None => member_is_set(data.as_bytes(), "error"),
        };
        if name == "error" || is_error {
            self.state.error = Some(data.as_bytes().to_vec());
            return;
        }
        let is_start = name == "message_start";
        let is_stop = name == "message_stop";
        if let Some(v) = view {
            self.read(v);
        }
        push_name(out, event.event);
        if is_start {
            push_message_start(out, data.as_bytes(), self.state.encoded_id());
        } else {
            push_with_id(out, data.as_bytes(), self.state.encoded_id());
        }
        self.state.chunks += 1;
        if is_stop {
            self.state.end(out);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::stream::sse::{parse_all, Event};
    use proptest::prelude::*;

    const FIXTURE: &[u8] = include_bytes!("../../../../tests/fixtures/sse/anthropic_messages_stream.txt");

    fn parse(bytes: &[u8]) -> Vec<Event> {
        parse_all(&[bytes])
    }

    #[test]
    fn names_kept_ids_set_usage_read_done_added() {
        let mut rw = MessagesStreamRewriter::new("msg_gw");
        let mut out = rw.feed(FIXTURE);
        out.extend(rw.finish());
        let events = parse(&out);
        let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap_or_default()).collect();
        assert_eq!(names.first().map(String::as_str), Some("message_start"));
        assert_eq!(names[names.len() - 2], "message_stop");
        assert_eq!(events.last().unwrap().data, "[DONE]");
        for e in &events[..events.len() - 1] {
            let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
            assert_eq!(v["id"], "msg_gw");
        }
        let start: serde_json::Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(start["message"]["id"], "msg_gw");
        assert_eq!(start["message"]["model"], "claude-sonnet-4-5");
        let usage = rw.usage().unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (25, 15, 40));
        assert_eq!(rw.state().output_text, "Hello!");
        assert_eq!(rw.state().finish_reason.as_deref(), Some("end_turn"));
        assert!(rw.state().done && rw.state().saw_output);
    }

    #[test]
    fn error_event_kept_back() {
        let mut rw = MessagesStreamRewriter::new("x");
        let out = rw.feed(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n");
        assert_eq!(parse(&out).len(), 1);
        assert!(rw.state().error.is_some());
    }

    #[test]
    fn cache_tokens_count_as_prompt() {
        let u = parse_messages_usage(br#"{"id":"m","usage":{"input_tokens":3,"cache_read_input_tokens":10,"cache_creation_input_tokens":2,"output_tokens":4}}"#).unwrap().unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.total_tokens), (15, 10, 4, 19));
        assert_eq!(u.cache_write_tokens, 2);
        assert!(parse_messages_usage(b"[]").is_err());
        // Of the writes, those kept an hour; never more than the writes.
        let hour = parse_messages_usage(br#"{"usage":{"input_tokens":3,"cache_creation_input_tokens":20,"cache_creation":{"ephemeral_5m_input_tokens":5,"ephemeral_1h_input_tokens":15},"output_tokens":4}}"#).unwrap().unwrap();
        assert_eq!((hour.prompt_tokens, hour.cache_write_tokens, hour.cache_write_1h_tokens), (23, 20, 15));
        let over = parse_messages_usage(
            br#"{"usage":{"cache_creation_input_tokens":2,"cache_creation":{"ephemeral_1h_input_tokens":9}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(over.cache_write_1h_tokens, 2);
        // Only the breakdown given: the writes are its sum (review).
        let parts = parse_messages_usage(
            br#"{"usage":{"input_tokens":1,"cache_creation":{"ephemeral_5m_input_tokens":4,"ephemeral_1h_input_tokens":9}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!((parts.prompt_tokens, parts.cache_write_tokens, parts.cache_write_1h_tokens), (14, 13, 9));
        // Review: an odd `cache_creation` failed the whole usage, and the prompt went unbilled.
        for odd in [&br#"0"#[..], br#""x""#, br#"[1]"#, br#"null"#] {
            let body =
                [&br#"{"usage":{"input_tokens":5000,"output_tokens":5,"cache_creation":"#[..], odd, b"}}"].concat();
            let u = parse_messages_usage(&body).unwrap().unwrap();
            assert_eq!((u.prompt_tokens, u.completion_tokens, u.cache_write_1h_tokens), (5000, 5, 0));
        }
    }

    fn run(rw: &mut MessagesStreamRewriter, input: &[u8]) -> Vec<u8> {
        let mut out = rw.feed(input);
        out.extend(rw.finish());
        out
    }

    #[test]
    fn only_ids_change() {
        let mut rw = MessagesStreamRewriter::new("msg_gw");
        let out = run(&mut rw, FIXTURE);
        let expected = String::from_utf8(FIXTURE.to_vec())
            .unwrap()
            .replace("\"msg_01XFDUDYJgAACzvnptvVoYEL\"", "\"msg_gw\"")
            .replace("data: {\"type\"", "data: {\"id\":\"msg_gw\",\"type\"")
            + "data: [DONE]\n\n";
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn unnamed_events_use_their_type_and_upstream_done_is_dropped() {
        let mut rw = MessagesStreamRewriter::new("gw");
        let out = run(
            &mut rw,
            b"data: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":2}}}\n\ndata: [DONE]\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\nevent: ping\ndata: {}\n\n",
        );
        let events = parse(&out);
        assert_eq!(events.len(), 3);
        let start: serde_json::Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!((&start["id"], &start["message"]["id"]), (&"gw".into(), &"gw".into()));
        assert_eq!(events[1].event.as_deref(), Some("message_stop"));
        assert_eq!(events[2].data, "[DONE]");
        let u = rw.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (7, 2, 0));
        assert_eq!(rw.state().model.as_deref(), Some("m"));
        assert!(rw.state().done && !rw.state().saw_output);
        assert_eq!(rw.state().chunks, 2);
    }

    #[test]
    fn data_that_is_not_a_json_object_breaks_the_stream() {
        let mut rw = MessagesStreamRewriter::new("gw");
        let out = run(
            &mut rw,
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"bro\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        assert_eq!(parse(&out).len(), 1); // message_start only
        assert_eq!(rw.state().error.as_deref(), Some(crate::stream::sse::MALFORMED_EVENT_ERROR));
        assert!(!rw.state().done);
    }

    #[test]
    fn thinking_and_tool_input_are_output_and_usage_is_cumulative() {
        let mut rw = MessagesStreamRewriter::new("gw");
        run(
            &mut rw,
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\"\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":3}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":9,\"output_tokens\":8}}\n\n",
        );
        assert_eq!(rw.state().output_text, "hm{\"a\"");
        assert_eq!(rw.state().reasoning_upto(usize::MAX), "hm");
        assert_eq!(rw.state().finish_reason.as_deref(), Some("tool_use"));
        let u = rw.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.total_tokens), (9, 8, 17));
        assert!(!rw.state().done);
    }

    #[test]
    fn input_repeated_in_message_delta_is_counted_once_and_a_null_part_kept() {
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":10,\"cache_creation_input_tokens\":2,\"output_tokens\":1}}}\n\n";
        for (delta, expected) in [
            (&br#"{"input_tokens":3,"cache_read_input_tokens":10,"cache_creation_input_tokens":2,"output_tokens":9}"#[..], (15, 10, 9)),
            (&br#"{"input_tokens":3,"cache_read_input_tokens":null,"cache_creation_input_tokens":null,"output_tokens":9}"#[..], (15, 10, 9)),
            (&br#"{"output_tokens":9}"#[..], (15, 10, 9)),
            (&br#"{"input_tokens":4,"output_tokens":9}"#[..], (16, 10, 9)),
        ] {
            let mut rw = MessagesStreamRewriter::new("gw");
            let mut stream = start.to_vec();
            stream.extend_from_slice(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":");
            stream.extend_from_slice(delta);
            stream.extend_from_slice(b"}\n\n");
            run(&mut rw, &stream);
            let u = rw.usage().unwrap();
            assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), expected);
        }
    }

    #[test]
    fn message_without_inner_object_and_odd_shapes() {
        let mut rw = MessagesStreamRewriter::new("gw");
        let out = run(&mut rw, b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":5}\n\nevent: x\ndata: {\"delta\":7}\n\n");
        assert_eq!(
            out,
            b"event: message_start\ndata: {\"id\":\"gw\",\"type\":\"message_start\",\"message\":5}\n\nevent: x\ndata: {\"id\":\"gw\",\"delta\":7}\n\n"
        );
        assert_eq!(rw.state().chunks, 2);
    }

    #[test]
    fn nothing_after_stop_or_error() {
        let mut rw = MessagesStreamRewriter::new("gw");
        let out = run(&mut rw, b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n");
        assert!(out.is_empty());
        assert!(rw.state().error.is_some() && rw.usage().is_none());
    }

    proptest! {
        #[test]
        fn same_output_however_split(cuts in proptest::collection::vec(0..FIXTURE.len(), 0..10)) {
            let mut whole = MessagesStreamRewriter::new("gw");
            let mut expected = whole.feed(FIXTURE);
            expected.extend(whole.finish());
            let mut points = cuts.clone();
            points.sort_unstable();
            let mut rw = MessagesStreamRewriter::new("gw");
            let mut got = Vec::new();
            let mut last = 0;
            for p in points {
                got.extend(rw.feed(&FIXTURE[last..p]));
                last = p;
            }
            got.extend(rw.feed(&FIXTURE[last..]));
            got.extend(rw.finish());
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut rw = MessagesStreamRewriter::new("gw");
            run(&mut rw, &bytes);
            let _ = parse_messages_usage(&bytes);
        }
    }
}
