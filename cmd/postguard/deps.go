package main

// Temporary: keeps the stack's modules in go.mod while the packages that use them are written.
import (
	_ "github.com/chromedp/chromedp"
	_ "github.com/getkin/kin-openapi/openapi3filter"
	_ "github.com/gin-gonic/gin"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/resend/resend-go/v2"
	_ "github.com/riverqueue/river"
	_ "github.com/riverqueue/river/riverdriver/riverpgxv5"
	_ "github.com/riverqueue/river/riverdriver/riversqlite"
	_ "github.com/riverqueue/river/riverlog"
	_ "github.com/riverqueue/river/rivermigrate"
	_ "github.com/riverqueue/river/rivertest"
	_ "github.com/stretchr/testify/require"
	_ "golang.org/x/crypto/argon2"
	_ "golang.org/x/text/unicode/norm"
	_ "modernc.org/sqlite"
	_ "riverqueue.com/riverui"
)

func main() {}
