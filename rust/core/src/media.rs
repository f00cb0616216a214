//! What a prompt's media parts are held at, in prompt tokens. The gateway runs no provider's own
//! accounting (it does not decode images or render pages), so each part is held at a bound read
//! cheaply from what it carries:
//! - an image: the model's configured tokens per image (`image_tokens`: what its provider bills at
//!   most for one image as it scales it);
//! - audio: its length (a WAV's header, else its size at 8 kbit/s, the lowest plausible bitrate) at
//!   AUDIO_TOKENS_PER_SECOND;
//! - a file: a PDF at PAGE_TEXT_TOKENS plus one image per page (Anthropic and OpenAI bill a page as
//!   its text and its picture), its pages the leaves of its page tree (pdf_pages); other data as
//!   its text (or a token a byte, if it is not text); a file named by id or URL, whose bytes the
//!   gateway does not see, or a PDF whose tree cannot be walked, at MAX_FILE_PAGES pages at least.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use memchr::memmem;
use serde_json::Value;

/// The default tokens of an image part: about the most a provider bills for one image as it
/// scales it (Anthropic's 1,600 at 1.15 megapixels; OpenAI's GPT-4o 1,445 at high detail). A model
/// billed more per image (GPT-4o mini: 33 times as many, at a lower price) is configured so.
pub const IMAGE_PART_TOKENS: usize = 1_600;
/// Input audio's tokens per second (OpenAI: a token per 100 ms of a user's audio).
pub const AUDIO_TOKENS_PER_SECOND: usize = 10;
/// The lowest bitrate compressed audio plausibly has (8 kbit/s): its size then bounds its length.
pub const MIN_AUDIO_BYTES_PER_SECOND: usize = 1_000;
/// A PDF page's text at most, as Anthropic bills it (1,500 to 3,000 tokens a page).
pub const PAGE_TEXT_TOKENS: usize = 3_000;
/// The most pages a provider reads of one PDF (Anthropic and OpenAI: 100).
pub const MAX_FILE_PAGES: usize = 100;
/// The most one prompt's PDFs have their object streams inflated to, together, to count their
/// pages (an `Inflation` budget): a few ms of work (a prompt under 256 KB is counted on the event
/// loop), far more than the page objects of the 100 pages a provider reads take. A PDF past it is
/// held at MAX_FILE_PAGES.
pub const MAX_INFLATED_BYTES: usize = 4 << 20;

/// What is left of a prompt's MAX_INFLATED_BYTES.
pub type Inflation = std::cell::Cell<usize>;

/// Base64 as clients send it: padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An audio part's tokens (`{"type": "input_audio", "input_audio": {"data": base64}}`).
pub fn audio_tokens(part: &Value) -> usize {
    let Some(Value::String(data)) = part.get("input_audio").and_then(|audio| audio.get("data")) else {
        return 0;
    };
    let bytes = decoded(data);
    let (size, byte_rate) = bytes
        .as_deref()
        .and_then(wav_data)
        .unwrap_or((bytes.as_ref().map_or(data.len() / 4 * 3, Vec::len), MIN_AUDIO_BYTES_PER_SECOND));
    (size * AUDIO_TOKENS_PER_SECOND).div_ceil(byte_rate)
}

/// A file part's tokens: the chat shape's `file` (`file.file_data`, a data URL), the responses
/// shape's `input_file` (`file_data`) and the messages shape's `document` (`source`: base64, text or
/// content blocks, counted by `count_blocks`).
pub fn file_tokens(
    part: &Value,
    image_tokens: usize,
    inflation: &Inflation,
    count_text: impl Fn(&str) -> crate::error::Result<usize>,
    count_blocks: impl Fn(&[Value]) -> crate::error::Result<usize>,
) -> crate::error::Result<usize> {
    let per_page = PAGE_TEXT_TOKENS + image_tokens;
    let data = match part.get("type").and_then(Value::as_str) {
        Some("file") => part.get("file").and_then(|file| file.get("file_data")),
        Some("input_file") => part.get("file_data"),
        Some("document") => {
            let source = part.get("source");
            match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
                Some("base64") => source.and_then(|s| s.get("data")),
                Some("text") => {
                    let text = source.and_then(|s| s.get("data")).and_then(Value::as_str).unwrap_or("");
                    return count_text(text);
                }
                Some("content") => {
                    return match source.and_then(|s| s.get("content")) {
                        Some(Value::String(text)) => count_text(text),
                        Some(Value::Array(blocks)) => count_blocks(blocks),
                        _ => Ok(0),
                    };
                }
                _ => None,
            }
        }
        _ => return Ok(0),
    };
    let Some(bytes) = data.and_then(Value::as_str).and_then(decoded) else {
        return Ok(MAX_FILE_PAGES * per_page); // named by id or URL, or not base64: unseen
    };
    // A PDF's header may follow up to 1,024 bytes of anything, as readers allow.
    if memmem::find(&bytes[..bytes.len().min(1024)], b"%PDF-").is_some() {
        return Ok(pages_or_most(&bytes, inflation).saturating_mul(per_page));
    }
    match std::str::from_utf8(&bytes) {
        Ok(text) => count_text(text),
        Err(_) => Ok(bytes.len()),
    }
}

/// The bytes of base64 data, bare or a data URL's (`data:<type>;base64,<data>`); None for anything
/// else.
fn decoded(data: &str) -> Option<Vec<u8>> {
    let encoded = match data.strip_prefix("data:") {
        Some(url) => {
            let (header, rest) = url.split_once(',')?;
            if !header.ends_with(";base64") {
                return None;
            }
            rest
        }
        None => data,
    };
    BASE64.decode(encoded).ok().or_else(|| {
        // Line-wrapped base64 (MIME's 76 columns) decodes once its whitespace is gone.
        let bare: Vec<u8> = encoded.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        BASE64.decode(bare).ok()
    })
}

/// A RIFF/WAVE file's length in seconds, from its header ([`wav_data`]); None for anything else
/// (other formats would need decoding). Transcription holds and bills an upload by it.
pub fn wav_seconds(data: &[u8]) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)] // sizes and rates far below 2^52
    wav_data(data).map(|(size, byte_rate)| size as f64 / byte_rate as f64)
}

/// A RIFF/WAVE file's audio bytes and bytes per second, from its header; None for anything else.
/// The audio runs to the end of the file, whatever its `data` chunk says (a decoder reads a size of
/// 0 so). A PCM header gives the rate twice (its byte rate, and the sample rate times the frame
/// size): the slower of the two, so that a byte rate that lies cannot shorten the length held;
/// any other coding (ADPCM, ...), the lowest plausible rate.
fn wav_data(data: &[u8]) -> Option<(usize, usize)> {
    if data.len() < 12 || &data[..4] != b"RIFF" || &data[8..12] != b"WAVE" {
        return None;
    }
    let le32 = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let le16 = |at: usize| data.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let (mut pos, mut byte_rate) = (12usize, 0usize);
    while pos + 8 <= data.len() {
        let length = le32(pos + 4)?;
        match &data[pos..pos + 4] {
            b"fmt " if length >= 16 => {
                // PCM (1), IEEE float (3), or the extensible header (0xFFFE) that carries either.
                let pcm = matches!(le16(pos + 8)?, 1 | 3 | 0xFFFE);
                let sample_rate = le32(pos + 12)?;
                let declared = le32(pos + 16)?;
                let block_align = le16(pos + 20)?;
                byte_rate = if pcm {
                    [declared, sample_rate * block_align].into_iter().filter(|&r| r > 0).min()?
                } else {
                    MIN_AUDIO_BYTES_PER_SECOND
                };
            }
            b"data" => return (byte_rate > 0).then_some((data.len() - pos - 8, byte_rate)),
            _ => {}
        }
        pos = pos.checked_add(8 + length + (length & 1))?;
    }
    None
}

/// A PDF's pages, found as a renderer finds them: from its catalog's `/Pages`, down the page
/// tree's `/Kids`, counting the leaves, over its objects as the file leaves them (the last
/// definition of each, as an incremental update redefines them; names' `#` escapes decoded;
/// object streams (PDF 1.5) inflated). None when the tree cannot be walked whole: no catalog, an
/// object it names missing (an object stream that is not Flate, encrypted, or past the prompt's
/// budget), a `/Kids` array held elsewhere, a tree too deep; the caller then holds it at
/// MAX_FILE_PAGES or at its page objects, whichever is more (`pages_or_most`).
pub fn pdf_pages(pdf: &[u8], inflation: &Inflation) -> Option<usize> {
    let mut objects = Objects::default();
    let mut at = 0;
    while let Some(stream) = next_stream(pdf, at) {
        objects.read(&pdf[at..stream.keyword]);
        // The stream's dictionary: the object text since its `obj`.
        let opened = memmem::rfind(&pdf[at..stream.keyword], b"obj").map_or(at, |i| at + i);
        let dictionary = decode_names(&pdf[opened..stream.keyword]);
        if memmem::find(&dictionary, b"/ObjStm").is_some() {
            match miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(stream.body(pdf), inflation.get()) {
                Ok(inflated) => {
                    inflation.set(inflation.get() - inflated.len());
                    objects.read_packed(&dictionary, &inflated);
                }
                Err(_) => inflation.set(0), // past the budget: the rest of the prompt inflates nothing more
            }
        }
        at = stream.end;
    }
    objects.read(&pdf[at..]);
    objects.pages()
}

/// A PDF's pages as pdf_pages finds them, else (a tree it cannot walk) as many as it has page
/// objects (`/Type /Page`), at least MAX_FILE_PAGES.
pub fn pages_or_most(pdf: &[u8], inflation: &Inflation) -> usize {
    pdf_pages(pdf, inflation).unwrap_or_else(|| page_objects(&decode_names(pdf)).max(MAX_FILE_PAGES))
}

/// The most objects a PDF's page-tree walk visits, and the deepest tree.
const MAX_TREE_NODES: usize = 1 << 18;
const MAX_TREE_DEPTH: usize = 64;

/// A PDF's objects by number: each one's text (names decoded), its last definition.
#[derive(Default)]
struct Objects {
    by_number: rustc_hash::FxHashMap<u64, Vec<u8>>,
    /// The catalog, as the last trailer (or cross-reference stream) names it (`/Root N G R`).
    root: Option<u64>,
}

impl Objects {
    /// The `N G obj ... endobj` objects of a stretch of object text (a stream's dictionary runs to
    /// the stretch's end, its `stream` keyword).
    fn read(&mut self, text: &[u8]) {
        let text = decode_names(text);
        // Each header (`N G obj`, its number read from the few bytes before it), in order; a body
        // runs to its `endobj` or the next header, whichever comes first: one pass, however the
        // text is made.
        let headers: Vec<(usize, u64)> = memmem::find_iter(&text, b"obj")
            .filter(|&at| !text[..at].ends_with(b"end") && text.get(at + 3).is_none_or(|&b| !is_regular(b)))
            .filter_map(|at| Some((at, object_number(&text[at.saturating_sub(48)..at])?)))
            .collect();
        if let Some(root) = names(&text, b"/Root").filter_map(|end| reference(&text[end..])).last() {
            self.root = Some(root);
        }
        let mut ends = memmem::find_iter(&text, b"endobj").peekable();
        for (i, &(at, number)) in headers.iter().enumerate() {
            let after = at + 3;
            while ends.next_if(|&end| end < after).is_some() {}
            let next = headers.get(i + 1).map_or(text.len(), |&(next, _)| next);
            let stop = ends.peek().map_or(text.len(), |&end| end).min(next).max(after);
            self.by_number.insert(number, text[after..stop].to_vec());
        }
    }

    /// The objects of an object stream: `/N` pairs of numbers and offsets, then the objects, from
    /// `/First` on.
    fn read_packed(&mut self, dictionary: &[u8], data: &[u8]) {
        let (Some(count), Some(first)) = (integer_after(dictionary, b"/N"), integer_after(dictionary, b"/First"))
        else {
            return;
        };
        let Some(header) = data.get(..first as usize) else { return };
        let numbers: Vec<u64> = header
            .split(|b| b.is_ascii_whitespace())
            .filter(|token| !token.is_empty())
            .map_while(|token| std::str::from_utf8(token).ok()?.parse().ok())
            .collect();
        let pairs: Vec<(u64, usize)> =
            numbers.chunks_exact(2).take(count as usize).map(|p| (p[0], p[1] as usize)).collect();
        for (i, &(number, offset)) in pairs.iter().enumerate() {
            let start = first as usize + offset;
            let stop = pairs.get(i + 1).map_or(data.len(), |&(_, next)| first as usize + next);
            // Offsets that do not rise would have each object copy the rest: such an object is
            // left out (and a tree that needs it is not walked).
            if let Some(body) = data.get(start..stop).filter(|_| stop > start) {
                self.by_number.insert(number, decode_names(body).into_owned());
            }
        }
    }

    /// The leaves under the catalog's `/Pages`, the catalog being the one the trailer names, as a
    /// reader finds it (a catalog elsewhere in the file, or none named, is no answer).
    fn pages(&self) -> Option<usize> {
        let catalog = self.by_number.get(&self.root?)?;
        let root = names(catalog, b"/Pages").next().and_then(|end| reference(&catalog[end..]))?;
        Some(self.leaves(root)?.max(1))
    }

    /// The pages under the page-tree node `root`; None when an object is missing or the tree is
    /// past the walk's bounds.
    fn leaves(&self, root: u64) -> Option<usize> {
        let mut seen = rustc_hash::FxHashSet::default();
        let mut stack = vec![(root, 0usize)];
        let mut leaves = 0;
        while let Some((number, depth)) = stack.pop() {
            if depth > MAX_TREE_DEPTH || seen.len() > MAX_TREE_NODES {
                return None;
            }
            if !seen.insert(number) {
                continue; // a cycle, or a page named twice: once
            }
            let body = self.by_number.get(&number)?;
            match names(body, b"/Kids").next() {
                None => leaves += 1,
                Some(end) => {
                    let array = body[end..].trim_ascii_start().strip_prefix(b"[")?;
                    let array = &array[..memchr::memchr(b']', array).unwrap_or(array.len())];
                    stack.extend(references(array).map(|kid| (kid, depth + 1)));
                }
            }
        }
        Some(leaves)
    }
}

/// The object number of an `N G obj` header whose `obj` follows `before`.
fn object_number(before: &[u8]) -> Option<u64> {
    let mut tokens = before.rsplit(|b| b.is_ascii_whitespace()).filter(|t| !t.is_empty());
    let generation = tokens.next()?;
    let number = tokens.next()?;
    if !generation.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(number).ok()?.parse().ok()
}

/// The indirect reference (`N G R`) `text` starts with, its object number.
fn reference(text: &[u8]) -> Option<u64> {
    let mut tokens = text.split(|b| b.is_ascii_whitespace()).filter(|t| !t.is_empty());
    let (number, generation, keyword) = (tokens.next()?, tokens.next()?, tokens.next()?);
    let keyword = keyword.strip_prefix(b"R")?;
    if !generation.iter().all(u8::is_ascii_digit) || keyword.first().is_some_and(|&b| is_regular(b)) {
        return None;
    }
    std::str::from_utf8(number).ok()?.parse().ok()
}

/// The object numbers of the indirect references (`N G R`) in `text`, in order.
fn references(text: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let tokens: Vec<&[u8]> = text.split(|b| b.is_ascii_whitespace()).filter(|t| !t.is_empty()).collect();
    let found: Vec<u64> = tokens
        .windows(3)
        .filter(|w| w[2] == b"R" && w[1].iter().all(u8::is_ascii_digit))
        .filter_map(|w| std::str::from_utf8(w[0]).ok()?.parse().ok())
        .collect();
    found.into_iter()
}

/// The whole number after the name `name` in a dictionary (`/N 12`).
fn integer_after(dictionary: &[u8], name: &[u8]) -> Option<u64> {
    let end = names(dictionary, name).next()?;
    let digits: Vec<u8> = dictionary[end..].trim_ascii_start().iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// A stream: where its `stream` keyword starts, its body (after the keyword's end of line, up to
/// `endstream`) and where the `endstream` keyword ends.
struct Stream {
    keyword: usize,
    start: usize,
    stop: usize,
    end: usize,
}

impl Stream {
    fn body<'a>(&self, pdf: &'a [u8]) -> &'a [u8] {
        &pdf[self.start..self.stop]
    }
}

/// The first stream at or after `from` (a `stream` keyword that is not `endstream`'s end and is
/// followed by its end of line). A stream without `endstream` runs to the end.
fn next_stream(pdf: &[u8], from: usize) -> Option<Stream> {
    let mut search = from;
    loop {
        let keyword = search + memmem::find(&pdf[search..], b"stream")?;
        let after = keyword + b"stream".len();
        // A stream follows its dictionary (`>> stream`): the word elsewhere (a comment, a
        // string, `endstream`) starts nothing.
        let follows_dictionary = pdf[from.max(keyword.saturating_sub(64))..keyword].trim_ascii_end().ends_with(b">>");
        if !follows_dictionary || !matches!(pdf.get(after), Some(b'\r' | b'\n')) {
            search = after;
            continue;
        }
        let start = after + pdf[after..].iter().take(2).take_while(|&&b| b == b'\r' || b == b'\n').count();
        let stop = memmem::find(&pdf[start..], b"endstream").map_or(pdf.len(), |i| start + i);
        let end = (stop + b"endstream".len()).min(pdf.len());
        return Some(Stream { keyword, start, stop, end });
    }
}

/// `text` as PDF's tokenizer reads it, outside literal strings: comments (`%` to the end of the
/// line) and NULs are whitespace, and names' `#xx` escapes are decoded (`/P#61ge` is `/Page`); a
/// string's bytes are kept as they are. Unchanged (and not copied) when it has none of these.
fn decode_names(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !text.iter().any(|&b| matches!(b, b'#' | b'%' | 0)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let (mut in_name, mut depth, mut i) = (false, 0usize, 0usize);
    while i < text.len() {
        let b = text[i];
        if depth > 0 {
            // In a literal string: nested parentheses, and a backslash escapes the next byte.
            match b {
                b'\\' => {
                    out.extend_from_slice(&text[i..(i + 2).min(text.len())]);
                    i += 2;
                    continue;
                }
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
            out.push(b);
            i += 1;
            continue;
        }
        match b {
            b'(' => {
                depth = 1;
                in_name = false;
            }
            b'%' => {
                let line = text[i..].iter().position(|&c| c == b'\r' || c == b'\n').unwrap_or(text.len() - i);
                out.push(b' ');
                i += line;
                in_name = false;
                continue;
            }
            0 => {
                out.push(b' ');
                i += 1;
                in_name = false;
                continue;
            }
            b'/' => in_name = true,
            b'#' if in_name => {
                if let (Some(high), Some(low)) =
                    (text.get(i + 1).and_then(|&c| hex(c)), text.get(i + 2).and_then(|&c| hex(c)))
                {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                    continue;
                }
            }
            _ if !is_regular(b) => in_name = false,
            _ => {}
        }
        out.push(b);
        i += 1;
    }
    std::borrow::Cow::Owned(out)
}

/// Where each whole name `name` in `text` ends (`/Kids`, not `/KidsX`).
fn names<'a>(text: &'a [u8], name: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    memmem::find_iter(text, name)
        .map(move |at| at + name.len())
        .filter(|&end| text.get(end).is_none_or(|&b| !is_regular(b)))
}

/// The `/Type /Page` entries in `bytes` (not `/Pages`: a name ends at whitespace or a delimiter).
fn page_objects(bytes: &[u8]) -> usize {
    names(bytes, b"/Type")
        .filter(|&end| match bytes[end..].trim_ascii_start().strip_prefix(b"/Page") {
            Some(after) => after.first().is_none_or(|&b| !is_regular(b)),
            None => false,
        })
        .count()
}

/// PDF's regular characters: neither whitespace nor a delimiter.
fn is_regular(b: u8) -> bool {
    !(b.is_ascii_whitespace() || b == 0 || b"()<>[]{}/%".contains(&b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn wav(seconds: usize, byte_rate: u32) -> Vec<u8> {
        let data_len = seconds * 16_000 * 2;
        let mut out = b"RIFF".to_vec();
        out.extend_from_slice(&((36 + data_len) as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes()); // PCM
        out.extend_from_slice(&1u16.to_le_bytes()); // mono
        out.extend_from_slice(&16_000u32.to_le_bytes());
        out.extend_from_slice(&byte_rate.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes()); // block align
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data_len as u32).to_le_bytes());
        out.resize(out.len() + data_len, 0);
        out
    }

    fn counted(text: &str) -> crate::error::Result<usize> {
        Ok(text.len())
    }

    fn blocks(parts: &[Value]) -> crate::error::Result<usize> {
        Ok(parts.len() * 7)
    }

    fn file(part: Value) -> usize {
        file_tokens(&part, IMAGE_PART_TOKENS, &Inflation::new(MAX_INFLATED_BYTES), counted, blocks).unwrap()
    }

    fn pages(pdf: &[u8]) -> Option<usize> {
        pdf_pages(pdf, &Inflation::new(MAX_INFLATED_BYTES))
    }

    #[test]
    fn a_wavs_seconds_are_its_audio_over_its_slower_rate() {
        assert_eq!(wav_seconds(&wav(3, 32_000)), Some(3.0));
        assert_eq!(wav_seconds(&wav(3, 320_000)), Some(3.0));
        assert_eq!(wav_seconds(&wav(3, 16_000)), Some(6.0));
        assert_eq!(wav_seconds(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(wav_seconds(&[0xFF; 64]), None);
    }

    #[test]
    fn audio_is_held_by_its_length() {
        let three_seconds = json!({"type": "input_audio", "input_audio": {"data": b64(&wav(3, 32_000))}});
        assert_eq!(audio_tokens(&three_seconds), 3 * AUDIO_TOKENS_PER_SECOND);
        // A byte rate that claims ten times the real one does not shorten it.
        let lying = json!({"type": "input_audio", "input_audio": {"data": b64(&wav(3, 320_000))}});
        assert_eq!(audio_tokens(&lying), 3 * AUDIO_TOKENS_PER_SECOND);
        // Compressed audio: its size at 8 kbit/s (5,000 bytes: five seconds at most).
        let mp3 = json!({"input_audio": {"data": b64(&[0xFF; 5_000]), "format": "mp3"}});
        assert_eq!(audio_tokens(&mp3), 5 * AUDIO_TOKENS_PER_SECOND);
        assert_eq!(audio_tokens(&json!({"input_audio": {}})), 0);
        // Review: a `data` size of 0 (a decoder reads to the end), and a coding whose frames are
        // not samples (ADPCM, tag 0x11) with a byte rate that lies, each held it at nothing.
        let mut sizeless = wav(3, 32_000);
        sizeless[40..44].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(audio_tokens(&json!({"input_audio": {"data": b64(&sizeless)}})), 3 * AUDIO_TOKENS_PER_SECOND);
        let mut adpcm = wav(1, u32::MAX);
        adpcm[20..22].copy_from_slice(&0x11u16.to_le_bytes());
        let size = adpcm.len() - 44;
        let held = audio_tokens(&json!({"input_audio": {"data": b64(&adpcm)}}));
        assert_eq!(held, (size * AUDIO_TOKENS_PER_SECOND).div_ceil(MIN_AUDIO_BYTES_PER_SECOND));
    }

    /// The objects of an `n`-page PDF as a writer lays them out: the catalog (1), the page tree
    /// (2) and the pages (3 on).
    fn tree(n: usize) -> Vec<(u64, String)> {
        let kids: Vec<String> = (0..n).map(|i| format!("{} 0 R", i + 3)).collect();
        let mut objects = vec![
            (1, "<< /Type /Catalog /Pages 2 0 R >>".to_string()),
            (2, format!("<< /Type /Pages /Kids [{}] /Count {n} >>", kids.join(" "))),
        ];
        objects.extend((0..n).map(|i| (i as u64 + 3, "<< /Type /Page /Parent 2 0 R >>".to_string())));
        objects
    }

    fn written(objects: &[(u64, String)]) -> Vec<u8> {
        let mut out = b"%PDF-1.4\n".to_vec();
        for (number, body) in objects {
            out.extend_from_slice(format!("{number} 0 obj\n{body}\nendobj\n").as_bytes());
        }
        out.extend_from_slice(b"trailer\n<< /Root 1 0 R /Size 9 >>\n%%EOF\n");
        out
    }

    fn pdf(n: usize) -> Vec<u8> {
        written(&tree(n))
    }

    /// The objects packed in one object stream (PDF 1.5), its type spelt `kind`.
    fn packed(objects: &[(u64, String)], kind: &str) -> Vec<u8> {
        let (mut header, mut data) = (String::new(), String::new());
        for (number, body) in objects {
            header.push_str(&format!("{number} {} ", data.len()));
            data.push_str(body);
            data.push('\n');
        }
        let first = header.len();
        let dictionary = format!(
            "99 0 obj\n<< /Type {kind} /N {} /First {first} /Filter /FlateDecode >>\nstream\r\n",
            objects.len()
        );
        let mut out = b"%PDF-1.7\n".to_vec();
        out.extend_from_slice(dictionary.as_bytes());
        out.extend(miniz_oxide::deflate::compress_to_vec_zlib((header + &data).as_bytes(), 6));
        out.extend_from_slice(b"\r\nendstream\nendobj\ntrailer\n<< /Root 1 0 R >>\n");
        out
    }

    fn most(pdf: &[u8]) -> usize {
        pages_or_most(pdf, &Inflation::new(MAX_INFLATED_BYTES))
    }

    #[test]
    fn a_pdf_is_held_by_its_pages() {
        let per_page = PAGE_TEXT_TOKENS + IMAGE_PART_TOKENS;
        let data = format!("data:application/pdf;base64,{}", b64(&pdf(3)));
        assert_eq!(file(json!({"type": "file", "file": {"file_data": data}})), 3 * per_page);
        assert_eq!(file(json!({"type": "input_file", "file_data": data})), 3 * per_page);
        let source = json!({"type": "base64", "media_type": "application/pdf", "data": b64(&pdf(2))});
        assert_eq!(file(json!({"type": "document", "source": source})), 2 * per_page);
        // A tree compressed in an object stream is walked too.
        assert_eq!(pages(&packed(&tree(4), "/ObjStm")), Some(4));
        // A tree that cannot be walked (no catalog; a stream that cannot be inflated) may hide
        // pages: its page objects, at least the most a provider reads.
        let broken = b"%PDF-1.7\n/Type /Page\n5 0 obj << /Type /ObjStm >> stream\nnot zlib\nendstream".to_vec();
        assert_eq!(pages(&broken), None);
        assert_eq!(most(&broken), MAX_FILE_PAGES);
        assert_eq!(most(b"%PDF-1.4\n<< /Type /Pages >>"), MAX_FILE_PAGES);
        // A prompt's PDFs share one budget: once a stream passes it, the next are not inflated.
        let budget = Inflation::new(MAX_INFLATED_BYTES);
        let mut bomb = b"%PDF-1.7\n5 0 obj << /Type /ObjStm >>\nstream\n".to_vec();
        bomb.extend(miniz_oxide::deflate::compress_to_vec_zlib(&vec![0; MAX_INFLATED_BYTES + 1], 6));
        bomb.extend_from_slice(b"\nendstream\n");
        assert_eq!(pdf_pages(&bomb, &budget), None);
        assert_eq!(budget.get(), 0);
        assert_eq!(pdf_pages(&packed(&tree(4), "/ObjStm"), &budget), None);
    }

    #[test]
    fn a_pdf_cannot_hide_its_pages() {
        // Review: a name escape, or pages that do not say their type, read as one page or none.
        let escaped: Vec<(u64, String)> = tree(3)
            .into_iter()
            .map(|(n, body)| (n, body.replace("/Catalog", "/Cat#61log").replace("/Kids", "/K#69ds")))
            .collect();
        assert_eq!(pages(&written(&escaped)), Some(3));
        let untyped: Vec<(u64, String)> =
            tree(5).into_iter().map(|(n, body)| (n, body.replace("/Type /Page ", ""))).collect();
        assert_eq!(pages(&written(&untyped)), Some(5));
        // An object stream whose type is escaped is still one.
        assert_eq!(pages(&packed(&tree(7), "/Obj#53tm")), Some(7));
        // Kids held in another object cannot be read here.
        let indirect = vec![
            (1, "<< /Type /Catalog /Pages 2 0 R >>".to_string()),
            (2, "<< /Type /Pages /Kids 9 0 R >>".to_string()),
            (9, "[3 0 R]".to_string()),
            (3, "<< /Type /Page >>".to_string()),
        ];
        assert_eq!(pages(&written(&indirect)), None);
        // A tree that names itself is walked once.
        let cycle = vec![
            (1, "<< /Type /Catalog /Pages 2 0 R >>".to_string()),
            (2, "<< /Type /Pages /Kids [2 0 R 3 0 R] >>".to_string()),
            (3, "<< /Type /Page >>".to_string()),
        ];
        assert_eq!(pages(&written(&cycle)), Some(1));
        // What a content stream holds is not an object.
        let mut drawn = pdf(1);
        drawn.extend_from_slice(
            b"9 0 obj << /Length 40 >>\nstream\n4 0 obj << /Type /Page >> endobj\nendstream\nendobj\n",
        );
        assert_eq!(pages(&drawn), Some(1));
        // A literal `#` outside a name (a title) is left as it is.
        assert_eq!(decode_names(b"(C#12) /A#42"), std::borrow::Cow::<[u8]>::Owned(b"(C#12) /AB".to_vec()));
    }

    #[test]
    fn a_pdf_cannot_hide_its_pages_from_the_tokenizer() {
        // Review: a comment saying `stream`, comments and NULs inside the tree, a header after a
        // newline, each read a 100-page PDF as one page.
        let mut commented = b"%PDF-1.4\n% stream\n".to_vec();
        commented.extend_from_slice(&written(&tree(5))[9..]);
        assert_eq!(pages(&commented), Some(5));
        let split: Vec<(u64, String)> = tree(5)
            .into_iter()
            .map(|(n, body)| (n, body.replace(" 0 R", " 0 %a comment\n\0R").replace("/Type /", "/Type %c\n/")))
            .collect();
        assert_eq!(pages(&written(&split)), Some(5));
        let late = [b"\n".as_slice(), &pdf(5)].concat();
        let data = format!("data:application/pdf;base64,{}", b64(&late));
        assert_eq!(file(json!({"type": "input_file", "file_data": data})), 5 * (PAGE_TEXT_TOKENS + IMAGE_PART_TOKENS));
        // A trailer naming a catalog that is not there (hidden, or missing) is no answer.
        let mut hidden = pdf(1);
        hidden.extend_from_slice(b"trailer << /Root 77 0 R >>\n");
        assert_eq!(pages(&hidden), None);
        // Made to be slow (review: a `/Kids[` scan was quadratic): read in one pass.
        let mut slow = b"%PDF-1.7\n".to_vec();
        slow.extend(b"/Kids[ 1 0 obj ".repeat(40_000));
        assert_eq!(pages(&slow), None);
    }

    #[test]
    fn only_the_page_tree_counts() {
        // Review: every /Kids entry counted as a page, and every revision's page objects: a
        // name tree of 500 destinations made a one-page PDF 501 pages.
        let mut objects = tree(1);
        objects[0].1 = "<< /Type /Catalog /Pages 2 0 R /Names << /Dests 10 0 R >> >>".to_string();
        let leaves: Vec<String> = (0..500).map(|i| format!("{} 0 R", i + 11)).collect();
        objects.push((10, format!("<< /Kids [{}] >>", leaves.join(" "))));
        objects.extend((0..500).map(|i| (i as u64 + 11, "<< /Limits [(a) (b)] /Names [(a) 3 0 R] >>".to_string())));
        assert_eq!(pages(&written(&objects)), Some(1));
        // Inner nodes are not pages.
        let nested = vec![
            (1, "<< /Type /Catalog /Pages 2 0 R >>".to_string()),
            (2, "<< /Type /Pages /Kids [3 0 R 4 0 R] /Count 3 >>".to_string()),
            (3, "<< /Type /Pages /Kids [5 0 R 6 0 R] /Count 2 >>".to_string()),
            (4, "<< /Type /Page >>".to_string()),
            (5, "<< /Type /Page >>".to_string()),
            (6, "<< /Type /Page >>".to_string()),
        ];
        assert_eq!(pages(&written(&nested)), Some(3));
        // An incremental update redefines objects: the last definition holds.
        let mut updated = pdf(3);
        updated.extend_from_slice(&written(&tree(3)[1..]));
        updated.extend_from_slice(&written(&tree(3)[1..]));
        assert_eq!(pages(&updated), Some(3));
    }

    #[test]
    fn unseen_files_are_held_at_the_most_pages() {
        let most = MAX_FILE_PAGES * (PAGE_TEXT_TOKENS + IMAGE_PART_TOKENS);
        assert_eq!(file(json!({"type": "file", "file": {"file_id": "file-1"}})), most);
        assert_eq!(file(json!({"type": "input_file", "file_url": "https://x/a.pdf"})), most);
        assert_eq!(file(json!({"type": "document", "source": {"type": "url", "url": "https://x"}})), most);
        let unreadable = format!("data:application/pdf;base64,{}", b64(b"%PDF-1.7 nothing"));
        assert_eq!(file(json!({"type": "input_file", "file_data": unreadable})), most);
    }

    #[test]
    fn other_files_are_their_text() {
        let text = format!("data:text/plain;base64,{}", b64(b"hello there"));
        assert_eq!(file(json!({"type": "input_file", "file_data": text})), "hello there".len());
        let binary = format!("data:application/octet-stream;base64,{}", b64(&[0xFF, 0xFE, 0x00]));
        assert_eq!(file(json!({"type": "input_file", "file_data": binary})), 3);
        let plain = json!({"type": "document", "source": {"type": "text", "data": "abc"}});
        assert_eq!(file(plain), 3);
        let content = json!({"type": "document", "source": {"type": "content", "content": [{}, {}]}});
        assert_eq!(file(content), 14);
        // Wrapped base64 decodes too.
        let wrapped = b64(b"a line of text").chars().enumerate().fold(String::new(), |mut s, (i, c)| {
            if i > 0 && i % 4 == 0 {
                s.push('\n');
            }
            s.push(c);
            s
        });
        assert_eq!(file(json!({"type": "input_file", "file_data": wrapped})), "a line of text".len());
    }
}
