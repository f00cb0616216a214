//! What operators see of each request, gathered without the interpreter: the metrics' counts and
//! histogram observations of a process between two flushes (`Tally`), and the request's line on
//! stderr (`access_line`). A request's end reports here in one call each; the Python side
//! (gateway.telemetry) adds a flush's counts to prometheus_client's shared values once a second
//! and writes the lines in batches.
//!
//! Labels come from bounded sets: a model the configuration does not name counts as "", a channel
//! not configured for its model as "" (the same rule as the Python side's for its other callers).

use rustc_hash::{FxHashMap, FxHashSet};

/// The counters a model request adds to, by their labels (joined by `SEP` in the tally's keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// endpoint, model, status, code
    Requests = 0,
    /// model, direction ("in" | "out")
    Tokens = 1,
    /// model
    Cost = 2,
    /// model, channel, outcome
    Attempts = 3,
    /// model
    Failovers = 4,
}

impl Counter {
    pub const ALL: [Counter; 5] =
        [Counter::Requests, Counter::Tokens, Counter::Cost, Counter::Attempts, Counter::Failovers];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Requests => "requests",
            Counter::Tokens => "tokens",
            Counter::Cost => "cost",
            Counter::Attempts => "attempts",
            Counter::Failovers => "failovers",
        }
    }
}

/// The histograms, each by endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Histogram {
    AddedLatency = 0,
    UpstreamLatency = 1,
    FirstByte = 2,
}

impl Histogram {
    pub const ALL: [Histogram; 3] = [Histogram::AddedLatency, Histogram::UpstreamLatency, Histogram::FirstByte];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::AddedLatency => "added_latency",
            Histogram::UpstreamLatency => "upstream_latency",
            Histogram::FirstByte => "first_byte",
        }
    }
}

const HISTOGRAMS: usize = 3;
/// Between the labels of one key: a unit separator never appears in a route, model, channel or code.
pub const SEP: char = '\u{1f}';

/// One histogram's observations since the last flush: a count per bucket (the last is +Inf's) and
/// their sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub counts: Vec<u64>,
    pub sum: f64,
}

/// One model request's figures, as its close reports them.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest<'a> {
    pub endpoint: &'a str,
    pub model: Option<&'a str>,
    pub status: u16,
    pub code: Option<&'a str>,
    /// From the request's arrival to its report.
    pub total_ns: i64,
    /// Waiting for the upstream (0: it never went upstream).
    pub upstream_ns: i64,
    /// From the arrival to a stream's first byte sent (0: not a stream, or nothing was sent).
    pub first_byte_ns: i64,
    /// The channels tried (a safety check's tries excluded), each with its outcome.
    pub attempts: &'a [(String, String)],
    /// The settlement's figures, when it was charged.
    pub usage: Option<Usage<'a>>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage<'a> {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Exact dollars in plain decimal notation ("0.0000138"); the metric is a float, for graphs.
    pub cost: &'a str,
}

impl ModelRequest<'_> {
    /// The gateway's own time: for a stream up to its first byte, else the whole request, less the
    /// upstream's (None when it never went upstream).
    pub fn added_ns(&self) -> Option<i64> {
        if self.upstream_ns == 0 {
            None
        } else if self.first_byte_ns != 0 {
            Some(self.first_byte_ns - self.upstream_ns)
        } else {
            Some(self.total_ns - self.upstream_ns)
        }
    }
}

#[derive(Debug)]
pub struct Tally {
    bounds: [Vec<f64>; HISTOGRAMS],
    models: FxHashSet<String>,
    channels: FxHashSet<String>, // model SEP channel
    counters: [FxHashMap<String, f64>; 5],
    histograms: [FxHashMap<String, Observed>; HISTOGRAMS],
    key: String,
}

impl Tally {
    /// `bounds`: each histogram's upper bounds, ascending, +Inf excluded; `models`: each configured
    /// model with its channels' names.
    pub fn new(bounds: [Vec<f64>; HISTOGRAMS], models: &[(String, Vec<String>)]) -> Self {
        let mut channels = FxHashSet::default();
        for (model, names) in models {
            for name in names {
                channels.insert(format!("{model}{SEP}{name}"));
            }
        }
        Self {
            bounds,
            models: models.iter().map(|(m, _)| m.clone()).collect(),
            channels,
            counters: Default::default(),
            histograms: Default::default(),
            key: String::new(),
        }
    }

    /// The model's label: its name when configured, else "".
    fn model<'a>(&self, name: Option<&'a str>) -> &'a str {
        match name {
            Some(n) if self.models.contains(n) => n,
            _ => "",
        }
    }

    fn count(&mut self, counter: Counter, labels: &[&str], amount: f64) {
        self.key.clear();
        for (i, label) in labels.iter().enumerate() {
            if i > 0 {
                self.key.push(SEP);
            }
            self.key.push_str(label);
        }
        let map = &mut self.counters[counter as usize];
        match map.get_mut(self.key.as_str()) {
            Some(total) => *total += amount,
            None => {
                map.insert(self.key.clone(), amount);
            }
        }
    }

    /// Count `value` where prometheus_client's observe() would: the first bucket whose bound is
    /// >= value (the last, +Inf's, past every bound).
    fn observe(&mut self, histogram: Histogram, endpoint: &str, value: f64) {
        let bounds = &self.bounds[histogram as usize];
        let bucket = bounds.partition_point(|bound| *bound < value);
        let map = &mut self.histograms[histogram as usize];
        let slot = match map.get_mut(endpoint) {
            Some(slot) => slot,
            None => map
                .entry(endpoint.to_owned())
                .or_insert_with(|| Observed { counts: vec![0; bounds.len() + 1], sum: 0.0 }),
        };
        if let Some(count) = slot.counts.get_mut(bucket) {
            *count += 1;
        }
        slot.sum += value;
    }

    /// Any answered request: one count (the model request's histograms come with `model_request`).
    pub fn request(&mut self, endpoint: &str, model: Option<&str>, status: u16, code: Option<&str>) {
        let model = self.model(model);
        let mut status_text = itoa_buf();
        let status_text = format_u16(&mut status_text, status);
        self.count(Counter::Requests, &[endpoint, model, status_text, code.unwrap_or("")], 1.0);
    }

    /// A model request has ended (its charge, if any, settled).
    pub fn model_request(&mut self, request: &ModelRequest<'_>) {
        self.request(request.endpoint, request.model, request.status, request.code);
        if let Some(added) = request.added_ns() {
            self.observe(Histogram::AddedLatency, request.endpoint, seconds(added).max(0.0));
        }
        if request.upstream_ns != 0 {
            self.observe(Histogram::UpstreamLatency, request.endpoint, seconds(request.upstream_ns));
        }
        if request.first_byte_ns != 0 {
            self.observe(Histogram::FirstByte, request.endpoint, seconds(request.first_byte_ns));
        }
        let model = self.model(request.model);
        let mut first: Option<&str> = None;
        let mut moved = false;
        for (channel, outcome) in request.attempts {
            self.key.clear();
            self.key.push_str(model);
            self.key.push(SEP);
            self.key.push_str(channel);
            let label = if self.channels.contains(self.key.as_str()) { channel.as_str() } else { "" };
            self.count(Counter::Attempts, &[model, label, outcome], 1.0);
            match first {
                None => first = Some(channel),
                Some(f) if f != channel => moved = true,
                Some(_) => {}
            }
        }
        if moved {
            self.count(Counter::Failovers, &[model], 1.0);
        }
        if let Some(usage) = request.usage {
            if usage.prompt_tokens > 0 {
                self.count(Counter::Tokens, &[model, "in"], usage.prompt_tokens as f64);
            }
            if usage.completion_tokens > 0 {
                self.count(Counter::Tokens, &[model, "out"], usage.completion_tokens as f64);
            }
            let cost: f64 = usage.cost.parse().unwrap_or(0.0);
            if cost != 0.0 {
                self.count(Counter::Cost, &[model], cost);
            }
        }
    }

    /// Everything gathered since the last drain, which starts afresh: each counter's labels (split)
    /// and amount, each histogram's endpoint and observations.
    pub fn drain(&mut self) -> Drained {
        let mut counts = Vec::new();
        for (counter, map) in Counter::ALL.into_iter().zip(self.counters.iter_mut()) {
            for (key, amount) in map.drain() {
                counts.push((counter, key.split(SEP).map(str::to_owned).collect(), amount));
            }
        }
        let mut observed = Vec::new();
        for (histogram, map) in Histogram::ALL.into_iter().zip(self.histograms.iter_mut()) {
            for (endpoint, slot) in map.drain() {
                observed.push((histogram, endpoint, slot));
            }
        }
        Drained { counts, observed }
    }
}

/// What a drain hands over: each counter's labels (in their order) and amount, each histogram's
/// endpoint and observations.
#[derive(Debug, Default)]
pub struct Drained {
    pub counts: Vec<(Counter, Vec<String>, f64)>,
    pub observed: Vec<(Histogram, String, Observed)>,
}

fn seconds(ns: i64) -> f64 {
    ns as f64 / 1e9
}

type ItoaBuf = [u8; 5];

fn itoa_buf() -> ItoaBuf {
    [0; 5]
}

/// A status code's decimal text, without allocating.
fn format_u16(buf: &mut ItoaBuf, mut value: u16) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 || at == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

// ------------------------------------------------------------------ the request's line

/// How lines are written: JSON objects, or plain text for a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    Json,
    Text,
}

/// A field's value in a request line.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Null,
    Str(&'a str),
    Int(i64),
    /// Milliseconds, from nanoseconds: written with up to three decimals, always as a number with
    /// a fraction (412.5, 1.0).
    Millis(i64),
}

impl<'a> From<Option<&'a str>> for Value<'a> {
    fn from(value: Option<&'a str>) -> Self {
        value.map_or(Value::Null, Value::Str)
    }
}

pub const ACCESS_LOGGER: &str = "gateway.access";

/// One request's line (newline included): the time `now_ns` (UTC, to the millisecond), the level
/// and logger, `message`, then `fields` in their order. Text lines leave out fields that are null.
pub fn access_line(format: LineFormat, now_ns: i64, message: &str, fields: &[(&str, Value<'_>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    match format {
        LineFormat::Json => {
            out.extend_from_slice(b"{\"ts\":\"");
            push_timestamp(&mut out, now_ns);
            out.extend_from_slice(b"\",\"level\":\"info\",\"logger\":\"");
            out.extend_from_slice(ACCESS_LOGGER.as_bytes());
            out.extend_from_slice(b"\",\"message\":");
            json_string(&mut out, message);
            for (name, value) in fields {
                out.push(b',');
                json_string(&mut out, name);
                out.push(b':');
                match value {
                    Value::Null => out.extend_from_slice(b"null"),
                    Value::Str(s) => json_string(&mut out, s),
                    Value::Int(i) => push_int(&mut out, *i),
                    Value::Millis(ns) => millis(&mut out, *ns),
                }
            }
            out.push(b'}');
        }
        LineFormat::Text => {
            push_timestamp(&mut out, now_ns);
            out.extend_from_slice(b" INFO    ");
            out.extend_from_slice(ACCESS_LOGGER.as_bytes());
            out.push(b' ');
            out.extend_from_slice(message.as_bytes());
            for (name, value) in fields {
                if matches!(value, Value::Null) {
                    continue;
                }
                out.push(b' ');
                out.extend_from_slice(name.as_bytes());
                out.push(b'=');
                match value {
                    Value::Null => {}
                    Value::Str(s) => out.extend_from_slice(s.as_bytes()),
                    Value::Int(i) => push_int(&mut out, *i),
                    Value::Millis(ns) => millis(&mut out, *ns),
                }
            }
        }
    }
    out.push(b'\n');
    out
}

/// An integer's decimal text.
fn push_int(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    push_digits(out, value.unsigned_abs(), 1);
}

/// `value` in decimal, zero-padded to at least `width` digits.
fn push_digits(out: &mut Vec<u8>, mut value: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    while value > 0 || digits.len() - at < width {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    out.extend_from_slice(&digits[at..]);
}

/// Nanoseconds as milliseconds rounded to the microsecond (half away from zero), written with at
/// most three decimals and at least one: 412.5, 0.061, 1.0, -0.25.
fn millis(out: &mut Vec<u8>, ns: i64) {
    let magnitude = ns.unsigned_abs();
    let micros = magnitude / 1000 + u64::from(magnitude % 1000 >= 500);
    if ns < 0 && micros > 0 {
        out.push(b'-');
    }
    push_digits(out, micros / 1000, 1);
    out.push(b'.');
    let mut fraction = micros % 1000;
    if fraction == 0 {
        out.push(b'0');
        return;
    }
    let mut width = 3;
    while fraction.is_multiple_of(10) {
        fraction /= 10;
        width -= 1;
    }
    push_digits(out, fraction, width);
}

/// JSON's string syntax: quotes, backslashes and control characters escaped; the rest as it is.
fn json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    // Every byte looked at, no early exit: the compiler vectorizes it (a short-circuiting `all`
    // took ~4,000 instructions a request's line, benches/instructions.py).
    let plain = !bytes.iter().fold(false, |seen, &b| seen | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if plain {
        out.extend_from_slice(bytes);
    } else {
        for &b in bytes {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b if b < 0x20 => {
                    out.extend_from_slice(b"\\u00");
                    out.push(HEX[usize::from(b >> 4)]);
                    out.push(HEX[usize::from(b & 0xf)]);
                }
                b => out.push(b),
            }
        }
    }
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The line of a model request: who asked (ids, never a key or a body), what, how it ended, its
/// timings and, when it was charged, its usage and cost.
pub fn model_request_line(
    format: LineFormat,
    now_ns: i64,
    ids: &RequestIds<'_>,
    method: &str,
    request: &ModelRequest<'_>,
) -> Vec<u8> {
    let mut status = itoa_buf();
    let status_text = format_u16(&mut status, request.status);
    let message = [method, " ", request.endpoint, " ", status_text].concat();
    let mut fields: Vec<(&str, Value<'_>)> = vec![
        ("request_id", Value::Str(ids.request_id)),
        ("trace_id", ids.trace_id.into()),
        ("account_id", Value::Str(ids.account_id)),
        ("key_id", Value::Str(ids.key_id)),
        ("method", Value::Str(method)),
        ("endpoint", Value::Str(request.endpoint)),
        ("model", request.model.into()),
        ("status", Value::Int(i64::from(request.status))),
        ("code", request.code.into()),
        ("duration_ms", Value::Millis(request.total_ns)),
        ("added_ms", request.added_ns().map_or(Value::Null, Value::Millis)),
        ("upstream_ms", if request.upstream_ns == 0 { Value::Null } else { Value::Millis(request.upstream_ns) }),
        ("first_byte_ms", if request.first_byte_ns == 0 { Value::Null } else { Value::Millis(request.first_byte_ns) }),
    ];
    if let Some(usage) = request.usage {
        fields.push(("prompt_tokens", Value::Int(i64::try_from(usage.prompt_tokens).unwrap_or(i64::MAX))));
        fields.push(("completion_tokens", Value::Int(i64::try_from(usage.completion_tokens).unwrap_or(i64::MAX))));
        fields.push(("cost", Value::Str(usage.cost)));
    }
    access_line(format, now_ns, &message, &fields)
}

/// Whose request a line is about.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIds<'a> {
    pub request_id: &'a str,
    pub trace_id: Option<&'a str>,
    pub account_id: &'a str,
    pub key_id: &'a str,
}

/// Any other answer (a refusal for the key, a listing, the management API).
#[derive(Debug, Clone, Copy, Default)]
pub struct Answer<'a> {
    pub trace_id: Option<&'a str>,
    pub method: &'a str,
    pub endpoint: &'a str,
    pub status: u16,
    pub code: Option<&'a str>,
    pub duration_ns: i64,
}

/// The line of any other answer.
pub fn answer_line(format: LineFormat, now_ns: i64, answer: &Answer<'_>) -> Vec<u8> {
    let mut status_buf = itoa_buf();
    let status_text = format_u16(&mut status_buf, answer.status);
    let message = [answer.method, " ", answer.endpoint, " ", status_text].concat();
    let fields = [
        ("trace_id", answer.trace_id.into()),
        ("method", Value::Str(answer.method)),
        ("endpoint", Value::Str(answer.endpoint)),
        ("status", Value::Int(i64::from(answer.status))),
        ("code", answer.code.into()),
        ("duration_ms", Value::Millis(answer.duration_ns)),
    ];
    access_line(format, now_ns, &message, &fields)
}

/// `now_ns` since the epoch as "2026-11-24T12:00:00.123+00:00" (UTC, to the millisecond), as
/// Python's datetime.isoformat(timespec="milliseconds") writes it.
pub fn timestamp(now_ns: i64) -> String {
    let mut out = Vec::with_capacity(29);
    push_timestamp(&mut out, now_ns);
    String::from_utf8(out).unwrap_or_default() // digits and punctuation only
}

fn push_timestamp(out: &mut Vec<u8>, now_ns: i64) {
    let millis = now_ns.div_euclid(1_000_000);
    let (seconds, ms) = (millis.div_euclid(1000), millis.rem_euclid(1000));
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    // Every part is non-negative here (rem_euclid), the year too for any time after 1 BC.
    let part = |value: i64| u64::try_from(value).unwrap_or(0);
    push_digits(out, part(year), 4);
    out.push(b'-');
    push_digits(out, part(month), 2);
    out.push(b'-');
    push_digits(out, part(day), 2);
    out.push(b'T');
    push_digits(out, part(rest / 3600), 2);
    out.push(b':');
    push_digits(out, part(rest % 3600 / 60), 2);
    out.push(b':');
    push_digits(out, part(rest % 60), 2);
    out.push(b'.');
    push_digits(out, part(ms), 3);
    out.extend_from_slice(b"+00:00");
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally() -> Tally {
        let bounds = [vec![0.001, 0.01], vec![0.1, 1.0], vec![0.1, 1.0]];
        Tally::new(bounds, &[("m".to_owned(), vec!["a".to_owned(), "b".to_owned()])])
    }

    fn counter(drained: &[(Counter, Vec<String>, f64)], which: Counter, labels: &[&str]) -> Option<f64> {
        drained
            .iter()
            .find(|(c, l, _)| *c == which && l.iter().map(String::as_str).eq(labels.iter().copied()))
            .map(|e| e.2)
    }

    #[test]
    fn a_model_request_counts_once_with_its_labels_and_usage() {
        let mut t = tally();
        let attempts = [("a".to_owned(), "ok".to_owned())];
        let request = ModelRequest {
            endpoint: "/v1/chat/completions",
            model: Some("m"),
            status: 200,
            total_ns: 5_000_000,
            upstream_ns: 4_000_000,
            attempts: &attempts,
            usage: Some(Usage { prompt_tokens: 3, completion_tokens: 4, cost: "0.0000138" }),
            ..Default::default()
        };
        t.model_request(&request);
        t.model_request(&request);
        let Drained { counts, observed } = t.drain();
        assert_eq!(counter(&counts, Counter::Requests, &["/v1/chat/completions", "m", "200", ""]), Some(2.0));
        assert_eq!(counter(&counts, Counter::Tokens, &["m", "in"]), Some(6.0));
        assert_eq!(counter(&counts, Counter::Tokens, &["m", "out"]), Some(8.0));
        assert_eq!(counter(&counts, Counter::Attempts, &["m", "a", "ok"]), Some(2.0));
        assert!((counter(&counts, Counter::Cost, &["m"]).unwrap_or(0.0) - 0.0000276).abs() < 1e-15);
        assert_eq!(counter(&counts, Counter::Failovers, &["m"]), None);
        let added = observed.iter().find(|(h, _, _)| *h == Histogram::AddedLatency).map(|o| o.2.clone());
        // 1 ms added: not above the first bound (0.001), so its bucket
        assert_eq!(added, Some(Observed { counts: vec![2, 0, 0], sum: 0.002 }));
        assert!(t.drain().counts.is_empty(), "a drain starts afresh");
    }

    #[test]
    fn unknown_models_and_channels_fold_to_empty_labels_and_a_move_is_a_failover() {
        let mut t = tally();
        let attempts = [("a".to_owned(), "timeout".to_owned()), ("zz".to_owned(), "ok".to_owned())];
        t.model_request(&ModelRequest {
            endpoint: "/e",
            model: Some("m"),
            status: 200,
            attempts: &attempts,
            ..Default::default()
        });
        t.request("/e", Some("made-up"), 404, Some("model_not_found"));
        let Drained { counts, observed } = t.drain();
        assert_eq!(counter(&counts, Counter::Attempts, &["m", "", "ok"]), Some(1.0));
        assert_eq!(counter(&counts, Counter::Failovers, &["m"]), Some(1.0));
        assert_eq!(counter(&counts, Counter::Requests, &["/e", "", "404", "model_not_found"]), Some(1.0));
        assert!(observed.is_empty(), "no upstream, no first byte: nothing observed");
    }

    #[test]
    fn a_value_past_every_bound_counts_in_the_last_bucket_and_a_bound_in_its_own() {
        let mut t = tally();
        for first_byte in [100_000_000, 2_000_000_000] {
            t.model_request(&ModelRequest {
                endpoint: "/e",
                status: 200,
                upstream_ns: 1,
                first_byte_ns: first_byte,
                ..Default::default()
            });
        }
        let observed = t.drain().observed;
        let first = observed.iter().find(|(h, _, _)| *h == Histogram::FirstByte).map(|o| o.2.counts.clone());
        assert_eq!(first, Some(vec![1, 0, 1]));
    }

    #[test]
    fn timestamps_match_isoformat_in_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000+00:00");
        assert_eq!(timestamp(1_795_953_613_726_999_999), "2026-11-29T12:00:13.726+00:00");
        assert_eq!(timestamp(951_782_400_001_000_000), "2000-02-29T00:00:00.001+00:00");
        assert_eq!(timestamp(-1_000_000), "1969-12-31T23:59:59.999+00:00");
    }

    #[test]
    fn milliseconds_keep_three_decimals_at_most_and_one_at_least() {
        let cases = [
            (412_500_000, "412.5"),
            (61_000, "0.061"),
            (1_000_000, "1.0"),
            (0, "0.0"),
            (1_234_567, "1.235"),
            (-250_000, "-0.25"),
            (499, "0.0"),
        ];
        for (ns, text) in cases {
            let mut out = Vec::new();
            millis(&mut out, ns);
            assert_eq!(String::from_utf8(out).unwrap_or_default(), text, "{ns}");
        }
    }

    #[test]
    fn json_lines_escape_and_order_their_fields() {
        let line = access_line(
            LineFormat::Json,
            0,
            "POST /v1/x 200",
            &[
                ("a", Value::Str("q\"\\\n\u{1}é")),
                ("b", Value::Null),
                ("c", Value::Int(-3)),
                ("d", Value::Millis(1_500_000)),
            ],
        );
        let text = String::from_utf8(line).unwrap_or_default();
        assert_eq!(
            text,
            "{\"ts\":\"1970-01-01T00:00:00.000+00:00\",\"level\":\"info\",\"logger\":\"gateway.access\",\
             \"message\":\"POST /v1/x 200\",\"a\":\"q\\\"\\\\\\n\\u0001é\",\"b\":null,\"c\":-3,\"d\":1.5}\n"
        );
        let parsed: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap_or_default();
        assert_eq!(parsed["a"], "q\"\\\n\u{1}é");
    }

    #[test]
    fn text_lines_leave_out_nulls() {
        let line = access_line(LineFormat::Text, 0, "GET /v1/models 200", &[("a", Value::Null), ("b", Value::Int(2))]);
        assert_eq!(
            String::from_utf8(line).unwrap_or_default(),
            "1970-01-01T00:00:00.000+00:00 INFO    gateway.access GET /v1/models 200 b=2\n"
        );
    }
}
