package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// eventTimeout bounds every wait for a job event of a running client: the event arrives, the
// bound only keeps a broken test from hanging.
const eventTimeout = 30 * time.Second

// clientBundle is a store whose River client runs postguard's workers and queues, as a postguard
// process does, for what only a running client shows: pacing across workers, a send cut short
// by shutdown, the periodic prune. Everything else is tested one job at a time (testBundle).
type clientBundle struct {
	config   *Config
	fake     *resendfake.Server
	logs     *syncBuffer
	registry *prometheus.Registry
	store    *dbtest.Store

	eventsMu sync.Mutex
	events   <-chan *river.Event
	seen     []*river.Event
}

type clientOpts struct {
	// configure adjusts the jobs Config.
	configure func(config *Config)
	// fake configures the resendfake.
	fake *resendfake.Config
	// configureRiver adjusts the River config the jobs Config made.
	configureRiver func(riverConfig *river.Config)
	// keepPeriodicJobs keeps the periodic prune (run on start), which newClientBundle otherwise
	// removes so that tests see only their own jobs.
	keepPeriodicJobs bool
}

func newClientBundle(t *testing.T, newStore dbtest.NewStoreFunc, opts *clientOpts) *clientBundle {
	t.Helper()

	if opts == nil {
		opts = &clientOpts{}
	}
	fake := resendfake.New(t, opts.fake)
	sender, err := mail.NewResendSender(&mail.ResendConfig{
		APIKey:  "re_test_key",
		BaseURL: fake.URL(),
		From:    "Postguard <no-reply@example.com>",
		Timeout: 10 * time.Second,
	})
	require.NoError(t, err)

	logs := &syncBuffer{}
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
	if opts.configure != nil {
		opts.configure(config)
	}
	store := newStore(t, dbtest.WithRiverConfig(func(store riverstore.Store) (*river.Config, error) {
		riverConfig, err := NewRiverConfig(&Deps{
			Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Registerer: registry,
			Sender:     sender,
			Store:      store,
			Jobs:       store.Jobs(),
		}, config)
		if err != nil {
			return nil, err
		}
		if !opts.keepPeriodicJobs {
			riverConfig.PeriodicJobs = nil
		}
		if opts.configureRiver != nil {
			opts.configureRiver(riverConfig)
		}
		return riverConfig, nil
	}))

	return &clientBundle{config: config, fake: fake, logs: logs, registry: registry, store: store}
}

// start subscribes to job events and starts the client, stopped when the test ends.
func (b *clientBundle) start(t *testing.T) {
	t.Helper()

	client := b.store.Jobs()
	events, cancel := client.Subscribe(
		river.EventKindJobCancelled,
		river.EventKindJobCompleted,
		river.EventKindJobFailed,
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
func (b *clientBundle) wait(t *testing.T, jobID int64, kinds ...river.EventKind) *river.Event {
	t.Helper()

	return b.waitFunc(t, fmt.Sprintf("%v of job %d", kinds, jobID), func(event *river.Event) bool {
		return event.Job.ID == jobID && slices.Contains(kinds, event.Kind)
	})
}

// waitKind returns the first event of one of eventKinds for a job of the kind.
func (b *clientBundle) waitKind(t *testing.T, kind string, eventKinds ...river.EventKind) *river.Event {
	t.Helper()

	return b.waitFunc(t, fmt.Sprintf("%v of a %s job", eventKinds, kind), func(event *river.Event) bool {
		return event.Job.Kind == kind && slices.Contains(eventKinds, event.Kind)
	})
}

func (b *clientBundle) waitFunc(t *testing.T, what string, match func(event *river.Event) bool) *river.Event {
	t.Helper()

	b.eventsMu.Lock()
	defer b.eventsMu.Unlock()

	for i, event := range b.seen {
		if match(event) {
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
			if event.Job != nil && match(event) {
				return event
			}
			b.seen = append(b.seen, event)
		case <-timeout.C:
			require.FailNow(t, fmt.Sprintf("no event %s within %s; logs:\n%s", what, eventTimeout, b.logs.String()))
		}
	}
}

// insert inserts a job and returns its row.
func (b *clientBundle) insert(t *testing.T, args river.JobArgs, opts *river.InsertOpts) *rivertype.JobRow {
	t.Helper()

	res, err := b.store.JobInsert(t.Context(), args, opts)
	require.NoError(t, err)
	require.False(t, res.UniqueSkippedAsDuplicate, "job was a duplicate")
	return res.Job
}

// job returns a job's current row.
func (b *clientBundle) job(t *testing.T, id int64) *rivertype.JobRow {
	t.Helper()

	job, err := b.store.Jobs().JobGet(t.Context(), id)
	require.NoError(t, err)
	return job
}

// deliveries counts postguard_email_deliveries_total{kind,outcome}.
func (b *clientBundle) deliveries(t *testing.T, kind, outcome string) float64 {
	t.Helper()

	return (&testBundle{registry: b.registry}).deliveries(t, kind, outcome)
}
