//! Writes each bundled vocabulary into OUT_DIR in the form `bpe::Vocab` counts with: the ordinary
//! tokens' bytes concatenated in rank order (`NAME.bytes`) and each token's length in one byte
//! (`NAME.lens`). The vocabularies are tiktoken's, as the tiktoken-rs crate bundles them; reading
//! them here rather than at run time spares every worker tiktoken-rs's 45 MB of maps.

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo::rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    for (name, bpe) in [("o200k_base", tiktoken_rs::o200k_base()?), ("cl100k_base", tiktoken_rs::cl100k_base()?)] {
        let special = bpe.special_tokens();
        let mut bytes = Vec::new();
        let mut lens = Vec::new();
        // Ordinary ranks run from 0 without a gap; the special tokens sit above them.
        while let Ok(token) = bpe.decode_bytes(&[u32::try_from(lens.len())?]) {
            if std::str::from_utf8(&token).is_ok_and(|text| special.contains(text)) {
                break;
            }
            lens.push(u8::try_from(token.len()).map_err(|_| format!("{name}: a token longer than 255 bytes"))?);
            bytes.extend_from_slice(&token);
        }
        std::fs::write(out.join(format!("{name}.bytes")), bytes)?;
        std::fs::write(out.join(format!("{name}.lens")), lens)?;
    }
    Ok(())
}
