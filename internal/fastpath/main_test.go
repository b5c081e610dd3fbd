package fastpath_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every refused dial; the breaker tests make many.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
