//! Idempotency fingerprints: a stable digest of method, path and body.
//!
//! Two requests that mean the same thing must get the same fingerprint, so JSON bodies are
//! canonicalised (keys sorted, whitespace dropped; under any Content-Type but multipart's, as the
//! gateway reads them) and multipart bodies are reduced to their parts,
//! sorted by name (the boundary is random per request in every client library, and clients order
//! fields differently; repeated fields keep their order). Anything else is hashed byte for
//! byte. Each piece is length-prefixed so that no two different inputs can run together.

use crate::error::{CoreError, Result};
use crate::multipart;
use serde_json::Value;

const DOMAIN: &[u8] = b"gateway idempotency fingerprint v1";

struct Writer(blake3::Hasher);

impl Writer {
    fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }
}

pub fn fingerprint(
    method: &str,
    path: &str,
    body: &[u8],
    content_type: Option<&str>,
    key: Option<&[u8]>,
) -> Result<String> {
    let hasher = match key {
        None => blake3::Hasher::new(),
        Some(k) => {
            let k: &[u8; 32] = k.try_into().map_err(|_| {
                CoreError::InvalidArgument(format!("the fingerprint key must be 32 bytes, not {}", k.len()))
            })?;
            blake3::Hasher::new_keyed(k)
        }
    };
    let mut w = Writer(hasher);
    w.field(DOMAIN);
    w.field(method.to_ascii_uppercase().as_bytes());
    w.field(path.as_bytes());
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    if ct.starts_with("multipart/form-data") {
        if let Some(mut parts) =
            multipart::boundary(content_type.unwrap_or("")).and_then(|b| multipart::parts(body, &b))
        {
            w.field(b"multipart");
            // Fields of different names mean the same in any order, as a JSON object's keys do;
            // the order of repeated ones (`image[]`, several images) is kept: a stable sort.
            parts.sort_by(|a, b| a.name.cmp(&b.name));
            for part in parts {
                w.field(part.name.as_bytes());
                w.field(part.filename.as_deref().unwrap_or("").as_bytes());
                w.field(part.content_type.as_deref().unwrap_or("").as_bytes());
                w.field(part.content);
            }
            return Ok(w.0.finalize().to_hex().to_string());
        }
    }
    // Whatever else its Content-Type says: the gateway reads a JSON body as JSON under any type
    // (review: the same body sent again as text/plain, as curl's -d does, got idempotency_key_reused).
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let mut canonical = Vec::with_capacity(body.len());
        write_canonical(&value, &mut canonical);
        w.field(b"json");
        w.field(&canonical);
        return Ok(w.0.finalize().to_hex().to_string());
    }
    w.field(b"bytes");
    w.field(body);
    Ok(w.0.finalize().to_hex().to_string())
}

/// Compact JSON with object keys sorted, whatever serde_json's map order is in this build.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => write_json(scalar, out),
    }
}

fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Writing a string or scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(body: &[u8], ct: Option<&str>) -> String {
        fingerprint("POST", "/v1/images/generations", body, ct, None).unwrap()
    }

    #[test]
    fn json_order_and_whitespace_do_not_matter() {
        let a = fp(br#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#, Some("application/json"));
        let b = fp(b"{ \"a\" : {\"x\":\"s\", \"y\" : [1, 2]},\n\"b\": 1 }", Some("application/json; charset=utf-8"));
        assert_eq!(a, b);
        assert_ne!(a, fp(br#"{"b":2,"a":{"y":[1,2],"x":"s"}}"#, Some("application/json")));
        assert_ne!(a, fp(br#"{"b":1,"a":{"y":[2,1],"x":"s"}}"#, Some("application/json")));
    }

    #[test]
    fn method_path_and_key_matter() {
        let body = br#"{"a":1}"#;
        let base = fingerprint("POST", "/a", body, None, None).unwrap();
        assert_ne!(base, fingerprint("POST", "/b", body, None, None).unwrap());
        assert_ne!(base, fingerprint("PUT", "/a", body, None, None).unwrap());
        assert_eq!(base, fingerprint("post", "/a", body, None, None).unwrap());
        let keyed = fingerprint("POST", "/a", body, None, Some(&[7u8; 32])).unwrap();
        assert_ne!(base, keyed);
        assert_eq!(keyed.len(), 64);
        assert!(fingerprint("POST", "/a", body, None, Some(&[7u8; 31])).is_err());
    }

    #[test]
    fn raw_bodies_by_bytes() {
        assert_ne!(fp(b"abc", Some("audio/wav")), fp(b"abd", Some("audio/wav")));
        assert_eq!(fp(b"{not json", Some("application/json")), fp(b"{not json", Some("application/json")));
        // JSON is JSON under any type but multipart's: the gateway reads it so.
        let json = fp(b"{\"a\":1}", Some("application/json"));
        for ct in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
            assert_eq!(fp(b"{\"a\": 1}", ct), json);
        }
    }

    fn form(boundary: &str, fields: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, filename, content) in fields {
            out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            match filename {
                Some(f) => out.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: image/png\r\n\r\n").as_bytes(),
                ),
                None => out.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
            }
            out.extend_from_slice(content);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        out
    }

    #[test]
    fn multipart_boundary_does_not_matter() {
        let fields: &[(&str, Option<&str>, &[u8])] =
            &[("prompt", None, b"a cat"), ("image", Some("cat.png"), b"\x89PNG\r\n\x00\xff")];
        let a = fp(&form("abc123", fields), Some("multipart/form-data; boundary=abc123"));
        let b = fp(&form("zz-99", fields), Some("multipart/form-data; boundary=\"zz-99\""));
        assert_eq!(a, b);
        let other: &[(&str, Option<&str>, &[u8])] =
            &[("prompt", None, b"a dog"), ("image", Some("cat.png"), b"\x89PNG\r\n\x00\xff")];
        assert_ne!(a, fp(&form("abc123", other), Some("multipart/form-data; boundary=abc123")));
        let body = form("b", fields);
        let parts = multipart::parts(&body, "b").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].filename.as_deref(), Some("cat.png"));
        assert_eq!(parts[1].content_type.as_deref(), Some("image/png"));
        assert_eq!(parts[1].content, b"\x89PNG\r\n\x00\xff");
    }

    #[test]
    fn multipart_field_order_does_not_matter_but_repeated_fields_keep_theirs() {
        let ct = Some("multipart/form-data; boundary=b");
        let a: &[(&str, Option<&str>, &[u8])] = &[
            ("prompt", None, b"a cat"),
            ("model", None, b"m"),
            ("image[]", Some("1.png"), b"1"),
            ("image[]", Some("2.png"), b"2"),
        ];
        let b: &[(&str, Option<&str>, &[u8])] = &[
            ("image[]", Some("1.png"), b"1"),
            ("model", None, b"m"),
            ("image[]", Some("2.png"), b"2"),
            ("prompt", None, b"a cat"),
        ];
        assert_eq!(fp(&form("b", a), ct), fp(&form("b", b), ct));
        let swapped: &[(&str, Option<&str>, &[u8])] = &[
            ("prompt", None, b"a cat"),
            ("model", None, b"m"),
            ("image[]", Some("2.png"), b"2"),
            ("image[]", Some("1.png"), b"1"),
        ];
        assert_ne!(fp(&form("b", a), ct), fp(&form("b", swapped), ct));
    }

    #[test]
    fn broken_multipart_falls_back_to_bytes() {
        assert!(multipart::parts(b"--b\r\nno head end", "b").is_none());
        let a = fp(b"--b\r\nbroken", Some("multipart/form-data; boundary=b"));
        assert_eq!(a, fp(b"--b\r\nbroken", Some("multipart/form-data; boundary=b")));
    }

    proptest! {
        #[test]
        fn canonical_json_is_stable_under_reordering(pairs in proptest::collection::btree_map("[a-z]{1,6}", any::<i32>(), 0..10)) {
            let forward: serde_json::Map<String, Value> = pairs.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect();
            let mut text_rev = String::from("{");
            for (i, (k, v)) in pairs.iter().rev().enumerate() {
                if i > 0 { text_rev.push_str(" ,\n "); }
                text_rev.push_str(&format!("{k:?} : {v}"));
            }
            text_rev.push('}');
            prop_assert_eq!(fp(Value::Object(forward).to_string().as_bytes(), None), fp(text_rev.as_bytes(), None));
        }
    }
}
