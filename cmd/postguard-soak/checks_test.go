package main

import (
	"bytes"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// goodData is a soak where everything held: two users, their mail, a reset, a clean burst.
func goodData() *soakData {
	return &soakData{
		opts:     &options{APIs: 3, Workers: 2, Clients: 2, FaultEvery: time.Second, RefuseFor: time.Second},
		database: "pgsoak_test",
		answers: []answer{
			{route: routeRegister, status: http.StatusCreated},
			{route: routeRegister, status: http.StatusCreated},
			{route: routeForgotPassword, status: http.StatusAccepted},
			{route: routeRegister, status: http.StatusServiceUnavailable, retryAfter: "5"},
			{route: routeRegister, transport: errors.New("connection refused")},
		},
		registrations: []registration{{1, "a@example.com"}, {2, "b@example.com"}},
		bursts:        []burst{{sent: 15, admitted: 5, refused: 10, limit: 5}},
		faults:        []fault{{name: "kill -9 worker"}, {name: "SIGTERM api"}},
		stops:         []fault{{name: "final SIGTERM api-1"}},
		users:         map[int64]string{1: "a@example.com", 2: "b@example.com"},
		jobs: []jobRecord{
			{id: 1, kind: kindWelcome, state: "completed", userID: 1},
			{id: 2, kind: kindVerification, state: "completed", userID: 1},
			{id: 3, kind: kindWelcome, state: "completed", userID: 2},
			{id: 4, kind: kindVerification, state: "completed", userID: 2, errCount: 1, rescued: true},
			{id: 5, kind: kindPasswordReset, state: "completed", userID: 1},
		},
		deliveries: []delivery{
			{to: "a@example.com", kind: kindWelcome},
			{to: "a@example.com", kind: kindVerification},
			{to: "b@example.com", kind: kindWelcome},
			{to: "b@example.com", kind: kindVerification},
			{to: "a@example.com", kind: kindPasswordReset},
		},
	}
}

func TestEvaluate(t *testing.T) {
	t.Parallel()

	t.Run("AllHeld", func(t *testing.T) {
		t.Parallel()

		r := evaluate(goodData())
		var out bytes.Buffer
		r.write(&out)
		require.True(t, r.passed(), out.String())
		require.Contains(t, out.String(), "result: PASS")
		require.Contains(t, out.String(), "201: 2, 202: 1, 503: 1, transport error: 1")
		require.Equal(t, 1, r.rescued)
	})

	for _, tt := range []struct {
		name      string
		breakFunc func(d *soakData)
		check     string
	}{
		{"A500", func(d *soakData) { d.answers = append(d.answers, answer{status: http.StatusInternalServerError}) }, "no 500s"},
		{"A503WithoutRetryAfter", func(d *soakData) { d.answers = append(d.answers, answer{status: http.StatusServiceUnavailable}) }, "every 503 carried Retry-After"},
		{"A409", func(d *soakData) { d.answers = append(d.answers, answer{status: http.StatusConflict}) }, "no unexpected status"},
		{"BurstOverLimit", func(d *soakData) { d.bursts[0].admitted, d.bursts[0].refused = 6, 9 }, "limits held across processes"},
		{"CleanBurstUnderLimit", func(d *soakData) { d.bursts[0].admitted, d.bursts[0].refused = 4, 11 }, "limits held across processes"},
		{"NoCleanBurst", func(d *soakData) { d.bursts[0].unknown, d.bursts[0].refused = 1, 9 }, "limits held across processes"},
		{"RegistrationNotStored", func(d *soakData) {
			// Answered 201, and nothing of it anywhere.
			delete(d.users, 2)
			d.jobs = append(d.jobs[:2], d.jobs[4])
			d.deliveries = append(d.deliveries[:2], d.deliveries[4])
		}, "every accepted registration stored"},
		{"UserWithoutWelcome", func(d *soakData) { d.jobs, d.deliveries = d.jobs[1:], d.deliveries[1:] }, "every user has its welcome and verification jobs"},
		// A job that never completed sent nothing.
		{"JobDiscarded", func(d *soakData) { d.jobs[4].state, d.deliveries = "discarded", d.deliveries[:4] }, "no job lost, discarded or cancelled"},
		{"JobUnfinished", func(d *soakData) { d.jobs[4].state, d.deliveries = "retryable", d.deliveries[:4] }, "no job lost, discarded or cancelled"},
		{"QueueNotDrained", func(d *soakData) { d.drainErr = errors.New("3 jobs still unfinished") }, "no job lost, discarded or cancelled"},
		{"MailTwice", func(d *soakData) {
			d.deliveries = append(d.deliveries, delivery{to: "b@example.com", kind: kindWelcome})
		}, "every mail delivered exactly once"},
		{"MailMissing", func(d *soakData) { d.deliveries = d.deliveries[:4] }, "every mail delivered exactly once"},
		{"MailToNobody", func(d *soakData) {
			d.deliveries = append(d.deliveries, delivery{to: "x@example.com", kind: kindWelcome})
		}, "every mail delivered exactly once"},
		{"SIGTERMNotZero", func(d *soakData) { d.stops[0].err = errors.New("exit status 1") }, "every fault played, every SIGTERM exited 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			data := goodData()
			tt.breakFunc(data)
			r := evaluate(data)
			require.False(t, r.passed())
			var failed []string
			for _, c := range r.checks {
				if !c.passed {
					failed = append(failed, c.name)
				}
			}
			require.Equal(t, []string{tt.check}, failed)
			var out bytes.Buffer
			r.write(&out)
			require.Contains(t, out.String(), "FAIL  "+tt.check)
			require.Contains(t, out.String(), "result: FAIL")
		})
	}
}

func TestKindOfKey(t *testing.T) {
	t.Parallel()

	for key, want := range map[string]string{
		"welcome:17":                            kindWelcome,
		"welcome_email:17:9f86d081884c7d659a2f": kindWelcome,
		"verification_email:17:42":              kindVerification,
		"password_reset_email:17:ab12":          kindPasswordReset,
	} {
		require.Equal(t, want, kindOfKey(key), key)
	}
}

func TestParseOptions(t *testing.T) {
	t.Parallel()

	var stderr bytes.Buffer
	opts, err := parseOptions(nil, func(string) string { return "postgres://u@h/db" }, &stderr)
	require.NoError(t, err)
	require.Equal(t, "postgres://u@h/db", opts.DatabaseURL)
	require.Equal(t, 3*time.Minute, opts.Duration)

	for _, args := range [][]string{
		{"-apis", "1"},
		{"-workers", "1"},
		{"-duration", "1s"},
		{"-refuse-for", "20s"},
		{"extra"},
	} {
		_, err := parseOptions(args, func(string) string { return "" }, &stderr)
		require.ErrorIs(t, err, errUsage, "%v", args)
	}
}
