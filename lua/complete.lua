-- complete.lua: cache a finished result, and drop the lease if this owner
-- holds it.
-- KEYS[1]=lease KEYS[2]=result
-- ARGV[1]=owner ('' when refilling the cache from the database: no lease
--         is touched)
-- ARGV[2]=generation (decimal) ARGV[3]=fingerprint ARGV[4]=blob
-- ARGV[5]=ttl_ms (0: cache nothing, only drop the lease)
-- Returns {cached, dropped}: cached is 1 when the result hash holds this
-- result afterwards, dropped is 1 when this owner's lease was deleted.
-- Rules, in order:
--   1. a lease of another owner with a higher generation means this
--      completion is stale: nothing is written;
--   2. a cached result of a higher generation is kept (not overwritten);
--      the same result (fingerprint, generation, blob) is left as it is,
--      TTL included, so a re-run changes nothing;
--   3. the lease is deleted only if ARGV[1] holds it.
-- Server calls for a first completion by the lease holder: 5 (HMGET, HMGET,
-- HSET, PEXPIRE, DEL).
-- Safe to re-run: a second run finds the same result cached and no lease of
-- ARGV[1], and writes nothing.
local function gt(a, b) -- a > b for canonical decimal strings
  if #a ~= #b then return #a > #b end
  return a > b
end

local lease = redis.call('HMGET', KEYS[1], 'o', 'g')
if lease[1] and lease[1] ~= ARGV[1] and lease[2] and gt(lease[2], ARGV[2]) then
  return {0, 0}
end

local cached = 0
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  local r = redis.call('HMGET', KEYS[2], 'f', 'g', 'd')
  if r[1] and r[2] and gt(r[2], ARGV[2]) then
    cached = 0
  elseif r[1] == ARGV[3] and r[2] == ARGV[2] and r[3] == ARGV[4] then
    cached = 1
  else
    -- The result hash holds f, g and d alone: HSET overwrites all three.
    redis.call('HSET', KEYS[2], 'f', ARGV[3], 'g', ARGV[2], 'd', ARGV[4])
    redis.call('PEXPIRE', KEYS[2], ttl)
    cached = 1
  end
end

local dropped = 0
if ARGV[1] ~= '' and lease[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  dropped = 1
end
return {cached, dropped}
