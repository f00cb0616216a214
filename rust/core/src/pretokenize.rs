//! Splitting text into the pieces BPE merges within, exactly as tiktoken's patterns do.
//!
//! tiktoken splits with one backtracking regex (with a look-ahead), which took ~90 % of a count
//! through fancy-regex, ~30 µs per KB of text. Here:
//! - a piece that starts, ends and is decided on ASCII bytes alone is found by a hand-written scan
//!   of the pattern's alternatives (`o200k_piece`, `cl100k_piece`): a few ns a byte;
//! - any other piece (the scan read a byte past ASCII) by the same alternatives without look-around,
//!   through a finite automaton (regex-automata): `\s+(?!\S)`, the one look-ahead, is matched as
//!   `\s+\s` with its last character given back, as GitHub's bpe-openai does, and `\s+$` takes a run
//!   that ends the text.
//!
//! Every position of any text starts a match of some alternative (letters, digits, other
//! characters, white space), so the pieces are contiguous and each is the first match anchored
//! where the previous one ended. The tests split random text both ways and with tiktoken's own
//! pattern (fancy-regex), piece for piece.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

/// Which of tiktoken's split patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    O200k,
    Cl100k,
}

/// The alternatives of o200k_base's pattern, in its order, without look-around.
const O200K_SPLITS: &[(&str, bool)] = &[
    (
        concat!(
            r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"#,
            "|",
            r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"#,
            "|",
            r#"\p{N}{1,3}"#,
            "|",
            r#" ?[^\s\p{L}\p{N}]+[\r\n/]*"#,
            "|",
            r#"\s*[\r\n]+"#,
            "|",
            r#"\s+$"#,
        ),
        false,
    ),
    (r#"\s+\s"#, true),
    (r#"\s+"#, false),
];

/// cl100k_base's. Its possessive quantifiers give nothing back that a later part could use, so plain
/// ones split alike. Its `\s++$` comes before `\s*[\r\n]` (bpe-openai has them the other way
/// round, and splits "\n " in two where tiktoken keeps one piece).
const CL100K_SPLITS: &[(&str, bool)] = &[
    (r#"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+$|\s*[\r\n]"#, false),
    (r#"\s+\s"#, true),
    (r#"\s"#, false),
];

/// Splits text as one of tiktoken's patterns does.
pub struct Splitter {
    pattern: Pattern,
    alternatives: Regex,
    /// By alternative: whether its match ends with a look-ahead character, given back.
    gives_back_last: Vec<bool>,
}

impl Splitter {
    pub fn new(pattern: Pattern) -> Result<Self, String> {
        let splits = match pattern {
            Pattern::O200k => O200K_SPLITS,
            Pattern::Cl100k => CL100K_SPLITS,
        };
        let sources: Vec<&str> = splits.iter().map(|(source, _)| *source).collect();
        let alternatives = Regex::new_many(&sources).map_err(|e| e.to_string())?;
        Ok(Self { pattern, alternatives, gives_back_last: splits.iter().map(|(_, back)| *back).collect() })
    }

    pub fn pieces<'a>(&'a self, text: &'a str) -> Pieces<'a> {
        Pieces { splitter: self, text, at: 0 }
    }

    /// Where the piece that starts at `at` ends (`at` < the text's length, on a char boundary).
    fn piece_end(&self, text: &str, at: usize) -> usize {
        let bytes = text.as_bytes();
        let scanned = match self.pattern {
            Pattern::O200k => o200k_piece(bytes, at),
            Pattern::Cl100k => cl100k_piece(bytes, at),
        };
        match scanned {
            Some(end) => end,
            None => self.automaton_piece_end(text, at),
        }
    }

    fn automaton_piece_end(&self, text: &str, at: usize) -> usize {
        let found = text.get(at..).and_then(|rest| self.alternatives.search(&Input::new(rest).anchored(Anchored::Yes)));
        let Some(found) = found else {
            // Never: some alternative matches at every position. Were it to happen, the rest of the
            // text would be one piece rather than lost.
            return text.len();
        };
        let mut end = at + found.end();
        if self.gives_back_last.get(found.pattern().as_usize()).copied().unwrap_or(false) {
            // `\s+\s` matched two characters or more: the last is the look-ahead's.
            end -= text[at..end].chars().next_back().map_or(0, char::len_utf8);
        }
        end.max(at + text[at..].chars().next().map_or(1, char::len_utf8))
    }
}

pub struct Pieces<'a> {
    splitter: &'a Splitter,
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let start = self.at;
        if start >= self.text.len() {
            return None;
        }
        let end = self.splitter.piece_end(self.text, start);
        self.at = end;
        self.text.get(start..end)
    }
}

// ------------------------------------------------------------------ the ASCII scans
//
// Each reads the text through `Ascii`, which stops the scan (None) at the first byte past ASCII it
// is asked for: such a byte may be a letter, a digit, a mark or white space to the pattern, and
// the automaton decides that piece. A scan reads every byte its answer depends on (the one that
// ends a run included), so an answer it gives is the pattern's.

/// ASCII bytes of the text; `get` is None past the end, and stops the scan on a byte past ASCII.
struct Ascii<'a>(&'a [u8]);

enum Byte {
    End,
    Ascii(u8),
}

impl Ascii<'_> {
    /// The byte at `i`; Err(()) when it is past ASCII.
    #[inline]
    fn get(&self, i: usize) -> Result<Byte, ()> {
        match self.0.get(i) {
            None => Ok(Byte::End),
            Some(&b) if b < 0x80 => Ok(Byte::Ascii(b)),
            Some(_) => Err(()),
        }
    }

    /// Whether the byte at `i` is ASCII and `class` holds for it (false at the end).
    #[inline]
    fn is(&self, i: usize, class: fn(u8) -> bool) -> Result<bool, ()> {
        Ok(match self.get(i)? {
            Byte::End => false,
            Byte::Ascii(b) => class(b),
        })
    }

    /// The end of the run of `class` bytes from `i`.
    #[inline]
    fn run(&self, mut i: usize, class: fn(u8) -> bool) -> Result<usize, ()> {
        while self.is(i, class)? {
            i += 1;
        }
        Ok(i)
    }
}

fn upper(b: u8) -> bool {
    b.is_ascii_uppercase()
}
fn lower(b: u8) -> bool {
    b.is_ascii_lowercase()
}
fn letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}
fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}
/// `\s` (Unicode White_Space) within ASCII: tab, line feed, vertical tab, form feed, carriage
/// return, space.
fn space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}
fn newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}
/// `[^\r\n\p{L}\p{N}]`: what may stand before a word.
fn before_word(b: u8) -> bool {
    !newline(b) && !letter(b) && !digit(b)
}
/// `[^\s\p{L}\p{N}]`: punctuation, symbols and controls.
fn other(b: u8) -> bool {
    !space(b) && !letter(b) && !digit(b)
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i`: its length, 0 when none matches.
fn contraction(text: &Ascii<'_>, i: usize) -> Result<usize, ()> {
    if !text.is(i, |b| b == b'\'')? {
        return Ok(0);
    }
    let at = |j: usize| -> Result<u8, ()> {
        Ok(match text.get(j)? {
            Byte::End => 0,
            Byte::Ascii(b) => b.to_ascii_lowercase(),
        })
    };
    Ok(match at(i + 1)? {
        b's' | b't' | b'm' | b'd' => 2,
        b'r' if at(i + 2)? == b'e' => 3,
        b'v' if at(i + 2)? == b'e' => 3,
        b'l' if at(i + 2)? == b'l' => 3,
        _ => 0,
    })
}

/// `\p{N}{1,3}` at `at`, a digit.
fn numbers(text: &Ascii<'_>, at: usize) -> Result<usize, ()> {
    let mut end = at + 1;
    while end < at + 3 && text.is(end, digit)? {
        end += 1;
    }
    Ok(end)
}

/// ` ?[^\s\p{L}\p{N}]+` then a run of `tail` at `at`: its end, None when it does not match.
fn symbols(text: &Ascii<'_>, at: usize, first: u8, tail: fn(u8) -> bool) -> Result<Option<usize>, ()> {
    let start = if first == b' ' { at + 1 } else { at };
    if !text.is(start, other)? {
        return Ok(None);
    }
    let end = text.run(start, other)?;
    text.run(end, tail).map(Some)
}

/// The end of the run of white space at `at` (`at` is white space: every other ASCII byte was
/// taken by the alternatives before).
fn white_space(text: &Ascii<'_>, at: usize) -> Result<usize, ()> {
    let end = text.run(at, space)?;
    if end == at {
        return Err(()); // never (see above); the automaton would decide
    }
    Ok(end)
}

/// Just past the last line break of the white space in at..run_end, if it holds one.
fn past_last_line_break(text: &Ascii<'_>, at: usize, run_end: usize) -> Option<usize> {
    (at..run_end).rev().find(|&i| text.is(i, newline).unwrap_or(false)).map(|last| last + 1)
}

/// The end of the piece o200k_base's pattern matches at `at`, read from ASCII alone; None when that
/// takes a byte past ASCII.
fn o200k_piece(bytes: &[u8], at: usize) -> Option<usize> {
    o200k_scan(&Ascii(bytes), at).ok()
}

fn o200k_scan(text: &Ascii<'_>, at: usize) -> Result<usize, ()> {
    let Byte::Ascii(first) = text.get(at)? else { return Ok(at) };
    // A word: an optional character before it, upper-case letters, lower-case ones, a contraction.
    // In ASCII the two word alternatives differ only where no lower-case letter follows the
    // upper-case ones (the first needs one, the second then matches the upper-case run).
    let word = if before_word(first) { at + 1 } else { at };
    if text.is(word, letter)? {
        let uppers = text.run(word, upper)?;
        let end = text.run(uppers, lower)?;
        return Ok(end + contraction(text, end)?);
    }
    if digit(first) {
        return numbers(text, at);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    if let Some(end) = symbols(text, at, first, |b| newline(b) || b == b'/')? {
        return Ok(end);
    }
    let run_end = white_space(text, at)?;
    // `\s*[\r\n]+`: up to the run's last line break, when it has one.
    if let Some(end) = past_last_line_break(text, at, run_end) {
        return Ok(end);
    }
    // `\s+(?!\S)` (the run ends the text, or all of it but its last character), else `\s+`.
    if matches!(text.get(run_end)?, Byte::End) || run_end - at == 1 {
        Ok(run_end)
    } else {
        Ok(run_end - 1)
    }
}

/// The same for cl100k_base's pattern.
fn cl100k_piece(bytes: &[u8], at: usize) -> Option<usize> {
    cl100k_scan(&Ascii(bytes), at).ok()
}

fn cl100k_scan(text: &Ascii<'_>, at: usize) -> Result<usize, ()> {
    let Byte::Ascii(first) = text.get(at)? else { return Ok(at) };
    // `'(?i:[sdmt]|ll|ve|re)` comes first: a contraction is a piece of its own.
    let quote = contraction(text, at)?;
    if quote > 0 {
        return Ok(at + quote);
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    let word = if before_word(first) { at + 1 } else { at };
    if text.is(word, letter)? {
        return text.run(word, letter);
    }
    if digit(first) {
        return numbers(text, at);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if let Some(end) = symbols(text, at, first, newline)? {
        return Ok(end);
    }
    let run_end = white_space(text, at)?;
    // `\s+$`
    if matches!(text.get(run_end)?, Byte::End) {
        return Ok(run_end);
    }
    // `\s*[\r\n]`: up to the run's last line break, when it has one.
    if let Some(end) = past_last_line_break(text, at, run_end) {
        return Ok(end);
    }
    // `\s+(?!\S)`, else `\s`.
    Ok(if run_end - at == 1 { at + 1 } else { run_end - 1 })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// tiktoken's own patterns, as tiktoken-rs gives them (cl100k's it does not export: as its
    /// source writes it).
    const O200K_PATTERN: &str = tiktoken_rs::O200K_BASE_PAT_STR;
    const CL100K_PATTERN: &str = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";

    fn splitter(pattern: Pattern) -> &'static Splitter {
        static SPLITTERS: OnceLock<[Splitter; 2]> = OnceLock::new();
        let [o200k, cl100k] =
            SPLITTERS.get_or_init(|| [Splitter::new(Pattern::O200k).unwrap(), Splitter::new(Pattern::Cl100k).unwrap()]);
        if pattern == Pattern::O200k {
            o200k
        } else {
            cl100k
        }
    }

    /// The pieces tiktoken splits into: its pattern through fancy-regex, backtracking and look-ahead.
    fn tiktoken_pieces(pattern: Pattern, text: &str) -> Vec<&str> {
        static REGEXES: OnceLock<[fancy_regex::Regex; 2]> = OnceLock::new();
        let [o200k, cl100k] =
            REGEXES.get_or_init(|| [O200K_PATTERN, CL100K_PATTERN].map(|p| fancy_regex::Regex::new(p).unwrap()));
        let regex = if pattern == Pattern::O200k { o200k } else { cl100k };
        regex.find_iter(text).map(|m| m.unwrap().as_str()).collect()
    }

    fn ours(pattern: Pattern, text: &str) -> Vec<&str> {
        splitter(pattern).pieces(text).collect()
    }

    /// The automaton alone, every piece.
    fn automaton(pattern: Pattern, text: &str) -> Vec<&str> {
        let s = splitter(pattern);
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let end = s.automaton_piece_end(text, at);
            pieces.push(&text[at..end]);
            at = end;
        }
        pieces
    }

    const BOTH: [Pattern; 2] = [Pattern::O200k, Pattern::Cl100k];

    #[test]
    fn examples_split_as_tiktoken_does() {
        let texts = [
            "",
            "Hello, world!",
            "It's we've they'll I'd you're DON'T 'S 'Ll",
            "    leading spaces\n\n\ttabs\r\n  trailing   ",
            "\n ",
            "a  \n  b",
            "HTTPServer getURL URLs ABC's x'y",
            "1234567890 3.14159 -42 //path/to//\n\n",
            "tab\tthen\x0bvertical\x0cfeed\x1fcontrol",
            "日本語 naïve café Ⅻ ٣٤",
            "'s'S'sss''t",
        ];
        for pattern in BOTH {
            for text in texts {
                assert_eq!(ours(pattern, text), tiktoken_pieces(pattern, text), "{pattern:?} {text:?}");
                assert_eq!(automaton(pattern, text), tiktoken_pieces(pattern, text), "{pattern:?} {text:?}");
            }
        }
    }

    #[test]
    fn a_scan_never_answers_on_a_byte_past_ascii() {
        // The run of spaces ends at a no-break space: the scan must hand the piece over.
        assert_eq!(o200k_piece("\n   \u{a0}\n".as_bytes(), 0), None);
        assert_eq!(cl100k_piece("ab\u{e9}".as_bytes(), 0), None);
        assert_eq!(o200k_piece(b"ab cd", 0), Some(2));
    }

    /// Text made of what the patterns tell apart: each kind of letter, marks, digits of several
    /// scripts, apostrophes and contractions in both cases, every kind of white space and line
    /// break, punctuation, slashes, controls, and non-ASCII next to ASCII.
    fn tricky_text() -> impl Strategy<Value = String> {
        let parts = prop::sample::select(vec![
            "a",
            "b",
            "Z",
            "Q",
            "é",
            "É",
            "ǅ",
            "ʰ",
            "中",
            "ー",
            "\u{301}",
            "\u{94d}",
            "ß",
            "ſ",
            "K",
            "1",
            "7",
            "٣",
            "৪",
            "Ⅻ",
            "½",
            "'",
            "'s",
            "'S",
            "'ll",
            "'LL",
            "'Re",
            "'ve",
            "'m",
            "'d",
            "'t",
            "’s",
            " ",
            "  ",
            "\t",
            "\n",
            "\r",
            "\r\n",
            "\u{b}",
            "\u{c}",
            "\u{a0}",
            "\u{85}",
            "\u{2028}",
            "\u{3000}",
            ".",
            ",",
            "!",
            "/",
            "//",
            "\\",
            "-",
            "_",
            "\u{1}",
            "\u{1f}",
            "\u{7f}",
            "😀",
            "🇫🇷",
            "\u{200d}",
            "<|endoftext|>",
            "$",
            "€",
        ]);
        prop::collection::vec(parts, 0..40).prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_text_splits_as_tiktoken_does(text in tricky_text()) {
            for pattern in BOTH {
                let expected = tiktoken_pieces(pattern, &text);
                prop_assert_eq!(ours(pattern, &text), expected.clone(), "{:?}", pattern);
                prop_assert_eq!(automaton(pattern, &text), expected, "{:?} (automaton)", pattern);
            }
        }

        #[test]
        fn any_text_splits_as_tiktoken_does(text in "\\PC{0,60}|\\s{0,8}|[\\x00-\\x7f]{0,80}|[ \\t\\n\\r a-zA-Z0-9'./]{0,80}") {
            for pattern in BOTH {
                prop_assert_eq!(ours(pattern, &text), tiktoken_pieces(pattern, &text), "{:?}", pattern);
            }
        }
    }
}
