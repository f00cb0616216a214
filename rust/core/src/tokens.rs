//! Exact BPE token counts with the bundled o200k_base and cl100k_base vocabularies.
//!
//! The vocabularies and split patterns are tiktoken's, as the tiktoken-rs crate bundles them
//! (build.rs writes the vocabularies out at build time); text is split into pieces as those
//! patterns split it ([`crate::pretokenize`], ~10x faster than the regex on ASCII text) and the
//! pieces are counted on [`crate::bpe::Vocab`], which holds a vocabulary in a tenth of
//! tiktoken-rs's memory. The tests cross-check against tiktoken-rs and GitHub's bpe-openai, the
//! Python tests against OpenAI's tiktoken.

use crate::bpe::Vocab;
use crate::error::{CoreError, Result};
use crate::media;
use crate::pretokenize::{Pattern, Splitter};
use serde_json::Value;
use std::cell::Cell;
use std::str::FromStr;
use std::sync::OnceLock;

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

/// One encoding: how text splits into pieces and the vocabulary that merges them.
struct Tokenizer {
    splitter: Splitter,
    vocab: Vocab,
}

static O200K: OnceLock<std::result::Result<Tokenizer, String>> = OnceLock::new();
static CL100K: OnceLock<std::result::Result<Tokenizer, String>> = OnceLock::new();

impl Encoding {
    /// The tokenizer, made on first use (a few milliseconds) and kept for the life of the process.
    fn tokenizer(self) -> Result<&'static Tokenizer> {
        let loaded = match self {
            Encoding::O200kBase => O200K.get_or_init(|| self.load()),
            Encoding::Cl100kBase => CL100K.get_or_init(|| self.load()),
        };
        loaded.as_ref().map_err(|e| CoreError::InvalidArgument(format!("the {self:?} vocabulary failed to load: {e}")))
    }

    /// The split pattern, the tokens' bytes and their lengths (written by build.rs).
    fn parts(self) -> (Pattern, &'static [u8], &'static [u8]) {
        macro_rules! vocabulary {
            ($name:literal) => {
                (
                    include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".bytes")).as_slice(),
                    include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".lens")).as_slice(),
                )
            };
        }
        let (pattern, (bytes, lengths)) = match self {
            Encoding::O200kBase => (Pattern::O200k, vocabulary!("o200k_base")),
            Encoding::Cl100kBase => (Pattern::Cl100k, vocabulary!("cl100k_base")),
        };
        (pattern, bytes, lengths)
    }

    fn load(self) -> std::result::Result<Tokenizer, String> {
        let (pattern, bytes, lengths) = self.parts();
        Ok(Tokenizer { splitter: Splitter::new(pattern)?, vocab: Vocab::new(bytes, lengths)? })
    }
}

/// The longest piece (a run the pre-tokenizer does not split: one character repeated, a blob with
/// no space) merged exactly. Merging takes about a second a megabyte of such a run, which a hostile
/// body of a few megabytes would make seconds of a worker's time (review: a 9 MB run held a worker
/// 5 s); a longer one is counted a token a byte, the most it can be (every token is a byte or more).
pub const MAX_EXACT_PIECE_BYTES: usize = 1 << 20;

/// The text's tokens, as tiktoken counts them (but for pieces over MAX_EXACT_PIECE_BYTES).
pub fn count_tokens(text: &str, encoding: Encoding) -> Result<usize> {
    if text.is_empty() {
        return Ok(0);
    }
    let tokenizer = encoding.tokenizer()?;
    Ok(tokenizer
        .splitter
        .pieces(text)
        .map(|piece| match piece.len() {
            n if n > MAX_EXACT_PIECE_BYTES => n,
            _ => tokenizer.vocab.count_piece(piece.as_bytes()),
        })
        .sum())
}

/// OpenAI's accounting for chat prompts: per message 3 tokens plus every string field's tokens
/// (+1 for a name), text parts of array contents, tool-call names and arguments; 3 to prime the reply.
/// The gateway adds what else a provider bills as input: image, audio and file parts (crate::media),
/// the message shape's tool blocks, and the request's tools, functions and response_format as JSON.
pub const TOKENS_PER_MESSAGE: usize = 3;
pub const TOKENS_PER_NAME: usize = 1;
pub const REPLY_PRIMING: usize = 3;

/// What else the model reads as prompt and the provider bills as input: tool definitions (and the
/// legacy functions), and a structured output's schema. Counted as their JSON text.
const PROMPT_FIELDS: [&str; 3] = ["tools", "functions", "response_format"];

pub use crate::media::IMAGE_PART_TOKENS;

/// A prompt's tokens as the hold counts them, and of them its audio's (`input_audio` parts), which
/// some models price apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCount {
    pub tokens: usize,
    pub audio_tokens: usize,
}

/// `image_tokens`: what the model is held at for each image part (crate::media).
pub fn count_chat_tokens(body: &[u8], encoding: Encoding, image_tokens: usize) -> Result<usize> {
    count_prompt(body, encoding, image_tokens, 0).map(|count| count.tokens)
}

/// count_chat_tokens, with the audio's share. `spoken_tokens`: what an earlier spoken answer named
/// by id (an assistant message's `"audio": {"id": ...}`, billed again as audio input) is held at,
/// its bytes never passing the gateway: the most audio the model answers with.
pub fn count_prompt(body: &[u8], encoding: Encoding, image_tokens: usize, spoken_tokens: usize) -> Result<PromptCount> {
    const EXPECTED: &str = "expected an object with a \"messages\" array";
    // Read as a map, where a key given twice is its last value, as the gateway's own JSON reader
    // (orjson) takes it: a derived struct refuses a duplicate field (hostile review: a 500). Any
    // other JSON value (an array, which a derived struct also read) is refused below.
    let parsed: Value = serde_json::from_slice(body).map_err(|e| CoreError::InvalidJson(format!("{EXPECTED}: {e}")))?;
    let Value::Object(mut fields) = parsed else {
        return Err(CoreError::InvalidJson(EXPECTED.into()));
    };
    let Some(Value::Array(messages)) = fields.remove("messages") else {
        return Err(CoreError::InvalidJson(EXPECTED.into()));
    };
    let mut total = REPLY_PRIMING;
    let parts = PartCounter {
        encoding,
        image_tokens,
        inflation: media::Inflation::new(media::MAX_INFLATED_BYTES),
        audio_tokens: Cell::new(0),
    };
    for (i, message) in messages.iter().enumerate() {
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
                Value::Array(content) if key == "content" => {
                    for part in content {
                        total += parts.count(part)?;
                    }
                }
                Value::Object(_) if key == "audio" => {
                    total += spoken_tokens;
                    parts.audio_tokens.set(parts.audio_tokens.get().saturating_add(spoken_tokens));
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
    for extra in PROMPT_FIELDS.iter().filter_map(|name| fields.get(*name)) {
        total += count_json(extra, encoding)?;
    }
    Ok(PromptCount { tokens: total, audio_tokens: parts.audio_tokens.get() })
}

/// What counting one prompt's content parts needs: the encoding, what an image is held at, the
/// prompt's one inflation budget (crate::media), and the audio counted so far.
struct PartCounter {
    encoding: Encoding,
    image_tokens: usize,
    inflation: media::Inflation,
    audio_tokens: Cell<usize>,
}

impl PartCounter {
    /// One part of an array content, by its type first: a text part, its text; an image, audio or
    /// a file, as crate::media holds them; the message shape's tool blocks, what they carry (a
    /// call's input as JSON, a result's content, text or parts); a Responses tool output, its
    /// output (text or parts, its images and files held as such); a refusal, its text. Any other
    /// part (a search result, a tool call, a block this count does not know) is counted whole, as
    /// its JSON text: what it carries reaches the model, and the provider bills it. A `text`
    /// beside a part of another type counts too (a translation may drop the key, never the image).
    fn count(&self, part: &Value) -> Result<usize> {
        let encoding = self.encoding;
        let count_blocks = |blocks: &[Value]| -> Result<usize> {
            let mut total = 0;
            for block in blocks {
                total += self.count(block)?;
            }
            Ok(total)
        };
        let said = part.get("text").and_then(Value::as_str);
        let text = said.map_or(Ok(0), |text| count_tokens(text, encoding))?;
        let rest = match part.get("type").and_then(Value::as_str) {
            Some("text" | "input_text" | "output_text") => 0,
            None if said.is_some() => 0,
            Some("image_url" | "image" | "input_image") => self.image_tokens,
            Some("input_audio") => {
                let audio = media::audio_tokens(part);
                self.audio_tokens.set(self.audio_tokens.get().saturating_add(audio));
                audio
            }
            Some("file" | "input_file" | "document") => media::file_tokens(
                part,
                self.image_tokens,
                &self.inflation,
                |text| count_tokens(text, encoding),
                count_blocks,
            )?,
            Some("tool_use") => part.get("input").map_or(Ok(0), |input| count_json(input, encoding))?,
            Some("tool_result") => match part.get("content") {
                Some(Value::String(text)) => count_tokens(text, encoding)?,
                Some(Value::Array(inner)) => count_blocks(inner)?,
                _ => 0,
            },
            Some("function_call_output") => match part.get("output") {
                Some(Value::String(text)) => count_tokens(text, encoding)?,
                Some(Value::Array(inner)) => count_blocks(inner)?,
                _ => count_json(part, encoding)?,
            },
            Some("refusal") => match part.get("refusal") {
                Some(Value::String(text)) => count_tokens(text, encoding)?,
                _ => count_json(part, encoding)?,
            },
            _ => count_json(part, encoding)?,
        };
        Ok(text + rest)
    }
}

fn count_json(value: &Value, encoding: Encoding) -> Result<usize> {
    match value {
        Value::Null => Ok(0),
        other => count_tokens(&other.to_string(), encoding),
    }
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
    fn counts_are_tiktokens() {
        let text = CORPUS.concat();
        assert_eq!(count(&text, Encoding::O200kBase), tiktoken_rs::o200k_base().unwrap().encode_ordinary(&text).len());
        assert_eq!(
            count(&text, Encoding::Cl100kBase),
            tiktoken_rs::cl100k_base().unwrap().encode_ordinary(&text).len()
        );
    }

    #[test]
    fn vocabularies_hold_every_ordinary_token() {
        assert_eq!(Encoding::O200kBase.tokenizer().unwrap().vocab.len(), 199_998);
        assert_eq!(Encoding::Cl100kBase.tokenizer().unwrap().vocab.len(), 100_256);
    }

    #[test]
    fn long_pieces_count_without_stalling() {
        // One piece of 200k letters takes the heap merge; the rescanning one would take minutes.
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for text in ["ab".repeat(100_000), " ".repeat(200_000), "x".repeat(200_000)] {
                assert_eq!(count(&text, encoding), other(encoding, &text), "{encoding:?} {}", &text[..2]);
            }
        }
    }

    #[test]
    fn a_run_past_the_exact_limit_counts_a_token_a_byte() {
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let run = "a".repeat(MAX_EXACT_PIECE_BYTES + 1);
            assert_eq!(count(&run, encoding), run.len());
            let exact = "a".repeat(MAX_EXACT_PIECE_BYTES);
            assert!(count(&exact, encoding) < exact.len() / 2);
        }
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
            + (3 + count("user", e) + count("bob", e) + 1 + count("Hi there", e) + IMAGE_PART_TOKENS)
            + (3 + count("assistant", e) + count("get", e) + count("{\"a\":1}", e));
        assert_eq!(count_chat_tokens(body, e, IMAGE_PART_TOKENS).unwrap(), expected);
    }

    #[test]
    fn tools_schemas_and_tool_blocks_are_prompt() {
        let e = Encoding::O200kBase;
        let tools = r#"[{"type":"function","function":{"name":"f","description":"many words here"}}]"#;
        let schema = r#"{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}"#;
        let bare = count_chat_tokens(br#"{"messages":[]}"#, e, IMAGE_PART_TOKENS).unwrap();
        let body = format!(r#"{{"messages":[],"tools":{tools},"response_format":{schema},"functions":null}}"#);
        let compact = |text: &str| serde_json::from_str::<Value>(text).unwrap().to_string();
        assert_eq!(
            count_chat_tokens(body.as_bytes(), e, IMAGE_PART_TOKENS).unwrap(),
            bare + count(&compact(tools), e) + count(&compact(schema), e)
        );
        // The message shape's blocks: a call's input, a result's content (text or text parts).
        let blocks = br#"{"messages":[{"role":"user","content":[
            {"type":"tool_use","id":"t","name":"f","input":{"q":"weather in Paris"}},
            {"type":"tool_result","tool_use_id":"t","content":"sunny, 21 degrees"},
            {"type":"tool_result","tool_use_id":"u","content":[{"type":"text","text":"rain"}]},
            {"type":"input_audio","input_audio":{"data":"AAAA"}}]}]}"#;
        let expected = bare
            + 3
            + count("user", e)
            + count(r#"{"q":"weather in Paris"}"#, e)
            + count("sunny, 21 degrees", e)
            + count("rain", e)
            + 1; // three bytes of audio: at most 3 ms at 8 kbit/s, one token
        assert_eq!(count_chat_tokens(blocks, e, IMAGE_PART_TOKENS).unwrap(), expected);
    }

    #[test]
    fn unknown_parts_count_whole_and_refusals_count() {
        let e = Encoding::O200kBase;
        let bare = count_chat_tokens(br#"{"messages":[{"role":"user","content":[]}]}"#, e, IMAGE_PART_TOKENS).unwrap();
        let with = |part: &str| {
            let body = format!(r#"{{"messages":[{{"role":"user","content":[{part}]}}]}}"#);
            count_chat_tokens(body.as_bytes(), e, IMAGE_PART_TOKENS).unwrap() - bare
        };
        let found = r#"{"type":"search_result","source":"s","title":"t","content":[{"type":"text","text":"many words of it"}]}"#;
        let compact = |text: &str| serde_json::from_str::<Value>(text).unwrap().to_string();
        assert_eq!(with(found), count(&compact(found), e));
        let output = r#"{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"big"},{"type":"input_image","image_url":"x"}]}"#;
        assert_eq!(with(output), count("big", e) + IMAGE_PART_TOKENS);
        // An image with a `text` beside it is an image still (review: it was held as its text).
        assert_eq!(with(r#"{"type":"image_url","image_url":{"url":"x"},"text":""}"#), IMAGE_PART_TOKENS);
        assert_eq!(with(r#"{"type":"refusal","refusal":"I will not"}"#), count("I will not", e));
        assert_eq!(with(r#""a bare string""#), count(r#""a bare string""#, e));
    }

    #[test]
    fn chat_errors() {
        assert!(count_chat_tokens(b"{}", Encoding::O200kBase, IMAGE_PART_TOKENS).is_err());
        // The audio's share of a prompt, wherever its parts are (a tool result's too).
        let clip =
            serde_json::json!({"type": "input_audio", "input_audio": {"data": "A".repeat(40_000), "format": "mp3"}});
        let one = media::audio_tokens(&clip);
        assert!(one > 0);
        let body = serde_json::json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, clip.clone()]},
            {"role": "user", "content": [{"type": "tool_result", "content": [clip]}]},
        ]});
        let count = count_prompt(body.to_string().as_bytes(), Encoding::O200kBase, IMAGE_PART_TOKENS, 0).unwrap();
        assert_eq!(count.audio_tokens, 2 * one);
        assert!(count.tokens > count.audio_tokens);
        let plain =
            count_prompt(br#"{"messages":[{"role":"user","content":"hi"}]}"#, Encoding::O200kBase, 1, 0).unwrap();
        assert_eq!(plain.audio_tokens, 0);
        // An earlier spoken answer named by id: held at the bound given, as audio.
        let named = br#"{"messages":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"assistant","audio":{"id":"audio_2"}}]}"#;
        let held = count_prompt(named, Encoding::O200kBase, 1, 500).unwrap();
        assert_eq!(held.audio_tokens, 1_000);
        assert!(held.tokens >= 1_000);
        assert!(count_chat_tokens(br#"{"messages":["x"]}"#, Encoding::O200kBase, IMAGE_PART_TOKENS).is_err());
        assert!(count_chat_tokens(b"not json", Encoding::O200kBase, IMAGE_PART_TOKENS).is_err());
        assert!(count_chat_tokens(b"[[]]", Encoding::O200kBase, IMAGE_PART_TOKENS).is_err());
        assert!(count_chat_tokens(br#"{"messages":{}}"#, Encoding::O200kBase, IMAGE_PART_TOKENS).is_err());
        assert_eq!(
            count_chat_tokens(br#" {"messages":[]} "#, Encoding::O200kBase, IMAGE_PART_TOKENS),
            Ok(REPLY_PRIMING)
        );
    }

    #[test]
    fn a_key_given_twice_counts_its_last_value() {
        // As the gateway's JSON reader takes it (hostile review: a derived struct refused it, a 500).
        let e = Encoding::O200kBase;
        let last = count_chat_tokens(
            br#"{"messages":[{"role":"user","content":"hello there"}],"tools":[{"type":"function"}]}"#,
            e,
            IMAGE_PART_TOKENS,
        );
        let twice = count_chat_tokens(
            br#"{"messages":[],"tools":[],"messages":[{"role":"user","content":"hello there"}],"tools":[{"type":"function"}]}"#,
            e,
            IMAGE_PART_TOKENS,
        );
        assert_eq!(twice, last);
        assert!(count_chat_tokens(br#"{"messages":[],"tools":null}"#, e, IMAGE_PART_TOKENS) == Ok(REPLY_PRIMING));
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
