package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// panicSender is a mail.Sender with a bug: it panics.
type panicSender struct{}

const panicMessage = "panicSender: nil map in the template cache"

func (panicSender) Send(context.Context, *mail.Message) (string, error) { panic(panicMessage) }

// TestServe_WorkerPanic wires a serve process in-process, as serverCommand does (the store,
// jobs.NewRiverConfig, River started, api.New on the same store), with a mail.Sender that
// panics. A registration's email jobs panic: River records each panic as the attempt's error
// (with its stack trace) and makes the job retryable, and the process goes on: it keeps serving
// HTTP (healthz, a second registration) and working jobs (a retried job runs, and panics, again).
func TestServe_WorkerPanic(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	secret := []byte(faultSecret)
	registry := prometheus.NewRegistry()
	logs := &syncBuffer{}
	logger := newLogger(&config{LogFormat: "json"}, logs)

	store := dbtest.NewPostgres(t, dbtest.WithRiverConfig(func(store riverstore.Store) (*river.Config, error) {
		return jobs.NewRiverConfig(
			&jobs.Deps{Store: store, Jobs: store.Jobs(), Sender: panicSender{}, Logger: logger, Registerer: registry},
			&jobs.Config{
				Secret:            secret,
				AppURL:            "http://localhost:8080",
				FetchCooldown:     10 * time.Millisecond,
				FetchPollInterval: 100 * time.Millisecond,
			})
	}))
	require.NoError(t, store.Jobs().Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, store.Jobs().Stop(stopCtx))
	})

	limiter, err := abuse.NewLimiter(store, secret, abuse.DefaultRules(), nil)
	require.NoError(t, err)
	router, err := api.New(&api.Config{
		Store:      store,
		Limiter:    limiter,
		Secret:     secret,
		Logger:     logger,
		Registerer: registry,
		Gatherer:   registry,
	})
	require.NoError(t, err)
	server := httptest.NewServer(router)
	t.Cleanup(server.Close)

	register := func(email string) int64 {
		t.Helper()
		resp, err := http.Post(server.URL+"/v1/auth/register", "application/json",
			strings.NewReader(`{"email":"`+email+`","password":"correct horse battery"}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		var body struct{ ID int64 }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return body.ID
	}

	// waitPanicked waits until both email jobs of user failed attempts times, and checks that
	// their last failure is the panic.
	waitPanicked := func(userID int64, attempts int) []*rivertype.JobRow {
		t.Helper()
		var jobRows []*rivertype.JobRow
		deadline := time.Now().Add(15 * time.Second)
		for {
			result, err := store.Jobs().JobList(ctx, river.NewJobListParams().Queues(jobs.QueueEmail).First(100))
			require.NoError(t, err)
			jobRows = jobRows[:0]
			for _, job := range result.Jobs {
				var args struct {
					UserID int64 `json:"user_id"`
				}
				require.NoError(t, json.Unmarshal(job.EncodedArgs, &args))
				if args.UserID == userID && len(job.Errors) >= attempts && job.State != rivertype.JobStateRunning {
					jobRows = append(jobRows, job)
				}
			}
			if len(jobRows) == 2 {
				break
			}
			require.True(t, time.Now().Before(deadline), "jobs of user %d did not fail %d times\nlogs:\n%s", userID, attempts, logs)
			time.Sleep(50 * time.Millisecond)
		}
		for _, job := range jobRows {
			require.Equal(t, rivertype.JobStateRetryable, job.State, "job %s", job.Kind)
			require.Equal(t, attempts, job.Attempt)
			last := job.Errors[len(job.Errors)-1]
			require.Equal(t, panicMessage, last.Error, "River records the panic value as the error")
			require.Contains(t, last.Trace, "panicSender.Send", "and its stack trace")
		}
		return jobRows
	}

	jobRows := waitPanicked(register("panic@example.com"), 1)

	// The process still serves HTTP.
	resp, err := http.Get(server.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	register("after-panic@example.com")

	// And still works jobs: a retry (brought forward from the retry policy's minute) runs again.
	_, err = store.Jobs().JobRetry(ctx, jobRows[0].ID)
	require.NoError(t, err)
	waitJob(t, store, jobRows[0].ID, 15*time.Second, "retried and panicked again", func(job *rivertype.JobRow) bool {
		return job.State == rivertype.JobStateRetryable && job.Attempt == 2 && job.Errors[1].Error == panicMessage
	})
}
