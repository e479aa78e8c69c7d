package abuse_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
)

// A login, as plain calls: spend an attempt before checking the password (a refusal checks
// nothing), and on a right one clear the account, refund the IP and issue a trusted device that
// the client sends back with its later logins. Guessers then lock the account for unknown clients
// only. The counters live in postguard's tables (db.Tables) on the app's own database; here a
// SQLite file, PostgreSQL the same through postgres.NewEngineFromPool.
func ExampleLimiter_Refund() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "abuse-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)
	engine, err := sqlite.NewEngine(ctx, filepath.Join(dir, "app.db"), &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	defer tables.Close()
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}); err != nil {
		panic(err)
	}

	rules, err := abuse.Rules{}.WithEnviron([]string{"RATE_LIMIT_LOGIN_IP=20/15m", "RATE_LIMIT_LOGIN_KEY=3/15m"})
	if err != nil {
		panic(err)
	}
	now := func() time.Time { return time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC) }
	limiter, err := abuse.NewLimiter(tables, []byte("the app's secret of 32 bytes, at least"), rules, &abuse.LimiterConfig{NowFunc: now})
	if err != nil {
		panic(err)
	}

	// attempt logs in from ip with password, carrying device (the client's token, or ""), and
	// returns the device a success issued.
	attempt := func(ip, password, device string) string {
		subject := abuse.Subject{IP: netip.MustParseAddr(ip), Key: "account-42", Device: device}
		d, err := limiter.Allow(ctx, "login", subject)
		if err != nil {
			panic(err)
		}
		if !d.Allowed {
			fmt.Printf("%s %q: refused by %s, retry in %ds\n", ip, password, d.Rule.PolicyName(), d.RetryAfterSeconds())
			return ""
		}
		if password != "correct horse" {
			fmt.Printf("%s %q: wrong, %d tries left\n", ip, password, d.Remaining)
			return ""
		}
		if err := limiter.Clear(ctx, "login", abuse.Subject{Key: subject.Key, Device: device}); err != nil {
			panic(err)
		}
		if err := limiter.Refund(ctx, "login", abuse.Subject{IP: subject.IP}); err != nil {
			panic(err)
		}
		issued, err := limiter.IssueDevice(ctx, "login", subject.Key)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s %q: logged in\n", ip, password)
		return issued
	}
	owner := attempt("198.51.100.7", "correct horse", "")
	for range 4 {
		attempt("203.0.113.9", "guess", "")
	}
	attempt("192.0.2.44", "correct horse", "")         // an unknown client: the account is locked
	attempt("198.51.100.7", "correct horse", owner)    // the owner's device is not
	attempt("198.51.100.7", "correct horse", "forged") // a bad token is no token
	// Output:
	// 198.51.100.7 "correct horse": logged in
	// 203.0.113.9 "guess": wrong, 2 tries left
	// 203.0.113.9 "guess": wrong, 1 tries left
	// 203.0.113.9 "guess": wrong, 0 tries left
	// 203.0.113.9 "guess": refused by login-key, retry in 600s
	// 192.0.2.44 "correct horse": refused by login-key, retry in 600s
	// 198.51.100.7 "correct horse": logged in
	// 198.51.100.7 "correct horse": refused by login-key, retry in 600s
}

func ExampleParseLimit() {
	limit, window, err := abuse.ParseLimit("5/15m")
	fmt.Println(limit, window, err)

	_, _, err = abuse.ParseLimit("0/15m")
	fmt.Println(err)
	// Output:
	// 5 15m0s <nil>
	// invalid rate limit "0/15m": limit 0 must be at least 1: want N/DURATION with N ≥ 1 and DURATION ≥ 1s in whole seconds, e.g. 5/15m or 3/1h
}

// The config loader reads every RATE_LIMIT_<ACTION>_<SCOPE> variable (os.Environ in
// production): a built-in action's overrides its rule, any other adds a custom action's.
func ExampleRules_WithEnviron() {
	rules, err := abuse.DefaultRules().WithEnviron([]string{
		"RATE_LIMIT_REGISTER_IP=20/1h",
		"RATE_LIMIT_LOGIN_IP=20/15m",
		"RATE_LIMIT_LOGIN_KEY=5/15m",
	})
	if err != nil {
		panic(err)
	}
	for _, rule := range rules.All() {
		fmt.Printf("%-38s %d/%s\n", rule.EnvName(), rule.Limit, rule.Window)
	}

	_, err = abuse.DefaultRules().WithEnviron([]string{"RATE_LIMIT_LOGIN_USER=5/15m"})
	fmt.Println(err)
	// Output:
	// RATE_LIMIT_REGISTER_IP                 20/1h0m0s
	// RATE_LIMIT_REGISTER_EMAIL              3/1h0m0s
	// RATE_LIMIT_FORGOT_PASSWORD_IP          5/15m0s
	// RATE_LIMIT_FORGOT_PASSWORD_EMAIL       3/1h0m0s
	// RATE_LIMIT_RESEND_VERIFICATION_IP      6/15m0s
	// RATE_LIMIT_RESEND_VERIFICATION_EMAIL   3/30m0s
	// RATE_LIMIT_RESET_PASSWORD_IP           10/15m0s
	// RATE_LIMIT_RIVERUI_LOGIN_IP            10/15m0s
	// RATE_LIMIT_LOGIN_IP                    20/15m0s
	// RATE_LIMIT_LOGIN_KEY                   5/15m0s
	// RATE_LIMIT_LOGIN_USER: unknown scope "USER": want RATE_LIMIT_<ACTION>_<SCOPE>, ACTION of A-Z, 0-9 and _ (starting with a letter, at most 32) and SCOPE one of IP, EMAIL, KEY
}

func ExampleIPResolver_ClientIP() {
	trusted, err := abuse.ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		panic(err)
	}
	resolver := abuse.NewIPResolver(trusted)

	h := http.Header{}
	h.Add("X-Forwarded-For", "6.6.6.6, 198.51.100.7:5678, 10.0.0.2")

	fmt.Println(resolver.ClientIP("10.0.0.1:443", h))     // through the trusted proxy
	fmt.Println(resolver.ClientIP("203.0.113.9:4431", h)) // straight from the internet: headers ignored
	// Output:
	// 198.51.100.7
	// 203.0.113.9
}

func ExampleBucketKey() {
	fmt.Println(abuse.BucketKey(netip.MustParseAddr("::ffff:192.0.2.7")))
	fmt.Println(abuse.BucketKey(netip.MustParseAddr("2001:db8:1:2:3:4:5:6")))
	// Output:
	// 192.0.2.7
	// 2001:db8:1:2::/64
}

func ExampleDecision_SetHeaders() {
	d := &abuse.Decision{
		Allowed:    false,
		Rule:       abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: 5, Window: 15 * time.Minute},
		ResetAfter: 540 * time.Second,
	}
	h := http.Header{}
	d.SetHeaders(h)
	for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		fmt.Printf("%s: %s\n", name, h.Get(name))
	}
	// Output:
	// RateLimit-Policy: "register-ip";q=5;w=900
	// RateLimit: "register-ip";r=0;t=540
	// Retry-After: 540
}
