//! multipart/form-data bodies: the parts, borrowed from the body (RFC 7578).

use memchr::memmem;

/// The boundary parameter of a multipart content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (_, params) = content_type.split_once(';')?;
    header_params(params)
        .find_map(|(name, value)| (name.eq_ignore_ascii_case("boundary") && !value.is_empty()).then_some(value))
}

/// The `name=value` parameters after a header's first `;` (RFC 7231 / 7578): names are
/// case-insensitive (compare with eq_ignore_ascii_case); a value may be a quoted string, in which
/// a `;` is part of the value and a backslash escapes the next character.
fn header_params(params: &str) -> impl Iterator<Item = (&str, String)> {
    let mut rest = params;
    std::iter::from_fn(move || loop {
        rest = rest.trim_start_matches(|c: char| c == ';' || c.is_ascii_whitespace());
        if rest.is_empty() {
            return None;
        }
        let name_end = rest.find(['=', ';']).unwrap_or(rest.len());
        let name = rest.get(..name_end)?.trim();
        rest = rest.get(name_end..)?;
        let Some(after_eq) = rest.strip_prefix('=') else {
            continue; // a parameter without a value, as a bare `form-data`
        };
        let after_eq = after_eq.trim_start();
        let mut value = String::new();
        if let Some(quoted) = after_eq.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    _ => value.push(c),
                }
            }
            rest = quoted.get(end..).unwrap_or_default();
        } else {
            let end = after_eq.find(';').unwrap_or(after_eq.len());
            value.push_str(after_eq.get(..end)?.trim_end());
            rest = after_eq.get(end..)?;
        }
        return Some((name, value));
    })
}

pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub content: &'a [u8],
}

/// The parts of a multipart/form-data body, or None when it is not well formed.
pub fn parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delimiter = format!("--{boundary}");
    let first = memmem::find(body, delimiter.as_bytes())?;
    let next_delimiter = format!("\r\n--{boundary}");
    let finder = memmem::Finder::new(next_delimiter.as_bytes());
    let mut pos = first + delimiter.len();
    let mut parts = Vec::new();
    loop {
        let rest = body.get(pos..)?;
        if rest.starts_with(b"--") {
            return Some(parts); // the closing delimiter
        }
        let rest = rest.strip_prefix(b"\r\n")?;
        let head_end = memmem::find(rest, b"\r\n\r\n")?;
        // Lossy: a filename in another charset (raw Latin-1 bytes, as some clients send) is not a
        // malformed body; its bytes become U+FFFD.
        let head = String::from_utf8_lossy(rest.get(..head_end)?);
        let content_start = head_end + 4;
        let content_len = finder.find(rest.get(content_start..)?)?;
        let content = rest.get(content_start..content_start + content_len)?;
        let mut part = Part { name: String::new(), filename: None, content_type: None, content };
        for line in head.split("\r\n") {
            let (name, value) = line.split_once(':')?;
            if name.trim().eq_ignore_ascii_case("content-disposition") {
                let params = value.split_once(';').map_or("", |(_, params)| params);
                let mut extended = None;
                for (k, v) in header_params(params) {
                    if k.eq_ignore_ascii_case("name") {
                        part.name = v;
                    } else if k.eq_ignore_ascii_case("filename") {
                        part.filename = Some(v);
                    } else if k.eq_ignore_ascii_case("filename*") {
                        extended = ext_value(&v);
                    }
                }
                // RFC 6266: `filename*` (RFC 8187's charset'lang'%-encoded form), when readable,
                // is the name; `filename` is the fallback for those who cannot read it.
                if extended.is_some() {
                    part.filename = extended;
                }
            } else if name.trim().eq_ignore_ascii_case("content-type") {
                part.content_type = Some(value.trim().to_owned());
            }
        }
        parts.push(part);
        // Skip the part's content and the CRLF that starts the next delimiter.
        pos = (body.len() - rest.len()) + content_start + content_len + next_delimiter.len();
    }
}

/// An RFC 8187 extended value (`UTF-8''%e2%82%ac%20rates.txt`), decoded; None when it is not one
/// (a charset other than UTF-8 or ISO-8859-1, a malformed escape).
fn ext_value(value: &str) -> Option<String> {
    let mut fields = value.splitn(3, '\'');
    let (charset, _language, encoded) = (fields.next()?, fields.next()?, fields.next()?);
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut rest = encoded.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = tail.get(2..)?;
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    if charset.eq_ignore_ascii_case("utf-8") {
        Some(String::from_utf8_lossy(&bytes).into_owned())
    } else if charset.eq_ignore_ascii_case("iso-8859-1") {
        Some(bytes.iter().map(|&b| char::from(b)).collect())
    } else {
        None
    }
}

/// The parts of a multipart/form-data body given its content type.
pub fn parse<'a>(body: &'a [u8], content_type: &str) -> Option<Vec<Part<'a>>> {
    parts(body, &boundary(content_type)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_files() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--not-the-end\r\n--XyZ--\r\n";
        let parts = parse(body, "multipart/form-data; boundary=XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].name.as_str(), parts[0].content), ("model", &b"whisper-1"[..]));
        assert_eq!(parts[1].filename.as_deref(), Some("a b.wav"));
        assert_eq!(parts[1].content_type.as_deref(), Some("audio/wav"));
        assert_eq!(parts[1].content, b"RIFF\r\n--not-the-end");
    }

    #[test]
    fn quoted_values_keep_semicolons_and_escapes() {
        let body =
            b"--b\r\nContent-Disposition: form-data; NAME=\"file\"; filename=\"a;b \\\"c\\\".wav\"\r\n\r\nx\r\n--b--";
        let parts = parse(body, "multipart/form-data; Boundary=\"b\"").unwrap();
        assert_eq!(parts[0].name, "file");
        assert_eq!(parts[0].filename.as_deref(), Some("a;b \"c\".wav"));
        assert_eq!(boundary("multipart/form-data; charset=utf-8; boundary=x;y").as_deref(), Some("x"));
        assert_eq!(boundary("multipart/form-data; boundary=\"\""), None);
        let params: Vec<_> = header_params(" form-data ; a ; b=\"unterminated").collect();
        assert_eq!(params, [("b", "unterminated".to_owned())]);
    }

    #[test]
    fn filenames_in_other_charsets_and_the_extended_form() {
        // Raw Latin-1 bytes in a filename: the body is well formed, the bytes become U+FFFD.
        let latin = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"caf\xe9.wav\"\r\n\r\nx\r\n--b--";
        let parts = parse(latin, "multipart/form-data; boundary=b").unwrap();
        assert_eq!(parts[0].filename.as_deref(), Some("caf\u{fffd}.wav"));
        // RFC 8187's filename*, alone or beside a plain fallback, which it replaces.
        for disposition in [
            "form-data; name=\"file\"; filename*=UTF-8''%e2%82%ac%20rates.wav",
            "form-data; name=\"file\"; filename=\"EUR rates.wav\"; filename*=utf-8'en'%E2%82%AC%20rates.wav",
        ] {
            let body = format!("--b\r\nContent-Disposition: {disposition}\r\n\r\nx\r\n--b--");
            let parts = parse(body.as_bytes(), "multipart/form-data; boundary=b").unwrap();
            assert_eq!(parts[0].filename.as_deref(), Some("\u{20ac} rates.wav"), "{disposition}");
        }
        assert_eq!(ext_value("iso-8859-1''caf%E9.wav").as_deref(), Some("caf\u{e9}.wav"));
        assert_eq!(ext_value("koi8-r''x"), None);
        assert_eq!(ext_value("UTF-8''%zz"), None);
        assert_eq!(ext_value("no quotes"), None);
    }

    proptest::proptest! {
        #[test]
        fn any_header_never_panics(header in ".{0,80}") {
            let _ = header_params(&header).count();
            let _ = boundary(&header);
        }
    }

    #[test]
    fn malformed() {
        assert!(parse(b"--XyZ\r\nno end of head", "multipart/form-data; boundary=XyZ").is_none());
        assert!(parse(b"whatever", "multipart/form-data").is_none());
        assert!(parse(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nunterminated",
            "multipart/form-data; boundary=XyZ"
        )
        .is_none());
    }
}
