//! Rewriting an upstream OpenAI Responses API answer (a whole body or a stream) for the client.
//!
//! The client sees the gateway's ids: every stream event gets a top-level `id` (spec 6.1.6), and the
//! `response` object that lifecycle events carry gets it as `response.id`; a `previous_response_id`
//! the upstream echoes becomes the gateway id the client sent. The upstream's own response id is kept
//! (`upstream_id`) because the next turn must name it to the channel that holds the state. Usage comes
//! from `response.usage`; `*.delta` text (answer, reasoning, tool arguments) is collected for counting
//! when no usage comes. `response.completed` / `response.incomplete` end the stream, followed by
//! `data: [DONE]` (spec 6.1.3; the client library stops there). An `error` event or
//! `response.failed` is kept back: its raw JSON lands in `error`.

use super::events::{push_name, push_with_id, read_named_event};
use super::sse::EventRef;
use super::{encode_id, StreamRewriter, StreamState, TokenUsage};
use crate::error::{CoreError, Result};
use crate::json::{for_each_member, key_is, member_is_set, starts_object, write_with_member};
use crate::json::{Count, Lenient, Text};
use serde::Deserialize;

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    input_tokens_details: Lenient<InputDetails>,
    #[serde(default)]
    output_tokens_details: Lenient<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Count,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Count,
}

impl From<UsageView> for TokenUsage {
    fn from(u: UsageView) -> Self {
        let prompt = u.input_tokens.0.unwrap_or(0);
        let completion = u.output_tokens.0.unwrap_or(0);
        TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt.saturating_add(completion),
            cached_tokens: u.input_tokens_details.0.and_then(|d| d.cached_tokens.0).unwrap_or(0),
            cache_write_tokens: 0, // OpenAI reports none
            reasoning_tokens: u.output_tokens_details.0.and_then(|d| d.reasoning_tokens.0).unwrap_or(0),
            ..TokenUsage::default()
        }
    }
}

#[derive(Deserialize)]
struct ResponseView<'a> {
    #[serde(default, borrow)]
    id: Text<'a>,
    #[serde(default, borrow)]
    model: Text<'a>,
    #[serde(default, borrow)]
    status: Text<'a>,
    #[serde(default)]
    usage: Lenient<UsageView>,
}

#[derive(Deserialize)]
struct ItemView<'a> {
    #[serde(default, borrow)]
    id: Text<'a>,
}

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(default, borrow)]
    response: Option<ResponseView<'a>>,
    #[serde(default, borrow)]
    delta: Text<'a>,
    /// `response.output_item.added` / `.done`: the output item, whose id a later turn may name.
    #[serde(default, borrow)]
    item: Lenient<ItemView<'a>>,
}

/// A whole (non-streamed) response with the gateway's id, and what the client must not see.
pub struct RewrittenResponse {
    pub body: Vec<u8>,
    /// The upstream's own id for this response (None when it sent none).
    pub upstream_id: Option<String>,
    pub usage: Option<TokenUsage>,
}

/// `body` (a Responses API object) with `id` set to `new_id` and, when it echoes a previous response
/// id, that set to `previous_id`. The whole body is validated.
pub fn rewrite_response(body: &[u8], new_id: &str, previous_id: Option<&str>) -> Result<RewrittenResponse> {
    if !starts_object(body) {
        return Err(CoreError::InvalidJson("expected a JSON object".into()));
    }
    let view: ResponseView<'_> = serde_json::from_slice(body).map_err(|e| CoreError::InvalidJson(e.to_string()))?;
    let upstream_id = view.id.into_owned();
    let usage = view.usage.0.map(TokenUsage::from);
    let mut out = Vec::with_capacity(body.len() + new_id.len() + 8);
    write_ids(body, &encode_id(new_id), previous_id.map(encode_id).as_deref(), &mut out)?;
    Ok(RewrittenResponse { body: out, upstream_id, usage })
}

/// Appends the response object `body` with its id (and a set previous_response_id) replaced.
fn write_ids(body: &[u8], encoded_id: &[u8], encoded_previous: Option<&[u8]>, out: &mut Vec<u8>) -> Result<()> {
    match encoded_previous {
        Some(previous) if member_is_set(body, "previous_response_id") => {
            let mut with_previous = Vec::with_capacity(body.len() + previous.len());
            write_with_member(body, "previous_response_id", previous, &mut with_previous)?;
            write_with_member(&with_previous, "id", encoded_id, out)
        }
        _ => write_with_member(body, "id", encoded_id, out),
    }
}

/// What an event's `delta` is: output (answer text, tool arguments), reasoning (its summary or
/// text, `response.reasoning_*.delta`), or nothing billed (audio, or no delta).
#[derive(Clone, Copy)]
enum Delta {
    Output,
    Reasoning,
    None,
}

pub struct ResponsesStreamRewriter {
    state: StreamState,
    encoded_previous: Option<Vec<u8>>,
    usage: Option<TokenUsage>,
    /// The upstream's own response id, which the next turn must name to the channel holding it.
    upstream_id: Option<String>,
    /// The ids of the response's output items, in order (an `item_reference` of a later turn names
    /// them: the gateway records whose they are).
    item_ids: Vec<String>,
}

impl ResponsesStreamRewriter {
    /// The state's finish reason is the response's last status (completed, incomplete ...).
    pub fn new(response_id: &str, previous_id: Option<&str>) -> Self {
        Self {
            state: StreamState::new(response_id),
            encoded_previous: previous_id.map(encode_id),
            usage: None,
            upstream_id: None,
            item_ids: Vec::new(),
        }
    }

    pub fn upstream_id(&self) -> Option<String> {
        self.upstream_id.clone()
    }

    pub fn item_ids(&self) -> Vec<String> {
        self.item_ids.clone()
    }

    fn read(&mut self, view: EventView<'_>, delta: Delta) {
        if let Some(id) = view.item.0.and_then(|item| item.id.into_owned()) {
            if !self.item_ids.contains(&id) {
                self.item_ids.push(id);
            }
        }
        if let Some(response) = view.response {
            if self.upstream_id.is_none() {
                self.upstream_id = response.id.into_owned();
            }
            self.state.note_model(response.model);
            if let Some(status) = response.status.into_owned() {
                self.state.finish_reason = Some(status);
            }
            if let Some(u) = response.usage.0 {
                self.usage = Some(u.into());
            }
        }
        match delta {
            Delta::Output => self.state.take_text(&view.delta),
            Delta::Reasoning => self.state.take_reasoning(&view.delta),
            Delta::None => {}
        }
    }

    /// An event carrying the `response` object: the gateway's ids set inside it and at the top level.
    fn push_lifecycle(&self, out: &mut Vec<u8>, data: &[u8]) {
        let mut span = None;
        let _ = for_each_member(data, |k, s| {
            if key_is(k, "response") {
                span = Some(s);
            }
        });
        let encoded_id = self.state.encoded_id();
        let mut nested = Vec::with_capacity(data.len() + 2 * encoded_id.len());
        let rewritten = span.is_some_and(|s| {
            let (Some(before), Some(inner), Some(after)) =
                (data.get(..s.start), data.get(s.clone()), data.get(s.end..))
            else {
                return false;
            };
            nested.extend_from_slice(before);
            let ok = inner.first() == Some(&b'{')
                && write_ids(inner, encoded_id, self.encoded_previous.as_deref(), &mut nested).is_ok();
            nested.extend_from_slice(after);
            ok
        });
        push_with_id(out, if rewritten { &nested } else { data }, encoded_id);
    }
}

impl StreamRewriter for ResponsesStreamRewriter {
    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
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
        let name = kind.or(event.event).unwrap_or("");
        if name == "error" || name == "response.failed" {
            self.state.error = Some(data.as_bytes().to_vec());
            return;
        }
        let ends = name == "response.completed" || name == "response.incomplete";
        // Audio deltas are base64 bytes, not text; every other delta is model output.
        let delta = if !name.ends_with(".delta") || name.contains("audio") {
            Delta::None
        } else if name.starts_with("response.reasoning") {
            Delta::Reasoning
        } else {
            Delta::Output
        };
        let mut has_response = false;
        if let Some(v) = view {
            has_response = v.response.is_some();
            self.read(v, delta);
        }
        push_name(out, event.event);
        if has_response {
            self.push_lifecycle(out, data.as_bytes());
        } else {
            push_with_id(out, data.as_bytes(), self.state.encoded_id());
        }
        self.state.chunks += 1;
        if ends {
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

    const FIXTURE: &[u8] = include_bytes!("../../../../tests/fixtures/sse/openai_responses_stream.txt");
    const UPSTREAM_ID: &str = "resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654";

    fn parse(bytes: &[u8]) -> Vec<Event> {
        parse_all(&[bytes])
    }

    fn run(rw: &mut ResponsesStreamRewriter, input: &[u8]) -> Vec<u8> {
        let mut out = rw.feed(input);
        out.extend(rw.finish());
        out
    }

    #[test]
    fn ids_set_everywhere_usage_read_done_added() {
        let mut rw = ResponsesStreamRewriter::new("resp_gw", Some("resp_prev_gw"));
        let out = run(&mut rw, FIXTURE);
        let events = parse(&out);
        assert_eq!(events.first().unwrap().event.as_deref(), Some("response.created"));
        assert_eq!(events[events.len() - 2].event.as_deref(), Some("response.completed"));
        assert_eq!(events.last().unwrap().data, "[DONE]");
        for e in &events[..events.len() - 1] {
            let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
            assert_eq!(v["id"], "resp_gw");
            if let Some(response) = v.get("response") {
                assert_eq!(response["id"], "resp_gw");
                assert_eq!(response["previous_response_id"], "resp_prev_gw");
            }
        }
        assert_eq!(rw.upstream_id().as_deref(), Some(UPSTREAM_ID));
        // Its output item, named in .added and .done: once.
        assert_eq!(rw.item_ids(), vec!["msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654".to_string()]);
        let u = rw.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.reasoning_tokens), (37, 5, 11, 2));
        assert_eq!(rw.state().output_text, "Hi there!");
        assert_eq!(rw.state().finish_reason.as_deref(), Some("completed"));
        assert_eq!(rw.state().model.as_deref(), Some("gpt-4.1-2025-04-14"));
        assert!(rw.state().done && rw.state().saw_output);
        assert!(!String::from_utf8(out).unwrap().contains(UPSTREAM_ID));
    }

    #[test]
    fn only_ids_change() {
        let mut rw = ResponsesStreamRewriter::new("resp_gw", None);
        let out = run(&mut rw, FIXTURE);
        let expected = String::from_utf8(FIXTURE.to_vec())
            .unwrap()
            .replace(&format!("\"{UPSTREAM_ID}\""), "\"resp_gw\"")
            .replace("data: {\"type\"", "data: {\"id\":\"resp_gw\",\"type\"")
            + "data: [DONE]\n\n";
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn error_and_failed_are_kept_back() {
        for event in [
            "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\",\"param\":null}\n\n",
            "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\"}}\n\n",
        ] {
            let mut rw = ResponsesStreamRewriter::new("gw", None);
            let delta = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n";
            let out = run(&mut rw, format!("{delta}{event}event: response.completed\ndata: {{}}\n\n").as_bytes());
            assert_eq!(parse(&out).len(), 1);
            assert!(rw.state().error.is_some() && !rw.state().done && rw.state().saw_output);
        }
    }

    #[test]
    fn reasoning_and_tool_arguments_are_output_audio_is_not() {
        let mut rw = ResponsesStreamRewriter::new("gw", None);
        run(
            &mut rw,
            b"data: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"think \"}\n\n\
data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\\\"a\\\":1}\"}\n\n\
data: {\"type\":\"response.audio.delta\",\"delta\":\"AAAA\"}\n\n\
data: {\"type\":\"response.incomplete\",\"response\":{\"id\":\"up\",\"status\":\"incomplete\",\"previous_response_id\":null}}\n\n",
        );
        assert_eq!(rw.state().output_text, "think {\"a\":1}");
        assert_eq!(rw.state().reasoning_upto(usize::MAX), "think ");
        assert_eq!(rw.state().finish_reason.as_deref(), Some("incomplete"));
        assert!(rw.state().done && rw.usage().is_none());
    }

    #[test]
    fn null_previous_id_is_left_null() {
        let mut rw = ResponsesStreamRewriter::new("gw", Some("prev"));
        let out = run(
            &mut rw,
            b"data: {\"type\":\"response.created\",\"response\":{\"id\":\"up\",\"previous_response_id\":null}}\n\n",
        );
        assert_eq!(out, b"data: {\"id\":\"gw\",\"type\":\"response.created\",\"response\":{\"id\":\"gw\",\"previous_response_id\":null}}\n\n");
    }

    #[test]
    fn whole_response_rewritten() {
        let body = br#"{"id":"resp_up","object":"response","previous_response_id":"resp_prev_up","output":[],"usage":{"input_tokens":3,"output_tokens":4,"output_tokens_details":{"reasoning_tokens":1}}}"#;
        let r = rewrite_response(body, "resp_gw", Some("resp_prev_gw")).unwrap();
        assert_eq!(
            String::from_utf8(r.body).unwrap(),
            r#"{"id":"resp_gw","object":"response","previous_response_id":"resp_prev_gw","output":[],"usage":{"input_tokens":3,"output_tokens":4,"output_tokens_details":{"reasoning_tokens":1}}}"#
        );
        assert_eq!(r.upstream_id.as_deref(), Some("resp_up"));
        let u = r.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.total_tokens), (3, 4, 1, 7));
        assert!(rewrite_response(b"[]", "x", None).is_err());
        assert!(rewrite_response(b"{\"id\":1,}", "x", None).is_err());
        let odd = rewrite_response(br#"{"id":7,"usage":null}"#, "x", None).unwrap();
        assert!(odd.upstream_id.is_none() && odd.usage.is_none());
    }

    proptest! {
        #[test]
        fn same_output_however_split(cuts in proptest::collection::vec(0..FIXTURE.len(), 0..10)) {
            let mut whole = ResponsesStreamRewriter::new("gw", Some("p"));
            let expected = run(&mut whole, FIXTURE);
            let mut points = cuts.clone();
            points.sort_unstable();
            let mut rw = ResponsesStreamRewriter::new("gw", Some("p"));
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
            let mut rw = ResponsesStreamRewriter::new("gw", Some("p"));
            run(&mut rw, &bytes);
            let _ = rewrite_response(&bytes, "gw", Some("p"));
        }
    }
}
