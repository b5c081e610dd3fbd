-- syncgen.lua: give this owner's lease the database's generation.
-- KEYS[1]=rec (claim.lua's header gives its forms)
-- ARGV[1]=generation (decimal, >= 1) ARGV[2]=owner
-- Returns 1 when ARGV[2] held the lease and its generation is now ARGV[1]
-- (its TTL unchanged); 0 otherwise, with nothing written.
-- Called when the durable store picked another generation than claim.lua
-- proposed, so that complete.lua's staleness rule compares durable
-- generations.
-- Server calls (EVALSHA included): 3 (GET, SET).
-- Safe to re-run: a second run writes the same value.
-- leaseOwner(v) returns the owner and lease_ms of rec's value when it is a
-- lease (claim.lua's parse, for the lease form), or nil.
local function leaseOwner(v)
  if not v or string.sub(v, 1, 1) ~= 'L' then return nil end
  local a = string.find(v, ':', 2, true)
  local b = a and string.find(v, ':', a + 1, true)
  if not b or #v < b + 36 or not string.match(string.sub(v, 2, a - 1), '^[1-9]%d*$')
      or not string.match(string.sub(v, a + 1, b - 1), '^%d+$') then
    return nil
  end
  return string.sub(v, b + 1, b + 36), string.sub(v, a + 1, b - 1), a, b
end

local v = redis.call('GET', KEYS[1])
local owner, _, a = leaseOwner(v)
if owner == ARGV[2] then
  redis.call('SET', KEYS[1], 'L' .. ARGV[1] .. string.sub(v, a), 'KEEPTTL')
  return 1
end
return 0
