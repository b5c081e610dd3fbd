package fastpath_test

import (
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

func TestKeysFor(t *testing.T) {
	t.Parallel()
	ref := durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "secret-key-123"}.Ref(nil)
	d := ref.Digest()
	h := hex.EncodeToString(d[:])

	t.Run("LayoutIsPrefixHashTagSuffix", func(t *testing.T) {
		k := fastpath.KeysFor("app", ref)
		want := fastpath.Keys{Record: "app:{" + h + "}:rec"}
		if k != want {
			t.Fatalf("KeysFor = %+v\nwant %+v", k, want)
		}
	})
	t.Run("EmptyPrefixIsDefault", func(t *testing.T) {
		if got := fastpath.KeysFor("", ref).Record; !strings.HasPrefix(got, "oncekey:{") {
			t.Fatalf("Record = %q", got)
		}
	})
	t.Run("NamesRevealNoTenantOperationOrKey", func(t *testing.T) {
		re := regexp.MustCompile(`^oncekey:\{[0-9a-f]{64}\}:rec$`)
		k := fastpath.KeysFor("", ref)
		for _, name := range []string{k.Record} {
			if !re.MatchString(name) {
				t.Errorf("%q does not match %v", name, re)
			}
			for _, secret := range []string{"acme", "orders", "secret"} {
				if strings.Contains(name, secret) {
					t.Errorf("%q contains %q", name, secret)
				}
			}
		}
	})
	t.Run("DistinctScopesDistinctKeys", func(t *testing.T) {
		seen := map[string]durable.Scope{}
		for _, s := range []durable.Scope{
			{Tenant: "a", Operation: "b", Key: "c"},
			{Tenant: "b", Operation: "a", Key: "c"},
			{Tenant: "a", Operation: "bc", Key: "d"},
			{Tenant: "ab", Operation: "c", Key: "d"},
			{Tenant: "a", Operation: "b", Key: "d"},
		} {
			k := fastpath.KeysFor("", s.Ref(nil)).Record
			if prev, ok := seen[k]; ok {
				t.Fatalf("%+v and %+v share %s", prev, s, k)
			}
			seen[k] = s
		}
	})
}

// braceKeys are client keys that would move the slot if they were ever put
// in a key name: a whole {tag}, an open and a close brace.
var braceKeys = []string{"{user-1}", "{user-1}:order-9", "a{b", "}x{y}", "{}", "{{tag}}"}

// keySlot is Redis Cluster's key-to-slot rule: CRC16 (XMODEM) of the hash
// tag (the bytes between the first '{' and the first '}' after it, when not
// empty) or of the whole key, modulo 16384. The cluster test checks it
// against CLUSTER KEYSLOT on a real cluster.
func keySlot(key string) int64 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int64(crc % 16384)
}

func TestKeySlot_KnownValues(t *testing.T) {
	t.Parallel()
	// Values from the Redis Cluster specification and redis-cli.
	for key, want := range map[string]int64{"123456789": 12739, "foo": 12182, "{user1000}.following": 3443, "{user1000}.followers": 3443, "somekey": 11058, "foo{hash_tag}": 2515, "foo{}{bar}": 8363} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestKeysFor_BracesInKeyCannotMoveSlot(t *testing.T) {
	t.Parallel()
	checkBraceSlots(t, keySlot)
}

// checkBraceSlots checks, with the slot function given, that the key of a
// client key with braces sit in the slot of the hash, never in the
// slot of the client's tag.
func checkBraceSlots(t *testing.T, slot func(string) int64) {
	t.Helper()
	for _, key := range braceKeys {
		ref := durable.Scope{Tenant: "t", Operation: "op", Key: key}.Ref(nil)
		d := ref.Digest()
		want := slot(hex.EncodeToString(d[:]))
		k := fastpath.KeysFor("", ref)
		for _, name := range []string{k.Record} {
			if got := slot(name); got != want {
				t.Errorf("key %q: %s is in slot %d, want %d (its hash's)", key, name, got, want)
			}
		}
		if tagged := slot("oncekey:" + key + ":rec"); tagged == want {
			t.Errorf("key %q: the raw-key name's slot %d equals the hash's; pick another example", key, tagged)
		}
	}
}
