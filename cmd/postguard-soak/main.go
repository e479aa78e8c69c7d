// Command postguard-soak runs postguard the way an operator does, and breaks it the way
// production does: several `postguard api` and `postguard worker` processes of the real binary
// on one PostgreSQL database, mailing through a local fake of Resend, under load for minutes,
// while a schedule of faults plays (kill -9 of a worker and of an api, SIGTERM of each, every
// database backend terminated, the database refusing connections for seconds). Then it lets the
// queue drain, stops every process, and checks what the service promises:
//
//   - no answer was a 500, and every 503 carried Retry-After;
//   - a per-IP limit spent from all api processes at once admitted exactly its limit;
//   - every accepted registration is stored with its two jobs;
//   - every mail was delivered exactly once (counted at the fake, per recipient and kind, against
//     the jobs that sent it);
//   - no job was lost, discarded or cancelled, and every process stopped by SIGTERM exited 0.
//
// It prints the figures and exits 0 when every check passed, 1 when one failed (or the soak could
// not run), 2 on a bad command line. It works in a database of its own (pgsoak_<random>, created
// on the server the URL names and dropped at the end), so the database-wide faults touch nothing
// else; it never restarts the PostgreSQL server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, errUsage), errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "postguard-soak: %v\n", err)
		os.Exit(1)
	}
}

// errUsage is returned once a bad command line has been reported.
var errUsage = errors.New("usage")

// errChecksFailed is returned when the soak ran and a check failed; the report says which.
var errChecksFailed = errors.New("checks failed")

// databaseURLFallback is the server the soak creates its database on when neither -database-url
// nor TEST_DATABASE_URL says.
const databaseURLFallback = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// options are the command line.
type options struct {
	DatabaseURL  string
	Postguard    string
	Duration     time.Duration
	APIs         int
	Workers      int
	Clients      int
	FaultEvery   time.Duration
	RefuseFor    time.Duration
	BurstEvery   time.Duration
	Limit        int
	ResendMaxRPS int
	DrainTimeout time.Duration
	Keep         bool
}

// Validate reports the first bad option.
func (o *options) Validate() error {
	switch {
	case o.Postguard == "":
		return errors.New("-postguard must name the postguard binary")
	case o.Duration < 10*time.Second || o.Duration > 24*time.Hour:
		return errors.New("-duration must be between 10s and 24h")
	case o.APIs < 2 || o.APIs > 16:
		return errors.New("-apis must be between 2 and 16: a fault takes one down at a time")
	case o.Workers < 2 || o.Workers > 16:
		return errors.New("-workers must be between 2 and 16: a fault takes one down at a time")
	case o.Clients < 1 || o.Clients > 256:
		return errors.New("-clients must be between 1 and 256")
	case o.FaultEvery < time.Second:
		return errors.New("-fault-every must be at least 1s")
	case o.RefuseFor < time.Second || o.RefuseFor >= o.FaultEvery:
		return errors.New("-refuse-for must be at least 1s and shorter than -fault-every")
	case o.BurstEvery < time.Second:
		return errors.New("-burst-every must be at least 1s")
	case o.Limit < 1 || o.Limit > 100:
		return errors.New("-limit must be between 1 and 100")
	case o.ResendMaxRPS < 0 || o.ResendMaxRPS > 10_000:
		return errors.New("-resend-max-rps must be between 0 and 10000")
	case o.DrainTimeout < time.Minute:
		return errors.New("-drain-timeout must be at least 1m")
	}
	return nil
}

// parseOptions reads the command line; getenv supplies TEST_DATABASE_URL's default.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	opts := &options{}
	fs := flag.NewFlagSet("postguard-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `postguard-soak runs api and worker processes of the postguard binary on one PostgreSQL database,
under load and faults, then checks that nothing was lost, doubled or answered 500.

Usage: postguard-soak [flags]

Flags:
`)
		fs.PrintDefaults()
	}

	defaultURL := databaseURLFallback
	if u := getenv("TEST_DATABASE_URL"); u != "" {
		defaultURL = u
	}
	fs.StringVar(&opts.DatabaseURL, "database-url", defaultURL,
		"PostgreSQL server to create the soak's own database pgsoak_<random> on (its user needs CREATEDB);\n"+
			"TEST_DATABASE_URL when set")
	fs.StringVar(&opts.Postguard, "postguard", "bin/postguard", "the postguard binary to run (make soak builds it there)")
	fs.DurationVar(&opts.Duration, "duration", 3*time.Minute, "how long the load and the faults last")
	fs.IntVar(&opts.APIs, "apis", 3, "`postguard api` processes")
	fs.IntVar(&opts.Workers, "workers", 2, "`postguard worker` processes")
	fs.IntVar(&opts.Clients, "clients", 8, "concurrent load clients, spread over the api processes")
	fs.DurationVar(&opts.FaultEvery, "fault-every", 15*time.Second, "time between two faults (they take turns)")
	fs.DurationVar(&opts.RefuseFor, "refuse-for", 5*time.Second, "how long the database refuses connections in that fault")
	fs.DurationVar(&opts.BurstEvery, "burst-every", 20*time.Second, "time between two limit bursts from one IP over every api")
	fs.IntVar(&opts.Limit, "limit", 5, "per-IP limit of forgot-password (RATE_LIMIT_FORGOT_PASSWORD_IP) that the bursts spend")
	fs.IntVar(&opts.ResendMaxRPS, "resend-max-rps", 100, "RESEND_MAX_RPS of the workers (0 = unpaced); the fake allows 10% more")
	fs.DurationVar(&opts.DrainTimeout, "drain-timeout", 15*time.Minute, "how long the queue may take to drain after the load")
	fs.BoolVar(&opts.Keep, "keep", false, "keep the database and the processes' logs")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "postguard-soak: unexpected arguments %q\n", fs.Args())
		return nil, errUsage
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "postguard-soak: %v\n", err)
		return nil, errUsage
	}
	return opts, nil
}

// run is main without the process, so that tests can call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, err := parseOptions(args, getenv, stderr)
	if err != nil {
		return err
	}
	report, err := newSoak(opts, stderr).run(ctx)
	if err != nil {
		return err
	}
	report.write(stdout)
	if !report.passed() {
		return errChecksFailed
	}
	return nil
}
