package jobs

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// nopStore is a db.Tables for config tests that never reach the database.
type nopStore struct{ db.Tables }

// nopJobs is a RiverClient for config tests that never reach River.
type nopJobs struct{ RiverClient }

// nopSender is a mail.Sender that accepts everything.
type nopSender struct{}

func (nopSender) Send(context.Context, *mail.Message) (string, error) { return "nop", nil }

func validConfig() *Config {
	return &Config{
		Secret: testSecret,
		AppURL: "https://app.example.com/",
	}
}

func TestNewRiverConfig(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		deps *Deps
		logs *bytes.Buffer
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()

		logs := &bytes.Buffer{}
		return &testBundle{
			deps: &Deps{
				Logger: slog.New(slog.NewTextHandler(logs, nil)),
				Sender: nopSender{},
				Store:  nopStore{},
				Jobs:   nopJobs{},
			},
			logs: logs,
		}
	}

	t.Run("Worker", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		config := validConfig()
		config.EmailWorkers = 7
		config.JobTimeout = 20 * time.Second
		config.RescueAfter = time.Minute
		config.FetchCooldown = 5 * time.Millisecond
		config.FetchPollInterval = 50 * time.Millisecond

		riverConfig, err := NewRiverConfig(bundle.deps, config)
		require.NoError(t, err)

		require.Equal(t, map[string]river.QueueConfig{
			QueueEmail:       {MaxWorkers: 7},
			QueueMaintenance: {MaxWorkers: 2},
		}, riverConfig.Queues)
		require.NotNil(t, riverConfig.Workers)
		require.Len(t, riverConfig.PeriodicJobs, 2, "prune and prune_counters")
		require.Equal(t, time.Duration(-1), riverConfig.CompletedJobRetentionPeriod)
		require.Equal(t, time.Duration(-1), riverConfig.CancelledJobRetentionPeriod)
		require.Equal(t, time.Duration(-1), riverConfig.DiscardedJobRetentionPeriod)
		require.Equal(t, 20*time.Second, riverConfig.JobTimeout)
		require.Equal(t, time.Minute, riverConfig.RescueStuckJobsAfter)
		require.Equal(t, 5*time.Millisecond, riverConfig.FetchCooldown)
		require.Equal(t, 50*time.Millisecond, riverConfig.FetchPollInterval)
		require.IsType(t, &RetryPolicy{}, riverConfig.RetryPolicy)
		require.Same(t, bundle.deps.Logger, riverConfig.Logger)
		require.Len(t, riverConfig.Middleware, 1)
		require.IsType(t, &riverlog.Middleware{}, riverConfig.Middleware[0])
		require.Empty(t, bundle.logs.String())
	})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		riverConfig, err := NewRiverConfig(bundle.deps, validConfig())
		require.NoError(t, err)

		require.Equal(t, DefaultEmailWorkers, riverConfig.Queues[QueueEmail].MaxWorkers)
		require.Equal(t, DefaultJobTimeout, riverConfig.JobTimeout)
		require.Equal(t, DefaultRescueAfter, riverConfig.RescueStuckJobsAfter)
		require.Zero(t, riverConfig.FetchCooldown) // River's default
		require.Equal(t, time.Minute, validConfig().withDefaults().CounterPruneInterval)
	})

	t.Run("NoSenderLeavesEmailQueued", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		bundle.deps.Sender = nil

		riverConfig, err := NewRiverConfig(bundle.deps, validConfig())
		require.NoError(t, err)

		require.Equal(t, map[string]river.QueueConfig{QueueMaintenance: {MaxWorkers: 2}}, riverConfig.Queues)
		require.Len(t, riverConfig.PeriodicJobs, 2)
		require.Contains(t, bundle.logs.String(), "level=WARN")
		require.Contains(t, bundle.logs.String(), "email jobs stay queued")
	})

	t.Run("InsertOnly", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		config := validConfig()
		config.InsertOnly = true

		riverConfig, err := NewRiverConfig(bundle.deps, config)
		require.NoError(t, err)

		require.Nil(t, riverConfig.Queues)
		require.Nil(t, riverConfig.PeriodicJobs)
		require.NotNil(t, riverConfig.Workers)
		require.Empty(t, bundle.logs.String())
	})

	t.Run("RegistersMetrics", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		registry := prometheus.NewRegistry()
		bundle.deps.Registerer = registry

		_, err := NewRiverConfig(bundle.deps, validConfig())
		require.NoError(t, err)
		// Twice on one registry (a test, or a process building two configs) is fine.
		_, err = NewRiverConfig(bundle.deps, validConfig())
		require.NoError(t, err)
	})

	t.Run("StoreRequired", func(t *testing.T) {
		t.Parallel()

		_, err := NewRiverConfig(&Deps{}, validConfig())
		require.ErrorContains(t, err, "Deps.Store is required")
		_, err = NewWorkers(&Deps{}, validConfig())
		require.ErrorContains(t, err, "Deps.Store is required")
	})

	t.Run("JobsRequiredByNewRiverConfig", func(t *testing.T) {
		t.Parallel()

		// River's job cleaner is off in postguard's config: without Jobs, nothing would ever
		// delete a finished job.
		_, err := NewRiverConfig(&Deps{Store: nopStore{}, Sender: nopSender{}}, validConfig())
		require.ErrorContains(t, err, "Deps.Jobs is required")
	})

	t.Run("RecipientsRequiredByNewWorkers", func(t *testing.T) {
		t.Parallel()

		_, err := NewWorkers(&Deps{Store: nopStore{}, Sender: nopSender{}}, validConfig())
		require.ErrorContains(t, err, "Deps.Recipients is required")
		workers, err := NewWorkers(&Deps{Store: nopStore{}, Sender: nopSender{}, Recipients: UserRecipients(nopStore{})}, validConfig())
		require.NoError(t, err)
		require.NoError(t, workers.Register(river.NewWorkers()))
	})

	t.Run("SecretOfAtLeast32Bytes", func(t *testing.T) {
		t.Parallel()

		deps := &Deps{Store: nopStore{}, Sender: nopSender{}, Recipients: UserRecipients(nopStore{})}
		for _, secret := range [][]byte{nil, []byte("abc"), testSecret[:tokens.MinSecretLen-1]} {
			config := validConfig()
			config.Secret = secret
			_, err := NewWorkers(deps, config)
			require.ErrorIs(t, err, tokens.ErrWeakSecret)
			require.ErrorContains(t, err, "jobs: Config.Secret (APP_SECRET)")
		}
	})

	t.Run("ProvidersWorkTheEmailQueue", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		bundle.deps.Sender = nil
		bundle.deps.Providers = []Provider{{Name: "smtp", Sender: nopSender{}, MaxRPS: 2}}

		riverConfig, err := NewRiverConfig(bundle.deps, validConfig())
		require.NoError(t, err)
		require.Equal(t, DefaultEmailWorkers, riverConfig.Queues[QueueEmail].MaxWorkers)
	})

	t.Run("BadProviders", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name      string
			providers []Provider
			want      string
		}{
			{"NoName", []Provider{{Sender: nopSender{}}}, "without a Name"},
			{"NoSender", []Provider{{Name: "smtp"}}, `provider "smtp" has no Sender`},
			{"Twice", []Provider{{Name: "smtp", Sender: nopSender{}}, {Name: "smtp", Sender: nopSender{}}}, `provider "smtp" is named twice`},
			{"NegativeRate", []Provider{{Name: "smtp", Sender: nopSender{}, MaxRPS: -1}}, "negative MaxRPS"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				_, err := NewWorkers(&Deps{Store: nopStore{}, Recipients: UserRecipients(nopStore{}), Providers: tt.providers}, validConfig())
				require.ErrorContains(t, err, tt.want)
			})
		}
	})
}

func TestArgs_InsertOpts(t *testing.T) {
	t.Parallel()

	t.Run("Welcome", func(t *testing.T) {
		t.Parallel()

		opts := WelcomeEmailArgs{}.InsertOpts()
		require.Equal(t, QueueEmail, opts.Queue)
		require.Equal(t, EmailMaxAttempts, opts.MaxAttempts)
		require.True(t, opts.UniqueOpts.ByArgs)
		require.ElementsMatch(t, []string{"available", "cancelled", "completed", "discarded", "pending", "retryable", "running", "scheduled"}, statesToStrings(opts.UniqueOpts.ByState))
	})

	for _, args := range []interface {
		river.JobArgs
		river.JobArgsWithInsertOpts
	}{VerificationEmailArgs{}, PasswordResetEmailArgs{}} {
		t.Run(args.Kind(), func(t *testing.T) {
			t.Parallel()

			opts := args.InsertOpts()
			require.Equal(t, QueueEmail, opts.Queue)
			require.Equal(t, EmailMaxAttempts, opts.MaxAttempts)
			require.True(t, opts.UniqueOpts.ByArgs)
			require.ElementsMatch(t, []string{"available", "pending", "retryable", "running", "scheduled"}, statesToStrings(opts.UniqueOpts.ByState))
		})
	}

	t.Run("Prune", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, QueueMaintenance, PruneArgs{}.InsertOpts().Queue)
	})

	t.Run("PruneCounters", func(t *testing.T) {
		t.Parallel()

		opts := PruneCountersArgs{}.InsertOpts()
		require.Equal(t, QueueMaintenance, opts.Queue)
		require.True(t, opts.UniqueOpts.ByArgs)
		require.ElementsMatch(t, []string{"available", "pending", "retryable", "running", "scheduled"}, statesToStrings(opts.UniqueOpts.ByState))
	})

	t.Run("Kinds", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, "welcome_email", WelcomeEmailArgs{}.Kind())
		require.Equal(t, "verification_email", VerificationEmailArgs{}.Kind())
		require.Equal(t, "password_reset_email", PasswordResetEmailArgs{}.Kind())
		require.Equal(t, "prune", PruneArgs{}.Kind())
		require.Equal(t, "prune_counters", PruneCountersArgs{}.Kind())
	})
}

func statesToStrings[S ~string](states []S) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return out
}
