//! Writing SSE events for the client, shared by every shape's rewriter.

use crate::json::{starts_object, write_with_member};
use crate::stream::sse::EventRef;
use crate::stream::StreamState;
use serde::de::IgnoredAny;
use serde::Deserialize;

pub(crate) fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// One `data:` event for `data`; data with line breaks needs one data: line per line to stay one event.
pub(crate) fn push_event(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(b"data: ");
    push_data_lines(out, data);
}

/// An event of a named-event shape (messages, responses) read through the view `V`. Data that is
/// not a JSON object, or not valid JSON, breaks the stream (`StreamState::malformed`; an upstream
/// `[DONE]` is dropped: the rewriter sends its own) and None is returned; valid JSON the view
/// cannot read is Some(None).
pub(crate) fn read_named_event<'a, V: Deserialize<'a>>(
    event: EventRef<'a>,
    state: &mut StreamState,
) -> Option<Option<V>> {
    let data = event.data;
    let is_json = starts_object(data.as_bytes());
    let view = if is_json { serde_json::from_str::<V>(data).ok() } else { None };
    if !is_json || (view.is_none() && serde_json::from_str::<IgnoredAny>(data).is_err()) {
        if data.trim() != "[DONE]" {
            state.malformed(data);
        }
        return None;
    }
    Some(view)
}

/// The `event:` line of a named event (the message and responses shapes name theirs).
pub(crate) fn push_name(out: &mut Vec<u8>, name: Option<&str>) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
}

pub(crate) fn push_data_lines(out: &mut Vec<u8>, data: &[u8]) {
    let mut rest = data;
    while let Some(i) = memchr::memchr(b'\n', rest) {
        out.extend_from_slice(rest.get(..i).unwrap_or_default());
        out.extend_from_slice(b"\ndata: ");
        rest = rest.get(i + 1..).unwrap_or_default();
    }
    out.extend_from_slice(rest);
    out.extend_from_slice(b"\n\n");
}

/// One `data:` event for the object `data` with its top-level id set to `encoded_id`, written straight
/// into `out` (the usual case of a one-line chunk) or through a buffer (a chunk spread over lines).
pub(crate) fn push_with_id(out: &mut Vec<u8>, data: &[u8], encoded_id: &[u8]) {
    if memchr::memchr(b'\n', data).is_none() {
        out.extend_from_slice(b"data: ");
        // On error nothing was written; forward the chunk as it came.
        if write_with_member(data, "id", encoded_id, out).is_err() {
            out.extend_from_slice(data);
        }
        out.extend_from_slice(b"\n\n");
    } else {
        let mut rewritten = Vec::with_capacity(data.len() + encoded_id.len() + 8);
        match write_with_member(data, "id", encoded_id, &mut rewritten) {
            Ok(()) => push_event(out, &rewritten),
            Err(_) => push_event(out, data),
        }
    }
}
