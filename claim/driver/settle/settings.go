package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/fence"
)

// Settings are the options every request/response entry point shares; each
// adapter embeds them in its config and wraps the setters' errors in its
// own ErrConfig.
type Settings struct {
	// RetryAfter is the delay an in-progress answer suggests.
	RetryAfter time.Duration
	// FinishTimeout is the engine's Handoff.
	FinishTimeout time.Duration
	// Logger logs by operation identity only.
	Logger *slog.Logger
}

// DefaultSettings are the defaults of the request/response entry points.
func DefaultSettings() Settings {
	return Settings{RetryAfter: time.Second, FinishTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)}
}

// SetRetryAfter sets RetryAfter; d must be positive.
func (s *Settings) SetRetryAfter(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithRetryAfter: must be positive, got %v", d)
	}
	s.RetryAfter = d
	return nil
}

// SetFinishTimeout sets FinishTimeout; d must be positive.
func (s *Settings) SetFinishTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithFinishTimeout: must be positive, got %v", d)
	}
	s.FinishTimeout = d
	return nil
}

// SetLogger sets Logger; l must not be nil.
func (s *Settings) SetLogger(l *slog.Logger) error {
	if l == nil {
		return fmt.Errorf("WithLogger: nil logger")
	}
	s.Logger = l
	return nil
}

// Engine returns the settlement engine these settings configure, named
// name.
func (s *Settings) Engine(name string) *Engine {
	return &Engine{Name: name, Logger: s.Logger, Handoff: s.FinishTimeout}
}

// OperationID is the operation identity of the handler ctx belongs to, ""
// outside one.
func OperationID(ctx context.Context) string {
	if op := From(ctx); op != nil {
		return op.ID
	}
	return ""
}

// Token is the fencing token of the handler ctx belongs to.
func Token(ctx context.Context) (fence.Token, bool) {
	if op := From(ctx); op != nil {
		return op.Token, true
	}
	return fence.Token{}, false
}

// MarkUncertain marks the handler of ctx uncertain, or returns notGuarded
// outside a handler run under a lease.
func MarkUncertain(ctx context.Context, notGuarded error) error {
	op := From(ctx)
	if op == nil || op.InTx {
		return notGuarded
	}
	op.MarkUncertain()
	return nil
}

// ReleaseKey records the application's word that the handler of ctx had no
// effect, or returns notGuarded outside a handler.
func ReleaseKey(ctx context.Context, notGuarded error) error {
	op := From(ctx)
	if op == nil {
		return notGuarded
	}
	op.Release()
	return nil
}

// Step runs one step of the workflow of the handler of ctx (see
// claim.Lease.Step), or returns notGuarded outside a handler run under a
// lease. A step that the operation turned uncertain at
// (claim.ErrStepUncertain) marks the handler uncertain: whatever the
// handler returns then, the engine records nothing else.
func Step(ctx context.Context, notGuarded error, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	op := From(ctx)
	if op == nil || op.InTx || op.lease == nil {
		return nil, notGuarded
	}
	res, err := op.lease.Step(ctx, name, fn, opts...)
	if errors.Is(err, claim.ErrStepUncertain) {
		op.MarkUncertain()
	}
	return res, err
}
