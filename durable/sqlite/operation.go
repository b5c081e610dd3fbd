package sqlite

import (
	"context"
	"database/sql"

	"github.com/oncekey/oncekey/durable"
)

// operationDigestVersion is the migration that adds operation_digest
// (003_operation_digest.up.sql). SQLite has no SHA-256 in SQL, so
// [Migrate] fills the column for existing rows in Go, in the migration's
// transaction, right after the file ran.
const operationDigestVersion = 3

// backfillOperationDigests writes the operation digest (durable.Ref.Digest,
// the identity the Claimer hands out) of every row that has none.
func (s *store) backfillOperationDigests(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT tenant_id, operation, key_hash FROM `+s.cfg.table+
		` WHERE operation_digest IS NULL`)
	if err != nil {
		return err
	}
	var refs []durable.Ref
	for rows.Next() {
		var (
			r  durable.Ref
			kh []byte
		)
		if err := rows.Scan(&r.Tenant, &r.Operation, &kh); err != nil {
			rows.Close()
			return err
		}
		copy(r.KeyHash[:], kh)
		refs = append(refs, r)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range refs {
		d := r.Digest()
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.cfg.table+` SET operation_digest = ?4 WHERE `+pk,
			r.Tenant, r.Operation, r.KeyHash[:], d[:]); err != nil {
			return err
		}
	}
	return nil
}
