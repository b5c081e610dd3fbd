-- release.lua: drop the lease, only for the owner that holds it.
-- KEYS[1]=lease
-- ARGV[1]=owner
-- Returns 1 when ARGV[1] held the lease and it was deleted; 0 otherwise.
-- Safe to re-run: a second run finds no lease of ARGV[1] and returns 0.
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
