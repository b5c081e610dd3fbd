-- claim.lua: take the lease of one idempotency key, or say why not.
-- KEYS[1]=rec, the record's one key: absent, a lease or a result (below)
-- ARGV[1]=fingerprint ARGV[2]=owner ARGV[3]=lease_ms
-- ARGV[4]="ttl" (optional): a cached reply carries the result's PTTL too
-- (the in-process replay cache keeps its copy no longer than Redis's).
-- rec holds a lease, a result or nothing: record.lua, the prelude loaded
-- before this script, gives the two forms and parses them.
-- Returns one of:
--   {"cached", fingerprint, generation, blob}  a result with this fingerprint is cached
--   {"cached", fingerprint, generation, blob, pttl_ms}  the same, asked with "ttl"
--   {"mismatch"}                                a result with another fingerprint is cached
--   {"acquired", generation}                    this owner holds the lease now
--   {"finished", generation}                    the operation finished with a result too
--                                               large to cache (an "F" marker with this
--                                               fingerprint): read it from the durable store
--   {"busy", generation, owner, lease_ms, same, tentative, pttl_ms}
--                                               another owner holds a live lease of
--                                               lease_ms (its length: it ends sooner);
--                                               same is 1 when it is for this fingerprint;
--                                               pttl_ms is what is left of it (-1 unless
--                                               same and confirmed): its age is lease_ms
--                                               - pttl_ms, since its last confirmation or
--                                               renewal;
--                                               tentative is 1 when the durable store has
--                                               not granted it yet (a "T" lease): its
--                                               holder may only be about to replay, so
--                                               only the durable store can say whether
--                                               the operation is in progress or finished
-- A new lease is tentative ("T"): the durable store makes it "L" through
-- syncgen.lua once it grants the key, and a holder that finds the
-- operation finished replaces it with the result or an "F" marker
-- (complete.lua). A live lease of this owner with another fingerprint is
-- busy too. A
-- lease's fingerprint never makes a mismatch: a lease left behind by a
-- release that did not reach Redis must not make a new request fail for good.
-- A new lease proposes generation = Redis clock ms - 59000. The durable
-- store gives a record it creates or restarts at least its own clock ms -
-- 60000 and more than the record's last generation: a takeover comes at
-- least one lease after the lease it takes over was proposed, so while the
-- two clocks agree within a second the store keeps the proposal and no
-- sync is needed.
-- Server calls (EVALSHA included): a replay 2 (3 with "ttl": PTTL), a busy
-- duplicate of a confirmed lease 3 (GET, PTTL), of a tentative one or a
-- finished marker 2, a new key 4 (GET, TIME, SET).
-- The proposal is formatted with %d: tostring would print 1.8e+12.
-- Safe to re-run: a second run by the lease holder finds its own lease and
-- returns the same generation without proposing another.
local kind, gen, x, y, z, tent = parse(redis.call('GET', KEYS[1]))
if kind == 'F' then -- x: fingerprint
  if x ~= ARGV[1] then
    return {'mismatch'}
  end
  return {'finished', gen}
elseif kind == 'R' then -- x: fingerprint, y: blob
  if x ~= ARGV[1] then
    return {'mismatch'}
  end
  if ARGV[4] == 'ttl' then
    return {'cached', x, gen, y, redis.call('PTTL', KEYS[1])}
  end
  return {'cached', x, gen, y}
elseif kind == 'L' then -- x: lease_ms, y: owner, z: fingerprint
  local same = 0
  if z == ARGV[1] then same = 1 end
  if y == ARGV[2] and same == 1 then
    return {'acquired', gen}
  end
  local t, left = 0, -1
  if tent then t = 1 end
  if same == 1 and t == 0 then left = redis.call('PTTL', KEYS[1]) end
  return {'busy', gen, y, tonumber(x), same, t, left}
end

-- TIME is {seconds, microseconds}; whole ms since the epoch minus 59 s.
local now = redis.call('TIME')
gen = string.format('%d',
  tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - 59000)
redis.call('SET', KEYS[1], 'T' .. gen .. ':' .. ARGV[3] .. ':' .. ARGV[2] .. ARGV[1],
  'PX', ARGV[3])
return {'acquired', gen}
