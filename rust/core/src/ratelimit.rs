//! Token bucket with exact integer arithmetic.
//!
//! The level is kept in units of token × period_ns, so refilling `refill_tokens` per `period_ns`
//! adds exactly `refill_tokens` units per nanosecond: no rounding, no drift, whatever the call pattern.
//! The level stays within [MIN_LEVEL, capacity × period_ns], both far inside i128, so no arithmetic
//! on it can overflow.

use crate::error::{CoreError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeResult {
    pub allowed: bool,
    /// Whole tokens left after the call (0 while in debt).
    pub remaining: u64,
    /// 0 when allowed; else nanoseconds until the tokens asked for would be there
    /// (until the bucket is full when more than its capacity was asked for).
    pub retry_after_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill_tokens: u64,
    period_ns: u64,
    level: i128,
    last_ns: u64,
}

/// How far back a clock reading must be from the bucket's last one to count as the clock stepped
/// back rather than processes reading it in another order.
pub const CLOCK_STEP_NS: u64 = 1_000_000_000;
/// The deepest debt the level can reach (adjustments beyond it are clamped).
pub const MIN_LEVEL: i128 = i128::MIN / 4;
/// The largest full level, capacity × period_ns, accepted.
pub const MAX_FULL: i128 = i128::MAX / 4;

impl TokenBucket {
    pub fn new(capacity: u64, refill_tokens: u64, period_ns: u64, now_ns: u64) -> Result<Self> {
        let full = Self::check(capacity, refill_tokens, period_ns)?;
        Ok(Self { capacity, refill_tokens, period_ns, level: full, last_ns: now_ns })
    }

    pub fn from_state(capacity: u64, refill_tokens: u64, period_ns: u64, level: i128, last_ns: u64) -> Result<Self> {
        let full = Self::check(capacity, refill_tokens, period_ns)?;
        if level > full {
            return Err(CoreError::InvalidArgument(format!("level {level} is above the capacity {full}")));
        }
        if level < MIN_LEVEL {
            return Err(CoreError::InvalidArgument(format!("level {level} is below {MIN_LEVEL}")));
        }
        Ok(Self { capacity, refill_tokens, period_ns, level, last_ns })
    }

    fn check(capacity: u64, refill_tokens: u64, period_ns: u64) -> Result<i128> {
        if refill_tokens == 0 || period_ns == 0 {
            return Err(CoreError::InvalidArgument("refill_tokens and refill_period_ns must be positive".into()));
        }
        // u64 × u64 can reach 2^128, beyond i128; keep the full level well inside it, with room for debt.
        i128::from(capacity)
            .checked_mul(i128::from(period_ns))
            .filter(|full| *full <= MAX_FULL)
            .ok_or_else(|| CoreError::InvalidArgument("capacity × refill_period_ns is too large".into()))
    }

    fn full(&self) -> i128 {
        i128::from(self.capacity) * i128::from(self.period_ns)
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns <= self.last_ns {
            // Time going backwards counts as no time. A little is the order in which processes
            // sharing the bucket read their clocks; more is the clock stepped back (an NTP
            // correction): the bucket's clock then restarts from now, or it would refill nothing
            // until the clock passed its old reading again (time review: a step back of an hour
            // refused a key for an hour, its Retry-After saying seconds).
            if self.last_ns - now_ns > CLOCK_STEP_NS {
                self.last_ns = now_ns;
            }
            return;
        }
        let added = i128::from(now_ns - self.last_ns).saturating_mul(i128::from(self.refill_tokens));
        self.level = self.level.saturating_add(added).min(self.full());
        self.last_ns = now_ns;
    }

    fn whole_tokens(&self) -> u64 {
        u64::try_from(self.level.max(0) / i128::from(self.period_ns)).unwrap_or(u64::MAX)
    }

    fn wait_for(&self, units: i128) -> u64 {
        let missing = units.saturating_sub(self.level);
        if missing <= 0 {
            return 0;
        }
        let rate = i128::from(self.refill_tokens);
        u64::try_from((missing - 1) / rate + 1).unwrap_or(u64::MAX) // missing > 0: rounded up
    }

    pub fn try_take(&mut self, n: u64, now_ns: u64) -> TakeResult {
        self.refill(now_ns);
        if n > self.capacity {
            return TakeResult {
                allowed: false,
                remaining: self.whole_tokens(),
                retry_after_ns: self.wait_for(self.full()),
            };
        }
        let need = i128::from(n) * i128::from(self.period_ns);
        if self.level >= need {
            self.level -= need;
            TakeResult { allowed: true, remaining: self.whole_tokens(), retry_after_ns: 0 }
        } else {
            TakeResult { allowed: false, remaining: self.whole_tokens(), retry_after_ns: self.wait_for(need) }
        }
    }

    /// Correct a reservation: positive gives tokens back (never above capacity), negative takes more
    /// (the bucket may go into debt).
    pub fn adjust(&mut self, delta: i64, now_ns: u64) {
        self.refill(now_ns);
        let units = i128::from(delta).saturating_mul(i128::from(self.period_ns));
        self.level = self.level.saturating_add(units).clamp(MIN_LEVEL, self.full());
    }

    pub fn available(&mut self, now_ns: u64) -> u64 {
        self.refill(now_ns);
        self.whole_tokens()
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn state(&self) -> (i128, u64) {
        (self.level, self.last_ns)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MINUTE: u64 = 60_000_000_000;

    #[test]
    fn per_minute_limit() {
        let mut b = TokenBucket::new(60, 60, MINUTE, 0).unwrap();
        for i in 0..60 {
            let r = b.try_take(1, 0);
            assert!(r.allowed);
            assert_eq!(r.remaining, 59 - i);
        }
        let refused = b.try_take(1, 0);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_ns, 1_000_000_000); // one token a second
        assert!(!b.try_take(1, 999_999_999).allowed);
        assert!(b.try_take(1, 1_000_000_000).allowed);
    }

    #[test]
    fn more_than_capacity_is_never_allowed() {
        let mut b = TokenBucket::new(10, 10, MINUTE, 0).unwrap();
        b.try_take(4, 0);
        let r = b.try_take(11, 0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ns, 24_000_000_000); // until full again
    }

    #[test]
    fn adjust_gives_back_and_takes_into_debt() {
        let mut b = TokenBucket::new(100, 100, MINUTE, 0).unwrap();
        assert!(b.try_take(100, 0).allowed);
        b.adjust(30, 0);
        assert_eq!(b.available(0), 30);
        b.adjust(-50, 0);
        assert_eq!(b.available(0), 0);
        let r = b.try_take(1, 0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ns, 21 * 600_000_000); // 20 tokens of debt + 1
        b.adjust(1_000, 0);
        assert_eq!(b.available(0), 100);
    }

    #[test]
    fn time_backwards_and_state_round_trip() {
        let mut b = TokenBucket::new(5, 1, 1_000, 10_000).unwrap();
        assert!(b.try_take(5, 10_000).allowed);
        assert!(!b.try_take(1, 5_000).allowed);
        let (level, last) = b.state();
        let mut c = TokenBucket::from_state(5, 1, 1_000, level, last).unwrap();
        assert_eq!(c.try_take(1, 11_000), b.try_take(1, 11_000));
        assert!(TokenBucket::from_state(5, 1, 1_000, 5_001, 0).is_err());
        assert!(TokenBucket::new(5, 0, 1_000, 0).is_err());
        assert!(TokenBucket::new(u64::MAX, 1, u64::MAX, 0).is_err());
    }

    #[test]
    fn a_clock_stepped_back_restarts_the_buckets_clock() {
        const SECOND: u64 = 1_000_000_000;
        let hour_on = 3_600 * SECOND;
        let mut b = TokenBucket::new(3, 3, MINUTE, hour_on).unwrap(); // 3 a minute
        assert!(b.try_take(3, hour_on).allowed);
        // The clock steps back an hour: no time passed, and from there it refills as it would
        // have (it refilled nothing until the clock passed its old reading again).
        let stepped = SECOND;
        let r = b.try_take(1, stepped);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ns, 20 * SECOND);
        assert!(b.try_take(1, stepped + 20 * SECOND).allowed);
        // A reading a moment behind the last (processes sharing the bucket) counts as no time,
        // and does not move the bucket's clock back: that moment is not refilled twice.
        let last = b.state().1;
        assert!(!b.try_take(1, last - CLOCK_STEP_NS).allowed);
        assert_eq!(b.state().1, last);
        assert!(!b.try_take(1, last + 20 * SECOND - 1).allowed);
        assert!(b.try_take(1, last + 20 * SECOND).allowed);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let mut b = TokenBucket::new(3, u64::MAX, u64::MAX, 0).unwrap();
        b.adjust(i64::MIN, 0);
        b.adjust(i64::MIN, 0);
        assert_eq!(b.state().0, MIN_LEVEL);
        let r = b.try_take(1, 0);
        assert!(!r.allowed && r.retry_after_ns > 0);
        assert_eq!(b.available(0), 0);
        assert!(b.try_take(3, u64::MAX).allowed); // the longest wait refills it all
        b.adjust(i64::MAX, u64::MAX);
        assert_eq!(b.available(u64::MAX), 3);
        assert!(TokenBucket::from_state(1, 1, 1, MIN_LEVEL - 1, 0).is_err());
        let mut slow = TokenBucket::new(1, 1, u64::MAX, 0).unwrap();
        slow.adjust(i64::MIN, 0);
        assert_eq!(slow.try_take(1, 0).retry_after_ns, u64::MAX); // saturates, does not wrap
    }

    proptest! {
        #[test]
        fn admitted_never_exceeds_capacity_plus_refill(
            capacity in 1u64..1_000,
            refill in 1u64..1_000,
            period in 1u64..10_000_000_000,
            steps in proptest::collection::vec((0u64..2_000, 0u64..5_000_000_000, -60i64..60), 1..200),
        ) {
            // Tokens given back by a positive adjust may be taken again, so they count against the bound.
            let mut b = TokenBucket::new(capacity, refill, period, 0).unwrap();
            let mut now = 0u64;
            let mut admitted: i128 = 0;
            for (n, dt, delta) in steps {
                now += dt;
                b.adjust(delta, now);
                if delta > 0 {
                    admitted -= i128::from(delta);
                }
                let r = b.try_take(n, now);
                if r.allowed {
                    admitted += i128::from(n);
                } else if n <= capacity {
                    prop_assert!(r.retry_after_ns > 0);
                }
                // Exact: admitted × period ≤ capacity × period + refill × elapsed.
                prop_assert!(admitted * i128::from(period) <= i128::from(capacity) * i128::from(period) + i128::from(refill) * i128::from(now));
            }
        }

        #[test]
        fn retry_after_is_exactly_enough(capacity in 1u64..500, n in 1u64..500, spent in 0u64..500) {
            prop_assume!(n <= capacity);
            let mut b = TokenBucket::new(capacity, 7, 3_000, 0).unwrap();
            b.try_take(spent.min(capacity), 0);
            let r = b.try_take(n, 0);
            if !r.allowed {
                let mut late = b.clone();
                prop_assert!(late.try_take(n, r.retry_after_ns).allowed);
                let mut early = b.clone();
                prop_assert!(!early.try_take(n, r.retry_after_ns - 1).allowed);
            }
        }
    }
}
