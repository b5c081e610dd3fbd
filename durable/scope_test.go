package durable_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/durable"
)

func TestScope_Validate(t *testing.T) {
	ok := durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "k"}
	for _, tc := range []struct {
		name  string
		scope durable.Scope
		field string // "" when valid
	}{
		{"valid", ok, ""},
		{"key of 255 printable bytes", durable.Scope{Tenant: "t", Operation: "o", Key: strings.Repeat("~", 255)}, ""},
		{"key with space and punctuation", durable.Scope{Tenant: "t", Operation: "o", Key: " a-b_c.{tag}:/=+ "}, ""},
		{"unicode tenant", durable.Scope{Tenant: "société", Operation: "o", Key: "k"}, ""},
		{"empty tenant", durable.Scope{Operation: "o", Key: "k"}, "tenant"},
		{"tenant with a newline", durable.Scope{Tenant: "a\nb", Operation: "o", Key: "k"}, "tenant"},
		{"tenant not UTF-8", durable.Scope{Tenant: "\xc3", Operation: "o", Key: "k"}, "tenant"},
		{"tenant too long", durable.Scope{Tenant: strings.Repeat("t", 513), Operation: "o", Key: "k"}, "tenant"},
		{"empty operation", durable.Scope{Tenant: "t", Key: "k"}, "operation"},
		{"operation with DEL", durable.Scope{Tenant: "t", Operation: "o\x7f", Key: "k"}, "operation"},
		{"tenant with C1 control U+0080", durable.Scope{Tenant: "a\u0080b", Operation: "o", Key: "k"}, "tenant"},
		{"tenant with C1 control NEL U+0085", durable.Scope{Tenant: "a\u0085", Operation: "o", Key: "k"}, "tenant"},
		{"operation with C1 control CSI U+009B", durable.Scope{Tenant: "t", Operation: "POST \u009b/orders", Key: "k"}, "operation"},
		{"operation with C1 control U+009F", durable.Scope{Tenant: "t", Operation: "o\u009f", Key: "k"}, "operation"},
		{"tenant with U+00A0 after the C1 range", durable.Scope{Tenant: "a\u00a0b", Operation: "o\u00ff", Key: "k"}, ""},
		{"tenant with U+007E before DEL", durable.Scope{Tenant: "a~", Operation: "o", Key: "k"}, ""},
		{"empty key", durable.Scope{Tenant: "t", Operation: "o"}, "key"},
		{"key of 256 bytes", durable.Scope{Tenant: "t", Operation: "o", Key: strings.Repeat("k", 256)}, "key"},
		{"key with a tab", durable.Scope{Tenant: "t", Operation: "o", Key: "a\tb"}, "key"},
		{"key with a NUL", durable.Scope{Tenant: "t", Operation: "o", Key: "a\x00"}, "key"},
		{"key not ASCII", durable.Scope{Tenant: "t", Operation: "o", Key: "clé"}, "key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.scope.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v; want nil", err)
				}
				return
			}
			if !errors.Is(err, durable.ErrInvalidScope) {
				t.Fatalf("Validate = %v; want an error for %q matching ErrInvalidScope", err, tc.field)
			}
			if !strings.HasPrefix(err.Error(), "durable: invalid "+tc.field+": ") {
				t.Fatalf("message %q does not name the field", err)
			}
		})
	}
}

func TestScope_Ref(t *testing.T) {
	sc := durable.Scope{Tenant: "t", Operation: "o", Key: "client-key"}
	plain := sc.Ref(nil)
	if want := sha256.Sum256([]byte(sc.Key)); plain.KeyHash != want {
		t.Fatal("Ref(nil) is not SHA-256 of the key")
	}
	if sc.Ref([]byte{}) != plain {
		t.Fatal("an empty secret must mean no secret")
	}
	m := hmac.New(sha256.New, []byte("s1"))
	m.Write([]byte(sc.Key))
	keyed := sc.Ref([]byte("s1"))
	if !hmac.Equal(keyed.KeyHash[:], m.Sum(nil)) {
		t.Fatal("Ref(secret) is not HMAC-SHA-256(secret, key)")
	}
	if keyed == plain || keyed == sc.Ref([]byte("s2")) {
		t.Fatal("different secrets must give different refs")
	}
	if sc.Ref([]byte("s1")) != keyed || keyed.Tenant != "t" || keyed.Operation != "o" {
		t.Fatal("Ref is not deterministic or lost the tenant and operation")
	}
}

func TestRef_DigestSeparatesFields(t *testing.T) {
	// Concatenations that collide without length prefixes must not.
	refs := []durable.Ref{
		durable.Scope{Tenant: "ab", Operation: "c", Key: "k"}.Ref(nil),
		durable.Scope{Tenant: "a", Operation: "bc", Key: "k"}.Ref(nil),
		durable.Scope{Tenant: "a", Operation: "b", Key: "ck"}.Ref(nil),
		durable.Scope{Tenant: "a", Operation: "b", Key: "k"}.Ref(nil),
		durable.Scope{Tenant: "b", Operation: "a", Key: "k"}.Ref(nil),
	}
	seen := map[[32]byte]int{}
	for i, r := range refs {
		d := r.Digest()
		if j, dup := seen[d]; dup {
			t.Fatalf("refs %d and %d share a digest", i, j)
		}
		seen[d] = i
		if r.Digest() != d {
			t.Fatal("Digest is not deterministic")
		}
	}
}

func TestRef_OperationIDRevealsNothing(t *testing.T) {
	sc := durable.Scope{Tenant: "tenant-secret", Operation: "POST /orders", Key: "key-secret-123"}
	ref := sc.Ref(nil)
	id := ref.OperationID()
	if !regexp.MustCompile(`^op_[A-Za-z0-9_-]{43}$`).MatchString(id) {
		t.Fatalf("OperationID %q: want op_ and 43 base64url characters", id)
	}
	if ref.String() != id || fmt.Sprint(ref) != id {
		t.Fatal("String must be the operation identity")
	}
	other := durable.Scope{Tenant: sc.Tenant, Operation: sc.Operation, Key: "key-secret-124"}.Ref(nil)
	if other.OperationID() == id {
		t.Fatal("two keys share an operation identity")
	}
	var buf strings.Builder
	slog.New(slog.NewTextHandler(&buf, nil)).Info("claim", "scope", sc, "ref", ref)
	for _, secret := range []string{sc.Key, sc.Tenant, fmt.Sprintf("%x", ref.KeyHash)} {
		if strings.Contains(buf.String(), secret) {
			t.Fatalf("log line %q shows %q", buf.String(), secret)
		}
	}
}

func TestState(t *testing.T) {
	for _, s := range []durable.State{durable.Processing, durable.Completed, durable.Failed, durable.Uncertain} {
		if s.Finished() != (s == durable.Completed || s == durable.Failed) {
			t.Errorf("%s.Finished() = %v", s, s.Finished())
		}
	}
	if durable.State("released").Finished() || durable.State("").Finished() {
		t.Error("unknown states reported finished")
	}
}
