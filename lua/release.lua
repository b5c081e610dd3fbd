-- release.lua: drop the lease, only for the owner that holds it.
-- KEYS[1]=rec (claim.lua's header gives its forms)
-- ARGV[1]=owner
-- Returns 1 when ARGV[1] held the lease and it was deleted; 0 otherwise.
-- Server calls (EVALSHA included): 3 (GET, DEL).
-- Safe to re-run: a second run finds no lease of ARGV[1] and returns 0.
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

if leaseOwner(redis.call('GET', KEYS[1])) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
