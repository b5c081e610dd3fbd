package sqlite

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/headers"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads the columns of recordCols, then extra.
func scanRecord(sc scanner, extra ...any) (durable.Record, error) {
	var (
		rec                          durable.Record
		keyHash                      []byte
		state                        string
		gen, leaseRem, takeovers     int64
		created, expires, expiresIn  int64
		owner, jsonHeaders, resource sql.NullString
		status, version, completedAt sql.NullInt64
		headersBin, body             []byte
	)
	dest := append([]any{&rec.Ref.Tenant, &rec.Ref.Operation, &keyHash, &rec.Fingerprint, &state, &gen, &owner,
		&leaseRem, &status, &jsonHeaders, &headersBin, &body, &version, &resource,
		&takeovers, &created, &completedAt, &expires, &expiresIn}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return durable.Record{}, err
	}
	if len(keyHash) != len(rec.Ref.KeyHash) || gen < 1 || !storeapi.ValidState(durable.State(state)) {
		return durable.Record{}, fmt.Errorf("durable/sqlite: malformed record (state %q, generation %d)", state, gen)
	}
	copy(rec.Ref.KeyHash[:], keyHash)
	rec.State = durable.State(state)
	rec.Token.Generation = uint64(gen)
	if owner.Valid {
		u, err := uuid.Parse(owner.String)
		if err != nil {
			return durable.Record{}, fmt.Errorf("durable/sqlite: malformed owner token: %w", err)
		}
		rec.Token.Owner = u
	}
	rec.Released = rec.State == durable.Processing && !owner.Valid
	rec.LeaseRemaining = time.Duration(leaseRem) * time.Microsecond
	rec.Takeovers = int(takeovers)
	rec.CreatedAt = time.UnixMicro(created).UTC()
	rec.ExpiresAt = time.UnixMicro(expires).UTC()
	rec.ExpiresIn = time.Duration(expiresIn) * time.Microsecond
	if rec.State.Finished() {
		if completedAt.Valid {
			rec.CompletedAt = time.UnixMicro(completedAt.Int64).UTC()
		}
		res := &durable.Result{
			StatusCode: int(status.Int64),
			Body:       body,
			Version:    int(version.Int64),
			ResourceID: resource.String,
		}
		if res.Body == nil {
			res.Body = []byte{}
		}
		switch {
		case headersBin != nil:
			h, err := headers.Decode(headersBin)
			if err != nil {
				return durable.Record{}, fmt.Errorf("durable/sqlite: malformed stored headers: %w", err)
			}
			res.Headers = h
		case jsonHeaders.Valid:
			// Finished by the version before migration 002.
			if err := json.Unmarshal([]byte(jsonHeaders.String), &res.Headers); err != nil {
				return durable.Record{}, fmt.Errorf("durable/sqlite: malformed stored headers: %w", err)
			}
		}
		rec.Result = res
	}
	return rec, nil
}

// encodeHeaders returns the lossy JSON copy of h kept for the version before
// migration 002: NULL when empty.
func encodeHeaders(h map[string][]string) (sql.NullString, error) {
	if len(h) == 0 {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return sql.NullString{}, err
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// sameResult reports whether a stored result is the one a retried
// Complete or Fail carries; headers are compared in their stored,
// byte-for-byte encoding.
func sameResult(stored *durable.Result, res durable.Result) bool {
	if stored == nil {
		return false
	}
	return bytes.Equal(headers.Encode(stored.Headers), headers.Encode(res.Headers)) &&
		stored.StatusCode == res.StatusCode && stored.Version == res.Version &&
		stored.ResourceID == res.ResourceID && bytes.Equal(stored.Body, res.Body)
}

// heldBy reports whether rec carries tok.
func heldBy(rec durable.Record, tok fence.Token) bool {
	return rec.Token == tok
}

func validRef(ref durable.Ref) error {
	// The tenant and operation rules are Scope's; the key is already hashed.
	return durable.Scope{Tenant: ref.Tenant, Operation: ref.Operation, Key: "-"}.Validate()
}

// validToken rejects a token the store can never have issued (the zero
// Token, for one): it holds no record, so a write with it is fenced.
func validToken(op string, tok fence.Token) error {
	if tok.Generation < 1 || tok.Generation > 1<<62 || tok.Owner == uuid.Nil {
		return fmt.Errorf("durable/sqlite: %s: %w", op, durable.ErrFenced)
	}
	return nil
}

func validLease(d time.Duration) error {
	if d < time.Millisecond {
		return storeapi.Invalid("lease", "shorter than 1ms")
	}
	return nil
}
