-- complete.lua: cache a finished result, and drop the lease if this owner
-- holds it.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=owner ('' when refilling the cache from the database: it holds no
--         lease)
-- ARGV[2]=generation (decimal) ARGV[3]=fingerprint ARGV[4]=blob
-- ARGV[5]=ttl_ms (0: cache nothing, only drop the lease)
-- ARGV[6]="F" (optional): the result is too large to cache; write the "F"
--         marker (finished: read the durable store) instead, ARGV[4] ''.
-- Returns {cached, dropped}: cached is 1 when rec holds this result, or its
-- marker, afterwards; dropped is 1 when this call removed ARGV[1]'s lease.
-- Whenever it writes, it wakes the duplicates waiting on the key: an
-- SPUBLISH on the shard channel KEYS[1] .. ':wake', which shares KEYS[1]'s
-- hash tag and so its slot (a server without sharded pub/sub, before Redis
-- 7, fails the SPUBLISH alone, which is ignored: waiters poll there).
-- Rules, in order:
--   1. a confirmed lease of another owner with a higher generation means
--      this completion is stale: nothing is written. A tentative lease
--      never stops a finished result: the durable store has not granted
--      it, and its holder will find this result there;
--   2. a cached result or marker of a higher generation is kept (not
--      overwritten); the same value is left as it is, TTL included, so a
--      re-run changes nothing;
--   3. otherwise the result (or marker) is written, replacing the lease the
--      key held (this owner's, a tentative one, or another owner's of a
--      generation not above this one: the store committed this result, so
--      that lease is stale);
--   4. with nothing to cache, the lease is deleted only if ARGV[1] holds it.
-- Server calls for a first completion by the lease holder (EVALSHA
-- included): 4 (GET, SET, SPUBLISH).
-- Safe to re-run: a second run finds the same value cached and writes
-- nothing.
local v = redis.call('GET', KEYS[1])
local kind, gen, x, y, _, tent = parse(v)
local mine = kind == 'L' and ARGV[1] ~= '' and y == ARGV[1]
if kind == 'L' and not mine and not tent and gt(gen, ARGV[2]) then
  return {0, 0}
end

local dropped = 0
if mine then dropped = 1 end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  if (kind == 'R' or kind == 'F') and gt(gen, ARGV[2]) then
    return {0, 0}
  end
  local r
  if ARGV[6] == 'F' then
    if kind == 'R' and gen == ARGV[2] and x == ARGV[3] then
      return {1, dropped} -- the result itself is cached already
    end
    r = 'F' .. ARGV[2] .. ':' .. #ARGV[3] .. ':' .. ARGV[3]
  else
    r = 'R' .. ARGV[2] .. ':' .. #ARGV[3] .. ':' .. ARGV[3] .. ARGV[4]
  end
  if v ~= r then
    redis.call('SET', KEYS[1], r, 'PX', ttl)
    redis.pcall('SPUBLISH', KEYS[1] .. ':wake', ARGV[2])
  end
  return {1, dropped}
end
if mine then
  redis.call('DEL', KEYS[1])
  redis.pcall('SPUBLISH', KEYS[1] .. ':wake', ARGV[2])
end
return {0, dropped}
