//! Byte-pair encoding counts over a compact vocabulary.
//!
//! tiktoken-rs keeps a vocabulary as three maps of 200k separately allocated tokens (encoder,
//! decoder and a sorted list: 45 MB for o200k_base in every worker). Counting needs only the
//! encoder, so this module holds it as the token bytes in rank order (borrowed from the binary),
//! the end of each token, and an open-addressing table of ranks keyed by the bytes' hash (about
//! 3 MB besides the bytes). The merge is tiktoken's `_byte_pair_merge` and
//! `_byte_pair_merge_large`, counting parts instead of collecting ranks.

use std::borrow::Cow;
use std::collections::BinaryHeap;
use std::hash::Hasher;

use rustc_hash::FxHasher;

pub type Rank = u32;

const EMPTY: u32 = u32::MAX;

/// Pieces at least this long are merged with a heap (O(m log n)) instead of by rescanning
/// (O(mn)), as in tiktoken, so that one long run of letters cannot stall a worker.
const LARGE_PIECE: usize = 100;

pub struct Vocab {
    /// Every token's bytes, concatenated in rank order.
    bytes: Cow<'static, [u8]>,
    /// `ends[r]` is where token `r` ends in `bytes`; it starts where token `r - 1` ends.
    ends: Box<[u32]>,
    /// Ranks by hash of their bytes, linear probing; `EMPTY` marks a free slot.
    slots: Box<[u32]>,
}

fn hash(bytes: &[u8]) -> usize {
    let mut hasher = FxHasher::default();
    hasher.write(bytes);
    hasher.finish() as usize
}

impl Vocab {
    /// A vocabulary from its tokens' bytes concatenated in rank order and each token's length.
    /// Refuses lengths that do not add up to the bytes, and a token given twice (ranks must name
    /// tokens one to one).
    pub fn new(bytes: impl Into<Cow<'static, [u8]>>, lengths: &[u8]) -> Result<Self, String> {
        let bytes = bytes.into();
        let mut end = 0u32;
        let ends: Box<[u32]> = lengths
            .iter()
            .map(|&len| {
                end = end.saturating_add(u32::from(len));
                end
            })
            .collect();
        if end as usize != bytes.len() || lengths.contains(&0) {
            return Err(format!("{} token lengths do not cover {} bytes", lengths.len(), bytes.len()));
        }
        let len = u32::try_from(ends.len()).map_err(|_| "too many tokens".to_string())?;
        // Below half full, a miss ends after about two probes.
        let capacity = (ends.len() * 2).next_power_of_two().max(2);
        let mut vocab = Vocab { bytes, ends, slots: vec![EMPTY; capacity].into() };
        let mask = capacity - 1;
        for rank in 0..len {
            let token = vocab.token(rank);
            let mut slot = hash(token) & mask;
            while vocab.slots[slot] != EMPTY {
                if vocab.token(vocab.slots[slot]) == token {
                    return Err(format!("token {rank} repeats token {}", vocab.slots[slot]));
                }
                slot = (slot + 1) & mask;
            }
            vocab.slots[slot] = rank;
        }
        Ok(vocab)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn token(&self, rank: Rank) -> &[u8] {
        let r = rank as usize;
        let start = if r == 0 { 0 } else { self.ends[r - 1] as usize };
        &self.bytes[start..self.ends[r] as usize]
    }

    #[inline]
    pub fn rank(&self, piece: &[u8]) -> Option<Rank> {
        let mask = self.slots.len() - 1;
        let mut slot = hash(piece) & mask;
        loop {
            let rank = self.slots[slot];
            if rank == EMPTY {
                return None;
            }
            if self.token(rank) == piece {
                return Some(rank);
            }
            slot = (slot + 1) & mask;
        }
    }

    fn rank_or_max(&self, piece: &[u8]) -> Rank {
        self.rank(piece).unwrap_or(Rank::MAX)
    }

    /// How many tokens `piece` (one match of the split pattern) encodes to.
    pub fn count_piece(&self, piece: &[u8]) -> usize {
        if piece.len() <= 1 || self.rank(piece).is_some() {
            return piece.len().min(1);
        }
        if piece.len() < LARGE_PIECE {
            self.merge_small(piece)
        } else {
            self.merge_large(piece)
        }
    }

    /// tiktoken's `_byte_pair_merge`: parts as (start, rank of the pair starting there); the
    /// lowest-ranked pair is merged until none is left.
    fn merge_small(&self, piece: &[u8]) -> usize {
        let mut parts: Vec<(usize, Rank)> = Vec::with_capacity(piece.len() + 1);
        let mut min_rank = (Rank::MAX, usize::MAX);
        for i in 0..piece.len() - 1 {
            let rank = self.rank_or_max(&piece[i..i + 2]);
            if rank < min_rank.0 {
                min_rank = (rank, i);
            }
            parts.push((i, rank));
        }
        parts.push((piece.len() - 1, Rank::MAX));
        parts.push((piece.len(), Rank::MAX));

        // The rank of the pair at `i` once part `i + 1` is gone (it is removed after this).
        let rank_after_merge = |parts: &[(usize, Rank)], i: usize| {
            if i + 3 < parts.len() {
                self.rank_or_max(&piece[parts[i].0..parts[i + 3].0])
            } else {
                Rank::MAX
            }
        };
        while min_rank.0 != Rank::MAX {
            let i = min_rank.1;
            if i > 0 {
                parts[i - 1].1 = rank_after_merge(&parts, i - 1);
            }
            parts[i].1 = rank_after_merge(&parts, i);
            parts.remove(i + 1);
            min_rank = (Rank::MAX, usize::MAX);
            for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
                if rank < min_rank.0 {
                    min_rank = (rank, i);
                }
            }
        }
        parts.len() - 1
    }

    /// tiktoken's `_byte_pair_merge_large`: the same merges, the next one taken from a heap.
    fn merge_large(&self, piece: &[u8]) -> usize {
        struct State {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: Rank,
        }
        let mut state = Vec::with_capacity(piece.len());
        state.push(State { prev: usize::MAX, end: 1, next_end: 2, next_rank: Rank::MAX });
        let mut heap = BinaryHeap::with_capacity(piece.len());
        for i in 0..piece.len() - 1 {
            if let Some(rank) = self.rank(&piece[i..i + 2]) {
                heap.push(Merge { start: i, rank });
                state[i].next_rank = rank;
            }
            state.push(State { prev: i, end: i + 2, next_end: i + 3, next_rank: Rank::MAX });
        }
        let potential_merge = |state: &mut Vec<State>, heap: &mut BinaryHeap<Merge>, start: usize, next_end: usize| {
            state[start].next_end = next_end;
            state[start].next_rank = Rank::MAX;
            if next_end <= piece.len() {
                if let Some(rank) = self.rank(&piece[start..next_end]) {
                    heap.push(Merge { start, rank });
                    state[start].next_rank = rank;
                }
            }
        };
        while let Some(left) = heap.pop() {
            if left.rank == Rank::MAX {
                break;
            }
            if left.rank != state[left.start].next_rank {
                continue; // invalidated by an earlier merge
            }
            let left_start = left.start;
            let right_start = state[left_start].end;
            let right_end = state[left_start].next_end;
            let right_next_end = state[right_start].next_end;
            state[left_start].end = right_end;
            potential_merge(&mut state, &mut heap, left_start, right_next_end);
            if right_end < state.len() {
                state[right_end].prev = left_start;
            }
            if left_start > 0 {
                let prev_start = state[left_start].prev;
                potential_merge(&mut state, &mut heap, prev_start, right_end);
            }
            state[right_start].next_rank = Rank::MAX;
        }
        let mut count = 0;
        let mut i = 0;
        while i < state.len() {
            count += 1;
            i = state[i].end;
        }
        count
    }
}

/// A merge of the part starting at `start` with the next; the heap pops the lowest rank first,
/// and of equal ranks the leftmost.
#[derive(Eq, PartialEq)]
struct Merge {
    start: usize,
    rank: Rank,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.start.cmp(&self.start))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A toy vocabulary: the bytes of "abc", then merges in rank order.
    fn toy() -> Vocab {
        let tokens: &[&[u8]] = &[b"a", b"b", b"c", b"ab", b"bc", b"abc", b"aa", b"aaaa"];
        let lengths: Vec<u8> = tokens.iter().map(|t| t.len() as u8).collect();
        Vocab::new(tokens.concat(), &lengths).unwrap()
    }

    #[test]
    fn finds_every_token_and_nothing_else() {
        let vocab = toy();
        assert_eq!(vocab.len(), 8);
        for rank in 0..vocab.len() as Rank {
            assert_eq!(vocab.rank(vocab.token(rank)), Some(rank));
        }
        assert_eq!(vocab.rank(b"ca"), None);
        assert_eq!(vocab.rank(b""), None);
    }

    #[test]
    fn merges_lowest_rank_first() {
        let vocab = toy();
        // ab (rank 3) at 0, then ab at 3 (before bc, rank 4), then abc (5) twice: 2 tokens.
        assert_eq!(vocab.count_piece(b"abcabc"), 2);
        assert_eq!(vocab.count_piece(b"cab"), 2); // c + ab
        assert_eq!(vocab.count_piece(b"aaaaa"), 2); // aa aa a -> aaaa a
        assert_eq!(vocab.count_piece(b"a"), 1);
        assert_eq!(vocab.count_piece(b""), 0);
    }

    #[test]
    fn small_and_large_merges_agree() {
        let vocab = toy();
        for piece in [&b"abcabcaabbcc"[..], b"aaaaaaaaaaaaa", b"cbacbacbaabc", b"ab", b"ba"] {
            assert_eq!(vocab.merge_small(piece), vocab.merge_large(piece), "{piece:?}");
        }
    }

    #[test]
    fn refuses_a_repeated_token_or_bad_lengths() {
        assert!(Vocab::new(b"aa".to_vec(), &[1, 1]).is_err());
        assert!(Vocab::new(b"ab".to_vec(), &[1]).is_err());
        assert!(Vocab::new(b"ab".to_vec(), &[1, 0, 1]).is_err());
        assert!(Vocab::new(b"ab".to_vec(), &[1, 2]).is_err());
        assert!(Vocab::new(&b"ab"[..], &[1, 1]).is_ok());
    }
}
