package postgres

import "github.com/jackc/pgx/v5/pgxpool"

// RateLimitPool exposes the rate-limit pool to the package's tests.
func (s *Store) RateLimitPool() *pgxpool.Pool { return s.rateLimitPool }
