//! `gateway._core`: conversions between Python and gateway-core, nothing else.
//! Types and docs for Python live in python/gateway/_core.pyi.

use gateway_core::append_file;
use gateway_core::http_head;
use gateway_core::media;
use gateway_core::multipart;
use gateway_core::ratelimit;
use gateway_core::shared_buckets::{self, Limit};
use gateway_core::stream::eventstream::{self, HeaderValue};
use gateway_core::stream::{chat, messages, responses, sse, StreamRewriter, TokenUsage};
use gateway_core::telemetry::{self, LineFormat};
use gateway_core::tokens::{self, Encoding};
use gateway_core::{idempotency, ids, json, key_digest as digest, CoreError as Core};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

/// Texts and bodies above these sizes are processed with the GIL released.
const DETACH_TEXT_BYTES: usize = 4 * 1024;
const DETACH_BODY_BYTES: usize = 64 * 1024;

/// The one place core errors become Python exceptions. The classes are Python's, in `gateway.core`
/// (CoreError and its subclasses, under the gateway's GatewayError); only file errors are OSError.
fn to_py(err: Core) -> PyErr {
    let message = err.to_string();
    let class = match err {
        Core::UnknownEncoding(_) => "UnknownEncodingError",
        Core::InvalidJson(_) => "InvalidJsonError",
        Core::InvalidEventStream(_) => "InvalidEventStreamError",
        Core::InvalidHttp(_) => "InvalidHttpError",
        Core::InvalidArgument(_) => "CoreError",
        Core::Io(_) => return PyOSError::new_err(message),
    };
    Python::attach(|py| {
        let found = py.import("gateway.core").and_then(|module| module.getattr(class));
        match found.map(|c| c.cast_into::<PyType>()) {
            Ok(Ok(class)) => PyErr::from_type(class, message),
            Ok(Err(e)) => e.into(),
            Err(e) => e,
        }
    })
}

fn encoding(name: &str) -> PyResult<Encoding> {
    name.parse().map_err(to_py)
}

// ------------------------------------------------------------------ SSE

#[pyclass(frozen, module = "gateway._core")]
struct SseEvent {
    #[pyo3(get)]
    event: Option<String>,
    #[pyo3(get)]
    data: String,
    #[pyo3(get)]
    id: Option<String>,
    #[pyo3(get)]
    retry: Option<u64>,
}

#[pymethods]
impl SseEvent {
    fn __repr__(&self) -> String {
        format!("SseEvent(event={:?}, data={:?}, id={:?}, retry={:?})", self.event, self.data, self.id, self.retry)
    }
}

fn to_events(events: Vec<sse::Event>) -> Vec<SseEvent> {
    events.into_iter().map(|e| SseEvent { event: e.event, data: e.data, id: e.id, retry: e.retry }).collect()
}

#[pyclass(module = "gateway._core")]
struct SseParser(sse::SseParser);

#[pymethods]
impl SseParser {
    #[new]
    fn new() -> Self {
        Self(sse::SseParser::new())
    }

    fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.0.feed(chunk, &mut out);
        to_events(out)
    }

    fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.0.finish(&mut out);
        to_events(out)
    }

    #[getter]
    fn overflowed(&self) -> bool {
        self.0.overflowed()
    }
}

// ------------------------------------------------------------------ AWS event streams

#[pyclass(frozen, module = "gateway._core")]
struct EventStreamMessage(eventstream::Message);

#[pymethods]
impl EventStreamMessage {
    /// Every header: strings as str, bytes and UUIDs as bytes, numbers and timestamps as int.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, value) in &self.0.headers {
            match value {
                HeaderValue::Bool(v) => out.set_item(name, v)?,
                HeaderValue::Byte(v) => out.set_item(name, v)?,
                HeaderValue::Short(v) => out.set_item(name, v)?,
                HeaderValue::Int(v) => out.set_item(name, v)?,
                HeaderValue::Long(v) | HeaderValue::Timestamp(v) => out.set_item(name, v)?,
                HeaderValue::Bytes(v) => out.set_item(name, PyBytes::new(py, v))?,
                HeaderValue::String(v) => out.set_item(name, v)?,
                HeaderValue::Uuid(v) => out.set_item(name, PyBytes::new(py, v))?,
            }
        }
        Ok(out)
    }

    /// A string header's value, or None.
    fn header(&self, name: &str) -> Option<String> {
        self.0.header_str(name).map(str::to_owned)
    }

    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.payload)
    }

    fn __repr__(&self) -> String {
        let names: Vec<&str> = self.0.headers.iter().map(|(n, _)| n.as_str()).collect();
        format!("EventStreamMessage(headers={names:?}, payload={} bytes)", self.0.payload.len())
    }
}

#[pyclass(module = "gateway._core")]
struct EventStreamParser(eventstream::EventStreamParser);

#[pymethods]
impl EventStreamParser {
    #[new]
    fn new() -> Self {
        Self(eventstream::EventStreamParser::new())
    }

    fn feed(&mut self, chunk: &[u8]) -> PyResult<Vec<EventStreamMessage>> {
        let mut out = Vec::new();
        self.0.feed(chunk, &mut out).map_err(to_py)?;
        Ok(out.into_iter().map(EventStreamMessage).collect())
    }

    fn finish(&mut self) -> PyResult<()> {
        self.0.finish().map_err(to_py)
    }
}

// ------------------------------------------------------------------ chat streams

#[pyclass(frozen, module = "gateway._core")]
#[derive(Clone)]
struct StreamUsage(TokenUsage);

#[pymethods]
impl StreamUsage {
    #[getter]
    fn prompt_tokens(&self) -> u64 {
        self.0.prompt_tokens
    }
    #[getter]
    fn completion_tokens(&self) -> u64 {
        self.0.completion_tokens
    }
    #[getter]
    fn total_tokens(&self) -> u64 {
        self.0.total_tokens
    }
    #[getter]
    fn cached_tokens(&self) -> u64 {
        self.0.cached_tokens
    }
    #[getter]
    fn cache_write_tokens(&self) -> u64 {
        self.0.cache_write_tokens
    }
    #[getter]
    fn reasoning_tokens(&self) -> u64 {
        self.0.reasoning_tokens
    }
    /// Every count in pricing.Usage's order of its first nine fields (prompt, completion, cached,
    /// reasoning, cache writes, audio prompt, image prompt (none here), the hour's cache writes,
    /// audio output): one call where nine getters cost ~0.5 us a request.
    #[getter]
    #[allow(clippy::type_complexity)]
    fn counts(&self) -> (u64, u64, u64, u64, u64, u64, u64, u64, u64) {
        let u = &self.0;
        (
            u.prompt_tokens,
            u.completion_tokens,
            u.cached_tokens,
            u.reasoning_tokens,
            u.cache_write_tokens,
            u.audio_prompt_tokens,
            0,
            u.cache_write_1h_tokens,
            u.audio_completion_tokens,
        )
    }
    #[getter]
    fn audio_prompt_tokens(&self) -> u64 {
        self.0.audio_prompt_tokens
    }
    #[getter]
    fn audio_completion_tokens(&self) -> u64 {
        self.0.audio_completion_tokens
    }
    #[getter]
    fn cache_write_1h_tokens(&self) -> u64 {
        self.0.cache_write_1h_tokens
    }
    fn __repr__(&self) -> String {
        format!("StreamUsage({:?})", self.0)
    }
}

/// A Rust stream rewriter as a Python class: its constructor, then feed/finish and what it has read
/// so far through the `StreamRewriter` trait, the same for every shape (see _core.pyi), then the
/// shape's own getters, each a method of the same name on the Rust rewriter.
macro_rules! stream_rewriter {
    (
        $name:ident($inner:ty),
        $(#[$ctor_attr:meta])* fn new($($arg:ident: $ty:ty),*) -> Self $ctor:block
        $(, getter $extra:ident: $extra_ty:ty)*
    ) => {
        #[pyclass(module = "gateway._core")]
        struct $name($inner);

        #[pymethods]
        impl $name {
            #[new]
            $(#[$ctor_attr])*
            fn new($($arg: $ty),*) -> Self $ctor

            fn feed<'py>(&mut self, py: Python<'py>, chunk: &[u8]) -> Bound<'py, PyBytes> {
                PyBytes::new(py, &self.0.feed(chunk))
            }

            fn finish<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyBytes> {
                PyBytes::new(py, &self.0.finish())
            }

            #[getter]
            fn done(&self) -> bool {
                self.0.state().done
            }
            #[getter]
            fn chunks(&self) -> u64 {
                self.0.state().chunks
            }
            #[getter]
            fn saw_output(&self) -> bool {
                self.0.state().saw_output
            }
            /// The answer is spoken: its output text is the transcript of audio.
            #[getter]
            fn spoken(&self) -> bool {
                self.0.state().spoken
            }
            #[getter]
            fn output_text(&self) -> String {
                self.0.state().output_text.clone()
            }
            /// A mark of how much output text has been collected so far (its length in bytes):
            /// cheap to take after every chunk, read back with `output_upto`.
            #[getter]
            fn output_len(&self) -> usize {
                self.0.state().output_text.len()
            }
            /// The output text collected up to a mark taken with `output_len`.
            fn output_upto(&self, mark: usize) -> String {
                let text = &self.0.state().output_text;
                text.get(..mark).unwrap_or(text).to_owned()
            }
            /// The reasoning within the output text up to a mark taken with `output_len`.
            fn reasoning_upto(&self, mark: usize) -> String {
                self.0.state().reasoning_upto(mark)
            }
            #[getter]
            fn usage(&self) -> Option<StreamUsage> {
                self.0.usage().map(StreamUsage)
            }
            #[getter]
            fn model(&self) -> Option<String> {
                self.0.state().model.clone()
            }
            #[getter]
            fn finish_reason(&self) -> Option<String> {
                self.0.state().finish_reason.clone()
            }
            #[getter]
            fn error<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
                self.0.state().error.as_deref().map(|e| PyBytes::new(py, e))
            }
            $(
                #[getter]
                fn $extra(&self) -> $extra_ty {
                    self.0.$extra()
                }
            )*
        }
    };
}

stream_rewriter!(
    ChatStreamRewriter(chat::ChatStreamRewriter),
    fn new(response_id: &str, forward_usage: bool) -> Self {
        Self(chat::ChatStreamRewriter::new(response_id, forward_usage))
    },
    getter awaits_usage: bool
);

stream_rewriter!(
    MessagesStreamRewriter(messages::MessagesStreamRewriter),
    fn new(response_id: &str) -> Self {
        Self(messages::MessagesStreamRewriter::new(response_id))
    }
);

stream_rewriter!(
    ResponsesStreamRewriter(responses::ResponsesStreamRewriter),
    #[pyo3(signature = (response_id, previous_response_id=None))]
    fn new(response_id: &str, previous_response_id: Option<&str>) -> Self {
        Self(responses::ResponsesStreamRewriter::new(response_id, previous_response_id))
    },
    getter upstream_id: Option<String>,
    getter item_ids: Vec<String>
);

#[pyclass(module = "gateway._core", frozen, get_all)]
struct RewrittenResponse {
    body: Py<PyBytes>,
    upstream_id: Option<String>,
    usage: Option<StreamUsage>,
}

#[pyfunction]
#[pyo3(signature = (body, new_id, previous_response_id=None))]
fn rewrite_response(
    py: Python<'_>,
    body: &[u8],
    new_id: &str,
    previous_response_id: Option<&str>,
) -> PyResult<RewrittenResponse> {
    let r = responses::rewrite_response(body, new_id, previous_response_id).map_err(to_py)?;
    Ok(RewrittenResponse {
        body: PyBytes::new(py, &r.body).unbind(),
        upstream_id: r.upstream_id,
        usage: r.usage.map(StreamUsage),
    })
}

#[pyfunction]
fn parse_messages_usage(body: &[u8]) -> PyResult<Option<StreamUsage>> {
    Ok(messages::parse_messages_usage(body).map_err(to_py)?.map(StreamUsage))
}

#[pyfunction]
fn parse_chat_usage(body: &[u8]) -> PyResult<Option<StreamUsage>> {
    Ok(chat::parse_chat_usage(body).map_err(to_py)?.map(StreamUsage))
}

#[pyfunction]
fn stamp_answer<'py>(
    py: Python<'py>,
    body: &[u8],
    new_id: &str,
    shape: &str,
) -> PyResult<(Bound<'py, PyBytes>, Option<StreamUsage>)> {
    let shape = match shape {
        "chat" => chat::AnswerShape::Chat,
        "messages" => chat::AnswerShape::Messages,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "unknown answer shape {other:?}: expected \"chat\" or \"messages\""
            )))
        }
    };
    let (out, usage) = chat::stamp_answer(body, new_id, shape).map_err(to_py)?;
    Ok((PyBytes::new(py, &out), usage.map(StreamUsage)))
}

#[pyfunction]
fn json_nesting_depth(py: Python<'_>, body: &[u8], limit: usize) -> usize {
    if body.len() > DETACH_BODY_BYTES {
        py.detach(|| json::nesting_depth(body, limit))
    } else {
        json::nesting_depth(body, limit)
    }
}

#[pyfunction]
fn set_json_id<'py>(py: Python<'py>, body: &[u8], new_id: &str) -> PyResult<Bound<'py, PyBytes>> {
    let out = chat::set_json_id(body, new_id).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

// ------------------------------------------------------------------ tokens

#[pyfunction]
#[pyo3(signature = (text, encoding = "o200k_base"))]
fn count_tokens(py: Python<'_>, text: &str, encoding: &str) -> PyResult<usize> {
    let enc = self::encoding(encoding)?;
    let result = if text.len() > DETACH_TEXT_BYTES {
        py.detach(|| tokens::count_tokens(text, enc))
    } else {
        tokens::count_tokens(text, enc)
    };
    result.map_err(to_py)
}

// The text signature spells the default out (pyo3 shows a constant's as `...`); the assertion keeps
// the two the same.
const _: () = assert!(tokens::IMAGE_PART_TOKENS == 1600);
#[pyfunction]
#[pyo3(
    signature = (body, encoding = "o200k_base", image_tokens = tokens::IMAGE_PART_TOKENS),
    text_signature = "(body, encoding='o200k_base', image_tokens=1600)"
)]
fn count_chat_tokens(py: Python<'_>, body: &[u8], encoding: &str, image_tokens: usize) -> PyResult<usize> {
    count_prompt_tokens(py, body, encoding, image_tokens, 0).map(|(tokens, _)| tokens)
}

/// count_chat_tokens and, of those tokens, the audio's.
#[pyfunction]
#[pyo3(
    signature = (body, encoding = "o200k_base", image_tokens = tokens::IMAGE_PART_TOKENS, spoken_tokens = 0),
    text_signature = "(body, encoding='o200k_base', image_tokens=1600, spoken_tokens=0)"
)]
fn count_prompt_tokens(
    py: Python<'_>,
    body: &[u8],
    encoding: &str,
    image_tokens: usize,
    spoken_tokens: usize,
) -> PyResult<(usize, usize)> {
    let enc = self::encoding(encoding)?;
    let result = if body.len() > DETACH_TEXT_BYTES {
        py.detach(|| tokens::count_prompt(body, enc, image_tokens, spoken_tokens))
    } else {
        tokens::count_prompt(body, enc, image_tokens, spoken_tokens)
    };
    result.map(|count| (count.tokens, count.audio_tokens)).map_err(to_py)
}

/// A RIFF/WAVE file's length in seconds from its header; None for anything else.
#[pyfunction]
fn wav_seconds(data: &[u8]) -> Option<f64> {
    media::wav_seconds(data)
}

// ------------------------------------------------------------------ rate limiting

#[pyclass(frozen, module = "gateway._core")]
struct TakeResult(ratelimit::TakeResult);

#[pymethods]
impl TakeResult {
    #[getter]
    fn allowed(&self) -> bool {
        self.0.allowed
    }
    #[getter]
    fn remaining(&self) -> u64 {
        self.0.remaining
    }
    #[getter]
    fn retry_after_ns(&self) -> u64 {
        self.0.retry_after_ns
    }
    fn __repr__(&self) -> String {
        format!("TakeResult({:?})", self.0)
    }
}

#[pyclass(module = "gateway._core")]
struct TokenBucket(ratelimit::TokenBucket);

#[pymethods]
impl TokenBucket {
    #[new]
    fn new(capacity: u64, refill_tokens: u64, refill_period_ns: u64, now_ns: u64) -> PyResult<Self> {
        ratelimit::TokenBucket::new(capacity, refill_tokens, refill_period_ns, now_ns).map(Self).map_err(to_py)
    }

    #[staticmethod]
    fn from_state(
        capacity: u64,
        refill_tokens: u64,
        refill_period_ns: u64,
        level: i128,
        last_ns: u64,
    ) -> PyResult<Self> {
        ratelimit::TokenBucket::from_state(capacity, refill_tokens, refill_period_ns, level, last_ns)
            .map(Self)
            .map_err(to_py)
    }

    fn try_take(&mut self, n: u64, now_ns: u64) -> TakeResult {
        TakeResult(self.0.try_take(n, now_ns))
    }

    fn adjust(&mut self, delta: i64, now_ns: u64) {
        self.0.adjust(delta, now_ns);
    }

    fn available(&mut self, now_ns: u64) -> u64 {
        self.0.available(now_ns)
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    #[getter]
    fn state(&self) -> (i128, u64) {
        self.0.state()
    }
}

// ------------------------------------------------------------------ multipart

#[pyclass(frozen, module = "gateway._core")]
struct MultipartPart {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    filename: Option<String>,
    #[pyo3(get)]
    content_type: Option<String>,
    data: Vec<u8>,
}

#[pymethods]
impl MultipartPart {
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }
    fn __repr__(&self) -> String {
        format!("MultipartPart(name={:?}, filename={:?}, {} bytes)", self.name, self.filename, self.data.len())
    }
}

#[pyfunction]
fn parse_multipart(py: Python<'_>, body: &[u8], content_type: &str) -> Option<Vec<MultipartPart>> {
    let run = || {
        multipart::parse(body, content_type).map(|parts| {
            parts
                .into_iter()
                .map(|p| MultipartPart {
                    name: p.name,
                    filename: p.filename,
                    content_type: p.content_type,
                    data: p.content.to_vec(),
                })
                .collect::<Vec<_>>()
        })
    };
    if body.len() > DETACH_BODY_BYTES {
        py.detach(run)
    } else {
        run()
    }
}

/// Token buckets shared by every process that opens the same file (see shared_buckets.rs).
#[pyclass(module = "gateway._core", frozen)]
struct SharedBuckets(shared_buckets::SharedBuckets);

/// The bucket a call names: its key's place in the table and its limit.
fn bucket(key: &str, capacity: u64, refill_tokens: u64, refill_period_ns: u64) -> (u64, Limit) {
    (shared_buckets::key_hash(key.as_bytes()), Limit { capacity, refill_tokens, period_ns: refill_period_ns })
}

#[pymethods]
impl SharedBuckets {
    #[new]
    fn new(path: std::path::PathBuf, slots: u64) -> PyResult<Self> {
        shared_buckets::SharedBuckets::open(&path, slots).map(Self).map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)]
    fn try_take(
        &self,
        py: Python<'_>,
        key: &str,
        capacity: u64,
        refill_tokens: u64,
        refill_period_ns: u64,
        n: u64,
        now_ns: u64,
    ) -> PyResult<TakeResult> {
        let (hash, l) = bucket(key, capacity, refill_tokens, refill_period_ns);
        // The file lock may wait on another process: never with the GIL held.
        py.detach(|| self.0.try_take(hash, l, n, now_ns)).map(TakeResult).map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)]
    fn adjust(
        &self,
        py: Python<'_>,
        key: &str,
        capacity: u64,
        refill_tokens: u64,
        refill_period_ns: u64,
        delta: i64,
        now_ns: u64,
    ) -> PyResult<u64> {
        let (hash, l) = bucket(key, capacity, refill_tokens, refill_period_ns);
        py.detach(|| self.0.adjust(hash, l, delta, now_ns)).map_err(to_py)
    }

    fn available(
        &self,
        py: Python<'_>,
        key: &str,
        capacity: u64,
        refill_tokens: u64,
        refill_period_ns: u64,
        now_ns: u64,
    ) -> PyResult<u64> {
        let (hash, l) = bucket(key, capacity, refill_tokens, refill_period_ns);
        py.detach(|| self.0.available(hash, l, now_ns)).map_err(to_py)
    }
}

// ------------------------------------------------------------------ small files, GIL held

/// The settlement journal's file (see append_file.rs: every call keeps the GIL on purpose).
#[pyclass(module = "gateway._core")]
struct AppendFile(Option<append_file::AppendFile>);

impl AppendFile {
    fn open_file(&mut self) -> PyResult<&mut append_file::AppendFile> {
        self.0.as_mut().ok_or_else(|| PyOSError::new_err("the file is closed"))
    }
}

#[pymethods]
impl AppendFile {
    #[new]
    fn new(path: std::path::PathBuf) -> PyResult<Self> {
        append_file::AppendFile::open_locked(&path).map(|f| Self(Some(f))).map_err(to_py)
    }

    fn append(&mut self, data: &[u8]) -> PyResult<()> {
        self.open_file()?.append(data).map_err(to_py)
    }

    fn truncate(&mut self) -> PyResult<()> {
        self.open_file()?.truncate().map_err(to_py)
    }

    /// Close the file, releasing its lock (again: nothing).
    fn close(&mut self) {
        self.0 = None;
    }
}

#[pyfunction]
fn file_len(path: std::path::PathBuf) -> PyResult<u64> {
    append_file::file_len(&path).map_err(to_py)
}

// ------------------------------------------------------------------ HTTP

/// The answer head at the start of `buf` as (HTTP/1.1?, status, [(name, value)], its length), or
/// None while incomplete. Values are read as Latin-1, as HTTP's obs-text is.
#[pyfunction]
fn parse_response_head<'py>(py: Python<'py>, buf: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Some(head) = http_head::parse_response_head(buf).map_err(to_py)? else {
        return Ok(None);
    };
    let pairs = head.headers.iter().map(|(name, value)| {
        let value = match std::str::from_utf8(value) {
            Ok(text) if value.is_ascii() => PyString::new(py, text),
            _ => PyString::new(py, &value.iter().map(|&b| char::from(b)).collect::<String>()),
        };
        PyTuple::new(py, [PyString::new(py, name), value])
    });
    let headers = PyList::new(py, pairs.collect::<PyResult<Vec<_>>>()?)?;
    let fields = (head.http11, head.status, headers, head.length);
    Ok(Some(fields.into_pyobject(py)?))
}

// ------------------------------------------------------------------ ids

/// The process's read-ahead of OS randomness for ids and traces. Every call holds the GIL, so the
/// lock is never contended, nor held when the process forks (os.fork holds the GIL too).
static RANDOM: std::sync::Mutex<ids::RandomPool> = std::sync::Mutex::new(ids::RandomPool::new());

/// The pool, locked (a poisoned lock is taken as it is: no call panics while holding it).
fn random_pool() -> std::sync::MutexGuard<'static, ids::RandomPool> {
    RANDOM.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn random_bytes<const N: usize>() -> PyResult<[u8; N]> {
    random_pool().take::<N>().map_err(to_py)
}

/// A new id: `prefix`, the time in milliseconds (12 hex digits), 80 random bits (20 hex digits).
#[pyfunction]
fn new_id(prefix: &str) -> PyResult<String> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
    Ok(ids::id(prefix, millis, &random_bytes()?))
}

/// Forget the randomness read ahead (a forked child's first call).
#[pyfunction]
fn forget_random() {
    random_pool().forget();
}

/// (trace id, flags, parent span id or None, span id) of a request with these headers (an
/// iterable of (name, value) byte pairs, as an ASGI scope has them): its first traceparent's trace
/// when valid, else a new one.
#[pyfunction]
fn request_trace(headers: &Bound<'_, PyAny>) -> PyResult<(String, String, Option<String>, String)> {
    let mut found: Option<Vec<u8>> = None;
    for pair in headers.try_iter()? {
        let pair = pair?;
        let name = pair.get_item(0)?;
        if name.extract::<&[u8]>().is_ok_and(|name| name == b"traceparent") {
            found = Some(pair.get_item(1)?.extract::<Vec<u8>>()?);
            break;
        }
    }
    let trace = ids::trace_context(found.as_deref(), &random_bytes()?);
    Ok((trace.trace_id, trace.flags, trace.parent_id, trace.span_id))
}

// ------------------------------------------------------------------ keys

/// SHA-256 of an API key's text: what keys are stored and looked up by.
#[pyfunction]
fn key_digest<'py>(py: Python<'py>, key: &str) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &digest::key_digest(key.as_bytes()))
}

// ------------------------------------------------------------------ idempotency

#[pyfunction]
#[pyo3(signature = (method, path, body, content_type = None, key = None))]
fn fingerprint(
    py: Python<'_>,
    method: &str,
    path: &str,
    body: &[u8],
    content_type: Option<&str>,
    key: Option<&[u8]>,
) -> PyResult<String> {
    let run = || idempotency::fingerprint(method, path, body, content_type, key);
    let result = if body.len() > DETACH_BODY_BYTES { py.detach(run) } else { run() };
    result.map_err(to_py)
}

// ------------------------------------------------------------------ telemetry

fn line_format(name: &str) -> PyResult<LineFormat> {
    match name {
        "json" => Ok(LineFormat::Json),
        "text" => Ok(LineFormat::Text),
        other => Err(to_py(Core::InvalidArgument(format!("line format {other:?}: expected \"json\" or \"text\"")))),
    }
}

/// A process's request metrics between two flushes, and the requests' lines (see telemetry.rs).
#[pyclass(module = "gateway._core")]
struct RequestTally(telemetry::Tally);

type DrainedCounts = Vec<(&'static str, Vec<String>, f64)>;
type DrainedHistograms = Vec<(&'static str, String, Vec<u64>, f64)>;

#[pymethods]
impl RequestTally {
    #[new]
    fn new(
        added_bounds: Vec<f64>,
        upstream_bounds: Vec<f64>,
        first_byte_bounds: Vec<f64>,
        models: Vec<(String, Vec<String>)>,
    ) -> Self {
        Self(telemetry::Tally::new([added_bounds, upstream_bounds, first_byte_bounds], &models))
    }

    #[pyo3(signature = (endpoint, model, status, code))]
    fn request(&mut self, endpoint: &str, model: Option<&str>, status: u16, code: Option<&str>) {
        self.0.request(endpoint, model, status, code);
    }

    #[pyo3(signature = (
        endpoint, model, status, code, total_ns, upstream_ns, first_byte_ns, attempts,
        prompt_tokens, completion_tokens, cost, line, now_ns, request_id, trace_id, account_id,
        key_id, method
    ))]
    #[allow(clippy::too_many_arguments)]
    fn model_request<'py>(
        &mut self,
        py: Python<'py>,
        endpoint: &str,
        model: Option<&str>,
        status: u16,
        code: Option<&str>,
        total_ns: i64,
        upstream_ns: i64,
        first_byte_ns: i64,
        attempts: Vec<(String, String)>,
        prompt_tokens: u64,
        completion_tokens: u64,
        cost: Option<&str>,
        line: Option<&str>,
        now_ns: i64,
        request_id: &str,
        trace_id: Option<&str>,
        account_id: &str,
        key_id: &str,
        method: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let request = telemetry::ModelRequest {
            endpoint,
            model,
            status,
            code,
            total_ns,
            upstream_ns,
            first_byte_ns,
            attempts: &attempts,
            usage: cost.map(|cost| telemetry::Usage { prompt_tokens, completion_tokens, cost }),
        };
        self.0.model_request(&request);
        let Some(format) = line else { return Ok(None) };
        let ids = telemetry::RequestIds { request_id, trace_id, account_id, key_id };
        let text = telemetry::model_request_line(line_format(format)?, now_ns, &ids, method, &request);
        Ok(Some(PyBytes::new(py, &text)))
    }

    fn drain(&mut self) -> (DrainedCounts, DrainedHistograms) {
        let drained = self.0.drain();
        let counts = drained.counts.into_iter().map(|(c, labels, amount)| (c.name(), labels, amount)).collect();
        let observed =
            drained.observed.into_iter().map(|(h, endpoint, o)| (h.name(), endpoint, o.counts, o.sum)).collect();
        (counts, observed)
    }
}

#[pyfunction]
#[pyo3(signature = (line, now_ns, trace_id, method, endpoint, status, code, duration_ns))]
#[allow(clippy::too_many_arguments)]
fn answer_line<'py>(
    py: Python<'py>,
    line: &str,
    now_ns: i64,
    trace_id: Option<&str>,
    method: &str,
    endpoint: &str,
    status: u16,
    code: Option<&str>,
    duration_ns: i64,
) -> PyResult<Bound<'py, PyBytes>> {
    let answer = telemetry::Answer { trace_id, method, endpoint, status, code, duration_ns };
    Ok(PyBytes::new(py, &telemetry::answer_line(line_format(line)?, now_ns, &answer)))
}

#[pyfunction]
fn log_timestamp(now_ns: i64) -> String {
    telemetry::timestamp(now_ns)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_EVENT_BYTES", sse::MAX_EVENT_BYTES)?;
    m.add("IMAGE_PART_TOKENS", tokens::IMAGE_PART_TOKENS)?;
    m.add("MIN_AUDIO_BYTES_PER_SECOND", media::MIN_AUDIO_BYTES_PER_SECOND)?;
    m.add("AUDIO_TOKENS_PER_SECOND", media::AUDIO_TOKENS_PER_SECOND)?;
    m.add("OVERSIZED_EVENT_ERROR", PyBytes::new(py, sse::OVERSIZED_EVENT_ERROR))?;
    m.add("MALFORMED_EVENT_ERROR", PyBytes::new(py, sse::MALFORMED_EVENT_ERROR))?;
    m.add("EMPTY_STREAM_ERROR", PyBytes::new(py, sse::EMPTY_STREAM_ERROR))?;
    m.add_class::<SseEvent>()?;
    m.add_class::<SseParser>()?;
    m.add_class::<EventStreamMessage>()?;
    m.add_class::<EventStreamParser>()?;
    m.add_class::<StreamUsage>()?;
    m.add_class::<ChatStreamRewriter>()?;
    m.add_class::<MessagesStreamRewriter>()?;
    m.add_class::<ResponsesStreamRewriter>()?;
    m.add_class::<RewrittenResponse>()?;
    m.add_function(wrap_pyfunction!(rewrite_response, m)?)?;
    m.add_class::<TakeResult>()?;
    m.add_class::<TokenBucket>()?;
    m.add_class::<SharedBuckets>()?;
    m.add_function(wrap_pyfunction!(parse_chat_usage, m)?)?;
    m.add_function(wrap_pyfunction!(parse_messages_usage, m)?)?;
    m.add_function(wrap_pyfunction!(set_json_id, m)?)?;
    m.add_function(wrap_pyfunction!(json_nesting_depth, m)?)?;
    m.add_function(wrap_pyfunction!(stamp_answer, m)?)?;
    m.add_function(wrap_pyfunction!(count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(count_chat_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(count_prompt_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(wav_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(key_digest, m)?)?;
    m.add_function(wrap_pyfunction!(new_id, m)?)?;
    m.add_function(wrap_pyfunction!(forget_random, m)?)?;
    m.add_function(wrap_pyfunction!(request_trace, m)?)?;
    m.add_function(wrap_pyfunction!(parse_response_head, m)?)?;
    m.add_class::<MultipartPart>()?;
    m.add_function(wrap_pyfunction!(parse_multipart, m)?)?;
    m.add_class::<AppendFile>()?;
    m.add_function(wrap_pyfunction!(file_len, m)?)?;
    m.add_class::<RequestTally>()?;
    m.add_function(wrap_pyfunction!(answer_line, m)?)?;
    m.add_function(wrap_pyfunction!(log_timestamp, m)?)?;
    Ok(())
}
