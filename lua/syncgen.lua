-- syncgen.lua: raise the generation counter to the database's generation.
-- KEYS[1]=lease KEYS[2]=gen
-- ARGV[1]=generation (decimal, >= 1) ARGV[2]=owner ('' for none)
-- ARGV[3]=retention_ms
-- Returns {counter, rewritten}: the counter afterwards (decimal string) and
-- 1 when ARGV[2] held the lease and its generation is now ARGV[1].
-- The counter only goes up: counter = max(counter, ARGV[1]); its TTL is
-- raised to at least the retention, never lowered.
-- Safe to re-run: a second run writes the same values.
local function gt(a, b) -- a > b for canonical decimal strings
  if #a ~= #b then return #a > #b end
  return a > b
end

local cur = redis.call('GET', KEYS[2])
if (not cur) or gt(ARGV[1], cur) then
  redis.call('SET', KEYS[2], ARGV[1], 'KEEPTTL')
  cur = ARGV[1]
end
local retention = tonumber(ARGV[3])
if redis.call('PTTL', KEYS[2]) < retention then
  redis.call('PEXPIRE', KEYS[2], retention)
end

local rewritten = 0
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'o') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'g', ARGV[1])
  rewritten = 1
end
return {cur, rewritten}
