package chaos

import "errors"

var (
	// ErrConfig is returned by [Run] for an invalid [Config]; the message
	// names the field.
	ErrConfig = errors.New("chaos: invalid config")

	// ErrUnknownScenario is returned by [Run] for a scenario name that
	// [Scenarios] does not list.
	ErrUnknownScenario = errors.New("chaos: unknown scenario")

	// ErrSetup is returned when the suite cannot prepare a run: the
	// database or Redis cannot be reached, the schema cannot be created.
	ErrSetup = errors.New("chaos: setup")

	// ErrNotBuilt is returned by [NegativeControl] for a mode that breaks
	// the library's settlement engine (one-attempt, release-on-error,
	// no-recover) in a binary built without -tags oncekey_negative, the
	// only builds where the engine can be broken.
	ErrNotBuilt = errors.New("chaos: built without -tags oncekey_negative")
)
