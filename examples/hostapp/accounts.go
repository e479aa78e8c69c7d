package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/postguard/postguard/jobs"
)

// accountsDB are the app's reads and writes of its accounts outside a sign-up's transaction, on a
// *sql.DB of either engine (on PostgreSQL, over its pgx pool).
type accountsDB struct{ db *sql.DB }

func (d accountsDB) findAccount(ctx context.Context, email string) (int64, []byte, error) {
	var id int64
	var hash []byte
	err := d.db.QueryRowContext(ctx, findAccountSQL, email).Scan(&id, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, nil
	}
	return id, hash, err
}

func (d accountsDB) recipient(ctx context.Context, id int64) (*jobs.Recipient, error) {
	var r jobs.Recipient
	err := d.db.QueryRowContext(ctx, recipientSQL, id).Scan(&r.Email, &r.Name, &r.Locale, &r.Unsubscribed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("account %d: %w", id, jobs.ErrNoRecipient)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading account %d: %w", id, err)
	}
	return &r, nil
}

func (d accountsDB) optOut(ctx context.Context, id int64) error {
	_, err := d.db.ExecContext(ctx, optOutSQL, id)
	return err
}
