package ginlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/ginlimit"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
)

// A host app limits its own routes with postguard's counters, in its own database: here a
// SQLite *sql.DB it opened itself (a pgx pool works the same, with postgres.NewEngineFromPool).
// Limit spends one request per request. The login handler spends first (a refusal checks no
// password), and on a right password clears the account, refunds the IP and gives the browser a
// trusted-device cookie, so that guessers who lock the account do not lock out its owner.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ginlimit-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// The host's own database handle, and postguard's tables in it.
	sqlDB, err := sql.Open("sqlite", filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1)
	quiet := slog.New(slog.DiscardHandler)
	engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}); err != nil {
		panic(err)
	}

	rules := abuse.Rules{}.
		With(abuse.Rule{Action: "search", Scope: abuse.ScopeIP, Limit: 2, Window: time.Minute}).
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeIP, Limit: 20, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 2, Window: 15 * time.Minute})
	now := func() time.Time { return time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC) } // a fixed clock, for the output
	limiter, err := abuse.NewLimiter(tables, []byte("the app's secret of 32 bytes, at least"), rules, &abuse.LimiterConfig{NowFunc: now})
	if err != nil {
		panic(err)
	}
	guard := ginlimit.New(limiter, nil)

	gin.SetMode(gin.ReleaseMode)
	router := gin.New()
	router.GET("/search", guard.Limit("search", nil), func(c *gin.Context) { c.String(http.StatusOK, "results") })
	router.POST("/login", func(c *gin.Context) {
		user := c.PostForm("user")
		subject := guard.Subject(c, abuse.Subject{Key: user, Device: guard.Device(c, "login")})
		if !guard.Spend(c, "login", subject) { // answered 429: no password is checked
			return
		}
		if c.PostForm("password") != "correct horse" {
			c.String(http.StatusUnauthorized, "wrong password") // the attempt is counted already
			return
		}
		if guard.Clear(c, "login", abuse.Subject{Key: user, Device: subject.Device}) && // the account's failures (or the device's)
			guard.Refund(c, "login", abuse.Subject{IP: subject.IP}) && // a success costs the IP nothing
			guard.IssueDevice(c, "login", user) { // this browser is now a known device
			c.String(http.StatusOK, "welcome")
		}
	})

	var device *http.Cookie
	send := func(method, target, body string, cookie *http.Cookie) {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = "198.51.100.7:40000"
		if cookie != nil {
			req.AddCookie(cookie)
		}
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)
		fmt.Println(method, target, rec.Code, rec.Header().Get("RateLimit"))
		for _, set := range rec.Result().Cookies() {
			device = set
			fmt.Printf("  cookie %s: Secure %t, HttpOnly %t, SameSite Lax %t, Path %s, Max-Age %d\n",
				set.Name, set.Secure, set.HttpOnly, set.SameSite == http.SameSiteLaxMode, set.Path, set.MaxAge)
		}
	}
	for range 3 {
		send(http.MethodGet, "/search", "", nil)
	}
	send(http.MethodPost, "/login", "user=ada&password=correct+horse", nil) // the owner, once
	send(http.MethodPost, "/login", "user=ada&password=guess", nil)         // then a guesser, twice
	send(http.MethodPost, "/login", "user=ada&password=guess", nil)
	send(http.MethodPost, "/login", "user=ada&password=correct+horse", nil)    // locked, for clients it does not know
	send(http.MethodPost, "/login", "user=ada&password=correct+horse", device) // but not for the owner's browser
	// Output:
	// GET /search 200 "search-ip";r=1;t=30
	// GET /search 200 "search-ip";r=0;t=30
	// GET /search 429 "search-ip";r=0;t=30
	// POST /login 200 "login-key";r=1;t=870
	//   cookie __Host-postguard-device-login: Secure true, HttpOnly true, SameSite Lax true, Path /, Max-Age 7776000
	// POST /login 401 "login-key";r=1;t=870
	// POST /login 401 "login-key";r=0;t=870
	// POST /login 429 "login-key";r=0;t=870
	// POST /login 200 "login-key";r=1;t=870
	//   cookie __Host-postguard-device-login: Secure true, HttpOnly true, SameSite Lax true, Path /, Max-Age 7776000
}
