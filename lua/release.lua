-- release.lua: drop the lease, only for the owner that holds it.
-- KEYS[1]=rec (record.lua, the prelude, gives its forms)
-- ARGV[1]=owner ARGV[2]="quiet" (optional): wake no one
-- Returns 1 when ARGV[1] held the lease and it was deleted, and then wakes
-- the duplicates waiting on the key (complete.lua says how) unless quiet;
-- 0 otherwise. A lease given back because the store refused it (another
-- holder has the record) is dropped quietly: waking the waiters then would
-- only send them to take the key in turn, each waking the others.
-- Server calls (EVALSHA included): 4 (GET, DEL, SPUBLISH).
-- Safe to re-run: a second run finds no lease of ARGV[1] and returns 0.
local kind, _, _, owner = parse(redis.call('GET', KEYS[1]))
if kind == 'L' and owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= 'quiet' then
    redis.pcall('SPUBLISH', KEYS[1] .. ':wake', '0')
  end
  return 1
end
return 0
