"""Token buckets in Redis, for gateways of many instances (gateway.buckets has the interface).

Each operation is one Lua script run by EVALSHA (loaded again when Redis answers NOSCRIPT, after a
restart), so it is atomic across every process of every instance: read the bucket, refill it, take
or correct, write it back. The arithmetic is the Rust core's (rust/core/src/ratelimit.rs and
shared_buckets.rs), exactly: the level is kept in units of token x period_ns as an integer, so no
rounding ever happens. Lua's numbers are doubles (exact only below 2**53, while a level reaches
2**125 and a nanosecond time 2**61), so the script does its integer arithmetic on numbers written
in base 10**7 digits (`bignum` below), with every product of two digits exact in a double.

That costs Redis's one thread 100-130 us per operation. The script's quick path answers first
whenever it can: the period, the time and the stored bucket in whole milliseconds and every level
in token x ms within 2**51 (a limit of up to ~37 billion tokens a minute), where the same arithmetic
is exact in doubles (~40 us). The gateway's buckets are always such (minute periods, the server's
clock read to the millisecond); anything else takes the bignum path, with the same answers
(property-tested against the Rust core both ways).

One Redis key per bucket, its value "<level> <last_ns> <period_ns> <capacity>", written by
every operation (as the file's slot is) with an expiry (PX): when the bucket would be full again, at
least one period later, plus EXPIRY_SLACK_MS; so keys of idle API keys never accumulate. A missing
key is a new, full bucket, and forgetting a bucket that is full is invisible: after one period
without use a bucket is full under any limit that refills its capacity within its period (every
limit the gateway sets), even one raised meanwhile. The one difference from the file, which keeps a
bucket until its slot is needed: a bucket still in debt when it expires (more than MAX_EXPIRY_MS, or
its limit lowered meanwhile) starts full.

The clock: `now_ns=None` (what the gateway passes) reads the Redis server's clock (TIME) inside
the script, to the millisecond, so every instance measures time on one clock and their own clocks
may differ. A
given `now_ns` is used as is (the tests compare the script with the Rust core on their own times).
"""

from __future__ import annotations

import logging
from typing import Final

from .buckets import BucketsUnavailable
from .core import CoreError
from .frozen import frozen
from .redis_client import UNAVAILABLE, RedisClient

log = logging.getLogger("gateway.ratelimits")

U64_MAX: Final = 2**64 - 1
I64_MIN: Final = -(2**63)
I64_MAX: Final = 2**63 - 1
# The Rust core's bound on a full level (i128::MAX / 4).
MAX_FULL: Final = (2**127 - 1) // 4
# What the buckets' keys are named under ("<prefix>:rl2:<key id>:requests"). rl2: the value keeps
# the capacity it was written under since 2026-12-02 (a changed limit moves the level by the change);
# a release that kept three fields reads four as no bucket, and this one three, so the two count
# apart while both run (a rolling upgrade: each allows the limit, at most twice it together) rather
# than each reading the other's buckets as full.
RATE_LIMIT_KEYS: Final = "rl2"
# Added to a key's expiry: a bucket kept a little past the moment it is full again is still full.
EXPIRY_SLACK_MS: Final = 1_000
# The longest a bucket is kept (one in debt for longer starts full again afterwards): a week.
MAX_EXPIRY_MS: Final = 7 * 24 * 3600 * 1000

SCRIPT: Final = r"""
-- One operation on one token bucket. KEYS[1]: the bucket. ARGV: op ("take", "adjust",
-- "available"), capacity, refill_tokens, period_ns, amount (n to take, delta to adjust),
-- now_ns ("" for the server's clock), expiry slack in ms, longest expiry in ms, and "1" to take
-- the quick path when it applies ("0": always the bignum one).

-- A clock reading this far behind the bucket's last is the clock stepped back (ratelimit.rs).
local CLOCK_STEP_NS = 1000000000
local key, op, period_s = KEYS[1], ARGV[1], ARGV[4]
local now_s = ARGV[6]
if now_s == '' then
  -- The server's clock to the millisecond, so that the quick path below applies.
  if redis.replicate_commands then redis.replicate_commands() end -- Redis < 7: TIME before writes
  local t = redis.call('TIME')
  now_s = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) .. '000000'
end
local stored = redis.call('GET', key)

-- The quick path: when the period, the time and the stored bucket are whole milliseconds and every
-- quantity in units of token x ms stays within +-2^52, the same arithmetic is exact in Lua's
-- doubles (integers below 2^53), and the answer is the bignum path's to the digit at a fraction of
-- its cost to Redis. Every other case falls through to the bignum path below.
do
  local LIMIT = 2251799813685248 -- 2^51
  local function small(s) -- a decimal integer of at most 15 characters (exact in a double), else nil
    if #s > 15 or not string.find(s, '^%-?%d+$') then return nil end
    return tonumber(s)
  end
  local function millis(s) -- nanoseconds that are whole milliseconds: the milliseconds, else nil
    if s == '0' then return 0 end
    if #s < 7 or string.sub(s, -6) ~= '000000' then return nil end
    return small(string.sub(s, 1, -7))
  end
  local capacity, rate, amount = small(ARGV[2]), small(ARGV[3]), small(ARGV[5])
  local period, now = millis(period_s), millis(now_s)
  local slack, longest = small(ARGV[7]), small(ARGV[8])
  local quick = ARGV[9] == '1' and capacity and rate and amount and period and now and slack and longest
    and rate >= 1 and rate <= 9000000000 and period >= 1 and capacity * period <= LIMIT
    and math.abs(amount) * period <= LIMIT
  local full = quick and capacity * period
  local level, last = full, now
  if quick and stored then
    local l, t, p, c = string.match(stored, '^(%-?%d+) (%d+) (%d+) (%d+)$')
    if l and p == period_s then
      level, last = millis(l), millis(t)
      local was = small(c)
      if level == nil or last == nil or was == nil or was * period > LIMIT or level < -LIMIT then
        quick = false
      else
        -- Under a changed capacity what was taken stays taken: the level moves by the change.
        level = level + (capacity - was) * period
        if level < -LIMIT then quick = false elseif level > full then level = full end
      end
    end
  end
  if quick then
    if now > last then
      local added = (now - last) * rate
      if added >= 2 * LIMIT then level = full else level = math.min(level + added, full) end
      last = now
    elseif last - now > CLOCK_STEP_NS / 1000000 then
      last = now -- the clock stepped back: the bucket's clock restarts from now (as the core's)
    end -- else time going backwards counts as no time
    local function text(v) return string.format('%.0f', v) end
    local function whole()
      if level <= 0 then return '0' end
      return text((level - math.fmod(level, period)) / period)
    end
    -- Nanoseconds until the level reaches `units` (token x ms): ceil(missing x 10^6 / rate), at
    -- most u64::MAX, as text; the product is split so that each part stays exact.
    local function wait_for(units)
      local missing = units - level
      if missing <= 0 then return '0' end
      local r1 = math.fmod(missing, rate)
      local q1 = (missing - r1) / rate
      local scaled = r1 * 1000000 -- below rate x 10^6 <= 9 x 10^15
      local r2 = math.fmod(scaled, rate)
      local q2 = (scaled - r2) / rate
      if r2 > 0 then q2 = q2 + 1 end
      if q2 == 1000000 then q1, q2 = q1 + 1, 0 end
      if q1 == 0 then return text(q2) end
      if q1 > 18446744073709 or (q1 == 18446744073709 and q2 > 551615) then return '18446744073709551615' end
      return text(q1) .. string.format('%06d', q2)
    end
    local result
    if op == 'take' then
      if amount > capacity then
        result = {0, whole(), wait_for(full)}
      else
        local need = amount * period
        if level >= need then
          level = level - need
          result = {1, whole(), '0'}
        else
          result = {0, whole(), wait_for(need)}
        end
      end
    elseif op == 'adjust' then
      level = math.min(level + amount * period, full) -- at least -2^52: far above the debt's floor
      result = whole()
    else
      result = whole()
    end
    -- Kept until full again (ceil(missing / rate) ms), at least a period, plus the slack.
    local keep = 0
    if full > level then
      local r = math.fmod(full - level, rate)
      keep = (full - level - r) / rate
      if r > 0 then keep = keep + 1 end
      if keep > 18446744073710 then keep = 18446744073710 end -- as the bignum path's u64::MAX ns
    end
    if keep < period then keep = period end
    keep = math.min(keep + slack, longest)
    local function ns(v) if v == 0 then return '0' end return text(v) .. '000000' end
    local value = ns(level) .. ' ' .. ns(last) .. ' ' .. period_s .. ' ' .. ARGV[2]
    redis.call('SET', key, value, 'PX', text(keep))
    return result
  end
end

-- The bignum path. Non-negative integers are arrays of base-10^7 digits, least significant first.
local B = 10000000

local function norm(a)
  local n = #a
  while n > 1 and a[n] == 0 do a[n] = nil; n = n - 1 end
  return a
end

local function parse(s)
  local a = {}
  local i = #s
  while i >= 1 do
    local j = i - 6
    if j < 1 then j = 1 end
    a[#a + 1] = tonumber(string.sub(s, j, i))
    i = j - 1
  end
  if #a == 0 then a[1] = 0 end
  return norm(a)
end

local function fmt(a)
  local parts = {string.format('%d', a[#a])}
  for i = #a - 1, 1, -1 do parts[#parts + 1] = string.format('%07d', a[i]) end
  return table.concat(parts)
end

local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end

local function add(a, b)
  local c, carry = {}, 0
  local n = math.max(#a, #b)
  for i = 1, n do
    local s = (a[i] or 0) + (b[i] or 0) + carry
    if s >= B then c[i] = s - B; carry = 1 else c[i] = s; carry = 0 end
  end
  if carry > 0 then c[n + 1] = carry end
  return c
end

local function sub(a, b) -- a >= b
  local c, borrow = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - borrow
    if s < 0 then c[i] = s + B; borrow = 1 else c[i] = s; borrow = 0 end
  end
  return norm(c)
end

local function mul(a, b)
  local c = {}
  for i = 1, #a + #b do c[i] = 0 end
  for i = 1, #a do
    local ai, carry = a[i], 0
    if ai ~= 0 then
      for j = 1, #b do
        local cur = c[i + j - 1] + ai * b[j] + carry -- below 10^14 + 2 * 10^7: exact
        local r = math.fmod(cur, B)
        c[i + j - 1] = r
        carry = (cur - r) / B
      end
      local k = i + #b
      while carry > 0 do
        local cur = c[k] + carry
        local r = math.fmod(cur, B)
        c[k] = r
        carry = (cur - r) / B
        k = k + 1
      end
    end
  end
  return norm(c)
end

local function approx(a)
  local v = 0
  for i = #a, 1, -1 do v = v * B + a[i] end
  return v
end

local function divmod(a, b) -- b > 0; long division, one base-10^7 digit at a time
  if cmp(a, b) < 0 then return {0}, a end
  local q, r = {}, {0}
  local bd = approx(b)
  for i = #a, 1, -1 do
    if #r == 1 and r[1] == 0 then r = {a[i]} else table.insert(r, 1, a[i]) end
    local d = 0
    if cmp(r, b) >= 0 then
      -- r < b * B, so the digit is below B; the estimate is off by one at most, then corrected.
      d = math.floor(approx(r) / bd)
      if d >= B then d = B - 1 end
      if d < 1 then d = 1 end
      local t = mul(b, {d})
      while cmp(t, r) > 0 do d = d - 1; t = sub(t, b) end
      r = sub(r, t)
      while cmp(r, b) >= 0 do d = d + 1; r = sub(r, b) end
    end
    q[i] = d
  end
  return norm(q), r
end

-- Signed integers: {neg = boolean, m = magnitude}; zero is never negative.
local function S(neg, m)
  if #m == 1 and m[1] == 0 then neg = false end
  return {neg = neg, m = m}
end
local function sparse(s)
  if string.sub(s, 1, 1) == '-' then return S(true, parse(string.sub(s, 2))) end
  return S(false, parse(s))
end
local function sfmt(x)
  if x.neg then return '-' .. fmt(x.m) end
  return fmt(x.m)
end
local function sneg(x) return S(not x.neg, x.m) end
local function sadd(x, y)
  if x.neg == y.neg then return S(x.neg, add(x.m, y.m)) end
  if cmp(x.m, y.m) >= 0 then return S(x.neg, sub(x.m, y.m)) end
  return S(y.neg, sub(y.m, x.m))
end
local function scmp(x, y)
  if x.neg ~= y.neg then return x.neg and -1 or 1 end
  local c = cmp(x.m, y.m)
  if x.neg then return -c end
  return c
end

local ZERO, ONE = {0}, {1}
local U64_MAX = parse('18446744073709551615')
local MIN_LEVEL = S(true, parse('42535295865117307932921825928971026432')) -- i128::MIN / 4

local capacity, rate = parse(ARGV[2]), parse(ARGV[3])
local period = parse(period_s)
local now = parse(now_s)
local full = S(false, mul(capacity, period))

-- The bucket: as stored, moved by a changed capacity (what was taken stays taken), or full when
-- new or its period changed.
local level, last
if stored then
  local l, t, p, c = string.match(stored, '^(%-?%d+) (%d+) (%d+) (%d+)$')
  if l and p == period_s then
    level, last = sparse(l), parse(t)
    level = sadd(level, sadd(full, sneg(S(false, mul(parse(c), period)))))
    if scmp(level, full) > 0 then level = full end
    if scmp(level, MIN_LEVEL) < 0 then level = MIN_LEVEL end
  end
end
if not level then level, last = full, now end

local function refill()
  if cmp(now, last) <= 0 then -- time going backwards counts as no time; a step back, see the core's
    if cmp(sub(last, now), parse(string.format('%.0f', CLOCK_STEP_NS))) > 0 then last = now end
    return
  end
  level = sadd(level, S(false, mul(sub(now, last), rate)))
  if scmp(level, full) > 0 then level = full end
  last = now
end

local function whole()
  if level.neg then return ZERO end
  return (divmod(level.m, period))
end

-- Nanoseconds until the level reaches `units`, rounded up; at most u64::MAX.
local function wait_for(units)
  local missing = sadd(units, sneg(level))
  if missing.neg or cmp(missing.m, ZERO) == 0 then return ZERO end
  local q = add((divmod(sub(missing.m, ONE), rate)), ONE)
  if cmp(q, U64_MAX) > 0 then return U64_MAX end
  return q
end

local result
refill()
if op == 'take' then
  local n = parse(ARGV[5])
  if cmp(n, capacity) > 0 then
    result = {0, fmt(whole()), fmt(wait_for(full))}
  else
    local need = S(false, mul(n, period))
    if scmp(level, need) >= 0 then
      level = sadd(level, sneg(need))
      result = {1, fmt(whole()), '0'}
    else
      result = {0, fmt(whole()), fmt(wait_for(need))}
    end
  end
elseif op == 'adjust' then
  local delta = sparse(ARGV[5])
  level = sadd(level, S(delta.neg, mul(delta.m, period)))
  if scmp(level, MIN_LEVEL) < 0 then level = MIN_LEVEL end
  if scmp(level, full) > 0 then level = full end
  result = fmt(whole())
else
  result = fmt(whole())
end

-- Kept until it is full again, and at least one period (a bucket idle that long is full under
-- any limit that refills its capacity within its period, the gateway's), plus the slack; in whole
-- ms rounded up, at most `longest` ms.
local function ms(ns)
  local q, r = divmod(ns, {1000000})
  if cmp(r, ZERO) > 0 then q = add(q, ONE) end
  return q
end
local keep = ms(wait_for(full))
if cmp(keep, ms(period)) < 0 then keep = ms(period) end
keep = add(keep, parse(ARGV[7]))
local longest = parse(ARGV[8])
if cmp(keep, longest) > 0 then keep = longest end
local value = sfmt(level) .. ' ' .. fmt(last) .. ' ' .. period_s .. ' ' .. fmt(capacity)
redis.call('SET', key, value, 'PX', fmt(keep))
return result
"""


@frozen
class RedisTaken:
    allowed: bool
    remaining: int
    retry_after_ns: int


class RedisBuckets:
    """The buckets in Redis under `prefix` + key, through `client` (gateway.redis_client.connect).
    Raises BucketsUnavailable when Redis cannot be used."""

    def __init__(
        self,
        client: RedisClient,
        prefix: str = f"gw:{RATE_LIMIT_KEYS}:",
        expiry_slack_ms: int = EXPIRY_SLACK_MS,
        max_expiry_ms: int = MAX_EXPIRY_MS,
        quick: bool = True,
    ) -> None:
        """`quick=False` runs every operation by the script's bignum path (the tests compare both)."""
        self._prefix = prefix
        self._script = client.register_script(SCRIPT)
        self._tail = (str(expiry_slack_ms), str(max_expiry_ms), "1" if quick else "0")

    async def try_take(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, n: int, now_ns: int | None
    ) -> RedisTaken:
        _u64(n)
        answer = await self._run("take", key, capacity, refill_tokens, refill_period_ns, n, now_ns)
        assert isinstance(answer, list)
        allowed, remaining, retry = answer
        return RedisTaken(bool(allowed), int(remaining), int(retry))

    async def available(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, now_ns: int | None
    ) -> int:
        answer = await self._run("available", key, capacity, refill_tokens, refill_period_ns, 0, now_ns)
        assert isinstance(answer, bytes)
        return int(answer)

    async def adjust(
        self,
        key: str,
        capacity: int,
        refill_tokens: int,
        refill_period_ns: int,
        delta: int,
        now_ns: int | None,
    ) -> int:
        if not I64_MIN <= delta <= I64_MAX:
            raise OverflowError(f"{delta} is outside i64")
        answer = await self._run("adjust", key, capacity, refill_tokens, refill_period_ns, delta, now_ns)
        assert isinstance(answer, bytes)
        return int(answer)

    async def _run(
        self,
        op: str,
        key: str,
        capacity: int,
        refill_tokens: int,
        period_ns: int,
        amount: int,
        now_ns: int | None,
    ) -> object:
        """The script's answer: [allowed, remaining, retry_after_ns] for "take", else the whole
        tokens left (numbers as decimal bytes: Lua's own numbers would lose digits)."""
        # The Rust core's checks, before Redis is asked anything.
        for value in (capacity, refill_tokens, period_ns):
            _u64(value)
        if now_ns is not None:
            _u64(now_ns)
        if refill_tokens == 0 or period_ns == 0:
            raise CoreError("refill_tokens and refill_period_ns must be positive")
        if capacity * period_ns > MAX_FULL:
            raise CoreError("capacity x refill_period_ns is too large")
        args = [op, capacity, refill_tokens, period_ns, amount, "" if now_ns is None else now_ns, *self._tail]
        try:
            result: object = await self._script(keys=[self._prefix + key], args=args)
        except UNAVAILABLE as exc:
            raise BucketsUnavailable(f"Redis is unavailable: {exc}") from exc
        return result


def _u64(value: int) -> None:
    if not 0 <= value <= U64_MAX:
        raise OverflowError(f"{value} is outside u64")
