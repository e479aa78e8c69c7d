// Package dbsqlc is the code sqlc generates from queries/postgres and the postgres migrations: one method
// per statement, rows and parameters as structs. Run `go tool sqlc generate` after changing
// either; only this file is written by hand. db/postgres adapts it to the db package's types.
package dbsqlc
