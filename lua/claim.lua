-- claim.lua: take the lease of one idempotency key, or say why not.
-- KEYS[1]=lease KEYS[2]=gen KEYS[3]=result (one hash tag: one slot)
-- ARGV[1]=fingerprint ARGV[2]=owner ARGV[3]=lease_ms ARGV[4]=retention_ms
-- ARGV[5]="ttl" (optional): a cached reply carries the result's PTTL too
-- (the in-process replay cache keeps its copy no longer than Redis's).
-- Returns one of:
--   {"cached", fingerprint, generation, blob}  a result with this fingerprint is cached
--   {"cached", fingerprint, generation, blob, pttl_ms}  the same, asked with "ttl"
--   {"mismatch"}                                a result with another fingerprint is cached
--   {"acquired", generation}                    this owner holds the lease now
--   {"busy", generation, owner, pttl_ms, same}  another owner holds a live lease;
--                                               same is 1 when it is for this fingerprint
-- A live lease of this owner with another fingerprint is busy too. A
-- lease's fingerprint never makes a mismatch: a lease left behind by a
-- release that did not reach Redis must not make a new request fail for good.
-- A new lease proposes generation = max(counter + 1, Redis clock ms - 59000)
-- and stores it in the counter. The durable store gives a record it creates
-- or restarts at least its own clock ms - 60000: when the two clocks agree
-- within a second the database keeps this proposal and no sync is needed.
-- A counter already ahead of the clock rises by 1. The counter's TTL is
-- raised to the retention, never lowered.
-- Server calls: a replay 1 (HMGET; 2 with "ttl": HMGET, PTTL), a busy duplicate 3 (HMGET, HMGET, PTTL),
-- a new key 7 (HMGET, HMGET, TIME, GET, SET, HSET, PEXPIRE); each read is
-- of a key the script does not write before it.
-- Generations travel as decimal strings: a Lua number is a double, exact for
-- the clock's ~1.8e12 but not above 2^53, and tostring would print 1.8e+12.
-- Safe to re-run: a second run by the lease holder finds its own lease and
-- returns the same generation without proposing another.
local function gt(a, b) -- a > b for canonical decimal strings
  if #a ~= #b then return #a > #b end
  return a > b
end

local function inc(s) -- s + 1 for a canonical decimal string
  local i = #s
  while i > 0 and string.sub(s, i, i) == '9' do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) ..
    string.rep('0', #s - i)
end

local res = redis.call('HMGET', KEYS[3], 'f', 'g', 'd')
if res[1] then
  if res[1] == ARGV[1] then
    if ARGV[5] == 'ttl' then
      return {'cached', res[1], res[2], res[3], redis.call('PTTL', KEYS[3])}
    end
    return {'cached', res[1], res[2], res[3]}
  end
  return {'mismatch'}
end

local lease = redis.call('HMGET', KEYS[1], 'o', 'g', 'f')
if lease[1] then
  if lease[1] == ARGV[2] and lease[3] == ARGV[1] then
    return {'acquired', lease[2]}
  end
  local same = 0
  if lease[3] == ARGV[1] then same = 1 end
  return {'busy', lease[2], lease[1], redis.call('PTTL', KEYS[1]), same}
end

-- TIME is {seconds, microseconds}; whole ms since the epoch minus 59 s.
local now = redis.call('TIME')
local floor = string.format('%d',
  tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - 59000)
local retention = ARGV[4]
local gen = redis.call('GET', KEYS[2])
if gen and string.match(gen, '^[1-9]%d*$') then
  gen = inc(gen)
  if gt(floor, gen) then gen = floor end
  redis.call('SET', KEYS[2], gen, 'KEEPTTL')
  -- Keep the counter at least for the retention; never shorten it (PTTL is
  -- -1 for a counter without a TTL). PEXPIRE's GT would save the PTTL but
  -- needs Redis 7.
  if redis.call('PTTL', KEYS[2]) < tonumber(retention) then
    redis.call('PEXPIRE', KEYS[2], retention)
  end
else
  -- No counter (or not a generation): the clock's proposal, kept for the
  -- retention.
  gen = floor
  redis.call('SET', KEYS[2], gen, 'PX', retention)
end
redis.call('HSET', KEYS[1], 'o', ARGV[2], 'g', gen, 'f', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'acquired', gen}
