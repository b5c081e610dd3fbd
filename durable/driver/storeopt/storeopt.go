// Package storeopt holds what the options of the SQL stores
// (durable/postgres, durable/sqlite) share: applying a store's options over
// its defaults, and the checks, with their error messages, of the options
// both stores take (the key secret, and the bound on how long a statement
// waits for a lock: lock_timeout, SQLite's busy timeout). Each check wraps
// the calling store's ErrConfig, so its errors match that store's sentinel
// and read as they always did.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package storeopt

import (
	"fmt"
	"time"
)

// maxLockWait bounds a store's lock wait (PostgreSQL's lock_timeout,
// SQLite's busy timeout): a claim must never wait anywhere near the 60 s
// the generation floor leaves (see package durable, "Generations").
const maxLockWait = 30 * time.Second

// Apply applies opts, in order, to c (a store's defaults) and returns the
// result; a nil option is skipped. On the first option that fails it
// returns the zero C and that option's error.
func Apply[C any, O ~func(*C) error](c C, opts []O) (C, error) {
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			var zero C
			return zero, err
		}
	}
	return c, nil
}

// CheckLockWait checks the lock wait d given to the option named option: at
// least 1ms and less than 30s. Otherwise it returns an error
// wrapping errConfig that names the option.
func CheckLockWait(errConfig error, option string, d time.Duration) error {
	if d < time.Millisecond || d >= maxLockWait {
		return fmt.Errorf("%w: %s: must be at least 1ms and less than %v", errConfig, option, maxLockWait)
	}
	return nil
}

// CheckKeySecret checks a secret given to WithKeySecret: it must not be
// empty. Otherwise it returns an error wrapping errConfig.
func CheckKeySecret(errConfig error, secret []byte) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: WithKeySecret: empty secret", errConfig)
	}
	return nil
}
