//! json.rs's in-place member rewrite (every streamed chunk gets the gateway's id through it) against
//! the same rewrite on serde_json's `RawValue`: the top-level members borrowed as raw values, the
//! object written back with the id replaced. The hand-written scanner stays only while it wins here.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gateway_core::json::{write_json_string, write_with_member};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::hint::black_box;

/// A key, borrowed from the input unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The top-level members of an object, in order, values as raw JSON.
struct Members<'a>(Vec<(Key<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(entry) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(MembersVisitor)
    }
}

/// What `write_with_member` does, on RawValue: every `key` member's value replaced by `encoded`,
/// or the member inserted first.
fn write_with_member_raw(body: &[u8], key: &str, encoded: &[u8], out: &mut Vec<u8>) -> serde_json::Result<()> {
    let members: Members<'_> = serde_json::from_slice(body)?;
    out.reserve(body.len() + encoded.len() + key.len() + 4);
    out.push(b'{');
    let has_key = members.0.iter().any(|(k, _)| k.0 == key);
    if !has_key {
        write_json_string(key, out);
        out.push(b':');
        out.extend_from_slice(encoded);
    }
    for (i, (k, v)) in members.0.iter().enumerate() {
        if i > 0 || !has_key {
            out.push(b',');
        }
        write_json_string(&k.0, out);
        out.push(b':');
        if k.0 == key {
            out.extend_from_slice(encoded);
        } else {
            out.extend_from_slice(v.get().as_bytes());
        }
    }
    out.push(b'}');
    Ok(())
}

fn chat_chunk() -> Vec<u8> {
    br#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_ee1d74bde0","choices":[{"index":0,"delta":{"content":" quick"},"logprobs":null,"finish_reason":null}],"usage":null}"#.to_vec()
}

/// A chunk whose one delta carries `kb` KiB of text with escapes (a long tool-call argument).
fn large_chunk(kb: usize) -> Vec<u8> {
    let text = "say \\\"hi\\\" \\u00e9\\n".repeat(kb * 1024 / 20);
    format!(
        r#"{{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}"#
    )
    .into_bytes()
}

fn messages_event() -> Vec<u8> {
    br#"{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#.to_vec()
}

fn bench_rewrite(c: &mut Criterion) {
    let encoded = br#""chatcmpl-gw0123456789abcdef""#;
    let inputs = [("chat_chunk", chat_chunk()), ("messages_no_id", messages_event()), ("large_16k", large_chunk(16))];
    let mut group = c.benchmark_group("set_id");
    for (name, body) in &inputs {
        // Both versions give the same JSON value.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_with_member(body, "id", encoded, &mut a).unwrap_or_default();
        write_with_member_raw(body, "id", encoded, &mut b).unwrap_or_default();
        let same = serde_json::from_slice::<serde_json::Value>(&a).ok() == serde_json::from_slice(&b).ok();
        assert!(same, "{name}: the two rewrites disagree");

        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("scanner", name), body, |bench, body| {
            let mut out = Vec::with_capacity(body.len() + 64);
            bench.iter(|| {
                out.clear();
                write_with_member(black_box(body), "id", encoded, &mut out).unwrap_or_default();
                black_box(out.len())
            });
        });
        group.bench_with_input(BenchmarkId::new("raw_value", name), body, |bench, body| {
            let mut out = Vec::with_capacity(body.len() + 64);
            bench.iter(|| {
                out.clear();
                write_with_member_raw(black_box(body), "id", encoded, &mut out).unwrap_or_default();
                black_box(out.len())
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_rewrite);
criterion_main!(benches);
