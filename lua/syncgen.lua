-- syncgen.lua: give this owner's lease the database's generation.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=generation (decimal, >= 1) ARGV[2]=owner
-- Returns 1 when ARGV[2] held the lease and its generation is now ARGV[1],
-- confirmed ("L": the durable store granted it), its TTL unchanged; 0
-- otherwise, with nothing written: a lease that is gone is not brought
-- back, so a late run after the completion changes nothing.
-- Called once the durable store granted the key: it confirms the tentative
-- lease claim.lua took, so duplicates are answered "in progress" by Redis
-- alone, and, when the store picked another generation than claim.lua
-- proposed, makes complete.lua's staleness rule compare durable
-- generations.
-- Server calls (EVALSHA included): 3 (GET, SET).
-- Safe to re-run: a second run writes the same value.
local kind, _, ms, owner, fp = parse(redis.call('GET', KEYS[1]))
if kind == 'L' and owner == ARGV[2] then
  redis.call('SET', KEYS[1], 'L' .. ARGV[1] .. ':' .. ms .. ':' .. owner .. fp, 'KEEPTTL')
  return 1
end
return 0
