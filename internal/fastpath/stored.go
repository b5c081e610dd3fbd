package fastpath

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stored is what a record's Redis key holds, decoded, for the tests, tools
// and chaos faults that read Redis directly. The scripts themselves read it
// in Lua; claim.lua's header is the layout's one description.
type Stored struct {
	// Kind is StoredNone, StoredLease, StoredResult or StoredFinished.
	Kind StoredKind
	// Tentative is set for a lease the durable store has not granted yet.
	Tentative bool
	// Generation is the lease's or the result's generation.
	Generation uint64
	// Owner is the lease holder's UUID text.
	Owner string
	// Lease is the lease's length.
	Lease time.Duration
	// Fingerprint is the lease's, the result's or the marker's fingerprint.
	Fingerprint string
	// Blob is the result's encoding.
	Blob string
	// TTL is the key's remaining time; negative when it has none, 0 when
	// absent.
	TTL time.Duration
}

// StoredKind says which form a record's key holds.
type StoredKind int

// The forms of a record's key.
const (
	StoredNone StoredKind = iota
	StoredLease
	StoredResult
	// StoredFinished: the marker of a finished operation whose result is
	// too large to cache; its replay comes from the durable store.
	StoredFinished
)

// ParseStored decodes a record key's value; ok is false when it is none of
// the forms (the scripts treat such a value as absent).
func ParseStored(v string) (s Stored, ok bool) {
	if len(v) < 2 {
		return Stored{}, false
	}
	head, rest, ok1 := strings.Cut(v[1:], ":")
	mid, tail, ok2 := strings.Cut(rest, ":")
	g, err := strconv.ParseUint(head, 10, 64)
	n, err2 := strconv.ParseUint(mid, 10, 64)
	if !ok1 || !ok2 || err != nil || err2 != nil || head[0] == '0' {
		return Stored{}, false
	}
	switch v[0] {
	case 'L', 'T':
		if len(tail) < 36 {
			return Stored{}, false
		}
		return Stored{Kind: StoredLease, Tentative: v[0] == 'T', Generation: g, Lease: time.Duration(n) * time.Millisecond, Owner: tail[:36], Fingerprint: tail[36:]}, true
	case 'F':
		if uint64(len(tail)) != n {
			return Stored{}, false
		}
		return Stored{Kind: StoredFinished, Generation: g, Fingerprint: tail}, true
	case 'R':
		if uint64(len(tail)) < n {
			return Stored{}, false
		}
		return Stored{Kind: StoredResult, Generation: g, Fingerprint: tail[:n], Blob: tail[n:]}, true
	}
	return Stored{}, false
}

// ReadStored reads and decodes what k's record key holds (GET and PTTL in
// one pipeline). A value that is neither form is an [ErrCorrupt].
func ReadStored(ctx context.Context, c redis.Cmdable, k Keys) (Stored, error) {
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, k.Record)
		pttl = p.PTTL(ctx, k.Record)
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return Stored{}, nil
	}
	if err != nil {
		return Stored{}, err
	}
	s, ok := ParseStored(get.Val())
	if !ok {
		return Stored{}, fmt.Errorf("%w: %s holds none of a record key's forms", ErrCorrupt, k.Record)
	}
	s.TTL = pttl.Val()
	return s, nil
}
