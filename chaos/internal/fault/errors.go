package fault

import "errors"

var (
	// ErrProxy is returned when a proxy cannot be started or a toxic added.
	ErrProxy = errors.New("fault: proxy")

	// ErrRedisProcess is returned when a redis-server process of a [Pair]
	// cannot be paused, restarted or reconfigured, or a command of the
	// suite's own fails.
	ErrRedisProcess = errors.New("fault: redis-server process")

	// ErrTerminate is returned when a PostgreSQL backend cannot be
	// terminated.
	ErrTerminate = errors.New("fault: terminate backend")
)
