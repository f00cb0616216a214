//! Rewriting an upstream OpenAI chat-completions stream for the client, and reading what it says.
//!
//! Each JSON chunk gets the gateway's response id (the rest of its bytes untouched); `usage`, the
//! streamed text (for counting when no usage comes), the model and the finish reason are read on the
//! way; `[DONE]` and upstream error chunks are noticed. Chunks are read with typed views whose leaves
//! are lenient ([`Text`], [`Count`]): a field of an unexpected type is ignored, not fatal, and a
//! valid JSON object of an unexpected shape is still forwarded with the gateway's id.

use super::events::{is_json_ws, push_with_id};
use super::sse::{EventRef, EMPTY_STREAM_ERROR};
use super::{encode_id, StreamRewriter, StreamState, TokenUsage};
use crate::error::{CoreError, Result};
use crate::json::{member_is_set, starts_object, write_with_member, Count, Lenient, Text};
use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    total_tokens: Count,
    #[serde(default)]
    prompt_tokens_details: Lenient<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Lenient<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Count,
    /// Not OpenAI's (it reports none): the gateway's Bedrock translation writes it, as OpenRouter does.
    #[serde(default)]
    cache_write_tokens: Count,
    #[serde(default)]
    audio_tokens: Count,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Count,
    #[serde(default)]
    audio_tokens: Count,
}

impl From<UsageView> for TokenUsage {
    fn from(u: UsageView) -> Self {
        let prompt = u.prompt_tokens.0.unwrap_or(0);
        let completion = u.completion_tokens.0.unwrap_or(0);
        let details = u.prompt_tokens_details.as_ref();
        let output = u.completion_tokens_details.as_ref();
        TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: u.total_tokens.0.unwrap_or(prompt.saturating_add(completion)),
            cached_tokens: details.and_then(|d| d.cached_tokens.0).unwrap_or(0),
            cache_write_tokens: details.and_then(|d| d.cache_write_tokens.0).unwrap_or(0),
            reasoning_tokens: output.and_then(|d| d.reasoning_tokens.0).unwrap_or(0),
            audio_prompt_tokens: details.and_then(|d| d.audio_tokens.0).unwrap_or(0),
            audio_completion_tokens: output.and_then(|d| d.audio_tokens.0).unwrap_or(0),
            cache_write_1h_tokens: 0,
        }
    }
}

#[derive(Deserialize)]
struct ChunkView<'a> {
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    usage: Lenient<UsageView>,
    #[serde(default, borrow)]
    model: Text<'a>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default)]
    index: Count,
    #[serde(default, borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(default, borrow)]
    finish_reason: Text<'a>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default, borrow)]
    content: Text<'a>,
    #[serde(default, borrow)]
    reasoning_content: Text<'a>,
    #[serde(default, borrow)]
    reasoning: Text<'a>,
    #[serde(default, borrow)]
    refusal: Text<'a>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCallView<'a>>>,
    /// The deprecated single function call of the functions API.
    #[serde(default, borrow)]
    function_call: Option<FunctionView<'a>>,
    /// Spoken output (`modalities: ["audio"]`): its transcript is what was said.
    #[serde(default, borrow)]
    audio: Lenient<AudioView<'a>>,
}

#[derive(Deserialize)]
struct AudioView<'a> {
    #[serde(default, borrow)]
    transcript: Text<'a>,
    #[serde(default, borrow)]
    data: Text<'a>,
}

#[derive(Deserialize)]
struct ToolCallView<'a> {
    #[serde(default, borrow)]
    function: Option<FunctionView<'a>>,
}

#[derive(Deserialize)]
struct FunctionView<'a> {
    #[serde(default, borrow)]
    name: Text<'a>,
    #[serde(default, borrow)]
    arguments: Text<'a>,
}

fn expect_object(body: &[u8]) -> Result<()> {
    // serde would also read a struct from an array; a body that is not an object is malformed.
    if starts_object(body) {
        Ok(())
    } else {
        Err(CoreError::InvalidJson("expected a JSON object".into()))
    }
}

/// `usage` of a whole (non-streamed) chat completion body, which must be a JSON object.
pub fn parse_chat_usage(body: &[u8]) -> Result<Option<TokenUsage>> {
    expect_object(body)?;
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        usage: Lenient<UsageView>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|e| CoreError::InvalidJson(e.to_string()))?;
    Ok(parsed.usage.0.map(TokenUsage::from))
}

/// The JSON object `body` with its top-level "id" set to `new_id` (inserted first when absent), every
/// other byte untouched. The whole body is validated first.
pub fn set_json_id(body: &[u8], new_id: &str) -> Result<Vec<u8>> {
    expect_object(body)?;
    serde_json::from_slice::<IgnoredAny>(body).map_err(|e| CoreError::InvalidJson(e.to_string()))?;
    let mut out = Vec::new();
    write_with_member(body, "id", &encode_id(new_id), &mut out)?;
    Ok(out)
}

/// The `usage` shape of a whole answer, for [`stamp_answer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerShape {
    /// OpenAI's: chat completions, embeddings, moderations.
    Chat,
    /// Anthropic's Messages.
    Messages,
}

/// [`set_json_id`] and the answer's `usage` in one reading: parsing the usage validates the whole
/// body as [`set_json_id`] would (serde reads every member it skips), so the body is not read twice.
pub fn stamp_answer(body: &[u8], new_id: &str, shape: AnswerShape) -> Result<(Vec<u8>, Option<TokenUsage>)> {
    let usage = match shape {
        AnswerShape::Chat => parse_chat_usage(body)?,
        AnswerShape::Messages => super::messages::parse_messages_usage(body)?,
    };
    let mut out = Vec::new();
    write_with_member(body, "id", &encode_id(new_id), &mut out)?;
    Ok((out, usage))
}

pub struct ChatStreamRewriter {
    state: StreamState,
    forward_usage: bool,
    usage: Option<TokenUsage>,
    /// The choices (by index) under way: begun, their finish_reason not yet said. An upstream
    /// that ends once every choice has finished, without `data: [DONE]` (some OpenAI-compatible
    /// servers never send it), has ended its answer whole.
    unfinished: Vec<u64>,
}

impl ChatStreamRewriter {
    pub fn new(response_id: &str, forward_usage: bool) -> Self {
        Self { state: StreamState::new(response_id), forward_usage, usage: None, unfinished: Vec::new() }
    }

    /// The answer is whole (`[DONE]`, or the upstream's end after every choice finished).
    fn done(&mut self, out: &mut Vec<u8>) {
        if self.forward_usage && self.usage.is_none() {
            self.state.done = true; // awaits_usage
            return;
        }
        self.state.end(out);
    }

    /// The stream is done, but its `[DONE]` was held back: the client asked for usage
    /// (`forward_usage`) and the upstream sent none (one that takes no `stream_options`, or never
    /// counts). The caller ends the stream with the gateway's own usage chunk, then `[DONE]`.
    pub fn awaits_usage(&self) -> bool {
        // Done comes only from `done`, which holds `[DONE]` back on these three conditions.
        self.state.done && self.forward_usage && self.usage.is_none()
    }

    /// Takes what the chunk says; true when the chunk is to be withheld from the client.
    fn read(&mut self, view: ChunkView<'_>) -> bool {
        self.state.note_model(view.model);
        let has_usage = view.usage.0.is_some();
        if let Some(u) = view.usage.0 {
            self.usage = Some(u.into());
        }
        let mut no_choices = true;
        for choice in view.choices.into_iter().flatten() {
            no_choices = false;
            let index = choice.index.0.unwrap_or(0);
            if let Some(reason) = choice.finish_reason.0 {
                self.state.finish_reason = Some(reason.into_owned());
                self.unfinished.retain(|&i| i != index);
            } else if !self.unfinished.contains(&index) {
                self.unfinished.push(index);
            }
            if let Some(delta) = choice.delta {
                self.state.take_reasoning(&delta.reasoning_content);
                self.state.take_reasoning(&delta.reasoning);
                self.state.take_text(&delta.content);
                self.state.take_text(&delta.refusal);
                if let Some(audio) = delta.audio.as_ref() {
                    self.state.spoken = true;
                    self.state.take_text(&audio.transcript);
                    // Audio is output too: a stream that speaks before its transcript comes is
                    // not held back for it.
                    self.state.saw_output |= audio.data.non_empty().is_some();
                }
                let calls = delta.tool_calls.iter().flatten().filter_map(|c| c.function.as_ref());
                for f in calls.chain(delta.function_call.as_ref()) {
                    self.state.take_text(&f.name);
                    self.state.take_text(&f.arguments);
                }
            }
        }
        no_choices && has_usage && !self.forward_usage
    }
}

impl StreamRewriter for ChatStreamRewriter {
    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }

    fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    fn at_end(&mut self, out: &mut Vec<u8>) {
        if !self.state.is_over() && self.state.finish_reason.is_some() && self.unfinished.is_empty() {
            self.done(out);
        }
    }

    fn handle(&mut self, event: EventRef<'_>, out: &mut Vec<u8>) {
        if self.state.is_over() {
            return;
        }
        let data = event.data;
        if data.trim_matches(is_json_ws) == "[DONE]" {
            if self.state.chunks == 0 && self.usage.is_none() {
                // Review: passed on as an answer, it gave a client that asked for usage none.
                self.state.error = Some(EMPTY_STREAM_ERROR.to_vec());
                return;
            }
            self.done(out);
            return;
        }
        if !starts_object(data.as_bytes()) {
            self.state.malformed(data);
            return;
        }
        match serde_json::from_str::<ChunkView<'_>>(data) {
            Ok(view) => {
                if view.error.is_some() {
                    self.state.error = Some(data.as_bytes().to_vec());
                    return;
                }
                if self.read(view) {
                    return; // the usage chunk the gateway asked for on its own account
                }
            }
            // Valid JSON of a shape the views do not know: forwarded, but an error is still an error.
            Err(_) if serde_json::from_str::<IgnoredAny>(data).is_ok() => {
                if member_is_set(data.as_bytes(), "error") {
                    self.state.error = Some(data.as_bytes().to_vec());
                    return;
                }
            }
            Err(_) => {
                self.state.malformed(data);
                return;
            }
        }
        push_with_id(out, data.as_bytes(), self.state.encoded_id());
        self.state.chunks += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::stream::sse::parse_all;
    use proptest::prelude::*;

    const FIXTURE: &[u8] = include_bytes!("../../../../tests/fixtures/sse/openai_chat_stream.txt");

    fn events(bytes: &[u8]) -> Vec<String> {
        parse_all(&[bytes]).into_iter().map(|e| e.data).collect()
    }

    #[test]
    fn done_waits_for_usage_the_client_asked_for_and_none_came() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        let mut asked = ChatStreamRewriter::new("chatcmpl-gw", true);
        let out = asked.feed(body);
        assert_eq!(events(&out).len(), 1, "the content chunk, not [DONE]");
        assert!(asked.state().done && asked.awaits_usage());
        assert!(asked.feed(b"data: {\"choices\":[]}\n\n").is_empty(), "nothing after the end");

        let mut not_asked = ChatStreamRewriter::new("chatcmpl-gw", false);
        let out = not_asked.feed(body);
        assert_eq!(events(&out).last().map(String::as_str), Some("[DONE]"));
        assert!(not_asked.state().done && !not_asked.awaits_usage());

        let mut counted = ChatStreamRewriter::new("chatcmpl-gw", true);
        let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
        counted.feed(usage);
        let out = counted.feed(b"data: [DONE]\n\n");
        assert_eq!(out, b"data: [DONE]\n\n");
        assert!(!counted.awaits_usage());
    }

    #[test]
    fn done_without_a_single_chunk_is_no_answer() {
        for forward in [true, false] {
            let mut rw = ChatStreamRewriter::new("gw", forward);
            assert_eq!(rw.feed(b"data: [DONE]\n\n"), b"");
            assert_eq!(rw.state().error.as_deref(), Some(EMPTY_STREAM_ERROR));
            assert!(!rw.state().done);
        }
        // The usage chunk the gateway asked for on its own, alone: an answer of nothing, counted.
        let mut rw = ChatStreamRewriter::new("gw", false);
        rw.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":0}}\n\n");
        rw.feed(b"data: [DONE]\n\n");
        assert!(rw.state().done && rw.state().error.is_none());
    }

    #[test]
    fn an_end_without_done_after_every_choice_finished_is_whole() {
        // Some OpenAI-compatible servers end the stream after the finish (and usage) chunk.
        let answer: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n\
            data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let usage: &[u8] = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n";
        let mut rw = ChatStreamRewriter::new("chatcmpl-gw", true);
        rw.feed(&[answer, usage].concat());
        assert!(!rw.state().done);
        assert_eq!(rw.finish(), b"data: [DONE]\n\n");
        assert!(rw.state().done && !rw.awaits_usage());
        assert_eq!(rw.usage().map(|u| u.completion_tokens), Some(2));

        // Asked for usage, none came: done, the caller's usage chunk goes before [DONE].
        let mut asked = ChatStreamRewriter::new("chatcmpl-gw", true);
        asked.feed(answer);
        assert!(asked.finish().is_empty());
        assert!(asked.state().done && asked.awaits_usage());
    }

    #[test]
    fn an_end_before_every_choice_finished_is_not_whole() {
        let cut = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n\
            data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"ho\"}}]}\n\n\
            data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let mut two = ChatStreamRewriter::new("chatcmpl-gw", false);
        two.feed(cut);
        assert!(two.finish().is_empty());
        assert!(!two.state().done, "choice 1 never finished");

        let mut unfinished = ChatStreamRewriter::new("chatcmpl-gw", false);
        unfinished.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        assert!(unfinished.finish().is_empty());
        assert!(!unfinished.state().done);
    }

    #[test]
    fn sets_id_reads_usage_and_done() {
        let mut rw = ChatStreamRewriter::new("chatcmpl-gw", true);
        let mut out = rw.feed(FIXTURE);
        out.extend(rw.finish());
        let data = events(&out);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        for chunk in &data[..data.len() - 1] {
            let v: serde_json::Value = serde_json::from_str(chunk).unwrap();
            assert_eq!(v["id"], "chatcmpl-gw");
        }
        assert!(rw.state().done);
        assert_eq!(rw.state().chunks, 12);
        assert_eq!(rw.state().output_text, "Hello! How can I help you today?");
        assert_eq!(rw.usage().unwrap().completion_tokens, 9);
        assert_eq!(rw.usage().unwrap().total_tokens, 18);
        assert_eq!(rw.state().finish_reason.as_deref(), Some("stop"));
        assert_eq!(rw.state().model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    }

    #[test]
    fn keeps_usage_chunk_from_client_that_did_not_ask() {
        let mut rw = ChatStreamRewriter::new("x", false);
        let out = rw.feed(FIXTURE);
        let data = events(&out);
        assert_eq!(data.len(), 12); // 11 choice chunks + [DONE]; the usage chunk consumed
        assert!(!data.iter().any(|d| d.contains("prompt_tokens")));
        assert_eq!(rw.usage().unwrap().prompt_tokens, 9);
    }

    #[test]
    fn bytes_other_than_id_untouched() {
        let mut rw = ChatStreamRewriter::new("chatcmpl-upstream123", true);
        let out = rw.feed(FIXTURE);
        assert_eq!(out, FIXTURE);
    }

    #[test]
    fn error_chunk_is_kept_back_and_ends_the_stream() {
        let mut rw = ChatStreamRewriter::new("x", true);
        let out = rw.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\ndata: {\"choices\":[]}\n\n");
        assert_eq!(events(&out).len(), 1);
        assert_eq!(rw.state().error.as_deref(), Some(&b"{\"error\":{\"message\":\"boom\"}}"[..]));
        assert!(rw.state().saw_output);
    }

    #[test]
    fn null_error_is_not_an_error_and_reasoning_and_tools_count_as_output() {
        let mut rw = ChatStreamRewriter::new("x", true);
        rw.feed(b"data: {\"error\":null,\"choices\":[{\"delta\":{\"reasoning_content\":\"think\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n");
        assert!(rw.state().error.is_none());
        assert_eq!(rw.state().output_text, "thinkf{}");
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n");
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"reasoning\":\"mo\"}}]}\n\n");
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"re\"}}]}\n\n");
        let state = rw.state();
        assert_eq!(state.output_text, "thinkf{}okmore");
        // Reasoning within a mark of what was delivered, for its own price.
        assert_eq!(state.reasoning_upto(state.output_text.len()), "thinkmore");
        assert_eq!(state.reasoning_upto(state.output_text.len() - 1), "thinkmor");
        assert_eq!(state.reasoning_upto(10), "think");
        assert_eq!(state.reasoning_upto(3), "thi");
        assert_eq!(state.reasoning_upto(0), "");
    }

    #[test]
    fn spoken_output_counts_its_transcript() {
        let mut rw = ChatStreamRewriter::new("x", true);
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"audio\":{\"id\":\"audio_1\",\"transcript\":\"Hel\"}}}]}\n\n");
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"audio\":{\"data\":\"UklGRg==\"}}}]}\n\n");
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"audio\":{\"transcript\":\"lo\"}}}]}\n\n");
        assert_eq!(rw.state().output_text, "Hello");
        assert!(rw.state().saw_output);
        let mut data_first = ChatStreamRewriter::new("x", true);
        data_first.feed(b"data: {\"choices\":[{\"delta\":{\"audio\":{\"id\":\"a\",\"data\":\"UklGRg==\"}}}]}\n\n");
        assert!(data_first.state().saw_output && data_first.state().output_text.is_empty());
        assert!(data_first.state().spoken && !ChatStreamRewriter::new("y", true).state().spoken);
    }

    #[test]
    fn an_odd_usage_detail_is_ignored_not_fatal() {
        // Review: `"prompt_tokens_details": "x"` failed the whole usage, and the prompt went
        // unbilled (streams) or the answer was refused as malformed (plain).
        let odd = parse_chat_usage(
            br#"{"usage":{"prompt_tokens":50,"completion_tokens":7,"prompt_tokens_details":"x","completion_tokens_details":[1,{"a":2}]}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!((odd.prompt_tokens, odd.completion_tokens, odd.cached_tokens), (50, 7, 0));
        assert!(parse_chat_usage(br#"{"usage":"x"}"#).unwrap().is_none());
        let mut rw = ChatStreamRewriter::new("x", true);
        rw.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"completion_tokens_details\":0}}\n\n");
        assert_eq!(rw.usage().map(|u| u.prompt_tokens), Some(9));
    }

    #[test]
    fn data_that_is_not_a_json_object_breaks_the_stream() {
        for bad in ["hello", r#"{"choices":[{"delta":{"content":"bro"#, "[1]", "null"] {
            let mut rw = ChatStreamRewriter::new("x", true);
            let first = rw.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n");
            assert!(!first.is_empty());
            assert_eq!(rw.feed(format!("data: {bad}\n\n").as_bytes()), b"", "{bad}");
            assert_eq!(rw.state().error.as_deref(), Some(crate::stream::sse::MALFORMED_EVENT_ERROR), "{bad}");
            // Nothing after the break is the client's.
            assert_eq!(rw.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\" world\"}}]}\n\n"), b"");
            assert_eq!((rw.state().chunks, rw.state().output_text.as_str()), (1, "Hi"));
        }
        let mut rw = ChatStreamRewriter::new("x", true);
        assert_eq!(rw.feed(b"data: \n\ndata:  \n\n"), b""); // white space only: nothing
        assert!(rw.state().error.is_none());
    }

    #[test]
    fn whole_body_usage() {
        let u = parse_chat_usage(br#"{"id":"a","usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":1}}}"#).unwrap().unwrap();
        assert_eq!(
            u,
            TokenUsage {
                prompt_tokens: 3,
                completion_tokens: 4,
                total_tokens: 7,
                cached_tokens: 2,
                cache_write_tokens: 0,
                reasoning_tokens: 1,
                ..TokenUsage::default()
            }
        );
        let written = parse_chat_usage(
            br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":2,"cache_write_tokens":5}}}"#,
        );
        assert_eq!(written.unwrap().unwrap().cache_write_tokens, 5);
        let audio = parse_chat_usage(
            br#"{"usage":{"prompt_tokens":90,"completion_tokens":40,"prompt_tokens_details":{"audio_tokens":60},"completion_tokens_details":{"audio_tokens":30,"reasoning_tokens":"x"}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!((audio.audio_prompt_tokens, audio.audio_completion_tokens, audio.reasoning_tokens), (60, 30, 0));
        assert_eq!(parse_chat_usage(br#"{"usage":null}"#).unwrap(), None);
        assert!(parse_chat_usage(b"[]").is_err());
    }

    fn run(rw: &mut ChatStreamRewriter, input: &[u8]) -> Vec<u8> {
        let mut out = rw.feed(input);
        out.extend(rw.finish());
        out
    }

    #[test]
    fn non_objects_break_the_stream_and_odd_objects_still_get_the_id() {
        for bad in [&b"data: [1,2]\n\n"[..], b"data: \"s\"\n\n", b"data: {broken\n\n"] {
            let mut rw = ChatStreamRewriter::new("gw", true);
            assert_eq!(run(&mut rw, bad), b"");
            assert!(rw.state().error.is_some() && rw.state().chunks == 0);
        }
        let mut rw = ChatStreamRewriter::new("gw", true);
        let out = run(&mut rw, b"data: {\"id\":\"up\",\"choices\":{\"weird\":1}}\n\n");
        assert_eq!(out, b"data: {\"id\":\"gw\",\"choices\":{\"weird\":1}}\n\n");
        assert_eq!(rw.state().chunks, 1);
    }

    #[test]
    fn odd_shaped_error_is_still_kept_back() {
        let mut rw = ChatStreamRewriter::new("gw", true);
        assert_eq!(run(&mut rw, b"data: {\"error\":{\"message\":\"x\"},\"choices\":5}\n\ndata: {}\n\n"), b"");
        assert_eq!(rw.state().error.as_deref(), Some(&b"{\"error\":{\"message\":\"x\"},\"choices\":5}"[..]));
    }

    #[test]
    fn lenient_fields() {
        let mut rw = ChatStreamRewriter::new("gw", true);
        run(
            &mut rw,
            br#"data: {"model":7,"choices":[{"delta":{"content":[{"type":"text","text":"hi"}],"refusal":" no"},"finish_reason":5}],"usage":{"prompt_tokens":2.0,"completion_tokens":"x","prompt_tokens_details":null}}

"#,
        );
        assert_eq!(rw.state().chunks, 1);
        assert_eq!(rw.state().output_text, "hi no");
        assert_eq!(rw.state().model, None);
        assert_eq!(rw.state().finish_reason, None);
        let u = rw.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.total_tokens), (2, 0, 2));
    }

    #[test]
    fn legacy_function_call_and_escapes_in_text() {
        let mut rw = ChatStreamRewriter::new("gw", true);
        run(&mut rw, b"data: {\"choices\":[{\"delta\":{\"function_call\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\\\"\\u00e9\\\"}\"}}}]}\n\n");
        assert_eq!(rw.state().output_text, "f{\"a\":\"\u{e9}\"}");
    }

    #[test]
    fn multi_line_data_stays_one_event() {
        let mut rw = ChatStreamRewriter::new("gw", true);
        let out = run(&mut rw, b"data: {\"a\":\ndata: 1}\n\n");
        assert_eq!(out, b"data: {\"id\":\"gw\",\"a\":\ndata: 1}\n\n");
    }

    #[test]
    fn nothing_after_done_and_done_with_spaces() {
        let mut rw = ChatStreamRewriter::new("gw", false);
        let hi = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let out = run(&mut rw, &[&hi[..], b"data:  [DONE] \n\ndata: {\"choices\":[]}\n\n"].concat());
        assert!(out.ends_with(b"}\n\ndata: [DONE]\n\n"));
        assert!(rw.state().done);
        assert_eq!(rw.state().chunks, 1);
    }

    #[test]
    fn response_id_is_escaped() {
        let mut rw = ChatStreamRewriter::new("a\"b\\c", true);
        let out = run(&mut rw, b"data: {\"id\":\"x\"}\n\n");
        assert_eq!(out, b"data: {\"id\":\"a\\\"b\\\\c\"}\n\n");
    }

    #[test]
    fn set_json_id_validates_the_whole_body() {
        assert_eq!(
            set_json_id(b" {\"id\": 1, \"a\": [1, {\"id\": 2}]} ", "gw").unwrap(),
            b" {\"id\": \"gw\", \"a\": [1, {\"id\": 2}]} "
        );
        assert_eq!(set_json_id(b"{}", "gw").unwrap(), b"{\"id\":\"gw\"}");
        for bad in
            [&b"{\"a\":xyz}"[..], b"{\"a\":1} trailing", b"{\"a\":[1}}", b"[]", b"", b"{\"a\":\"\x01\"}", b"\xff"]
        {
            assert!(matches!(set_json_id(bad, "gw"), Err(CoreError::InvalidJson(_))), "{bad:?}");
        }
    }

    #[test]
    fn stamp_answer_is_set_json_id_and_the_usage() {
        let body = br#" {"id": "up", "usage": {"prompt_tokens": 3, "completion_tokens": 4}, "a": [{"id": 2}]} "#;
        let (out, usage) = stamp_answer(body, "gw", AnswerShape::Chat).unwrap();
        assert_eq!(out, set_json_id(body, "gw").unwrap());
        assert_eq!(usage, parse_chat_usage(body).unwrap());
        let message = br#"{"type":"message","usage":{"input_tokens":5,"output_tokens":6}}"#;
        let (out, usage) = stamp_answer(message, "msg", AnswerShape::Messages).unwrap();
        assert_eq!(out, set_json_id(message, "msg").unwrap());
        assert_eq!(usage, super::super::messages::parse_messages_usage(message).unwrap());
        assert_eq!(stamp_answer(b"{}", "gw", AnswerShape::Chat).unwrap(), (b"{\"id\":\"gw\"}".to_vec(), None));
        for bad in
            [&b"{\"a\":xyz}"[..], b"{\"a\":1} trailing", b"{\"a\":[1}}", b"[]", b"", b"{\"a\":\"\x01\"}", b"\xff"]
        {
            for shape in [AnswerShape::Chat, AnswerShape::Messages] {
                assert!(matches!(stamp_answer(bad, "gw", shape), Err(CoreError::InvalidJson(_))), "{bad:?}");
            }
        }
    }

    /// A stream of chat chunks, noise and comments with every kind of line end.
    fn synthetic_stream() -> impl Strategy<Value = Vec<u8>> {
        let event = prop_oneof![
            "[a-zé😀 \\\\\"]{0,8}".prop_map(|t| format!(
                "data: {{\"id\":\"u\",\"choices\":[{{\"delta\":{{\"content\":{}}}}}]}}",
                serde_json::to_string(&t).unwrap()
            )),
            Just("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}".to_owned()),
            Just(": keep-alive".to_owned()),
            Just("data: not json".to_owned()),
            Just("data: {\"a\":\ndata: [1]}".to_owned()),
            Just("data: [DONE]".to_owned()),
        ];
        let end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        proptest::collection::vec((event, end.clone(), end), 0..12).prop_map(|events| {
            events.into_iter().flat_map(|(e, a, b)| format!("{}{a}{b}", e.replace('\n', a)).into_bytes()).collect()
        })
    }

    proptest! {
        #[test]
        fn synthetic_streams_same_output_however_split(
            bytes in synthetic_stream(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
            forward in any::<bool>(),
        ) {
            let mut whole = ChatStreamRewriter::new("gw", forward);
            let expected = run(&mut whole, &bytes);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut rw = ChatStreamRewriter::new("gw", forward);
            let mut got = Vec::new();
            let mut last = 0;
            for p in points {
                got.extend(rw.feed(&bytes[last..p]));
                last = p;
            }
            got.extend(rw.feed(&bytes[last..]));
            got.extend(rw.finish());
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(&rw.state().output_text, &whole.state().output_text);
            prop_assert_eq!(rw.state().chunks, whole.state().chunks);
            // Every forwarded JSON chunk carries the gateway's id.
            for e in events(&got) {
                if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(&e) {
                    prop_assert_eq!(m.get("id").and_then(|v| v.as_str()), Some("gw"));
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut rw = ChatStreamRewriter::new("gw", false);
            run(&mut rw, &bytes);
            let _ = set_json_id(&bytes, "x");
            let _ = parse_chat_usage(&bytes);
        }

        #[test]
        fn stamp_answer_is_both_readings(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..200),
                "[ {}\\[\\]\":,0-9a-z\\\\]{0,60}".prop_map(|s| format!("{{{s}}}").into_bytes()),
                (any::<Option<u32>>(), "[a-z]{0,5}").prop_map(|(n, k)| format!(
                    r#"{{"{k}":1,"usage":{},"id":"u"}}"#,
                    n.map_or("null".to_string(), |n| format!(r#"{{"prompt_tokens":{n},"input_tokens":{n}}}"#))
                ).into_bytes()),
            ],
        ) {
            let id = set_json_id(&bytes, "gw");
            for (shape, usage) in [
                (AnswerShape::Chat, parse_chat_usage(&bytes)),
                (AnswerShape::Messages, super::super::messages::parse_messages_usage(&bytes)),
            ] {
                match (stamp_answer(&bytes, "gw", shape), &id, usage) {
                    (Ok((out, got)), Ok(expected), Ok(usage)) => {
                        prop_assert_eq!(&out, expected);
                        prop_assert_eq!(got, usage);
                    }
                    (Err(_), _, Err(_)) | (Err(_), Err(_), _) => {}
                    (stamped, _, usage) => prop_assert!(false, "{:?} {:?} {:?}", stamped, id, usage),
                }
            }
        }
    }

    proptest! {
        #[test]
        fn same_output_however_split(cuts in proptest::collection::vec(0..FIXTURE.len(), 0..10)) {
            let mut whole = ChatStreamRewriter::new("gw", false);
            let mut expected = whole.feed(FIXTURE);
            expected.extend(whole.finish());
            let mut points = cuts.clone();
            points.sort_unstable();
            let mut rw = ChatStreamRewriter::new("gw", false);
            let mut got = Vec::new();
            let mut last = 0;
            for p in points {
                got.extend(rw.feed(&FIXTURE[last..p]));
                last = p;
            }
            got.extend(rw.feed(&FIXTURE[last..]));
            got.extend(rw.finish());
            prop_assert_eq!(got, expected);
            prop_assert_eq!(&rw.state().output_text, &whole.state().output_text);
        }
    }

    #[test]
    fn an_oversized_event_ends_the_stream_as_an_error() {
        let mut rw = ChatStreamRewriter::new("gw", true);
        let piece = vec![b'x'; 1 << 20];
        rw.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"");
        for _ in 0..16 {
            assert!(rw.feed(&piece).is_empty());
        }
        assert_eq!(rw.state().error.as_deref(), Some(crate::stream::sse::OVERSIZED_EVENT_ERROR));
        assert!(!rw.state().done);
    }
}
