package jobs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// testSecret is APP_SECRET in the jobs' tests.
var testSecret = []byte("a test secret of at least 32 bytes") //nolint:gochecknoglobals // a constant []byte

const (
	testAppURL = "https://app.example.com"
	// eventTimeout bounds every wait for a job event; generous, the machine is shared.
	eventTimeout = 20 * time.Second
)

// syncBuffer is a bytes.Buffer safe for concurrent writers (a log handler's target).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testClock is a clock that stands still until the test moves it: River's (a
// rivertype.TimeGenerator) and the workers' at once.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

// newTestClock starts a clock at the current second, which every engine stores exactly.
func newTestClock() *testClock {
	return &testClock{now: time.Now().UTC().Truncate(time.Second)}
}

// Now returns the clock's time.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NowOrNil returns the clock's time: River then uses it in its queries too, instead of the
// database's now.
func (c *testClock) NowOrNil() *time.Time {
	now := c.Now()
	return &now
}

// Advance moves the clock forward by d.
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// workerBundle is a store with a River client configured by NewRiverConfig, sending through the
// real ResendSender to a resendfake.
type workerBundle struct {
	config      *Config
	fake        *resendfake.Server
	logs        *syncBuffer
	registry    *prometheus.Registry
	riverConfig *river.Config
	sender      mail.Sender
	store       db.Store

	eventsMu sync.Mutex
	events   <-chan *river.Event
	seen     []*river.Event
}

type workerOpts struct {
	// clock, when set, is River's clock (river.Config.Test.Time) and the workers' NowFunc, and
	// retries get no jitter: schedules are then exact, and a job scheduled ahead waits for the
	// test to move the clock.
	clock *testClock
	// configure adjusts the jobs Config before NewRiverConfig.
	configure func(config *Config)
	// configureRiver adjusts the River config before ConfigureRiver.
	configureRiver func(riverConfig *river.Config)
	// fake configures the resendfake.
	fake *resendfake.Config
	// keepPeriodicJobs keeps the periodic prune (run on start), which setupWorker otherwise
	// removes so that tests see only their own jobs.
	keepPeriodicJobs bool
	// sender wraps the ResendSender.
	sender func(inner mail.Sender) mail.Sender
}

// setupWorker configures River on store from NewRiverConfig; the client is not started (see
// start), so a test may insert jobs first.
func setupWorker(t *testing.T, store db.Store, opts *workerOpts) *workerBundle {
	t.Helper()

	if opts == nil {
		opts = &workerOpts{}
	}

	fake := resendfake.New(t, opts.fake)
	var sender mail.Sender
	resendSender, err := mail.NewResendSender(&mail.ResendConfig{
		APIKey:  "re_test_key",
		BaseURL: fake.URL(),
		From:    "Postguard <no-reply@example.com>",
		Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	sender = resendSender
	if opts.sender != nil {
		sender = opts.sender(sender)
	}

	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	registry := prometheus.NewRegistry()

	config := &Config{
		AppURL:            testAppURL,
		EmailWorkers:      4,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		JobTimeout:        15 * time.Second,
		RescueAfter:       time.Minute,
		Secret:            testSecret,
	}
	if opts.clock != nil {
		config.NowFunc = opts.clock.Now
	}
	if opts.configure != nil {
		opts.configure(config)
	}

	riverConfig, err := NewRiverConfig(&Deps{
		Logger:     logger,
		Registerer: registry,
		Sender:     sender,
		Store:      store,
	}, config)
	require.NoError(t, err)
	if !opts.keepPeriodicJobs {
		riverConfig.PeriodicJobs = nil
	}
	if opts.clock != nil {
		riverConfig.Test.Time = opts.clock
		riverConfig.RetryPolicy = &RetryPolicy{NowFunc: opts.clock.Now, jitterFunc: func() float64 { return 0 }}
	}
	if opts.configureRiver != nil {
		opts.configureRiver(riverConfig)
	}
	dbtest.ConfigureRiver(t, store, riverConfig)

	return &workerBundle{
		config:      config,
		fake:        fake,
		logs:        logs,
		registry:    registry,
		riverConfig: riverConfig,
		sender:      sender,
		store:       store,
	}
}

// start subscribes to job events and starts the client, stopped when the test ends.
func (b *workerBundle) start(t *testing.T) {
	t.Helper()

	client := b.store.River()
	events, cancel := client.Subscribe(
		river.EventKindJobCancelled,
		river.EventKindJobCompleted,
		river.EventKindJobFailed,
		river.EventKindJobInterrupted,
		river.EventKindJobSnoozed,
	)
	b.eventsMu.Lock()
	b.events = events
	b.eventsMu.Unlock()

	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		cancel()
		ctx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelStop()
		require.NoError(t, client.Stop(ctx))
	})
}

// wait returns the first event of one of kinds for the job, seen before or arriving within
// eventTimeout. Events of other jobs are kept for later waits.
func (b *workerBundle) wait(t *testing.T, jobID int64, kinds ...river.EventKind) *river.Event {
	t.Helper()

	b.eventsMu.Lock()
	defer b.eventsMu.Unlock()

	for i, event := range b.seen {
		if event.Job.ID == jobID && slices.Contains(kinds, event.Kind) {
			b.seen = slices.Delete(b.seen, i, i+1)
			return event
		}
	}

	timeout := time.NewTimer(eventTimeout)
	defer timeout.Stop()
	for {
		select {
		case event, ok := <-b.events:
			require.True(t, ok, "event channel closed")
			if event.Job != nil && event.Job.ID == jobID && slices.Contains(kinds, event.Kind) {
				return event
			}
			b.seen = append(b.seen, event)
		case <-timeout.C:
			require.FailNow(t, fmt.Sprintf("no %v event for job %d within %s; logs:\n%s", kinds, jobID, eventTimeout, b.logs.String()))
		}
	}
}

// waitKind returns the first event of one of eventKinds for a job of the kind.
func (b *workerBundle) waitKind(t *testing.T, kind string, eventKinds ...river.EventKind) *river.Event {
	t.Helper()

	b.eventsMu.Lock()
	defer b.eventsMu.Unlock()

	timeout := time.NewTimer(eventTimeout)
	defer timeout.Stop()
	for {
		select {
		case event, ok := <-b.events:
			require.True(t, ok, "event channel closed")
			if event.Job != nil && event.Job.Kind == kind && slices.Contains(eventKinds, event.Kind) {
				return event
			}
			b.seen = append(b.seen, event)
		case <-timeout.C:
			require.FailNow(t, fmt.Sprintf("no %v event for a %s job within %s; logs:\n%s", eventKinds, kind, eventTimeout, b.logs.String()))
		}
	}
}

// insert inserts a job and returns its row.
func (b *workerBundle) insert(t *testing.T, args river.JobArgs, opts *river.InsertOpts) *rivertype.JobRow {
	t.Helper()

	res, err := b.store.JobInsert(t.Context(), args, opts)
	require.NoError(t, err)
	require.False(t, res.UniqueSkippedAsDuplicate, "job was a duplicate")
	return res.Job
}

// job returns a job's current row.
func (b *workerBundle) job(t *testing.T, id int64) *rivertype.JobRow {
	t.Helper()

	job, err := b.store.River().JobGet(t.Context(), id)
	require.NoError(t, err)
	return job
}

// deliveries counts postguard_email_deliveries_total{kind,outcome}.
func (b *workerBundle) deliveries(t *testing.T, kind, outcome string) float64 {
	t.Helper()

	families, err := b.registry.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != "postguard_email_deliveries_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, label := range metric.GetLabel() {
				labels[label.GetName()] = label.GetValue()
			}
			if labels["kind"] == kind && labels["outcome"] == outcome {
				return metric.GetCounter().GetValue()
			}
		}
	}
	return 0
}

var userSeq atomic.Int64 //nolint:gochecknoglobals // unique emails across parallel tests

// createUser registers a user with a unique email.
func createUser(t *testing.T, store db.Store) *db.User {
	t.Helper()

	n := userSeq.Add(1)
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{
		Email:        fmt.Sprintf("user%d@example.com", n),
		Name:         fmt.Sprintf("User %d", n),
		PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
		Now:          time.Now(),
	})
	require.NoError(t, err)
	return user
}

// keyPattern is the form of every idempotency key: <kind>:<user_id>:<128 random bits, hex>.
func keyPattern(kind string, userID int64) *regexp.Regexp {
	return regexp.MustCompile(`^` + kind + `:` + strconv.FormatInt(userID, 10) + `:[0-9a-f]{32}$`)
}

// linkToken returns the token of the first link in text that starts with prefix.
func linkToken(t *testing.T, text, prefix string) string {
	t.Helper()

	match := regexp.MustCompile(regexp.QuoteMeta(prefix) + `([A-Za-z0-9_-]+)`).FindStringSubmatch(text)
	require.NotNil(t, match, "no link %s… in:\n%s", prefix, text)
	return match[1]
}

// atomicOnce reports true to the first caller of do only.
type atomicOnce struct{ done atomic.Bool }

func (o *atomicOnce) do() bool { return o.done.CompareAndSwap(false, true) }
