-- release.lua: drop the lease, only for the owner that holds it.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=owner
-- Returns 1 when ARGV[1] held the lease and it was deleted, and then wakes
-- the duplicates waiting on the key (complete.lua says how); 0 otherwise.
-- Server calls (EVALSHA included): 4 (GET, DEL, SPUBLISH).
-- Safe to re-run: a second run finds no lease of ARGV[1] and returns 0.
local kind, _, _, owner = parse(redis.call('GET', KEYS[1]))
if kind == 'L' and owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('SPUBLISH', KEYS[1] .. ':wake', '0')
  return 1
end
return 0
