-- complete.lua: cache a finished result, and drop the lease if this owner
-- holds it.
-- KEYS[1]=rec (record.lua, the prelude, gives its two forms)
-- ARGV[1]=owner ('' when refilling the cache from the database: it holds no
--         lease)
-- ARGV[2]=generation (decimal) ARGV[3]=fingerprint ARGV[4]=blob
-- ARGV[5]=ttl_ms (0: cache nothing, only drop the lease)
-- Returns {cached, dropped}: cached is 1 when rec holds this result
-- afterwards, dropped is 1 when this call removed ARGV[1]'s lease.
-- Rules, in order:
--   1. a lease of another owner with a higher generation means this
--      completion is stale: nothing is written;
--   2. a cached result of a higher generation is kept (not overwritten);
--      the same result (fingerprint, generation, blob) is left as it is,
--      TTL included, so a re-run changes nothing;
--   3. otherwise the result is written, replacing the lease the key held
--      (this owner's, or another owner's of a generation not above this
--      one: the store committed this result, so that lease is stale);
--   4. with nothing to cache, the lease is deleted only if ARGV[1] holds it.
-- Server calls for a first completion by the lease holder (EVALSHA
-- included): 3 (GET, SET).
-- Safe to re-run: a second run finds the same result cached and writes
-- nothing.
local v = redis.call('GET', KEYS[1])
local kind, gen, x, y = parse(v)
local mine = kind == 'L' and ARGV[1] ~= '' and y == ARGV[1]
if kind == 'L' and not mine and gt(gen, ARGV[2]) then
  return {0, 0}
end

local dropped = 0
if mine then dropped = 1 end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  if kind == 'R' and gt(gen, ARGV[2]) then
    return {0, 0}
  end
  local r = 'R' .. ARGV[2] .. ':' .. #ARGV[3] .. ':' .. ARGV[3] .. ARGV[4]
  if v ~= r then
    redis.call('SET', KEYS[1], r, 'PX', ttl)
  end
  return {1, dropped}
end
if mine then
  redis.call('DEL', KEYS[1])
end
return {0, dropped}
