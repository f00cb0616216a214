//! Just enough JSON to edit one top-level member of an object in place, and lenient leaf types for
//! reading upstream chunks.
//!
//! Streams carry hundreds of chunks; re-serialising each to change its `id` would cost more than the
//! rest of the proxying. The scanner walks the top level of an object, skipping nested values and
//! strings (escapes included) without building anything, and reports the byte span of each value.
//! It checks the structure it walks (brackets matched, members well formed, nothing after the
//! object) but not the spelling of scalars: callers that need full validation parse with serde first.

use crate::error::{CoreError, Result};
use memchr::memchr2;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

fn invalid(what: &str, at: usize) -> CoreError {
    CoreError::InvalidJson(format!("{what} at byte {at}"))
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(c) = b.get(i) {
        if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// True when the first byte that is not JSON whitespace opens an object.
pub fn starts_object(b: &[u8]) -> bool {
    b.get(skip_ws(b, 0)) == Some(&b'{')
}

/// `i` is at an opening quote; returns the index just past the closing quote.
fn skip_string(b: &[u8], i: usize) -> Result<usize> {
    let mut j = i + 1;
    loop {
        let rest = b.get(j..).ok_or_else(|| invalid("unterminated string", i))?;
        let Some(k) = memchr2(b'"', b'\\', rest) else {
            return Err(invalid("unterminated string", i));
        };
        let at = j + k;
        if b.get(at) == Some(&b'"') {
            return Ok(at + 1);
        }
        j = at + 2; // a backslash and the character it escapes
    }
}

/// Nesting deeper than this is refused (serde_json refuses past 128 as well).
const MAX_DEPTH: usize = 512;

/// `i` is at the first byte of a value; returns the index just past it.
fn skip_value(b: &[u8], i: usize) -> Result<usize> {
    match b.get(i) {
        None => Err(invalid("missing value", i)),
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            // Closers must match their openers: one bit per open level (1 for an object).
            let mut open = [0u64; MAX_DEPTH / 64];
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => {
                        let word = open.get_mut(depth / 64).ok_or_else(|| invalid("nesting too deep", j))?;
                        let bit = 1u64 << (depth % 64);
                        if c == b'{' {
                            *word |= bit;
                        } else {
                            *word &= !bit;
                        }
                        depth += 1;
                    }
                    b'}' | b']' => {
                        let Some(d) = depth.checked_sub(1) else {
                            return Err(invalid("mismatched bracket", j));
                        };
                        let is_object = open.get(d / 64).is_some_and(|w| w & (1u64 << (d % 64)) != 0);
                        if is_object != (c == b'}') {
                            return Err(invalid("mismatched bracket", j));
                        }
                        depth = d;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err(invalid("unterminated object or array", i))
        }
        Some(_) => {
            let mut j = i;
            while let Some(c) = b.get(j) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                j += 1;
            }
            if j == i {
                Err(invalid("unexpected character", i))
            } else {
                Ok(j)
            }
        }
    }
}

/// Calls `each(raw_key, value_span)` for every top-level member of the object in `b`, where
/// `raw_key` is the key's bytes between its quotes (escapes undecoded). Returns the index just past
/// the opening brace and the number of members.
pub fn for_each_member<'a>(b: &'a [u8], mut each: impl FnMut(&'a [u8], Range<usize>)) -> Result<(usize, usize)> {
    let start = skip_ws(b, 0);
    if b.get(start) != Some(&b'{') {
        return Err(invalid("expected a JSON object", start));
    }
    let open = start + 1;
    let mut count = 0;
    let mut i = skip_ws(b, open);
    if b.get(i) == Some(&b'}') {
        return end_of_object(b, i + 1).map(|()| (open, 0));
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return Err(invalid("expected a key", i));
        }
        let key_end = skip_string(b, i)?;
        let key = b.get(i + 1..key_end - 1).unwrap_or_default();
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(invalid("expected ':'", i));
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = skip_value(b, value_start)?;
        each(key, value_start..value_end);
        count += 1;
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return end_of_object(b, i + 1).map(|()| (open, count)),
            _ => return Err(invalid("expected ',' or '}'", i)),
        }
    }
}

fn end_of_object(b: &[u8], i: usize) -> Result<()> {
    let end = skip_ws(b, i);
    if end == b.len() {
        Ok(())
    } else {
        Err(invalid("unexpected bytes after the object", end))
    }
}

/// True when the raw key (as it appears between quotes) is `name`.
pub fn key_is(raw: &[u8], name: &str) -> bool {
    if raw == name.as_bytes() {
        return true;
    }
    // A key written with escapes ("\u0069d") is still that key.
    raw.contains(&b'\\') && serde_json::from_slice::<String>(&[b"\"", raw, b"\""].concat()).is_ok_and(|k| k == name)
}

/// Appends to `out` the object `body` with every top-level `key` member's value replaced by
/// `encoded` (already JSON), or the member inserted first when the object has none. Every other byte
/// is kept as it was. On error nothing is appended.
pub fn write_with_member(body: &[u8], key: &str, encoded: &[u8], out: &mut Vec<u8>) -> Result<()> {
    // Nearly always one id member; a duplicate is rare enough to allocate for.
    let mut first: Option<Range<usize>> = None;
    let mut more: Vec<Range<usize>> = Vec::new();
    let (open, count) = for_each_member(body, |k, span| {
        if key_is(k, key) {
            if first.is_none() {
                first = Some(span);
            } else {
                more.push(span);
            }
        }
    })?;
    out.reserve(body.len() + encoded.len() + key.len() + 4);
    let Some(first) = first else {
        out.extend_from_slice(body.get(..open).unwrap_or_default());
        let mut key_json = Vec::with_capacity(key.len() + 2);
        write_json_string(key, &mut key_json);
        out.extend_from_slice(&key_json);
        out.push(b':');
        out.extend_from_slice(encoded);
        if count > 0 {
            out.push(b',');
        }
        out.extend_from_slice(body.get(open..).unwrap_or_default());
        return Ok(());
    };
    let mut last = 0;
    for span in std::iter::once(&first).chain(more.iter()) {
        out.extend_from_slice(body.get(last..span.start).unwrap_or_default());
        out.extend_from_slice(encoded);
        last = span.end;
    }
    out.extend_from_slice(body.get(last..).unwrap_or_default());
    Ok(())
}

/// `body` with every top-level `key` member set to the JSON string `value` (see [`write_with_member`]).
/// The structure is checked, scalars are not: use [`set_json_id`](crate::stream::chat::set_json_id)
/// for untrusted whole bodies.
pub fn set_string_member(body: &[u8], key: &str, value: &str) -> Result<Vec<u8>> {
    let mut encoded = Vec::with_capacity(value.len() + 2);
    write_json_string(value, &mut encoded);
    let mut out = Vec::new();
    write_with_member(body, key, &encoded, &mut out)?;
    Ok(out)
}

/// `s` as a JSON string literal.
pub fn write_json_string(s: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// True when the object `b` has a top-level `key` member whose value is not null.
pub fn member_is_set(b: &[u8], key: &str) -> bool {
    let mut set = false;
    let _ = for_each_member(b, |k, span| {
        if key_is(k, key) && b.get(span) != Some(b"null") {
            set = true;
        }
    });
    set
}

// ------------------------------------------------------------------ lenient leaves

/// Text where a string is expected, never failing the surrounding parse: a string is taken as it
/// is (borrowed when it has no escapes); an array of content parts gives the concatenated `text` /
/// `thinking` of its parts; an object gives its own `text` / `thinking`; anything else is no text.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Text<'a>(pub Option<Cow<'a, str>>);

impl<'a> Text<'a> {
    pub fn non_empty(&self) -> Option<&str> {
        self.0.as_deref().filter(|s| !s.is_empty())
    }

    pub fn into_owned(self) -> Option<String> {
        self.0.map(Cow::into_owned)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(TextVisitor(std::marker::PhantomData))
    }
}

struct TextVisitor<'a>(std::marker::PhantomData<&'a ()>);

fn append<'a>(acc: &mut Option<Cow<'a, str>>, more: Option<Cow<'a, str>>) {
    match (acc.as_mut(), more) {
        (_, None) => {}
        (None, more) => *acc = more,
        (Some(a), Some(m)) => a.to_mut().push_str(&m),
    }
}

impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
    type Value = Text<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Owned(v))))
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_unit<E>(self) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_none<E>(self) -> std::result::Result<Text<'a>, E> {
        Ok(Text(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Text<'a>, A::Error> {
        let mut acc = None;
        while let Some(part) = seq.next_element::<Text<'a>>()? {
            append(&mut acc, part.0);
        }
        Ok(Text(acc))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Text<'a>, A::Error> {
        let mut acc = None;
        while let Some(key) = map.next_key::<PartKey>()? {
            match key {
                PartKey::Text => append(&mut acc, map.next_value::<Text<'a>>()?.0),
                PartKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Text(acc))
    }
}

/// The keys of a content part that hold its text.
enum PartKey {
    Text,
    Other,
}

impl<'de> Deserialize<'de> for PartKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = PartKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<PartKey, E> {
                Ok(if matches!(v, "text" | "thinking") { PartKey::Text } else { PartKey::Other })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// An object where one is expected, read as `T`; any other JSON value (a number, a string, an
/// array, null) counts as absent instead of failing the surrounding parse: an upstream's usage
/// with one odd detail (`"cache_creation": 0`) is still read, its other counts billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lenient<T>(pub Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> Lenient<T> {
    pub fn as_ref(&self) -> Option<&T> {
        self.0.as_ref()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct LenientVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for LenientVisitor<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Lenient<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|t| Lenient(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Lenient<T>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_i64<E>(self, _: i64) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_u64<E>(self, _: u64) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_f64<E>(self, _: f64) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E>(self) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_none<E>(self) -> std::result::Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
        }
        d.deserialize_any(LenientVisitor(std::marker::PhantomData))
    }
}

/// A token count where a number is expected: a non-negative integer (or integral float) is taken,
/// anything else counts as absent instead of failing the surrounding parse.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct CountVisitor;
        impl<'de> Visitor<'de> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Count, E> {
                Ok(Count(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Count, E> {
                Ok(Count(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Count, E> {
                // The largest f64 below 2^64, so the cast below is exact.
                const MAX: f64 = 18_446_744_073_709_549_568.0;
                let ok = v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= MAX;
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Ok(Count(ok.then_some(v as u64)))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_unit<E>(self) -> std::result::Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_none<E>(self) -> std::result::Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Count, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Count, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
        }
        d.deserialize_any(CountVisitor)
    }
}

/// How deeply the JSON text `b` nests arrays and objects (0 for a scalar), counting to `limit + 1`
/// at most: a scan of its brackets outside strings, the strings skipped by memchr. It does not
/// validate: unbalanced or unterminated text gets whatever depth its brackets reached, and the
/// parser that follows refuses it.
pub fn nesting_depth(b: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest, mut i) = (0usize, 0usize, 0usize);
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => match skip_string(b, i) {
                Ok(end) => {
                    i = end;
                    continue;
                }
                Err(_) => break,
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > deepest {
                    deepest = depth;
                    if deepest > limit {
                        break;
                    }
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    deepest
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn depth_of(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(depth_of).max().unwrap_or(0),
            Value::Object(members) => 1 + members.values().map(depth_of).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn nesting_depth_counts_brackets_outside_strings() {
        assert_eq!(nesting_depth(b"1", 10), 0);
        assert_eq!(nesting_depth(b"{}", 10), 1);
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":[]}],"c":{}}"#, 10), 4);
        assert_eq!(nesting_depth(br#"{"s":"[[[{{{\"[[[","t":["]"]}"#, 10), 2);
        assert_eq!(nesting_depth(br#"{"s":"\\"}"#, 10), 1); // an escaped backslash ends before the quote
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        assert_eq!(nesting_depth(deep.as_bytes(), 100), 101); // stops counting past the limit
        assert_eq!(nesting_depth(deep.as_bytes(), 1000), 300);
        assert_eq!(nesting_depth(b"{\"open", 10), 1); // unterminated: what it reached
    }

    fn nested() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{}\"\\\\a]{0,6}".prop_map(Value::from)
        ];
        leaf.prop_recursive(12, 64, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\\[\\]{}\"]{0,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn nesting_depth_is_the_parsed_depth(value in nested()) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(nesting_depth(&text, usize::MAX - 1), depth_of(&value));
        }
    }

    fn set(body: &str) -> String {
        String::from_utf8(set_string_member(body.as_bytes(), "id", "gw-1").unwrap()).unwrap()
    }

    #[test]
    fn replaces_only_the_top_level_id() {
        let body = r#"{"id":"up","nested":{"id":"keep"},"list":[{"id":"keep"}],"s":"a \"id\": x"}"#;
        assert_eq!(set(body), r#"{"id":"gw-1","nested":{"id":"keep"},"list":[{"id":"keep"}],"s":"a \"id\": x"}"#);
    }

    #[test]
    fn keeps_whitespace_and_order() {
        assert_eq!(set("{ \"a\" : 1 ,\n \"id\" : \"x\" }"), "{ \"a\" : 1 ,\n \"id\" : \"gw-1\" }");
        assert_eq!(set("{\"a\":\"\\\\\",\"id\":1}"), "{\"a\":\"\\\\\",\"id\":\"gw-1\"}");
    }

    #[test]
    fn inserts_when_absent() {
        assert_eq!(set(r#"{"a":1}"#), r#"{"id":"gw-1","a":1}"#);
        assert_eq!(set("{}"), r#"{"id":"gw-1"}"#);
        assert_eq!(set(" { } "), r#" {"id":"gw-1" } "#);
    }

    #[test]
    fn replaces_non_string_escaped_and_duplicate_keys() {
        assert_eq!(set(r#"{"id":null}"#), r#"{"id":"gw-1"}"#);
        assert_eq!(set(r#"{"\u0069d":5}"#), r#"{"\u0069d":"gw-1"}"#);
        assert_eq!(set(r#"{"id":1,"a":2,"id":{"x":[]}}"#), r#"{"id":"gw-1","a":2,"id":"gw-1"}"#);
    }

    #[test]
    fn new_value_is_escaped() {
        let out = set_string_member(b"{}", "id", "a\"b\n\u{1}").unwrap();
        assert_eq!(out, br#"{"id":"a\"b\n\u0001"}"#);
    }

    #[test]
    fn rejects_broken_structure() {
        for bad in [
            "",
            "[]",
            "\"x\"",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1",
            "{\"a\":\"x}",
            "{\"a\":[1,2}",
            "{\"a\":[1}}",
            "{\"a\":{]}",
            "{} x",
            "{\"a\":1} {}",
            "{,}",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":\"\\",
        ] {
            assert!(set_string_member(bad.as_bytes(), "id", "x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowing() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(set_string_member(deep.as_bytes(), "id", "x").is_err());
    }

    #[test]
    fn member_is_set_ignores_null() {
        assert!(member_is_set(br#"{"error":{"m":1}}"#, "error"));
        assert!(!member_is_set(br#"{"error":null}"#, "error"));
        assert!(!member_is_set(br#"{"x":{"error":1}}"#, "error"));
    }

    #[derive(Deserialize)]
    struct Probe<'a> {
        #[serde(default, borrow)]
        t: Text<'a>,
        #[serde(default)]
        n: Count,
    }

    fn probe(s: &str) -> (Option<String>, Option<u64>) {
        let p: Probe<'_> = serde_json::from_str(s).unwrap();
        (p.t.into_owned(), p.n.0)
    }

    #[test]
    fn lenient_text_and_counts() {
        assert_eq!(probe(r#"{"t":"plain","n":3}"#), (Some("plain".into()), Some(3)));
        assert_eq!(probe(r#"{"t":"esc\"aped","n":3.0}"#), (Some("esc\"aped".into()), Some(3)));
        assert_eq!(probe(r#"{"t":5,"n":-1}"#), (None, None));
        assert_eq!(probe(r#"{"t":null,"n":"7"}"#), (None, None));
        assert_eq!(probe(r#"{"t":true,"n":2.5}"#), (None, None));
        assert_eq!(probe(r#"{"n":{"a":[1]},"t":{"x":[1,{"y":2}]}}"#), (None, None));
        assert_eq!(
            probe(
                r#"{"t":[{"type":"thinking","thinking":[{"type":"text","text":"hm "}]},{"type":"text","text":"ok"}]}"#
            ),
            (Some("hm ok".into()), None)
        );
        assert_eq!(probe(r#"{"t":["a","b",1]}"#), (Some("ab".into()), None));
        assert_eq!(probe("{}"), (None, None));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn result_parses_with_id_set_and_rest_equal(
            map in proptest::collection::btree_map(".{0,5}", json_value(), 0..6),
            pretty in any::<bool>(),
            new_id in ".{0,10}",
        ) {
            let original = Value::Object(map.into_iter().collect());
            let text = if pretty { serde_json::to_string_pretty(&original).unwrap() } else { original.to_string() };
            let out: Value = serde_json::from_slice(&set_string_member(text.as_bytes(), "id", &new_id).unwrap()).unwrap();
            let mut expected = original.clone();
            expected.as_object_mut().unwrap().insert("id".into(), json!(new_id));
            prop_assert_eq!(out, expected);
        }

        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = set_string_member(&bytes, "id", "x");
            let _ = member_is_set(&bytes, "error");
        }
    }
}
