package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// opFlags name one operation: -tenant with -operation and -key, or -tenant
// with -id.
type opFlags struct {
	tenant, operation, key, id, secretFile string
	rawKey                                 bool
}

func (o *opFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.tenant, "tenant", "", "tenant of the operation (required; never printed)")
	fs.StringVar(&o.operation, "operation", "", "operation, e.g. \"POST /orders\" (with -key)")
	fs.StringVar(&o.key, "key", "", "the client's idempotency key, hashed locally and never printed nor sent; \"-\" reads it from stdin. As the Idempotency-Key header carries it, an RFC 8941 string in double quotes ('\"K\"', escapes \\\" and \\\\) is unquoted as claimhttp does; otherwise it is taken as it is")
	fs.BoolVar(&o.rawKey, "raw-key", false, "take -key as it is, even when it begins with a double quote (a gRPC or message key that holds quotes)")
	fs.StringVar(&o.id, "id", "", "operation id (op_...) instead of -operation and -key")
	fs.StringVar(&o.secretFile, "key-secret-file", "", "file holding the store's key secret (postgres.WithKeySecret); default $ONCEKEY_KEY_SECRET")
}

// validate checks the combination and reads the key from stdin for "-".
func (o *opFlags) validate(e *env) error {
	if o.tenant == "" {
		return usagef("-tenant is required (operations are isolated per tenant)")
	}
	byKey := o.operation != "" || o.key != ""
	switch {
	case o.id != "" && byKey:
		return usagef("give either -id, or -operation and -key, not both")
	case o.id != "":
		_, err := parseOperationID(o.id)
		return err
	case o.operation == "" || o.key == "":
		return usagef("give -operation and -key (or -id)")
	}
	if o.key == "-" {
		line, err := bufio.NewReader(e.stdin).ReadString('\n')
		if err != nil && line == "" {
			return usagef("-key -: no key on stdin")
		}
		o.key = strings.TrimRight(line, "\r\n")
	}
	if !o.rawKey {
		k, err := headerKey(o.key)
		if err != nil {
			return err
		}
		o.key = k
	}
	// The store would refuse these too; checking here says which flag.
	if err := (durable.Scope{Tenant: o.tenant, Operation: o.operation, Key: o.key}).Validate(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// headerKey returns the key v names: an RFC 8941 sf-string (what the
// Idempotency-Key header carries, '"K"'), with surrounding spaces and tabs
// ignored, unquoted exactly as claimhttp parses the header (section 4.2.5
// of the RFC: printable ASCII, only \" and \\ are escapes, nothing after
// the closing quote); any other value is the key as it is. The errors
// never quote the key.
func headerKey(v string) (string, error) {
	t := strings.Trim(v, " \t")
	if !strings.HasPrefix(t, `"`) {
		return v, nil
	}
	const hint = " (-key in double quotes is read as the Idempotency-Key header's string; -raw-key takes it as it is)"
	var b strings.Builder
	for i := 1; i < len(t); i++ {
		switch c := t[i]; {
		case c == '\\':
			i++
			if i == len(t) || t[i] != '"' && t[i] != '\\' {
				return "", usagef("-key: only \\\" and \\\\ are escapes in a quoted key%s", hint)
			}
			b.WriteByte(t[i])
		case c == '"':
			if i != len(t)-1 {
				return "", usagef("-key: characters after the closing quote%s", hint)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", usagef("-key: a character outside printable ASCII in a quoted key%s", hint)
		default:
			b.WriteByte(c)
		}
	}
	return "", usagef("-key: unterminated quoted key%s", hint)
}

// secret returns the store's key secret: the file's contents (a trailing
// newline removed) or ONCEKEY_KEY_SECRET.
func (o *opFlags) secret(e *env) ([]byte, error) {
	if o.secretFile != "" {
		b, err := os.ReadFile(o.secretFile)
		if err != nil {
			return nil, usagef("-key-secret-file: %v", err)
		}
		b = []byte(strings.TrimRight(string(b), "\r\n"))
		if len(b) == 0 {
			return nil, usagef("-key-secret-file: empty")
		}
		return b, nil
	}
	return []byte(e.getenv("ONCEKEY_KEY_SECRET")), nil
}

// open opens the database of d with o's key secret, checks its tables
// (see openTables), and reads the record o names; cmd names the command in
// a store error. The caller closes the database.
func (o *opFlags) open(e *env, d *dbFlags, resolutions bool, cmd string) (*db, durable.Record, error) {
	secret, err := o.secret(e)
	if err != nil {
		return nil, durable.Record{}, err
	}
	b, err := d.openTables(e, secret, resolutions)
	if err != nil {
		return nil, durable.Record{}, err
	}
	rec, err := o.lookup(b.ctx, b.store)
	if err != nil {
		b.Close()
		if errors.Is(err, errUsage) {
			return nil, rec, err
		}
		return nil, rec, storeErr(cmd, err)
	}
	return b, rec, nil
}

// lookup reads the operation the flags name.
func (o *opFlags) lookup(ctx context.Context, st storeapi.Store[pgx.Tx]) (durable.Record, error) {
	if o.id != "" {
		return lookupByID(ctx, st, o.tenant, o.id)
	}
	// The store hashes the key as it derives its record key (SHA-256, or
	// HMAC-SHA-256 under the secret): only the hash is sent.
	ref, err := st.Ref(durable.Scope{Tenant: o.tenant, Operation: o.operation, Key: o.key})
	if err != nil {
		return durable.Record{}, usagef("%v", err)
	}
	return st.Get(ctx, ref)
}

// byOperationID is the store's read of a record by its operation
// identity within a tenant: digest is what durable.Ref.Digest returns,
// behind the "op_" identity. durable/postgres gains it with migration 003
// (storeapi.Store.Operation); with a store that has it, inspect and
// resolve -id read any record, with one that does not, only the pending
// ones (see lookupByID).
type byOperationID interface {
	Operation(ctx context.Context, tenant string, digest [32]byte) (durable.Record, error)
}

// pendingScan bounds the fallback of lookupByID.
const pendingScan = 10000

// errNoIDLookup says the store cannot read a record by its operation id.
var errNoIDLookup = errors.New("this store cannot read other records by operation id (migration 003): use -operation and -key")

// parseOperationID returns the digest behind an operation id ("op_" and
// 43 base64url characters, as durable.Ref.OperationID writes it).
func parseOperationID(id string) ([32]byte, error) {
	var d [32]byte
	rest, ok := strings.CutPrefix(id, "op_")
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if !ok || err != nil || len(b) != len(d) {
		return d, usagef("-id must be an operation id: op_ followed by 43 base64url characters")
	}
	copy(d[:], b)
	return d, nil
}

// lookupByID finds a record by tenant and operation id: through the
// store's read by identity when it has one; otherwise among the pending
// records (uncertain, or processing with an expired lease: the ones
// resolve settles), the oldest pendingScan of them.
func lookupByID(ctx context.Context, st storeapi.Store[pgx.Tx], tenant, id string) (durable.Record, error) {
	digest, err := parseOperationID(id)
	if err != nil {
		return durable.Record{}, err
	}
	if l, ok := any(st).(byOperationID); ok {
		return l.Operation(ctx, tenant, digest)
	}
	recs, err := st.Pending(ctx, 0, pendingScan)
	if err != nil {
		return durable.Record{}, err
	}
	for _, r := range recs {
		if r.Ref.Tenant == tenant && r.Ref.Digest() == digest {
			return r, nil
		}
	}
	return durable.Record{}, fmt.Errorf("operation %s is not among this tenant's pending operations (uncertain or stale); %w", id, errNoIDLookup)
}

// recordJSON is the printable form of a record: no tenant, no key, no
// key hash, no result body.
type recordJSON struct {
	OperationID      string     `json:"operation_id"`
	Tenant           string     `json:"tenant_digest"`
	Operation        string     `json:"operation"`
	State            string     `json:"state"`
	Released         bool       `json:"released,omitempty"`
	Generation       uint64     `json:"generation"`
	LeaseRemainingMs int64      `json:"lease_remaining_ms"`
	Takeovers        int        `json:"takeovers"`
	CreatedAt        time.Time  `json:"created_at"`
	CompletedAt      *time.Time `json:"completed_at,omitempty"`
	ExpiresAt        time.Time  `json:"expires_at"`
	Status           *int       `json:"result_status,omitempty"`
	ResultVersion    *int       `json:"result_version,omitempty"`
	BodyBytes        *int       `json:"result_body_bytes,omitempty"`
	// Step is the step of a workflow an uncertain or processing operation
	// stopped at (or runs); Steps, inspect's only, all its steps.
	Step  *stepJSON  `json:"step,omitempty"`
	Steps []stepJSON `json:"steps,omitempty"`
}

// tenantDigest names a tenant without showing it: the first 12 hex
// characters of its SHA-256, so an operator can group records.
func tenantDigest(t string) string {
	h := sha256.Sum256([]byte(t))
	return "t_" + hex.EncodeToString(h[:6])
}

func toJSON(r durable.Record) recordJSON {
	j := recordJSON{
		OperationID: r.Ref.OperationID(), Tenant: tenantDigest(r.Ref.Tenant), Operation: r.Ref.Operation,
		State: string(r.State), Released: r.Released, Generation: r.Token.Generation,
		LeaseRemainingMs: r.LeaseRemaining.Milliseconds(), Takeovers: r.Takeovers,
		CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(),
	}
	if !r.CompletedAt.IsZero() {
		c := r.CompletedAt.UTC()
		j.CompletedAt = &c
	}
	if r.Result != nil {
		s, v, n := r.Result.StatusCode, r.Result.Version, len(r.Result.Body)
		j.Status, j.ResultVersion, j.BodyBytes = &s, &v, &n
	}
	if r.Step != nil {
		st := toStepJSON(*r.Step)
		j.Step = &st
	}
	return j
}

func runInspect(e *env, args []string) error {
	var d dbFlags
	var o opFlags
	fs := newFlags(e, "inspect", "inspect -tenant T (-operation OP -key K | -id op_...) [-step-results] [flags]\n\n"+
		"Shows one operation: state, generation, lease, timestamps, result status, and the steps of\n"+
		"its workflow (seq, name, state, attempts, generation, times, result size) with the one it\n"+
		"stopped at. The key is hashed here the way the store derives its record key; neither it nor\n"+
		"the tenant is printed, nor a step's result unless -step-results asks.")
	d.register(fs, 30*time.Second)
	o.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	results := fs.Bool("step-results", false, fmt.Sprintf("also print each finished step's result (the application's data: it may hold personal data), at most its first %d bytes: quoted text, or hex when it is not UTF-8 (-json: result_text or result_hex)", stepResultShown))
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if err := o.validate(e); err != nil {
		return err
	}
	b, r, err := o.open(e, &d, false, "inspect")
	if err != nil {
		return err
	}
	defer b.Close()
	haveSteps, err := b.hasStepsTable(d)
	if err != nil {
		return err
	}
	var steps []durable.Step
	if haveSteps {
		if steps, err = b.store.Steps(b.ctx, r.Ref, *results); err != nil {
			return storeErr("inspect", err)
		}
	}
	if pendingStep(r) {
		r.Step = storeapi.CurrentStep(steps)
	}
	j := toJSON(r)
	for _, s := range steps {
		j.Steps = append(j.Steps, toStepJSON(s))
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(j)
	}
	if err := printRecord(e, j, r); err != nil {
		return err
	}
	return printSteps(e.stdout, j.Steps, haveSteps, *results)
}

func printRecord(e *env, j recordJSON, r durable.Record) error {
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	state := j.State
	if j.Released {
		state += " (released)"
	}
	fmt.Fprintf(w, "operation id\t%s\n", j.OperationID)
	fmt.Fprintf(w, "tenant digest\t%s\n", j.Tenant)
	fmt.Fprintf(w, "operation\t%s\n", j.Operation)
	fmt.Fprintf(w, "state\t%s\n", state)
	fmt.Fprintf(w, "generation\t%d\n", j.Generation)
	fmt.Fprintf(w, "lease remaining\t%s\n", time.Duration(j.LeaseRemainingMs)*time.Millisecond)
	fmt.Fprintf(w, "takeovers\t%d\n", j.Takeovers)
	fmt.Fprintf(w, "created at\t%s\n", j.CreatedAt.Format(time.RFC3339Nano))
	if j.CompletedAt != nil {
		fmt.Fprintf(w, "completed at\t%s\n", j.CompletedAt.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(w, "expires at\t%s\n", j.ExpiresAt.Format(time.RFC3339Nano))
	if j.Status != nil {
		fmt.Fprintf(w, "result status\t%d (version %d, body %d bytes)\n", *j.Status, *j.ResultVersion, *j.BodyBytes)
	}
	if label, text := stepLine(r); label != "" {
		fmt.Fprintf(w, "%s\t%s\n", label, text)
		if label != "running step" {
			fmt.Fprintf(w, "\t(settle it: oncekey resolve -step %s -happened -step-result R | -not-happened, with -reason)\n", r.Step.Name)
		}
	}
	return w.Flush()
}
