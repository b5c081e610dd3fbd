package claimgrpc

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
)

// MetadataKey is the metadata key that carries the idempotency key: one
// value of 1 to 255 printable ASCII characters.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the response header metadata key the server
// interceptor sets to "true" on a replayed answer.
const MetadataReplayed = "idempotency-replayed"

// Domain is the errdetails.ErrorInfo domain of the interceptor's own
// answers; their Reason is one of the Reason constants.
const Domain = "oncekey"

// The errdetails.ErrorInfo reasons of the interceptor's own answers. Those
// about an operation carry its identity in the metadata entry
// "operation_id".
const (
	// ReasonKeyMissing: InvalidArgument; the call carried no key.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: InvalidArgument; the key is not one value of 1 to
	// 255 printable ASCII characters.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyReused: FailedPrecondition; the key was used before with a
	// different request. Do not retry with this key.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: Aborted with a RetryInfo; a call with this key is
	// running. Retry with the same key after the delay.
	ReasonInProgress = "IDEMPOTENCY_IN_PROGRESS"
	// ReasonPending: Aborted with a RetryInfo; the call ran but its result
	// is not recorded yet. Retry with the same key: it will not run again.
	ReasonPending = "IDEMPOTENCY_RESULT_PENDING"
	// ReasonUncertain: Aborted with a RetryInfo; the outcome of the call
	// with this key is unknown and being reconciled. It will not run again;
	// a retry gets this answer until it is resolved, then the result.
	ReasonUncertain = "IDEMPOTENCY_OUTCOME_UNCERTAIN"
	// ReasonUnavailable: Unavailable with a RetryInfo; the store could not
	// be reached and the call did not run. Retry with the same key.
	ReasonUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
)

// UnaryServerInterceptor returns a gRPC unary server interceptor that makes
// the calls it guards execute at most once per tenant, operation and
// idempotency key within the retention window, and replays their stored
// reply or status to every retry. See the package documentation for the
// protocol and what each answer means.
//
// tenant returns the authenticated caller from the call's context
// (typically what an authentication interceptor that runs before this one
// put there). It is required: there is no default. An error or an empty
// tenant answers Unauthenticated before anything is claimed.
//
// It checks opts once and returns [ErrConfig], naming the bad option.
func UnaryServerInterceptor[TTx any](c *claim.Claimer[TTx], tenant func(ctx context.Context) (string, error), opts ...Option) (grpc.UnaryServerInterceptor, error) {
	if c == nil {
		return nil, configErr("nil Claimer")
	}
	o, err := newConfig(tenant, opts)
	if err != nil {
		return nil, err
	}
	s := &server[TTx]{c: c, o: o,
		settle: o.Engine("claimgrpc")}
	return s.intercept, nil
}

type server[TTx any] struct {
	c      *claim.Claimer[TTx]
	o      config
	settle *settle.Engine // the one settlement of started work
}

func (s *server[TTx]) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.o.methods(info.FullMethod) {
		return handler(ctx, req)
	}
	key, reason := keyFrom(ctx)
	switch reason {
	case ReasonKeyMissing:
		return nil, answer(codes.InvalidArgument, "this method requires an "+MetadataKey+" metadata entry", reason, "", 0)
	case ReasonKeyInvalid:
		return nil, answer(codes.InvalidArgument, "the "+MetadataKey+" metadata entry must appear once and hold 1 to 255 printable ASCII characters", reason, "", 0)
	}
	operation := s.o.operation(ctx, info.FullMethod)
	if operation == "" {
		s.o.Logger.Error("claimgrpc: the WithOperation function returned an empty operation")
		return nil, status.Error(codes.Internal, "the operation could not be named")
	}
	tenant, err := s.o.tenant(ctx)
	if err != nil || tenant == "" {
		return nil, status.Error(codes.Unauthenticated, "the caller could not be identified")
	}
	scope := durable.Scope{Tenant: tenant, Operation: operation, Key: key}
	if err := scope.Validate(); err != nil {
		s.o.Logger.Error("claimgrpc: invalid scope from the tenant or operation function", "err", err)
		return nil, status.Error(codes.Internal, "the call could not be scoped")
	}
	fp, err := fingerprint(info.FullMethod, req)
	if err != nil {
		s.o.Logger.Error("claimgrpc: request not fingerprinted", "method", info.FullMethod, "err", err)
		return nil, status.Error(codes.Internal, "the request could not be fingerprinted")
	}
	out, err := s.c.Claim(ctx, claim.Request{Scope: scope, Fingerprint: string(fp)})
	if err != nil {
		return nil, s.claimError(out.OperationID, err)
	}
	if out.Kind != claim.Acquired {
		return s.outcome(ctx, out)
	}
	return s.run(ctx, req, out, handler)
}

// keyFrom returns the call's idempotency key, or the reason it has none.
func keyFrom(ctx context.Context) (string, string) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(MetadataKey)
	switch {
	case len(vals) == 0:
		return "", ReasonKeyMissing
	case len(vals) > 1, durable.ValidateKey(vals[0]) != nil:
		return "", ReasonKeyInvalid
	}
	return vals[0], ""
}

// fingerprint hashes the full method, the request's message type and its
// deterministic marshalling. Deterministic marshalling is stable for one
// binary (map entries sorted); it is not a canonical form across protobuf
// implementations or schema versions: see the package documentation.
func fingerprint(fullMethod string, req any) (canon.Fingerprint, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", errors.New("claimgrpc: request is not a protobuf message")
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", err
	}
	name := string(m.ProtoReflect().Descriptor().FullName())
	return canon.Sum([]byte("grpc/v1"), []byte(fullMethod), []byte(name), b), nil
}

// run calls the handler under the lease, renewed until it returns, then
// completes, fails or marks the record uncertain.
//
// Once the handler has started, its effect may have happened: from then on
// the interceptor only records an outcome (completed, failed or uncertain),
// and releases the key only when the application said that nothing
// happened ([ReleaseKey]). When no outcome can be written at all, the
// record stays processing under its lease; see settle.
func (s *server[TTx]) run(ctx context.Context, req any, out claim.Outcome, handler grpc.UnaryHandler) (any, error) {
	opID := out.OperationID
	var (
		resp any
		herr error
	)
	// The engine runs the handler on a context detached from the call's
	// cancellation and deadline (its values, metadata included, are
	// kept), renewing the lease until it returns, and records its outcome;
	// a panic is recorded as uncertain and goes on.
	rep := s.settle.Run(ctx, out.Lease, settle.NewOp(out.Lease), func(work context.Context) settle.Settlement {
		resp, herr = handler(work, req)
		if herr != nil && errors.Is(context.Cause(work), claim.ErrLeaseExpired) {
			// The engine stopped the handler (its lease could not be
			// renewed): its error says it was interrupted, not what became
			// of its effect. Not a business outcome to replay: uncertain
			// (unless the handler said nothing happened).
			s.o.Logger.Warn("claimgrpc: handler interrupted by an unrenewed lease; outcome recorded as uncertain", "op", opID)
			return settle.Settlement{Kind: settle.Uncertain}
		}
		st, encErr := settlementFor(resp, herr)
		if encErr != nil {
			s.o.Logger.Error("claimgrpc: the handler's reply cannot be stored; outcome recorded as uncertain", "op", opID, "err", encErr)
		}
		return st
	})
	st := rep.Settlement
	switch rep.Verdict() {
	case settle.Lost:
		// Another worker holds the operation: its outcome is the
		// operation's; ours must not be published.
		s.o.Logger.Warn("claimgrpc: lease lost or "+st.Kind.String()+" fenced; reply discarded", "op", opID)
		return nil, s.inProgress(opID, 0)
	case settle.RecordedUncertain:
		return nil, s.uncertain(opID)
	case settle.Recorded, settle.RecordedRelease:
		// Completed, failed or released: the handler's own answer, which
		// is what every replay decodes from the record.
		return resp, herr
	case settle.ReleasePending:
		// The application said nothing happened: the lease will expire
		// and the next call runs, so "not processed" is the truth.
		return nil, s.unavailable()
	case settle.Pending:
		return nil, answer(codes.Aborted, "the call was processed, but its result is not recorded yet; retry with the same key", ReasonPending, opID, s.o.RetryAfter)
	case settle.RanOut, settle.Unrecorded:
	}
	s.o.Logger.Error("claimgrpc: "+st.Kind.String()+" failed; reply discarded", "op", opID, "err", rep.Cause())
	return nil, status.Error(codes.Internal, "the call was processed but its result could not be recorded")
}

// outcome answers a claim that did not run the handler.
func (s *server[TTx]) outcome(ctx context.Context, out claim.Outcome) (any, error) {
	switch out.Kind {
	case claim.Replayed:
		if out.Result == nil { // not produced by the claim package; fail safe
			return nil, s.inProgress(out.OperationID, 0)
		}
		_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
		resp, err := decodeReply(out.Result)
		if errors.Is(err, errNotReplayable) {
			s.o.Logger.Error("claimgrpc: stored result cannot be replayed", "op", out.OperationID, "err", err)
			return nil, status.Error(codes.Internal, "the stored result of this key cannot be replayed")
		}
		return resp, err
	case claim.Uncertain:
		return nil, s.uncertain(out.OperationID)
	default: // InProgress
		return nil, s.inProgress(out.OperationID, out.RetryAfter)
	}
}

func (s *server[TTx]) inProgress(opID string, holder time.Duration) error {
	retry := s.o.RetryAfter
	if holder > 0 {
		retry = min(retry, holder)
	}
	return answer(codes.Aborted, "a call with this key is still being processed; retry after the RetryInfo delay", ReasonInProgress, opID, retry)
}

func (s *server[TTx]) uncertain(opID string) error {
	return answer(codes.Aborted, "the outcome of the call with this key is not known yet and is being reconciled; it will not run again", ReasonUncertain, opID, s.o.RetryAfter)
}

func (s *server[TTx]) unavailable() error {
	return answer(codes.Unavailable, "the call was not processed; retry with the same key after the RetryInfo delay", ReasonUnavailable, "", s.o.RetryAfter)
}

// claimError answers an error from Claim: the handler did not run.
func (s *server[TTx]) claimError(opID string, err error) error {
	switch {
	case errors.Is(err, claim.ErrMismatch):
		return answer(codes.FailedPrecondition, "this key was already used for a different request", ReasonKeyReused, "", 0)
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, claim.ErrLeaseExpired):
		return s.unavailable()
	case errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		s.o.Logger.Error("claimgrpc: claim failed", "op", opID, "err", err)
		return status.Error(codes.Internal, "the call could not be processed")
	}
}

// answer is a status with an ErrorInfo of the interceptor's Domain and,
// when retry is positive, a RetryInfo.
func answer(code codes.Code, msg, reason, opID string, retry time.Duration) error {
	st := status.New(code, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: Domain}
	if opID != "" {
		info.Metadata = map[string]string{"operation_id": opID}
	}
	details := []protoadapt.MessageV1{info}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
