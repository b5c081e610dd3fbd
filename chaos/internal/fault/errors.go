package fault

import "errors"

var (
	// ErrNoRedisServer is returned when no redis-server binary is found
	// ($REDIS_SERVER, else redis-server on $PATH).
	ErrNoRedisServer = errors.New("fault: redis-server not installed (install it or set REDIS_SERVER)")

	// ErrProxy is returned when a proxy cannot be started or a toxic added.
	ErrProxy = errors.New("fault: proxy")

	// ErrRedisProcess is returned when a redis-server process cannot be
	// started, stopped or reconfigured.
	ErrRedisProcess = errors.New("fault: redis-server process")

	// ErrTerminate is returned when a PostgreSQL backend cannot be
	// terminated.
	ErrTerminate = errors.New("fault: terminate backend")
)
