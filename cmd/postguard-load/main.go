// Command postguard-load measures postguard's throughput and the ratios between its paths. It
// needs nothing but the service code and a database: it builds the service in-process the way
// the postguard command does (cmd/internal/service: one riverstore.Store on the chosen engine, the
// router, the limiter and the workers) and drives it over real loopback HTTP with net/http
// clients, so HTTP, Gin, the limiter and the store are all real.
//
// Every scenario runs in one process and one run, so that the ratios between them compare like
// with like on a noisy machine. It works in a schema of its own (PostgreSQL: pgload_<random>,
// migrated, dropped at the end) or in temporary files (SQLite), so it never touches real data;
// its HTTP traffic goes to 127.0.0.1 only; every loop is bounded in time and count.
//
// It is a measurement tool: it exits 0 when a target is missed (and says so), 1 when it cannot
// measure (database unreachable), 2 on a bad command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
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
		fmt.Fprintf(os.Stderr, "postguard-load: %v\n", err)
		os.Exit(1)
	}
}

// errUsage is returned once a bad command line has been reported.
var errUsage = errors.New("usage")

// Scenario names, in the order they run.
const (
	scenarioCeiling     = "ceiling"
	scenarioManyIPs     = "http-many-ips"
	scenarioRedis       = "redis"
	scenarioHotIP       = "http-hot-ip"
	scenarioRegister    = "register"
	scenarioEmailDrain  = "email-drain"
	scenarioSQLite      = "sqlite"
	scenarioFlood       = "flood"
	databaseURLFallback = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

var allScenarios = []string{
	scenarioCeiling, scenarioManyIPs, scenarioSQLite, scenarioRedis, scenarioHotIP, scenarioRegister, scenarioEmailDrain, scenarioFlood,
}

// Bounds of the flags, so that every loop stops by itself.
const (
	maxConcurrency = 10_000
	maxDuration    = 10 * time.Minute
	maxMails       = 100_000
	// maxRequestsPerScenario caps one scenario's requests whatever its duration. It also keeps
	// the client IPs of a run distinct: they are drawn from 10.0.0.0/8 (2^24 addresses).
	maxRequestsPerScenario = 2_000_000
)

// options are the command line.
type options struct {
	DatabaseURL       string
	Concurrency       int
	Duration          time.Duration
	FloodDuration     time.Duration
	Scenarios         []string
	JSON              bool
	Registrations     int
	Mails             int
	HoldConcurrency   int
	ExistingKeys      int
	Budget            int
	EmailWorkers      int
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	CPUProfile        string
	RedisURL          string
}

// Validate reports the first bad option.
func (o *options) Validate() error {
	switch {
	case !strings.HasPrefix(o.DatabaseURL, "postgres://") && !strings.HasPrefix(o.DatabaseURL, "postgresql://") &&
		!strings.HasPrefix(o.DatabaseURL, "sqlite://"):
		return errors.New("-database-url must be a postgres:// URL or sqlite://PATH")
	case o.Concurrency < 1 || o.Concurrency > maxConcurrency:
		return fmt.Errorf("-concurrency must be between 1 and %d", maxConcurrency)
	case o.HoldConcurrency < 0 || o.HoldConcurrency > maxConcurrency:
		return fmt.Errorf("-hold-concurrency must be 0 (sized by the tool) or between 1 and %d", maxConcurrency)
	case o.Registrations < 1 || o.Registrations > maxConcurrency:
		return fmt.Errorf("-registrations must be between 1 and %d", maxConcurrency)
	case o.Duration <= 0 || o.Duration > maxDuration:
		return fmt.Errorf("-duration must be positive and at most %s", maxDuration)
	case o.FloodDuration <= 0 || o.FloodDuration > maxDuration:
		return fmt.Errorf("-flood-duration must be positive and at most %s", maxDuration)
	case o.Mails < 1 || o.Mails > maxMails:
		return fmt.Errorf("-mails must be between 1 and %d", maxMails)
	case o.ExistingKeys < 1 || o.ExistingKeys > maxRequestsPerScenario:
		return fmt.Errorf("-existing-keys must be between 1 and %d", maxRequestsPerScenario)
	case o.Budget < 1 || o.Budget > 10_000:
		return errors.New("-budget must be between 1 and 10000 sends per second")
	case o.EmailWorkers < 1 || o.EmailWorkers > 1_000:
		return errors.New("-email-workers must be between 1 and 1000")
	case o.FetchCooldown < time.Millisecond || o.FetchPollInterval < o.FetchCooldown:
		return errors.New("-fetch-cooldown must be at least 1ms and -fetch-poll-interval at least -fetch-cooldown (River's bounds)")
	case len(o.Scenarios) == 0:
		return errors.New("-scenarios names no scenario")
	}
	if _, err := redis.ParseURL(o.RedisURL); err != nil {
		return fmt.Errorf("-redis-url must be a redis:// URL: %w", err)
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ","))
		}
	}
	return nil
}

func (o *options) selected(scenario string) bool { return slices.Contains(o.Scenarios, scenario) }

// parseOptions reads the command line; getenv supplies TEST_DATABASE_URL's default.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	opts := &options{}
	fs := flag.NewFlagSet("postguard-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `postguard-load measures postguard in-process over loopback HTTP, all scenarios in one run.

Usage: postguard-load [flags]

Scenarios (in order): %s

Flags:
`, strings.Join(allScenarios, ", "))
		fs.PrintDefaults()
	}

	defaultURL := databaseURLFallback
	if u := getenv("TEST_DATABASE_URL"); u != "" {
		defaultURL = u
	}
	var scenarios string
	fs.StringVar(&opts.DatabaseURL, "database-url", defaultURL,
		"PostgreSQL URL (a schema pgload_<random> is created, migrated and dropped), or sqlite://PATH (a temporary\n"+
			"database is created in PATH's directory; PATH itself is never opened); TEST_DATABASE_URL when set")
	fs.IntVar(&opts.Concurrency, "concurrency", 16, "concurrent clients of the ceiling and http-hot-ip scenarios")
	fs.DurationVar(&opts.Duration, "duration", 5*time.Second, "duration of each measurement")
	fs.DurationVar(&opts.FloodDuration, "flood-duration", time.Minute,
		"duration of the flood scenario's fresh-key flood, before its counters table is read and pruned (the prune's\n"+
			"measurement then lasts as long as the prune)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios to run")
	fs.BoolVar(&opts.JSON, "json", false, "print the report as JSON instead of a table")
	fs.IntVar(&opts.Registrations, "registrations", 200, "concurrent clients of the register scenario (its peak RSS is checked)")
	fs.IntVar(&opts.Mails, "mails", 500, "verification mails drained per email-drain phase")
	fs.IntVar(&opts.HoldConcurrency, "hold-concurrency", 0,
		"concurrent clients of the held rows (http-many-ips, redis, sqlite): forgot-password holds every answer for at\n"+
			"least 100ms (uniform timing), so N clients can never measure more than N/0.1s. 0 sizes N from the run's\n"+
			"ceiling: ceil(ceiling/pair's rate × 0.1s × 2), at most 10000 (fewer if file descriptors are short); a row\n"+
			"at ≥ 90% of N/0.1s is flagged \"capped by clients\" and passes no target")
	fs.IntVar(&opts.ExistingKeys, "existing-keys", 10_000, "size of the pre-filled key set cycled by ceiling/existing-keys")
	fs.IntVar(&opts.Budget, "budget", 20, "sends per second the fake Resend allows in email-drain/budget, and the service's RESEND_MAX_RPS there")
	fs.IntVar(&opts.EmailWorkers, "email-workers", 10, "EMAIL_WORKERS of the email-drain phases")
	fs.DurationVar(&opts.FetchCooldown, "fetch-cooldown", 5*time.Millisecond, "River FetchCooldown (JOB_FETCH_COOLDOWN) of the email-drain phases")
	fs.DurationVar(&opts.FetchPollInterval, "fetch-poll-interval", 100*time.Millisecond, "River FetchPollInterval (JOB_FETCH_POLL_INTERVAL) of the email-drain phases")
	fs.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&opts.RedisURL, "redis-url", redisURLFallback,
		"Redis of the redis scenario's baseline (the limiter on github.com/go-redis/redis_rate); without a Redis\n"+
			"answering there within 1s, that row is skipped and the report says why")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "postguard-load: unexpected arguments %q\n", fs.Args())
		return nil, errUsage
	}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(opts.Scenarios, s) {
			opts.Scenarios = append(opts.Scenarios, s)
		}
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "postguard-load: %v\n", err)
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

	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return fmt.Errorf("error creating CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("error starting CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	r := newRunner(opts, stderr)
	report, err := r.run(ctx)
	if err != nil {
		return err
	}
	if opts.JSON {
		return report.writeJSON(stdout)
	}
	return report.writeTable(stdout)
}
