//! Exact BPE token counts with the bundled o200k_base and cl100k_base vocabularies.
//!
//! tiktoken-rs is OpenAI's tiktoken core ported to a crate. bpe-openai counts a little faster but
//! keeps 70 MB resident per o200k_base vocabulary against tiktoken-rs's 28 MB, and memory is a
//! target of this gateway; the tests cross-check the two, and the Python tests check against
//! OpenAI's own tiktoken.

use crate::error::{CoreError, Result};
use serde::Deserialize;
use serde_json::Value;
use std::str::FromStr;
use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl FromStr for Encoding {
    type Err = CoreError;
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "o200k_base" => Ok(Encoding::O200kBase),
            "cl100k_base" => Ok(Encoding::Cl100kBase),
            other => Err(CoreError::UnknownEncoding(other.to_owned())),
        }
    }
}

static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();

impl Encoding {
    /// The vocabulary, loaded on first use (about 0.2 s) and kept for the life of the process.
    fn bpe(self) -> Result<&'static CoreBPE> {
        let loaded = match self {
            Encoding::O200kBase => O200K.get_or_init(|| tiktoken_rs::o200k_base().ok()),
            Encoding::Cl100kBase => CL100K.get_or_init(|| tiktoken_rs::cl100k_base().ok()),
        };
        loaded.as_ref().ok_or_else(|| CoreError::InvalidArgument(format!("the {self:?} vocabulary failed to load")))
    }
}

pub fn count_tokens(text: &str, encoding: Encoding) -> Result<usize> {
    if text.is_empty() {
        return Ok(0);
    }
    Ok(encoding.bpe()?.encode_ordinary(text).len())
}

/// OpenAI's accounting for chat prompts: per message 3 tokens plus every string field's tokens
/// (+1 for a name), text parts of array contents, tool-call names and arguments; 3 to prime the reply.
pub const TOKENS_PER_MESSAGE: usize = 3;
pub const TOKENS_PER_NAME: usize = 1;
pub const REPLY_PRIMING: usize = 3;

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Value>,
}

pub fn count_chat_tokens(body: &[u8], encoding: Encoding) -> Result<usize> {
    // serde would also read the struct from an array; only an object is a request body.
    if !crate::json::starts_object(body) {
        return Err(CoreError::InvalidJson("expected an object with a \"messages\" array".into()));
    }
    let parsed: ChatBody = serde_json::from_slice(body)
        .map_err(|e| CoreError::InvalidJson(format!("expected an object with a \"messages\" array: {e}")))?;
    let mut total = REPLY_PRIMING;
    for (i, message) in parsed.messages.iter().enumerate() {
        let Value::Object(fields) = message else {
            return Err(CoreError::InvalidJson(format!("messages[{i}] is not an object")));
        };
        total += TOKENS_PER_MESSAGE;
        for (key, value) in fields {
            match value {
                Value::String(s) => {
                    total += count_tokens(s, encoding)?;
                    if key == "name" {
                        total += TOKENS_PER_NAME;
                    }
                }
                Value::Array(parts) if key == "content" => {
                    for part in parts {
                        if let Some(Value::String(text)) = part.get("text") {
                            total += count_tokens(text, encoding)?;
                        }
                    }
                }
                Value::Array(calls) if key == "tool_calls" => {
                    for call in calls {
                        for field in ["name", "arguments"] {
                            if let Some(Value::String(s)) = call.get("function").and_then(|f| f.get(field)) {
                                total += count_tokens(s, encoding)?;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub const CORPUS: &[&str] = &[
        "",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "日本語のテキストとカタカナ、ひらがな。中文也可以。한국어 문장입니다.",
        "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦",
        "    leading spaces\n\n\ttabs\r\n  trailing   ",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "1234567890 3.14159 -42 1e10 0x1F 100,000,000",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "<|endoftext|> is text here, not a special token",
        "It's we've they'll I'd you're DON'T",
        "Ünïcödé façade naïve café résumé",
        "    \n    \n\n\n   x",
        "مرحبا بالعالم שלום עולם",
    ];

    /// An independent implementation (GitHub's bpe-openai) to cross-check against.
    fn other(encoding: Encoding, text: &str) -> usize {
        match encoding {
            Encoding::O200kBase => bpe_openai::o200k_base().count(text),
            Encoding::Cl100kBase => bpe_openai::cl100k_base().count(text),
        }
    }

    fn count(text: &str, e: Encoding) -> usize {
        count_tokens(text, e).unwrap()
    }

    /// Long runs of one character, where BPE implementations most often part ways.
    fn long_runs() -> Vec<String> {
        ["a", " ", "\n", "1", "😀", "ab", "中", ".", "\t ", "x "].iter().map(|s| s.repeat(3_000)).collect()
    }

    #[test]
    fn agrees_with_bpe_openai_on_corpus() {
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for text in CORPUS.iter().copied().map(String::from).chain(long_runs()) {
                assert_eq!(count(&text, encoding), other(encoding, &text), "{encoding:?} {text:?}");
            }
        }
        assert_eq!(count("Hello, world!", Encoding::O200kBase), 4);
        assert_eq!(count("Hello, world!", Encoding::Cl100kBase), 4);
    }

    #[test]
    fn unknown_encoding() {
        assert_eq!("gpt2".parse::<Encoding>(), Err(CoreError::UnknownEncoding("gpt2".into())));
    }

    #[test]
    fn chat_accounting() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","name":"bob","content":[{"type":"text","text":"Hi there"},{"type":"image_url","image_url":{"url":"http://x"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"a\":1}"}}]}]}"#;
        let e = Encoding::O200kBase;
        let expected = 3
            + (3 + count("system", e) + count("You are helpful.", e))
            + (3 + count("user", e) + count("bob", e) + 1 + count("Hi there", e))
            + (3 + count("assistant", e) + count("get", e) + count("{\"a\":1}", e));
        assert_eq!(count_chat_tokens(body, e).unwrap(), expected);
    }

    #[test]
    fn chat_errors() {
        assert!(count_chat_tokens(b"{}", Encoding::O200kBase).is_err());
        assert!(count_chat_tokens(br#"{"messages":["x"]}"#, Encoding::O200kBase).is_err());
        assert!(count_chat_tokens(b"not json", Encoding::O200kBase).is_err());
        assert!(count_chat_tokens(b"[[]]", Encoding::O200kBase).is_err());
        assert!(count_chat_tokens(br#"{"messages":{}}"#, Encoding::O200kBase).is_err());
        assert_eq!(count_chat_tokens(br#" {"messages":[]} "#, Encoding::O200kBase), Ok(REPLY_PRIMING));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn agrees_with_bpe_openai_on_random_text(text in "\\PC{0,60}|[ \\t\\n a-z0-9'.,!]{0,80}") {
            for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
                prop_assert_eq!(count(&text, encoding), other(encoding, &text));
            }
        }
    }
}
