package postgres

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable/driver/storeopt"
)

// Defaults of the options.
const (
	defaultTable           = "idempotency_requests"
	defaultLockTimeout     = 5 * time.Second
	defaultIdleInTxTimeout = 15 * time.Second
)

// Runtime parameters that [ConfigurePool] sets and [New] looks for.
const (
	paramLockTimeout = "lock_timeout"
	paramIdleInTx    = "idle_in_transaction_session_timeout"
)

// Option configures [New] and [Migrate] (and, for the timeouts, a pool in
// [ConfigurePool]).
type Option func(*config) error

type config struct {
	schema      string
	table       string
	secret      []byte
	lockTimeout time.Duration
	idleInTx    time.Duration
	partitions  int // 0: as the table is (unpartitioned when Migrate creates it)
}

func newConfig(opts []Option) (config, error) {
	return storeopt.Apply(config{table: defaultTable, lockTimeout: defaultLockTimeout, idleInTx: defaultIdleInTxTimeout}, opts)
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// WithSchema places the table (and its state type) in schema, which
// [Migrate] creates if needed; every statement then names it
// explicitly. Without it the pool's search_path decides. The name must be a
// lowercase SQL identifier (letters, digits, '_') of at most 63 bytes.
func WithSchema(schema string) Option {
	return func(c *config) error {
		if len(schema) > 63 || !identRE.MatchString(schema) || schema == "pg_catalog" {
			return fmt.Errorf("%w: WithSchema: %q is not a lowercase identifier of at most 63 bytes", ErrConfig, schema)
		}
		c.schema = schema
		return nil
	}
}

// WithTable names the table. Defaults to "idempotency_requests". The name must be a
// lowercase SQL identifier of at most 50 bytes (index names derive from it),
// and not "idempotency_state", the name of the state type.
func WithTable(table string) Option {
	return func(c *config) error {
		if len(table) > 50 || !identRE.MatchString(table) || table == "idempotency_state" {
			return fmt.Errorf("%w: WithTable: %q is not a lowercase identifier of at most 50 bytes", ErrConfig, table)
		}
		c.table = table
		return nil
	}
}

// WithKeySecret stores each idempotency key as HMAC-SHA-256(secret, key)
// instead of SHA-256(key), so a database dump cannot be matched against
// guessed keys (see [durable.Scope.Ref]). Every store on the same table must
// use the same secret, forever: a different secret addresses different
// records. The secret is copied; it must not be empty.
func WithKeySecret(secret []byte) Option {
	return func(c *config) error {
		if err := storeopt.CheckKeySecret(ErrConfig, secret); err != nil {
			return err
		}
		c.secret = append([]byte(nil), secret...)
		return nil
	}
}

// WithLockTimeout sets lock_timeout: how long a statement waits for a row
// lock before failing with [durable.ErrUnavailable] (retryable). Defaults to
// 5s; at least 1ms and less than 30s, an error wrapping [ErrConfig]
// otherwise: the generations a store hands out after a sweep rely on a claim
// never waiting anywhere near a minute (see the durable package's
// "Generations"). See the package documentation for where it applies.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if err := storeopt.CheckLockWait(ErrConfig, "WithLockTimeout", d); err != nil {
			return err
		}
		c.lockTimeout = d
		return nil
	}
}

// WithIdleInTxTimeout sets idle_in_transaction_session_timeout: a session
// whose transaction stays idle that long (a paused worker) is ended by the
// server, which rolls the transaction back and frees its row locks. Defaults
// to 15s; at least 1ms.
func WithIdleInTxTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithIdleInTxTimeout: must be at least 1ms", ErrConfig)
		}
		c.idleInTx = d
		return nil
	}
}

// Bounds of [WithPartitions].
const (
	minPartitions = 2
	maxPartitions = 1024
)

// WithPartitions makes [Migrate] create the table PARTITION BY HASH
// (tenant_id, operation, key_hash), its primary key, with n partitions
// named <table>_p0 ... <table>_p<n-1>. The primary key, and so the claim's
// one-statement uniqueness, is the same as on an unpartitioned table, and
// every statement the store sends on the claim path names the full key, so
// it reads and writes one partition (see the package documentation for
// the few that read all of them).
//
// n is chosen when the table is created, and cannot change: Migrate with
// WithPartitions on a table that exists unpartitioned, or with another
// number of partitions, changes nothing and returns a
// an error matching [ErrConfig] that names both. Migrate without it accepts the table as it is,
// partitioned or not, and [New] ignores it (the statements are the same).
// n must be from 2 to 1024; an error wrapping [ErrConfig] otherwise.
func WithPartitions(n int) Option {
	return func(c *config) error {
		if n < minPartitions || n > maxPartitions {
			return fmt.Errorf("%w: WithPartitions: %d partitions; must be from %d to %d", ErrConfig, n, minPartitions, maxPartitions)
		}
		c.partitions = n
		return nil
	}
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// ConfigurePool sets lock_timeout and idle_in_transaction_session_timeout as
// runtime parameters of every session cfg opens, from the
// [WithLockTimeout] and [WithIdleInTxTimeout] options (or their defaults);
// other options are validated and otherwise ignored. Call it before
// pgxpool.NewWithConfig. The parameters are sent in the connection's startup
// message, so they cost no round trip. A parameter already present in
// cfg (from the connection string, for example) is left as it is.
//
// [New] detects a pool configured this way (lock_timeout present in its
// runtime parameters) and then sends each statement as it is; otherwise it
// bounds its own lock waits per statement (see the package documentation).
//
// Do not call it for a pool behind PgBouncer in transaction mode: startup
// parameters do not survive a pooler that hands server sessions from client
// to client. PgBouncer refuses them (every connection fails, with an error
// matching [ErrConfig]) or, listed in its ignore_startup_parameters, drops
// them ([CheckDurability] reports it). Set the two timeouts per role or
// database there (ALTER ROLE ... SET); see the package documentation,
// "PgBouncer".
func ConfigurePool(cfg *pgxpool.Config, opts ...Option) error {
	if cfg == nil || cfg.ConnConfig == nil {
		return fmt.Errorf("%w: ConfigurePool: nil config", ErrConfig)
	}
	c, err := newConfig(opts)
	if err != nil {
		return err
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	rp := cfg.ConnConfig.RuntimeParams
	if _, ok := rp[paramLockTimeout]; !ok {
		rp[paramLockTimeout] = millis(c.lockTimeout)
	}
	if _, ok := rp[paramIdleInTx]; !ok {
		rp[paramIdleInTx] = millis(c.idleInTx)
	}
	return nil
}
