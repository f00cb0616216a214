//! Rewriting an upstream stream for the client, one module per shape, and reading what it says.
//!
//! Each shape's rewriter ([`chat`], [`messages`], [`responses`]) holds a [`StreamState`]: the SSE
//! parser feeding it, the gateway's response id, and what every shape learns on the way (chunks
//! forwarded, streamed text, model, finish reason, end, upstream error). [`StreamRewriter`] gives
//! them one face: a rewriter says how it handles one event and where its usage is; feeding chunks,
//! finishing and the overflow rule are written once here. The event writers shared by the shapes
//! are in [`events`].

pub mod chat;
pub mod events;
pub mod eventstream;
pub mod messages;
pub mod responses;
pub mod sse;

use crate::json::{write_json_string, Text};
use sse::{EventRef, SseParser, MALFORMED_EVENT_ERROR, OVERSIZED_EVENT_ERROR};

/// Token counts as the gateway bills them, whatever the shape called them upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Of the prompt, cached: read from the provider's cache (`cached_tokens`), and written to it
    /// (`cache_write_tokens`: Anthropic's cache_creation_input_tokens, Bedrock's cacheWriteInputTokens),
    /// which providers price apart from fresh input.
    pub cached_tokens: u64,
    pub cache_write_tokens: u64,
    pub reasoning_tokens: u64,
    /// Kinds some models price apart, each a part of the count above it: the prompt's and the
    /// output's audio (`prompt_tokens_details.audio_tokens`, `completion_tokens_details.audio_tokens`),
    /// and of the cache writes those kept for an hour (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`).
    pub audio_prompt_tokens: u64,
    pub audio_completion_tokens: u64,
    pub cache_write_1h_tokens: u64,
}

/// What a rewriter knows of its stream, the same for every shape.
pub struct StreamState {
    parser: SseParser,
    /// The response id as a JSON string literal, encoded once.
    encoded_id: Vec<u8>,
    /// The stream ended as the shape ends it (`[DONE]`, `message_stop`, `response.completed` ...).
    pub done: bool,
    /// Events forwarded to the client with the gateway's id.
    pub chunks: u64,
    pub saw_output: bool,
    /// Every piece of generated text (answer, reasoning, tool arguments), for counting when the
    /// upstream reports no usage.
    pub output_text: String,
    /// Where reasoning lies in `output_text` (byte ranges, adjacent ones merged: usually one),
    /// so that reasoning delivered is billed at its own price (`reasoning_upto`).
    reasoning_spans: Vec<(usize, usize)>,
    pub model: Option<String>,
    pub finish_reason: Option<String>,
    /// The upstream's error event, raw, kept back from the client; the stream is over after it.
    pub error: Option<Vec<u8>>,
    /// The answer is spoken (chat's `delta.audio`): its text is the transcript of audio, which the
    /// upstream counts as audio tokens only in its final usage.
    pub spoken: bool,
}

impl StreamState {
    pub fn new(response_id: &str) -> Self {
        Self {
            parser: SseParser::new(),
            encoded_id: encode_id(response_id),
            done: false,
            chunks: 0,
            saw_output: false,
            output_text: String::new(),
            reasoning_spans: Vec::new(),
            model: None,
            finish_reason: None,
            error: None,
            spoken: false,
        }
    }

    pub fn encoded_id(&self) -> &[u8] {
        &self.encoded_id
    }

    /// Done or failed: anything the upstream sends after is not the client's.
    pub fn is_over(&self) -> bool {
        self.done || self.error.is_some()
    }

    /// An event whose data is not a JSON object: the stream is broken there (review: forwarded as
    /// it came, it broke the clients' parsers with a JSONDecodeError, not the shape's error event).
    /// Data of only white space is nothing, not a break.
    pub(crate) fn malformed(&mut self, data: &str) {
        if !data.trim_matches(events::is_json_ws).is_empty() {
            self.error.get_or_insert_with(|| MALFORMED_EVENT_ERROR.to_vec());
        }
    }

    /// The stream ended as its shape ends it; the client gets the gateway's `[DONE]` after it.
    fn end(&mut self, out: &mut Vec<u8>) {
        self.done = true;
        out.extend_from_slice(b"data: [DONE]\n\n");
    }

    /// The model as the first event that names it says.
    fn note_model(&mut self, model: Text<'_>) {
        if self.model.is_none() {
            self.model = model.into_owned();
        }
    }

    fn take_text(&mut self, text: &Text<'_>) {
        if let Some(t) = text.non_empty() {
            self.saw_output = true;
            self.output_text.push_str(t);
        }
    }

    /// Reasoning text: output, and noted as reasoning.
    fn take_reasoning(&mut self, text: &Text<'_>) {
        let start = self.output_text.len();
        self.take_text(text);
        let end = self.output_text.len();
        if end == start {
            return;
        }
        match self.reasoning_spans.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => self.reasoning_spans.push((start, end)),
        }
    }

    /// The reasoning within the first `mark` bytes of `output_text` (a mark of its length).
    pub fn reasoning_upto(&self, mark: usize) -> String {
        let mut out = String::new();
        for &(start, end) in &self.reasoning_spans {
            if start >= mark {
                break;
            }
            // Spans and marks fall on the boundaries of whole pieces of text, so on characters.
            out.push_str(self.output_text.get(start..end.min(mark)).unwrap_or_default());
        }
        out
    }
}

/// An id (or any string) as a JSON string literal.
fn encode_id(id: &str) -> Vec<u8> {
    let mut encoded = Vec::with_capacity(id.len() + 2);
    write_json_string(id, &mut encoded);
    encoded
}

/// A shape's stream rewriter: it turns each parsed event into bytes for the client.
pub trait StreamRewriter {
    fn state(&self) -> &StreamState;
    fn state_mut(&mut self) -> &mut StreamState;
    /// One event: bytes for the client into `out`, what it says into the state.
    fn handle(&mut self, event: EventRef<'_>, out: &mut Vec<u8>);
    /// The usage the upstream reported, if any, as the gateway counts it.
    fn usage(&self) -> Option<TokenUsage>;

    /// Bytes for the client for every event this chunk completes.
    fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        // The parser is taken out for the call so that `handle` may borrow the rest of self.
        let mut parser = std::mem::take(&mut self.state_mut().parser);
        parser.feed_each(chunk, |e| self.handle(e, &mut out));
        let overflowed = parser.overflowed();
        let state = self.state_mut();
        state.parser = parser;
        if overflowed {
            // An event too large to hold ends the stream, as an upstream error event does.
            state.error.get_or_insert_with(|| OVERSIZED_EVENT_ERROR.to_vec());
        }
        out
    }

    /// The upstream ended (its last event handled): what the shape makes of an end without its
    /// closing event.
    fn at_end(&mut self, _out: &mut Vec<u8>) {}

    /// End of upstream input.
    fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut parser = std::mem::take(&mut self.state_mut().parser);
        parser.finish_each(|e| self.handle(e, &mut out));
        self.state_mut().parser = parser;
        self.at_end(&mut out);
        out
    }
}
