-- record.lua: the prelude put before each script when it is loaded (the
-- scripts are one source each: Redis runs no shared code). It reads the
-- record's one key, KEYS[1], whose value is one of
--   lease    "L" gen ":" lease_ms ":" owner fingerprint    (PX lease_ms)
--   tentative lease
--            "T" gen ":" lease_ms ":" owner fingerprint    (PX lease_ms)
--   result   "R" gen ":" #fingerprint ":" fingerprint blob (PX ttl)
--   finished "F" gen ":" #fingerprint ":" fingerprint      (PX ttl)
-- gen is a decimal without leading zeros, lease_ms decimal, owner a UUID's
-- 36-byte text.
-- A lease is tentative ("T") from claim.lua until the durable store has
-- granted its owner the key (syncgen.lua, or renew.lua, makes it "L"): its
-- holder may yet find the operation finished and only replay it, so a
-- duplicate that meets it asks the durable store rather than answer "in
-- progress". "F" says the operation finished with a result too large to
-- cache here: read it from the durable store.
-- parse(v) returns 'L', gen, lease_ms, owner, fingerprint, tentative (a
-- boolean) for either lease; 'R', gen, fingerprint, blob; 'F', gen,
-- fingerprint; or nil for any other value, which every script treats as
-- absent (a foreign or corrupt value must not fail a script: a script
-- error counts against Redis in the breaker).
-- gt(a, b) is a > b for canonical decimal strings: generations travel as
-- decimal strings, since a Lua number is a double, exact for the clock's
-- ~1.8e12 but not above 2^53.
local function parse(v)
  if not v then return nil end
  local kind = string.sub(v, 1, 1)
  local a = string.find(v, ':', 2, true)
  local b = a and string.find(v, ':', a + 1, true)
  if not b then return nil end
  local gen, n = string.sub(v, 2, a - 1), string.sub(v, a + 1, b - 1)
  if not string.match(gen, '^[1-9]%d*$') or not string.match(n, '^%d+$') then
    return nil
  end
  if (kind == 'L' or kind == 'T') and #v >= b + 36 then
    return 'L', gen, n, string.sub(v, b + 1, b + 36), string.sub(v, b + 37), kind == 'T'
  end
  n = tonumber(n)
  if kind == 'R' and #v >= b + n then
    return 'R', gen, string.sub(v, b + 1, b + n), string.sub(v, b + n + 1)
  end
  if kind == 'F' and #v == b + n then
    return 'F', gen, string.sub(v, b + 1, b + n)
  end
  return nil
end

local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

