//! Small files written with one short system call at a time, for callers that must not give up the
//! interpreter for it: the settlement journal (append a line, truncate when applied) and the key
//! cache's generation file (its length). Each call is a few microseconds in the page cache; the
//! binding runs them with the GIL held, because releasing it for that long hands the interpreter to
//! another thread (the store's writer) that the event loop then waits on (measured: +7 % requests/s
//! at concurrency 64 with the journal write, the id randomness and the generation check kept).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{CoreError, Result};

fn io_error(what: &str, path: &Path, err: std::io::Error) -> CoreError {
    CoreError::Io(format!("{what} {}: {err}", path.display()))
}

/// A file this process appends to, holding its exclusive lock (`flock`) for as long as it is open:
/// others can tell from the lock whether its owner is alive.
#[derive(Debug)]
pub struct AppendFile {
    file: File,
    /// The file's length after the last whole append (or truncation): a failed append's partial
    /// bytes are cut back to it, so that the next line does not land glued to a torn one.
    len: u64,
}

impl AppendFile {
    /// Open (creating it, mode 0600) for appending and take its exclusive lock; a file whose lock
    /// another holder has is refused.
    pub fn open_locked(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_error("cannot open", path, e))?;
        match file.try_lock() {
            Ok(()) => {
                let len = file.metadata().map_err(|e| io_error("cannot stat", path, e))?.len();
                Ok(Self { file, len })
            }
            Err(TryLockError::WouldBlock) => {
                Err(CoreError::Io(format!("{} is locked by another owner", path.display())))
            }
            Err(TryLockError::Error(e)) => Err(io_error("cannot lock", path, e)),
        }
    }

    /// Append `data` whole: with O_APPEND each write lands at the end, and a short write (a full
    /// disk) is continued or reported, never silently cut; a failed one leaves the file as it was
    /// (what it wrote of `data` is cut off again).
    pub fn append(&mut self, data: &[u8]) -> Result<()> {
        match self.file.write_all(data) {
            Ok(()) => {
                self.len += data.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len); // cutting needs no new block: best effort
                Err(CoreError::Io(format!("journal write failed: {e}")))
            }
        }
    }

    /// Empty the file (appends then start again at offset 0).
    pub fn truncate(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(|e| CoreError::Io(format!("journal truncate failed: {e}")))?;
        self.len = 0;
        Ok(())
    }
}

/// The length of the file at `path` (one stat).
pub fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path).map(|m| m.len()).map_err(|e| io_error("cannot stat", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_truncates_and_holds_the_lock() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| CoreError::Io(e.to_string()))?;
        let path = dir.path().join("journal.jsonl");
        let mut journal = AppendFile::open_locked(&path)?;
        journal.append(b"one\n")?;
        journal.append(b"two\n")?;
        assert_eq!(file_len(&path)?, 8);
        assert_eq!(std::fs::read(&path).map_err(|e| CoreError::Io(e.to_string()))?, b"one\ntwo\n");
        // Another open of the same file cannot take the lock while this one lives.
        assert!(matches!(AppendFile::open_locked(&path), Err(CoreError::Io(m)) if m.contains("locked")));
        journal.truncate()?;
        journal.append(b"three\n")?;
        assert_eq!(std::fs::read(&path).map_err(|e| CoreError::Io(e.to_string()))?, b"three\n");
        drop(journal);
        AppendFile::open_locked(&path).map(|_| ())
    }

    #[test]
    fn a_missing_file_has_no_length() {
        assert!(matches!(file_len(Path::new("/nonexistent/gateway/file")), Err(CoreError::Io(_))));
    }
}
