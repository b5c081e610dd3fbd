-- syncgen.lua: give this owner's lease the database's generation.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=generation (decimal, >= 1) ARGV[2]=owner
-- Returns 1 when ARGV[2] held the lease and its generation is now ARGV[1]
-- (its TTL unchanged); 0 otherwise, with nothing written.
-- Called when the durable store picked another generation than claim.lua
-- proposed, so that complete.lua's staleness rule compares durable
-- generations.
-- Server calls (EVALSHA included): 3 (GET, SET).
-- Safe to re-run: a second run writes the same value.
local kind, _, ms, owner, fp = parse(redis.call('GET', KEYS[1]))
if kind == 'L' and owner == ARGV[2] then
  redis.call('SET', KEYS[1], 'L' .. ARGV[1] .. ':' .. ms .. ':' .. owner .. fp, 'KEEPTTL')
  return 1
end
return 0
