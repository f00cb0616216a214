//! The stream rewriters on 200-delta streams of each shape, fed one network read per event as an
//! upstream sends them, and on the recorded upstream streams of tests/fixtures/sse, split into reads
//! of 64 bytes (events cut anywhere). Throughput is in events per second.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gateway_core::stream::chat::ChatStreamRewriter;
use gateway_core::stream::messages::MessagesStreamRewriter;
use gateway_core::stream::responses::ResponsesStreamRewriter;
use gateway_core::stream::StreamRewriter;
use std::hint::black_box;

const DELTAS: usize = 200;
const WORDS: [&str; 8] = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy"];

fn chat_stream() -> Vec<Vec<u8>> {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_ee1d74bde0\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"
        )
        .into_bytes()
    };
    let mut events = vec![chunk(r#"{"role":"assistant","content":"","refusal":null}"#, "null")];
    for i in 0..DELTAS {
        events.push(chunk(&format!(r#"{{"content":" {}"}}"#, WORDS[i % WORDS.len()]), "null"));
    }
    events.push(chunk("{}", r#""stop""#));
    events.push(
        br#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":200,"total_tokens":219,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}

"#
        .to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

fn messages_stream() -> Vec<Vec<u8>> {
    let event = |name: &str, data: &str| format!("event: {name}\ndata: {data}\n\n").into_bytes();
    let mut events = vec![
        event(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        event("ping", r#"{"type":"ping"}"#),
    ];
    for i in 0..DELTAS {
        let word = WORDS[i % WORDS.len()];
        let data =
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":" {word}"}}}}"#);
        events.push(event("content_block_delta", &data));
    }
    events.push(event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#));
    events.push(event(
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":200}}"#,
    ));
    events.push(event("message_stop", r#"{"type":"message_stop"}"#));
    events
}

fn responses_stream() -> Vec<Vec<u8>> {
    let event = |name: &str, data: String| format!("event: {name}\ndata: {data}\n\n").into_bytes();
    let response = |status: &str, usage: &str| {
        format!(
            r#"{{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec","object":"response","created_at":1741290958,"status":"{status}","model":"gpt-4.1-2025-04-14","output":[],"previous_response_id":null,"usage":{usage}}}"#
        )
    };
    let mut events = vec![event(
        "response.created",
        format!(r#"{{"type":"response.created","sequence_number":0,"response":{}}}"#, response("in_progress", "null")),
    )];
    for i in 0..DELTAS {
        let word = WORDS[i % WORDS.len()];
        let data = format!(
            r#"{{"type":"response.output_text.delta","sequence_number":{},"item_id":"msg_67c9fdcecf488190","output_index":0,"content_index":0,"delta":" {word}","logprobs":[]}}"#,
            i + 1
        );
        events.push(event("response.output_text.delta", data));
    }
    let usage = r#"{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":200,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":236}"#;
    events.push(event(
        "response.completed",
        format!(
            r#"{{"type":"response.completed","sequence_number":{},"response":{}}}"#,
            DELTAS + 1,
            response("completed", usage)
        ),
    ));
    events
}

/// The whole stream through a fresh rewriter, one read at a time; the bytes for the client.
fn rewrite(mut rewriter: impl StreamRewriter, reads: &[Vec<u8>]) -> usize {
    let mut sent = 0;
    for read in reads {
        sent += rewriter.feed(black_box(read)).len();
    }
    sent + rewriter.finish().len()
}

fn in_reads(bytes: &[u8], size: usize) -> Vec<Vec<u8>> {
    bytes.chunks(size).map(<[u8]>::to_vec).collect()
}

fn count_events(reads: &[Vec<u8>]) -> u64 {
    let all: Vec<u8> = reads.concat();
    all.windows(2).filter(|w| w == b"\n\n").count() as u64
}

/// A stream as the network reads of it.
type Reads = Vec<Vec<u8>>;

fn bench_rewriters(c: &mut Criterion) {
    let shapes: [(&str, Reads, Reads); 3] = [
        ("chat", chat_stream(), in_reads(include_bytes!("../../../tests/fixtures/sse/openai_chat_stream.txt"), 64)),
        (
            "messages",
            messages_stream(),
            in_reads(include_bytes!("../../../tests/fixtures/sse/anthropic_messages_stream.txt"), 64),
        ),
        (
            "responses",
            responses_stream(),
            in_reads(include_bytes!("../../../tests/fixtures/sse/openai_responses_stream.txt"), 64),
        ),
    ];
    let mut group = c.benchmark_group("rewrite");
    for (shape, synthetic, recorded) in &shapes {
        for (input, reads) in [("200_deltas", synthetic), ("recorded", recorded)] {
            group.throughput(Throughput::Elements(count_events(reads)));
            group.bench_with_input(BenchmarkId::new(*shape, input), reads, |b, reads| {
                b.iter(|| match *shape {
                    "chat" => rewrite(ChatStreamRewriter::new("chatcmpl-gw0123456789", true), reads),
                    "messages" => rewrite(MessagesStreamRewriter::new("msg_gw0123456789"), reads),
                    _ => rewrite(ResponsesStreamRewriter::new("resp_gw0123456789", None), reads),
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_rewriters);
criterion_main!(benches);
