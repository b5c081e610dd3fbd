package httptoken

import "testing"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"Idempotency-Key": true, "POST": true, "x!#$%&'*+-.^_`|~9": true,
		"": false, "a b": false, "a:b": false, "é": false, "a\x00": false, `"q"`: false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}
