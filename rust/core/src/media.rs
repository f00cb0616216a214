//! What a prompt's media parts are held at, in prompt tokens. The gateway runs no provider's own
//! accounting (it does not decode images or render pages), so each part is held at a bound read
//! cheaply from what it carries:
//! - an image: the model's configured tokens per image (`image_tokens`: what its provider bills at
//!   most for one image as it scales it);
//! - audio: its length (a WAV's header, else its size at 8 kbit/s, the lowest plausible bitrate) at
//!   AUDIO_TOKENS_PER_SECOND;
//! - a file: a PDF at PAGE_TEXT_TOKENS plus one image per page (Anthropic and OpenAI bill a page as
//!   its text and its picture), its pages counted from its page objects, object streams included;
//!   other data as its text (or a token a byte, if it is not text); a file named by id or URL, whose
//!   bytes the gateway does not see, or a PDF whose pages cannot be read, at MAX_FILE_PAGES pages.

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
    if bytes.starts_with(b"%PDF") {
        return Ok(pdf_pages(&bytes, inflation).unwrap_or(MAX_FILE_PAGES).saturating_mul(per_page));
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

/// A RIFF/WAVE file's audio bytes and bytes per second, from its header; None for anything else.
/// The header gives the rate twice (its byte rate, and the sample rate times the frame size): the
/// slower of the two, so that a byte rate that lies cannot shorten the length held.
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
                let sample_rate = le32(pos + 12)?;
                let declared = le32(pos + 16)?;
                let block_align = le16(pos + 20)?;
                byte_rate = [declared, sample_rate * block_align].into_iter().filter(|&r| r > 0).min()?;
            }
            b"data" => {
                let size = length.min(data.len() - pos - 8);
                return (byte_rate > 0).then_some((size, byte_rate));
            }
            _ => {}
        }
        pos = pos.checked_add(8 + length + (length & 1))?;
    }
    None
}

/// A PDF's pages, read as a renderer finds them: its page objects (`/Type /Page`) and the entries
/// of its page tree's `/Kids` arrays (a page need not say its type), in the object text outside
/// its streams and in its object streams (PDF 1.5), inflated; names with `#` escapes decoded first
/// (`/P#61ge` is `/Page`). The larger of the two counts (the tree's inner nodes are kids too: a few
/// pages more, never fewer). None when it shows no page (the caller holds it at MAX_FILE_PAGES); at
/// least MAX_FILE_PAGES when part of it cannot be read: an object stream that cannot be inflated
/// (not Flate, encrypted, or past the prompt's budget) or a `/Kids` array held elsewhere.
pub fn pdf_pages(pdf: &[u8], inflation: &Inflation) -> Option<usize> {
    let mut tree = PageTree::default();
    let mut at = 0;
    while let Some(stream) = next_stream(pdf, at) {
        tree.read(&pdf[at..stream.keyword]);
        // The stream's dictionary: the object text since its `obj`.
        let opened = memmem::rfind(&pdf[at..stream.keyword], b"obj").map_or(at, |i| at + i);
        if memmem::find(&decode_names(&pdf[opened..stream.keyword]), b"/ObjStm").is_some() {
            match miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(stream.body(pdf), inflation.get()) {
                Ok(inflated) => {
                    inflation.set(inflation.get() - inflated.len());
                    tree.read(&inflated);
                }
                Err(_) => {
                    // Past the budget (or not zlib): the rest of the prompt inflates nothing more.
                    inflation.set(0);
                    tree.unread = true;
                }
            }
        }
        at = stream.end;
    }
    tree.read(&pdf[at..]);
    tree.pages()
}

/// What a PDF's object text says of its page tree.
#[derive(Default)]
struct PageTree {
    page_objects: usize,
    kids: usize,
    unread: bool,
}

impl PageTree {
    fn read(&mut self, text: &[u8]) {
        let text = decode_names(text);
        self.page_objects += page_objects(&text);
        for at in names(&text, b"/Kids") {
            let rest = text[at..].trim_ascii_start();
            match rest.strip_prefix(b"[") {
                // An array of indirect references (`5 0 R`): its entries are its R keywords.
                Some(array) => {
                    let array = &array[..memchr::memchr(b']', array).unwrap_or(array.len())];
                    self.kids += array.split(|b| b.is_ascii_whitespace()).filter(|token| *token == b"R").count();
                }
                None => self.unread = true, // an indirect array: held in another object
            }
        }
    }

    fn pages(&self) -> Option<usize> {
        match (self.page_objects.max(self.kids), self.unread) {
            (0, false) => None,
            (n, true) => Some(n.max(MAX_FILE_PAGES)),
            (n, false) => Some(n),
        }
    }
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
        let ends_another = pdf[..keyword].ends_with(b"end");
        if ends_another || !matches!(pdf.get(after), Some(b'\r' | b'\n')) {
            search = after;
            continue;
        }
        let start = after + pdf[after..].iter().take(2).take_while(|&&b| b == b'\r' || b == b'\n').count();
        let stop = memmem::find(&pdf[start..], b"endstream").map_or(pdf.len(), |i| start + i);
        let end = (stop + b"endstream".len()).min(pdf.len());
        return Some(Stream { keyword, start, stop, end });
    }
}

/// `text` with the `#xx` escapes in its names decoded (`/P#61ge` is `/Page`); unchanged (and not
/// copied) when it has none.
fn decode_names(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if memchr::memchr(b'#', text).is_none() {
        return std::borrow::Cow::Borrowed(text);
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let mut in_name = false;
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        if b == b'/' {
            in_name = true;
        } else if !is_regular(b) {
            in_name = false;
        } else if in_name && b == b'#' {
            if let (Some(high), Some(low)) =
                (text.get(i + 1).and_then(|&c| hex(c)), text.get(i + 2).and_then(|&c| hex(c)))
            {
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
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
    }

    fn pdf(page_objects: usize) -> Vec<u8> {
        let mut out = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 2 >> endobj\n".to_vec();
        for i in 0..page_objects {
            out.extend_from_slice(format!("{} 0 obj << /Type /Page /Parent 1 0 R >> endobj\n", i + 2).as_bytes());
        }
        out
    }

    #[test]
    fn a_pdf_is_held_by_its_pages() {
        let per_page = PAGE_TEXT_TOKENS + IMAGE_PART_TOKENS;
        let data = format!("data:application/pdf;base64,{}", b64(&pdf(3)));
        assert_eq!(file(json!({"type": "file", "file": {"file_data": data}})), 3 * per_page);
        assert_eq!(file(json!({"type": "input_file", "file_data": data})), 3 * per_page);
        let source = json!({"type": "base64", "media_type": "application/pdf", "data": b64(&pdf(2))});
        assert_eq!(file(json!({"type": "document", "source": source})), 2 * per_page);
        // Page objects compressed in an object stream count too.
        let mut packed = b"%PDF-1.7\n5 0 obj << /Type /ObjStm /N 4 /Filter /FlateDecode >>\nstream\r\n".to_vec();
        packed.extend(miniz_oxide::deflate::compress_to_vec_zlib(&pdf(4), 6));
        packed.extend_from_slice(b"\r\nendstream\nendobj\n");
        assert_eq!(pages(&packed), Some(4));
        // A stream that cannot be inflated may hide pages: the most a provider reads.
        let broken = b"%PDF-1.7\n/Type /Page\n/ObjStm stream\nnot zlib\nendstream".to_vec();
        assert_eq!(pages(&broken), Some(MAX_FILE_PAGES));
        assert_eq!(pages(b"%PDF-1.4\n<< /Type /Pages >>"), None);
        // A prompt's PDFs share one budget: once a stream passes it, the next are not inflated.
        let budget = Inflation::new(MAX_INFLATED_BYTES);
        let mut bomb = b"%PDF-1.7\n/ObjStm stream\n".to_vec();
        bomb.extend(miniz_oxide::deflate::compress_to_vec_zlib(&vec![0; MAX_INFLATED_BYTES + 1], 6));
        bomb.extend_from_slice(b"\nendstream\n/Type /Page\n");
        assert_eq!(pdf_pages(&bomb, &budget), Some(MAX_FILE_PAGES));
        assert_eq!(budget.get(), 0);
        assert_eq!(pdf_pages(&packed, &budget), Some(MAX_FILE_PAGES));
    }

    #[test]
    fn a_pdf_cannot_hide_its_pages() {
        // Review: a name escape, or pages that do not say their type, read as one page or none.
        let escaped = b"%PDF-1.4\n2 0 obj << /Type /P#61ge >> endobj\n3 0 obj << /Ty#70e /Page >> endobj\n";
        assert_eq!(pages(escaped), Some(2));
        let untyped = b"%PDF-1.4\n1 0 obj << /Type /Pages /Kids [2 0 R 3 0 R\n4 0 R] /Count 1 >> endobj\n\
            2 0 obj << /Parent 1 0 R >> endobj 3 0 obj << >> endobj 4 0 obj << >> endobj";
        assert_eq!(pages(untyped), Some(3));
        // A tree of two levels: its inner node counts too, never fewer than the pages.
        let nested = b"1 0 obj << /Type /Pages /Kids [2 0 R] >> 2 0 obj << /Type /Pages /Kids [3 0 R 4 0 R] >>\
            3 0 obj << /Type /Page >> 4 0 obj << /Type /Page >>";
        assert_eq!(pages(nested), Some(3));
        // Kids held in another object cannot be read here.
        assert_eq!(
            pages(b"1 0 obj << /Type /Pages /Kids 5 0 R >> endobj 2 0 obj << /Type /Page >>"),
            Some(MAX_FILE_PAGES)
        );
        // An object stream whose type is escaped is still one.
        let mut packed = b"%PDF-1.7\n5 0 obj << /Type /Obj#53tm /Filter /FlateDecode >>\nstream\n".to_vec();
        packed.extend(miniz_oxide::deflate::compress_to_vec_zlib(&pdf(7), 6));
        packed.extend_from_slice(b"\nendstream\nendobj\n");
        assert_eq!(pages(&packed), Some(7));
        // What a content stream or an image happens to hold is not a page.
        let drawn = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n2 0 obj << /Length 40 >>\nstream\n/Type /Page /Type /Page /Kids [1 0 R]\nendstream\nendobj";
        assert_eq!(pages(drawn), Some(1));
        // A literal `#` outside a name (a title) is left as it is.
        assert_eq!(decode_names(b"(C#12) /A#42"), std::borrow::Cow::<[u8]>::Owned(b"(C#12) /AB".to_vec()));
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
