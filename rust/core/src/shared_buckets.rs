//! Token buckets shared by every process on one machine, in one small file.
//!
//! A gateway may run several worker processes; a per-key limit must hold across all of them, without
//! an external service. The buckets live in a file as a hash table of fixed 64-byte slots (key hash,
//! bucket state, the limit it was last used with). Each operation takes the file's exclusive lock
//! (`flock`: released by the kernel when a process dies, so a crash can never leave it held), reads
//! the few slots it needs, runs the exact `TokenBucket` arithmetic and writes the slot back: a few
//! microseconds, all in the page cache.
//!
//! The table never grows. A key probes at most `PROBE` slots from its hash; when they are all taken
//! by other keys, the slot of a bucket that is full again (as good as unused) is reused, else the
//! one used longest ago: with far more slots than keys in use this never happens.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{CoreError, Result};
use crate::ratelimit::{TakeResult, TokenBucket, MIN_LEVEL};

const MAGIC: &[u8; 8] = b"GWBKT001";
const HEADER: u64 = 64;
const SLOT: u64 = 64;
/// How many consecutive slots a key may occupy from its hash.
pub const PROBE: u64 = 32;

/// What a bucket allows: `capacity` tokens at most, refilled by `refill_tokens` every `period_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub capacity: u64,
    pub refill_tokens: u64,
    pub period_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    key: u64, // 0: empty
    level: i128,
    last_ns: u64,
    limit: Limit,
}

impl Slot {
    fn decode(b: &[u8]) -> Self {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Slot {
            key: u(0),
            level: i128::from_le_bytes(b[8..24].try_into().unwrap_or([0; 16])),
            last_ns: u(24),
            limit: Limit { capacity: u(32), refill_tokens: u(40), period_ns: u(48) },
        }
    }

    fn encode(&self) -> [u8; SLOT as usize] {
        let mut b = [0u8; SLOT as usize];
        b[0..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..24].copy_from_slice(&self.level.to_le_bytes());
        b[24..32].copy_from_slice(&self.last_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.limit.capacity.to_le_bytes());
        b[40..48].copy_from_slice(&self.limit.refill_tokens.to_le_bytes());
        b[48..56].copy_from_slice(&self.limit.period_ns.to_le_bytes());
        b
    }

    /// This slot's bucket under `limit`: its state carried over, or a full bucket for a fresh slot.
    /// Under a changed capacity what was taken stays taken: the level moves by the change, up or
    /// down (raised, the rest of the new limit is there at once; lowered, a key that took more
    /// than the new limit waits for it). Never cut nor topped up, so callers asking under the old
    /// and the new limit in turn, as workers do while a change reaches them, make no tokens.
    fn bucket(&self, limit: Limit, now_ns: u64) -> Result<TokenBucket> {
        let fresh = TokenBucket::new(limit.capacity, limit.refill_tokens, limit.period_ns, now_ns)?;
        if self.key == 0 {
            return Ok(fresh);
        }
        let full = i128::from(limit.capacity) * i128::from(limit.period_ns);
        // A level kept in other units (the limit's period changed) cannot carry over: start full.
        if self.limit.period_ns != limit.period_ns {
            return Ok(fresh);
        }
        let was = i128::from(self.limit.capacity) * i128::from(limit.period_ns);
        // Each full is below 2^125 (a slot's limit was checked when it was written), so the shift
        // fits; saturating all the same, for a damaged slot.
        let level = self.level.saturating_add(full.saturating_sub(was)).clamp(MIN_LEVEL, full);
        TokenBucket::from_state(limit.capacity, limit.refill_tokens, limit.period_ns, level, self.last_ns)
    }

    /// Whether this slot's bucket is full again at `now_ns` under its own last limit.
    fn is_idle(&self, now_ns: u64) -> bool {
        TokenBucket::from_state(
            self.limit.capacity,
            self.limit.refill_tokens,
            self.limit.period_ns,
            self.level,
            self.last_ns,
        )
        .map(|mut b| b.available(now_ns) >= b.capacity())
        .unwrap_or(true)
    }
}

pub struct SharedBuckets {
    file: File,
    slots: u64,
}

fn io(context: &str, err: std::io::Error) -> CoreError {
    CoreError::Io(format!("{context}: {err}"))
}

/// The key's place in the table: never 0, which marks an empty slot.
pub fn key_hash(key: &[u8]) -> u64 {
    let digest = blake3::hash(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first).max(1)
}

impl SharedBuckets {
    /// Open the table at `path`, creating it with `slots` slots when it does not exist; an existing
    /// table keeps its own size.
    pub fn open(path: &Path, slots: u64) -> Result<Self> {
        if slots < PROBE {
            return Err(CoreError::InvalidArgument(format!("a table needs at least {PROBE} slots")));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io("opening the rate-limit table", e))?;
        file.lock().map_err(|e| io("locking the rate-limit table", e))?;
        // On failure the file is closed, which releases the lock.
        let table = Self::init(file, slots)?;
        table.file.unlock().map_err(|e| io("unlocking the rate-limit table", e))?;
        Ok(table)
    }

    fn init(file: File, slots: u64) -> Result<Self> {
        let mut header = [0u8; HEADER as usize];
        let read = file.read_at(&mut header, 0).map_err(|e| io("reading the rate-limit table", e))?;
        if read == 0 {
            header[..8].copy_from_slice(MAGIC);
            header[8..16].copy_from_slice(&slots.to_le_bytes());
            file.set_len(HEADER + slots * SLOT).map_err(|e| io("sizing the rate-limit table", e))?;
            file.write_all_at(&header, 0).map_err(|e| io("writing the rate-limit table", e))?;
            return Ok(Self { file, slots });
        }
        if read < 16 || &header[..8] != MAGIC {
            return Err(CoreError::InvalidArgument("the file is not a rate-limit table".into()));
        }
        let slots = u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]));
        if slots < PROBE {
            return Err(CoreError::InvalidArgument("the rate-limit table is damaged".into()));
        }
        Ok(Self { file, slots })
    }

    /// Take `n` tokens from the key's bucket if it holds them.
    pub fn try_take(&self, key: u64, limit: Limit, n: u64, now_ns: u64) -> Result<TakeResult> {
        self.with_bucket(key, limit, now_ns, |b| b.try_take(n, now_ns))
    }

    /// Correct a reservation (see `TokenBucket::adjust`); returns the whole tokens left.
    pub fn adjust(&self, key: u64, limit: Limit, delta: i64, now_ns: u64) -> Result<u64> {
        self.with_bucket(key, limit, now_ns, |b| {
            b.adjust(delta, now_ns);
            b.available(now_ns)
        })
    }

    /// The whole tokens the key's bucket holds now.
    pub fn available(&self, key: u64, limit: Limit, now_ns: u64) -> Result<u64> {
        self.with_bucket(key, limit, now_ns, |b| b.available(now_ns))
    }

    fn with_bucket<T>(&self, key: u64, limit: Limit, now_ns: u64, f: impl FnOnce(&mut TokenBucket) -> T) -> Result<T> {
        // Checked before the lock: a bad limit fails without touching the table.
        TokenBucket::new(limit.capacity, limit.refill_tokens, limit.period_ns, now_ns)?;
        self.file.lock().map_err(|e| io("locking the rate-limit table", e))?;
        let outcome = self.update(key, limit, now_ns, f);
        let unlocked = self.file.unlock().map_err(|e| io("unlocking the rate-limit table", e));
        let value = outcome?;
        unlocked?;
        Ok(value)
    }

    fn update<T>(&self, key: u64, limit: Limit, now_ns: u64, f: impl FnOnce(&mut TokenBucket) -> T) -> Result<T> {
        let (index, slot) = self.find(key, now_ns)?;
        let mut bucket = slot.bucket(limit, now_ns)?;
        let value = f(&mut bucket);
        let (level, last_ns) = bucket.state();
        let written = Slot { key, level, last_ns, limit };
        self.file
            .write_all_at(&written.encode(), HEADER + index * SLOT)
            .map_err(|e| io("writing the rate-limit table", e))?;
        Ok(value)
    }

    /// The key's slot, or where it goes: an empty slot, else an idle one, else the least recently
    /// used of its probe window. A slot handed out for another key comes back marked empty.
    fn find(&self, key: u64, now_ns: u64) -> Result<(u64, Slot)> {
        let start = key % self.slots;
        let mut window = vec![0u8; (PROBE * SLOT) as usize];
        // The window may wrap around the table's end: read it in at most two pieces.
        let first = PROBE.min(self.slots - start);
        self.read_slots(start, &mut window[..(first * SLOT) as usize])?;
        if first < PROBE {
            self.read_slots(0, &mut window[(first * SLOT) as usize..])?;
        }
        let slots: Vec<Slot> = window.chunks_exact(SLOT as usize).map(Slot::decode).collect();
        let at = |i: usize| (start + i as u64) % self.slots;
        if let Some(i) = slots.iter().position(|s| s.key == key) {
            return Ok((at(i), slots[i]));
        }
        let reuse = slots
            .iter()
            .position(|s| s.key == 0)
            .or_else(|| slots.iter().position(|s| s.is_idle(now_ns)))
            .or_else(|| slots.iter().enumerate().min_by_key(|(_, s)| s.last_ns).map(|(i, _)| i))
            .unwrap_or(0);
        Ok((at(reuse), Slot { key: 0, level: 0, last_ns: 0, limit: slots[reuse].limit }))
    }

    fn read_slots(&self, first: u64, into: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(into, HEADER + first * SLOT).map_err(|e| io("reading the rate-limit table", e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000_000_000;
    const PER_MINUTE_10: Limit = Limit { capacity: 10, refill_tokens: 10, period_ns: MINUTE };

    fn table(dir: &tempfile::TempDir, slots: u64) -> SharedBuckets {
        SharedBuckets::open(&dir.path().join("buckets"), slots).unwrap()
    }

    #[test]
    fn two_handles_on_one_file_share_every_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (table(&dir, 1024), table(&dir, 1024));
        let key = key_hash(b"key_1:requests");
        for i in 0..10 {
            let handle = if i % 2 == 0 { &a } else { &b };
            assert!(handle.try_take(key, PER_MINUTE_10, 1, 0).unwrap().allowed);
        }
        let refused = b.try_take(key, PER_MINUTE_10, 1, 0).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_ns, 6_000_000_000);
        assert!(a.try_take(key, PER_MINUTE_10, 1, 6_000_000_000).unwrap().allowed);
        // Another key has its own bucket.
        assert!(a.try_take(key_hash(b"key_2:requests"), PER_MINUTE_10, 10, 0).unwrap().allowed);
    }

    #[test]
    fn adjust_and_available() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(&dir, 64);
        let key = key_hash(b"tokens");
        assert!(t.try_take(key, PER_MINUTE_10, 8, 0).unwrap().allowed);
        assert_eq!(t.adjust(key, PER_MINUTE_10, 5, 0).unwrap(), 7);
        assert_eq!(t.available(key, PER_MINUTE_10, 0).unwrap(), 7);
        assert_eq!(t.adjust(key, PER_MINUTE_10, -9, 0).unwrap(), 0); // into debt
        assert!(!t.try_take(key, PER_MINUTE_10, 1, 0).unwrap().allowed);
    }

    #[test]
    fn a_changed_limit_keeps_what_was_taken_and_a_new_period_starts_full() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(&dir, 64);
        let key = key_hash(b"k");
        assert_eq!(t.available(key, PER_MINUTE_10, 0).unwrap(), 10);
        let six = Limit { capacity: 6, refill_tokens: 6, period_ns: MINUTE };
        // Raised: what was taken stays taken, the rest of the new limit is there at once.
        assert!(t.try_take(key, six, 6, 0).unwrap().allowed);
        assert!(!t.try_take(key, six, 1, 0).unwrap().allowed);
        let hundred = Limit { capacity: 100, refill_tokens: 100, period_ns: MINUTE };
        let taken = t.try_take(key, hundred, 1, 0).unwrap(); // review: refused until the refill
        assert!(taken.allowed);
        assert_eq!(taken.remaining, 93);
        // Lowered: 7 taken against 3 allowed, the key waits (not cut to the lower limit).
        let three = Limit { capacity: 3, refill_tokens: 3, period_ns: MINUTE };
        assert_eq!(t.available(key, three, 0).unwrap(), 0);
        assert!(!t.try_take(key, three, 1, 0).unwrap().allowed);
        let hourly = Limit { capacity: 5, refill_tokens: 5, period_ns: 60 * MINUTE };
        assert_eq!(t.available(key, hourly, 0).unwrap(), 5);
    }

    #[test]
    fn limits_asked_for_in_turn_make_no_tokens() {
        // Code review: workers that learn of a change at different moments ask under the old and
        // the new limit in turn; a raise that topped the bucket up each time let 382 through 100.
        let dir = tempfile::tempdir().unwrap();
        let t = table(&dir, 64);
        let key = key_hash(b"k");
        let six = Limit { capacity: 6, refill_tokens: 6, period_ns: MINUTE };
        let hundred = Limit { capacity: 100, refill_tokens: 100, period_ns: MINUTE };
        let mut allowed = 0;
        for _ in 0..4 {
            for limit in [hundred, six] {
                while t.try_take(key, limit, 1, 0).unwrap().allowed {
                    allowed += 1;
                }
            }
        }
        assert_eq!(allowed, 100);
        // A lowered limit on the deepest debt the level keeps holds it there (no error, no wrap).
        let huge = Limit { capacity: 1 << 63, refill_tokens: 1, period_ns: 1 << 61 };
        let none = Limit { capacity: 0, ..huge };
        let deep = key_hash(b"d");
        assert!(t.try_take(deep, huge, 1 << 63, 0).unwrap().allowed);
        assert_eq!(t.adjust(deep, huge, i64::MIN, 0).unwrap(), 0);
        assert_eq!(t.adjust(deep, huge, i64::MIN, 0).unwrap(), 0); // at MIN_LEVEL now
        assert_eq!(t.available(deep, none, 0).unwrap(), 0);
        assert_eq!(t.available(deep, huge, 0).unwrap(), 0);
    }

    #[test]
    fn a_full_table_reuses_idle_then_oldest_slots() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(&dir, PROBE);
        // Every slot busy (one token taken at time i), then one more key.
        for i in 0..PROBE {
            assert!(t.try_take(key_hash(&i.to_le_bytes()), PER_MINUTE_10, 1, i).unwrap().allowed);
        }
        let newcomer = key_hash(b"newcomer");
        assert!(t.try_take(newcomer, PER_MINUTE_10, 10, PROBE).unwrap().allowed);
        assert_eq!(t.available(newcomer, PER_MINUTE_10, PROBE).unwrap(), 0);
        // The oldest key lost its slot: it starts full again (lenient, never stricter).
        assert_eq!(t.available(key_hash(&0u64.to_le_bytes()), PER_MINUTE_10, PROBE).unwrap(), 10);
    }

    #[test]
    fn reopening_keeps_state_and_size_and_refuses_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_hash(b"k");
        {
            let t = table(&dir, 128);
            assert!(t.try_take(key, PER_MINUTE_10, 4, 0).unwrap().allowed);
        }
        let again = table(&dir, 4096);
        assert_eq!(again.slots, 128);
        assert_eq!(again.available(key, PER_MINUTE_10, 0).unwrap(), 6);
        let other = dir.path().join("other");
        std::fs::write(&other, b"not a table at all, clearly").unwrap();
        assert!(SharedBuckets::open(&other, 64).is_err());
        assert!(SharedBuckets::open(&dir.path().join("tiny"), 4).is_err());
        assert!(again.try_take(key, Limit { capacity: 1, refill_tokens: 0, period_ns: 1 }, 1, 0).is_err());
    }
}
