package storeopt_test

import (
	"errors"
	"testing"
	"time"

	"github.com/oncekey/oncekey/durable/driver/storeopt"
)

var errConfig = errors.New("store: invalid configuration")

type config struct{ a, b int }

type option func(*config) error

// The stores' messages, as they read before the checks moved here: a
// store's tests match its ErrConfig, these pin the words.
func TestCheckLockWait(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, time.Millisecond - 1, 30 * time.Second, time.Hour} {
		err := storeopt.CheckLockWait(errConfig, "WithLockTimeout", d)
		if !errors.Is(err, errConfig) {
			t.Fatalf("CheckLockWait(%v) = %v; want an error wrapping errConfig", d, err)
		}
		if want := "store: invalid configuration: WithLockTimeout: must be at least 1ms and less than 30s"; err.Error() != want {
			t.Fatalf("CheckLockWait(%v) = %q; want %q", d, err, want)
		}
	}
	for _, d := range []time.Duration{time.Millisecond, 5 * time.Second, 30*time.Second - 1} {
		if err := storeopt.CheckLockWait(errConfig, "WithBusyTimeout", d); err != nil {
			t.Fatalf("CheckLockWait(%v) = %v; want nil", d, err)
		}
	}
}

func TestCheckKeySecret(t *testing.T) {
	for _, s := range [][]byte{nil, {}} {
		err := storeopt.CheckKeySecret(errConfig, s)
		if !errors.Is(err, errConfig) || err.Error() != "store: invalid configuration: WithKeySecret: empty secret" {
			t.Fatalf("CheckKeySecret(%q) = %v; want the empty-secret error wrapping errConfig", s, err)
		}
	}
	if err := storeopt.CheckKeySecret(errConfig, []byte{0}); err != nil {
		t.Fatalf("CheckKeySecret of one byte = %v; want nil", err)
	}
}

// Apply runs the options in order over the defaults, skips nil ones, and
// on an error returns it with the zero config, running no later option.
func TestApply(t *testing.T) {
	setA := func(v int) option { return func(c *config) error { c.a = v; return nil } }
	c, err := storeopt.Apply(config{a: 1, b: 2}, []option{setA(3), nil, setA(4)})
	if err != nil || c != (config{a: 4, b: 2}) {
		t.Fatalf("Apply = %+v, %v; want {4 2}", c, err)
	}
	if c, err := storeopt.Apply(config{a: 1, b: 2}, []option(nil)); err != nil || c != (config{a: 1, b: 2}) {
		t.Fatalf("Apply without options = %+v, %v; want the defaults", c, err)
	}
	boom := errors.New("boom")
	ranAfter := false
	c, err = storeopt.Apply(config{a: 1, b: 2}, []option{
		setA(3),
		func(*config) error { return boom },
		func(*config) error { ranAfter = true; return nil },
	})
	if !errors.Is(err, boom) || c != (config{}) || ranAfter {
		t.Fatalf("Apply with a failing option = %+v, %v (later option ran: %v); want the zero config and boom, nothing after", c, err, ranAfter)
	}
}
