package fence_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/fence"
)

func TestToken_StringRoundTrip(t *testing.T) {
	t.Parallel()
	for _, gen := range []uint64{1, 2, 42, 1 << 53, ^uint64(0)} {
		tok := fence.Token{Generation: gen, Owner: uuid.New()}
		got, err := fence.Parse(tok.String())
		if err != nil {
			t.Fatalf("Parse(%q): %v", tok.String(), err)
		}
		if got != tok {
			t.Fatalf("Parse(%q) = %v, want %v", tok.String(), got, tok)
		}
		b, _ := tok.MarshalText()
		var back fence.Token
		if err := back.UnmarshalText(b); err != nil || back != tok {
			t.Fatalf("UnmarshalText(%q) = %v, %v", b, back, err)
		}
	}
}

func TestParse_RejectsMalformed(t *testing.T) {
	t.Parallel()
	owner := uuid.MustParse("5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11")
	good := "42." + owner.String()
	if _, err := fence.Parse(good); err != nil {
		t.Fatalf("Parse(%q): %v", good, err)
	}
	for _, s := range []string{
		"",
		"42",
		"." + owner.String(),
		"0." + owner.String(),
		"042." + owner.String(),
		"+42." + owner.String(),
		"-1." + owner.String(),
		"18446744073709551616." + owner.String(), // 2^64
		"42.",
		"42.5F0C1C9E-8D1E-4A51-9A59-2A4A0F4F6A11", // not canonical
		"42.{5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11}",
		"42.urn:uuid:5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11",
		"42.5f0c1c9e8d1e4a519a592a4a0f4f6a11",
		"4 2." + owner.String(),
	} {
		if _, err := fence.Parse(s); err == nil || !strings.HasPrefix(err.Error(), "fence: invalid token: ") {
			t.Errorf("Parse(%q) error = %v, want an invalid token", s, err)
		}
	}
}

// Tokens compare with ==: the same generation under another owner is
// another token, and the zero value is "no token".
func TestToken_Compare(t *testing.T) {
	t.Parallel()
	a := fence.Token{Generation: 3, Owner: uuid.New()}
	same := fence.Token{Generation: 3, Owner: uuid.New()}
	if a == same {
		t.Fatal("tokens with different owners must differ")
	}
	if b := a; b != a {
		t.Fatal("a token equals its copy")
	}
	if (fence.Token{Generation: 1}) == (fence.Token{}) || (fence.Token{Owner: a.Owner}) == (fence.Token{}) {
		t.Fatal("a token with a generation or an owner is not the zero Token")
	}
}

func FuzzParse(f *testing.F) {
	f.Add("42.5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11")
	f.Add("1.00000000-0000-0000-0000-000000000000")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.Parse(s)
		if err != nil {
			return
		}
		if tok.String() != s {
			t.Fatalf("Parse(%q) accepted a non-canonical form; String() = %q", s, tok.String())
		}
	})
}
