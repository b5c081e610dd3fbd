package durable

import (
	"errors"
	"time"
)

// StepState is the state of one recorded step of a workflow (Lease.Step in
// package claim).
type StepState string

// The states of a step. A step is started before its function runs and
// finished, with its result, after; a started step that is never finished
// may have had its effect.
const (
	// StepStarted: recorded before the function ran; its effect may have
	// happened.
	StepStarted StepState = "started"
	// StepFinished: the function returned and its result is recorded; the
	// step never runs again in this operation.
	StepFinished StepState = "finished"
	// StepUncertain: started by an earlier attempt, never finished, and not
	// declared repeatable: the operation is uncertain at this step until it
	// is settled (Reconciler, oncekey resolve -step).
	StepUncertain StepState = "uncertain"
)

// Step is one recorded step of an operation.
type Step struct {
	// Seq is the step's place in the workflow, from 0, in the order the
	// code calls the steps.
	Seq int
	// Name is the step's name, unique within the operation.
	Name  string
	State StepState
	// Key is the step's downstream idempotency key: the operation identity
	// and the name ("op_.../charge"), the same for every attempt.
	Key string
	// Repeatable: the step was declared safe to run again with its key.
	Repeatable bool
	// Generation is the generation of the lease that last started it.
	Generation uint64
	// Attempts counts the times it was started.
	Attempts   int
	StartedAt  time.Time
	FinishedAt time.Time // zero unless finished
	// Size is the length of the recorded result in bytes.
	Size int
	// Result is the recorded result of a finished step; nil unless the
	// read asked for results.
	Result []byte
}

// ErrStepOrder is returned when a workflow calls its steps in another
// order than the one recorded for the operation (a resume that calls a
// different sequence), or calls one name twice in one attempt. Nothing ran.
var ErrStepOrder = errors.New("durable: step out of order")
