-- renew.lua: extend the lease, only for the owner that holds it.
-- KEYS[1]=rec (claim.lua's header gives its forms)
-- ARGV[1]=owner ARGV[2]=lease_ms
-- Returns 1 when ARGV[1] held the lease, which now ends lease_ms from now
-- by Redis's clock; 0 otherwise (nothing written: an expired lease is not
-- brought back, another owner's is not touched, a result is not changed).
-- Server calls (EVALSHA included): 3 (GET, then PEXPIRE, or SET when the
-- length changed).
-- Safe to re-run: a second run sets the same length again.
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
local owner, ms, a, b = leaseOwner(v)
if owner ~= ARGV[1] then
  return 0
end
if ms == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else -- a new length: the value carries it too (a busy reply's hint)
  redis.call('SET', KEYS[1], string.sub(v, 1, a) .. ARGV[2] .. string.sub(v, b), 'PX', ARGV[2])
end
return 1
