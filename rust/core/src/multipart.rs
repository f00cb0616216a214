//! multipart/form-data bodies: the parts, borrowed from the body (RFC 7578).

use memchr::memmem;

/// The boundary parameter of a multipart content type.
pub fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = value.trim();
        let v = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v);
        (!v.is_empty()).then(|| v.to_owned())
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
        let head = std::str::from_utf8(rest.get(..head_end)?).ok()?;
        let content_start = head_end + 4;
        let content_len = finder.find(rest.get(content_start..)?)?;
        let content = rest.get(content_start..content_start + content_len)?;
        let mut part = Part { name: String::new(), filename: None, content_type: None, content };
        for line in head.split("\r\n") {
            let (name, value) = line.split_once(':')?;
            if name.trim().eq_ignore_ascii_case("content-disposition") {
                for param in value.split(';').skip(1) {
                    if let Some((k, v)) = param.split_once('=') {
                        let v = v.trim();
                        let v = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v).to_owned();
                        match k.trim() {
                            "name" => part.name = v,
                            "filename" => part.filename = Some(v),
                            _ => {}
                        }
                    }
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
