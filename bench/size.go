package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
)

// sizeSeed is how many records -records writes through the library; the
// rest are copies of them with new keys.
const sizeSeed = 1000

// recordSize measures what a record costs on disk (-records N): sizeSeed
// records written by Claimer.Do with the workloads' result, then copies of
// them with new key hashes and operation digests (and times a second
// apart) up to N (in statements of
// about a million rows), VACUUM ANALYZE, and the bytes per record of the
// table's heap, its TOAST, each index and the whole, before and after
// migration 007's contract step (timed). The copies carry
// exactly the columns the library wrote, so a change of the record's
// layout shows here as it would on a user's table.
func recordSize(ctx context.Context, e *env) (*workload, []extra, error) {
	n := e.cfg.records
	w := &workload{name: "size", about: fmt.Sprintf("%d records: %d through Do, the rest copied from them with new keys, then VACUUM ANALYZE", n, min(n, sizeSeed))}
	start := time.Now()
	seed := min(n, sizeSeed)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range min(e.cfg.concurrency, 16) {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(seed) || ctx.Err() != nil {
					return
				}
				if _, err := doFresh(ctx, e.setup, fmt.Sprintf("size-%d", i)); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return w, nil, fmt.Errorf("bench: size: %w", firstErr)
	}
	// The copy's select list: every column as written, but the key hash
	// and the operation digest, which are made unique per copy.
	var cols []string
	rows, err := e.pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'idempotency_requests' ORDER BY ordinal_position`, e.schema)
	if err != nil {
		return w, nil, fmt.Errorf("bench: size: columns: %w", err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return w, nil, fmt.Errorf("bench: size: columns: %w", err)
		}
		cols = append(cols, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(cols) == 0 {
		return w, nil, fmt.Errorf("bench: size: columns of %s: %d found, %v", e.table, len(cols), err)
	}
	sel := make([]string, len(cols))
	for i, c := range cols {
		switch c {
		case "key_hash", "operation_digest":
			sel[i] = "sha256(t." + c + " || int4send(g))"
		case "created_at", "completed_at", "expires_at", "lease_expires_at":
			// Distinct times, as real records have: an index of equal
			// values would be deduplicated and look smaller than it is.
			// A second per copy spreads 10M records over about 3 hours,
			// as 1000 requests a second would.
			sel[i] = "t." + c + " + g * interval '1 second'"
		default:
			sel[i] = "t." + c
		}
	}
	copyStmt := `INSERT INTO ` + e.table + ` (` + strings.Join(cols, ", ") + `) SELECT ` + strings.Join(sel, ", ") +
		` FROM (SELECT * FROM ` + e.table + ` LIMIT ` + fmt.Sprint(seed) + `) t, generate_series($1::integer, $2::integer) g`
	// Copies g = 1.. of the seed rows: (n - seed) / seed rounds, about a
	// million rows per statement.
	per := max(1, 1_000_000/seed)
	copies := (n - seed) / seed
	for lo := 1; lo <= copies; lo += per {
		hi := min(copies, lo+per-1)
		if _, err := e.pool.Exec(ctx, copyStmt, lo, hi); err != nil {
			return w, nil, fmt.Errorf("bench: size: copy %d-%d: %w", lo, hi, err)
		}
		logf("size: %d of %d records", seed*(hi+1), n)
	}
	out, err := measureTable(ctx, e, e.table, "")
	if err != nil {
		return w, nil, err
	}
	out[0].Note = fmt.Sprintf("written and measured in %s", fmtDur(time.Since(start)))
	// The same table carried over by migration 007's contract step (the
	// operation digest as the primary key; oncekey migrate contract), timed.
	cstart := time.Now()
	if _, err := pgmigrate.Contract(ctx, e.pool, postgres.Migrations(), pgmigrate.Target{Schema: e.schema, Table: pgmigrate.DefaultTable}); err != nil {
		return w, nil, fmt.Errorf("bench: size: contract: %w", err)
	}
	took := time.Since(cstart)
	contracted, err := measureTable(ctx, e, e.table, "digest-key ")
	if err != nil {
		return w, nil, err
	}
	contracted[0].Note = fmt.Sprintf("after oncekey migrate contract (007), which took %s", fmtDur(took))
	out = append(out, contracted...)
	// The same records in issue 30.4's slim record (slim.go), for the size
	// after.
	for _, t := range []struct{ table, prefix string }{{e.slimTable, "slim "}, {e.slimPendingTable, "slim-pending "}} {
		stmt := strings.NewReplacer("%S", t.table, "%T", e.table).Replace(slimCopySQL)
		if _, err := e.pool.Exec(ctx, stmt); err != nil {
			return w, nil, fmt.Errorf("bench: size: slim copy: %w", err)
		}
		slim, err := measureTable(ctx, e, t.table, t.prefix)
		if err != nil {
			return w, nil, err
		}
		out = append(out, slim...)
	}
	return w, out, nil
}

// measureTable runs VACUUM ANALYZE on table and returns the bytes per
// record of its heap, TOAST, each index and the whole, each name prefixed
// with prefix.
func measureTable(ctx context.Context, e *env, table, prefix string) ([]extra, error) {
	if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return nil, fmt.Errorf("bench: size: vacuum: %w", err)
	}
	var count, heap, toast, total int64
	var width float64
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`),
		pg_relation_size(c.oid), COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0), pg_total_relation_size(c.oid),
		(SELECT avg(pg_column_size(t.*)) FROM (SELECT * FROM `+table+` LIMIT 10000) t)
		FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&count, &heap, &toast, &total, &width); err != nil {
		return nil, fmt.Errorf("bench: size: %w", err)
	}
	per1 := func(b int64) float64 { return float64(b) / float64(count) }
	out := []extra{
		{Name: prefix + "records", Value: float64(count)},
		{Name: prefix + "row (pg_column_size)", Value: width, Unit: "B/record", Note: "the tuple's data, averaged over 10,000 rows"},
		{Name: prefix + "heap", Value: per1(heap), Unit: "B/record", Note: "pg_relation_size: tuples, their headers and line pointers, page free space (fillfactor)"},
		{Name: prefix + "TOAST", Value: per1(toast), Unit: "B/record"},
	}
	irows, err := e.pool.Query(ctx, `SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass ORDER BY c.relname`, table)
	if err != nil {
		return nil, fmt.Errorf("bench: size: indexes: %w", err)
	}
	defer irows.Close()
	for irows.Next() {
		var name string
		var b int64
		if err := irows.Scan(&name, &b); err != nil {
			return nil, fmt.Errorf("bench: size: indexes: %w", err)
		}
		out = append(out, extra{Name: prefix + "index " + name, Value: per1(b), Unit: "B/record"})
	}
	if err := irows.Err(); err != nil {
		return nil, fmt.Errorf("bench: size: indexes: %w", err)
	}
	out = append(out, extra{Name: prefix + "total", Value: per1(total), Unit: "B/record",
		Note: fmt.Sprintf("pg_total_relation_size %.2f GB for %d records", float64(total)/1e9, count)})
	return out, nil
}
