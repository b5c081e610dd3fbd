-- renew.lua: extend the lease, only for the owner that holds it.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=owner ARGV[2]=lease_ms
-- Returns 1 when ARGV[1] held the lease, which now ends lease_ms from now
-- by Redis's clock; 0 otherwise (nothing written: an expired lease is not
-- brought back, another owner's is not touched, a result is not changed).
-- A tentative lease ("T") of this owner is confirmed ("L").
-- Server calls (EVALSHA included): 3 (GET, then PEXPIRE, or SET when the
-- length changed).
-- Safe to re-run: a second run sets the same length again.
local kind, gen, ms, owner, fp, tent = parse(redis.call('GET', KEYS[1]))
if kind ~= 'L' or owner ~= ARGV[1] then
  return 0
end
if ms == ARGV[2] and not tent then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else -- a new length: the value carries it too (a busy reply's hint); a
  -- tentative lease renewed is confirmed: only a granted holder renews
  redis.call('SET', KEYS[1], 'L' .. gen .. ':' .. ARGV[2] .. ':' .. owner .. fp, 'PX', ARGV[2])
end
return 1
