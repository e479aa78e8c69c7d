package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// TestServe_DeliveryFeedback is the delivery loop through the real wiring: RESEND_WEBHOOK_SECRET
// and ADMIN_TOKEN from the environment, the fake Resend posting its signed webhook to the
// listening process, the admin API reading what it did.
func TestServe_DeliveryFeedback(t *testing.T) {
	t.Parallel()

	const adminToken = "an-admin-token-of-at-least-32-bytes"
	fake := resendfake.New(t, nil)
	env := map[string]string{
		"DATABASE_URL":            "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":                  "resend",
		"RESEND_API_KEY":          "re_test",
		"RESEND_FROM_EMAIL":       "postguard@example.com",
		"RESEND_BASE_URL":         fake.URL(),
		"RESEND_MAX_RPS":          "0",
		"RESEND_WEBHOOK_SECRET":   fake.WebhookSecret(),
		"ADMIN_TOKEN":             adminToken,
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "50ms",
	}
	server := startServer(t, service.RoleServe, env)

	resp, err := http.Post(server.URL+"/v1/auth/register", "application/json",
		strings.NewReader(`{"email":"ada@example.com","password":"correct horse battery"}`))
	require.NoError(t, err)
	var registered struct{ ID int64 }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&registered))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	var verification resendfake.Delivery
	require.Eventually(t, func() bool {
		for _, delivery := range fake.Deliveries() {
			if strings.HasPrefix(delivery.IdempotencyKey, "verification_email:") {
				verification = delivery
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "verification mail not sent; logs:\n%s", server.Logs.String())

	// The fake posts Resend's signed event to the process; the message's acceptance may still be
	// on its way into the database, so an unknown id is retried as Resend would.
	webhookURL := server.URL + "/v1/webhooks/resend"
	messagesURL := server.URL + "/v1/admin/users/" + strconv.FormatInt(registered.ID, 10) + "/messages"
	require.Eventually(t, func() bool {
		status, err := fake.SendWebhook(t.Context(), webhookURL, fake.Event(verification, resendfake.EventBounced, nil))
		if err != nil || status != http.StatusNoContent {
			return false
		}
		answer, err := adminGet(t, messagesURL, adminToken)
		return err == nil && answer.Suppression != nil
	}, 20*time.Second, 20*time.Millisecond)

	answer, err := adminGet(t, messagesURL, adminToken)
	require.NoError(t, err)
	require.Equal(t, "bounced", answer.Suppression.Reason)
	statuses := map[string]string{}
	for _, message := range answer.Messages {
		statuses[message.Kind] = message.Status
	}
	require.Equal(t, "bounced", statuses["verification_email"])

	// Unsigned or without the token: refused.
	status, err := resendfake.New(t, nil).SendWebhook(t.Context(), webhookURL, fake.Event(verification, resendfake.EventComplained, nil))
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, status)
	resp, err = http.Get(server.URL + "/v1/admin/suppressions")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Bearer realm="postguard admin"`, resp.Header.Get("WWW-Authenticate"))
	require.NoError(t, server.stop(t))

	// Unset, neither is mounted.
	delete(env, "RESEND_WEBHOOK_SECRET")
	delete(env, "ADMIN_TOKEN")
	server = startServer(t, service.RoleServe, env)
	status, err = fake.SendWebhook(t.Context(), server.URL+"/v1/webhooks/resend", fake.Event(verification, resendfake.EventDelivered, nil))
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, server.URL+"/v1/admin/suppressions", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.NoError(t, server.stop(t))

	// Set but malformed, the process does not start, and says which variable is wrong.
	env["RESEND_WEBHOOK_SECRET"] = "not-a-signing-secret"
	env["ADMIN_TOKEN"] = "short"
	out, err := runCommand(t, []string{"serve"}, env)
	require.Error(t, err, out)
	require.ErrorContains(t, err, "RESEND_WEBHOOK_SECRET")
	require.ErrorContains(t, err, "ADMIN_TOKEN")
}

type adminMessagesAnswer struct {
	Suppression *struct {
		Reason string `json:"reason"`
	} `json:"suppression"`
	Messages []struct {
		Kind   string `json:"kind"`
		Status string `json:"status"`
	} `json:"messages"`
}

// adminGet reads a user's messages from the admin API; safe off the test's goroutine.
func adminGet(t *testing.T, url, token string) (*adminMessagesAnswer, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	var answer adminMessagesAnswer
	return &answer, json.Unmarshal(body, &answer)
}
