-- renew.lua: extend the lease, only for the owner that holds it.
-- KEYS[1]=lease
-- ARGV[1]=owner ARGV[2]=lease_ms
-- Returns 1 when ARGV[1] held the lease, which now ends lease_ms from now
-- by Redis's clock; 0 otherwise (nothing written: an expired lease is not
-- brought back, another owner's is not touched).
-- Safe to re-run: a second run sets the same length again.
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
