package claimtest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/oncekey/oncekey/claim/claimhttp"
)

// Window is one way a request can be duplicated, cut or retried that the
// checks force (see the package documentation for each).
type Window string

// The windows, in the order the checks run them.
const (
	Concurrent        Window = "concurrent"
	DroppedResponse   Window = "dropped-response"
	CrashBeforeCommit Window = "crash-before-commit"
	PanicAfterEffect  Window = "panic-after-effect"
	Mismatch          Window = "mismatch"
	RedisEmptied      Window = "redis-emptied"
)

// allWindows is every window, in order.
var allWindows = []Window{Concurrent, DroppedResponse, CrashBeforeCommit, PanicAfterEffect, Mismatch, RedisEmptied}

var (
	// ErrNotIdempotent is matched by the error of a check in which the
	// code under test failed a window; each failure is a [*WindowError].
	ErrNotIdempotent = errors.New("claimtest: not idempotent")
	// ErrConfig is matched by the error of a check given a bad argument or
	// option; nothing ran.
	ErrConfig = errors.New("claimtest: invalid configuration")
)

// WindowError is one window the code under test failed.
type WindowError struct {
	Window Window
	// Account says what was sent, what came back, the effects counted and
	// expected, and what was wrong, over several lines.
	Account string
}

func (e *WindowError) Error() string {
	return "claimtest: window " + string(e.Window) + ": not idempotent\n" + e.Account
}

// Is reports whether target is [ErrNotIdempotent].
func (e *WindowError) Is(target error) bool { return target == ErrNotIdempotent }

// Failed lists the windows err (from a check) reports as failed, in the
// order they ran; none for nil or another error.
func Failed(err error) []Window {
	var out []Window
	var walk func(error)
	walk = func(err error) {
		if we, ok := err.(*WindowError); ok {
			out = append(out, we.Window)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// Option configures a check ([Env.CheckHTTP], [Env.CheckDo]).
type Option func(*config) error

type config struct {
	inTx       bool
	mw         []claimhttp.Option
	windows    []Window // nil: all that apply
	duplicates int
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// WithInTransaction runs the handler of [Env.CheckHTTP] in transaction
// mode (claimhttp.WithInTransaction; pass it here, not to
// [WithMiddleware], so the check knows the mode): the windows are then
// crash-before-commit instead of panic-after-effect. [Env.CheckDo] is
// always in a transaction.
func WithInTransaction() Option {
	return func(c *config) error { c.inTx = true; return nil }
}

// WithMiddleware adds options to the claimhttp.Middleware that
// [Env.CheckHTTP] puts in front of the handler, such as
// claimhttp.WithCanon or claimhttp.WithStoredHeaders: check the handler
// with the options it is served with. Leave out claimhttp.WithHeader (the
// check sends Idempotency-Key) and claimhttp.WithInTransaction (use
// [WithInTransaction]).
func WithMiddleware(opts ...claimhttp.Option) Option {
	return func(c *config) error {
		for _, o := range opts {
			if o == nil {
				return configErr("WithMiddleware: nil option")
			}
		}
		c.mw = append(c.mw, opts...)
		return nil
	}
}

// WithWindows runs only the windows named, in the package's order. A
// window that does not apply to the mode (panic-after-effect in a
// transaction, crash-before-commit in workflow mode) is skipped with a log
// line. By default every window that applies runs.
func WithWindows(ws ...Window) Option {
	return func(c *config) error {
		if len(ws) == 0 {
			return configErr("WithWindows: no window")
		}
		for _, w := range ws {
			if !slices.Contains(allWindows, w) {
				return configErr("WithWindows: unknown window %q", string(w))
			}
		}
		c.windows = append(c.windows, ws...)
		return nil
	}
}

// WithDuplicates sets how many requests with one key the concurrent
// window sends at once: at least 2, 8 by default.
func WithDuplicates(n int) Option {
	return func(c *config) error {
		if n < 2 {
			return configErr("WithDuplicates: %d is less than 2", n)
		}
		c.duplicates = n
		return nil
	}
}

// checkConfig reads the options of the check name, whose code under test
// (what names it) is nil when isNil.
func checkConfig(name string, opts []Option, what string, isNil bool, effects func() int) (config, error) {
	cfg, err := newConfig(opts)
	switch {
	case err != nil:
		return cfg, err
	case isNil:
		return cfg, configErr("%s: nil %s", name, what)
	case effects == nil:
		return cfg, configErr("%s: nil effects function", name)
	}
	return cfg, nil
}

func newConfig(opts []Option) (config, error) {
	c := config{duplicates: 8}
	for _, o := range opts {
		if o == nil {
			return config{}, configErr("nil Option")
		}
		if err := o(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// plan returns the windows to run in a mode (inTx: in a transaction), and
// those asked for that do not apply.
func (c config) plan(inTx bool) (run, skipped []Window) {
	for _, w := range allWindows {
		asked := c.windows == nil || slices.Contains(c.windows, w)
		applies := !(inTx && w == PanicAfterEffect) && (inTx || w != CrashBeforeCommit)
		switch {
		case asked && applies:
			run = append(run, w)
		case asked && c.windows != nil:
			skipped = append(skipped, w)
		}
	}
	return run, skipped
}
