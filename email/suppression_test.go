package email_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/email"
)

func TestSuppressionKey(t *testing.T) {
	t.Parallel()

	secret := []byte("0123456789abcdef0123456789abcdef")
	key := email.SuppressionKey(secret, "ada@example.com")
	require.Len(t, key, sha256.Size)
	require.Equal(t, key, email.SuppressionKey(secret, "ada@example.com"), "stable")

	// HMAC-SHA-256 under the secret, with a prefix of its own: not the unsubscribe or rate-limit
	// keys of the same text, and not a plain hash.
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("suppression:v1:ada@example.com"))
	require.Equal(t, mac.Sum(nil), key)
	require.NotEqual(t, key, email.SuppressionKey(secret, "bob@example.com"))
	require.NotEqual(t, key, email.SuppressionKey([]byte("another secret of at least 32 bytes"), "ada@example.com"))
	plain := sha256.Sum256([]byte("ada@example.com"))
	require.NotEqual(t, plain[:], key)
}

func TestSuppression(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name               string
		event              email.Event
		reason, wantDetail string
	}{
		{"PermanentBounce", email.Event{Status: email.StatusBounced, Bounce: &email.Bounce{Type: "Permanent", SubType: "General", Permanent: true}}, email.ReasonBounced, "General"},
		{"PermanentBounceFreeText", email.Event{Status: email.StatusBounced, Bounce: &email.Bounce{Type: "Permanent", SubType: "550 <ada@example.com>", Permanent: true}}, email.ReasonBounced, ""},
		{"Complaint", email.Event{Status: email.StatusComplained}, email.ReasonComplained, ""},
		{"ProvidersOwn", email.Event{Status: email.StatusSuppressed, SuppressedType: "OnAccountSuppressionList"}, email.ReasonSuppressed, "OnAccountSuppressionList"},
		{"TransientBounce", email.Event{Status: email.StatusBounced, Bounce: &email.Bounce{Type: "Transient", SubType: "MailboxFull"}}, "", ""},
		{"UnclassifiedBounce", email.Event{Status: email.StatusBounced}, "", ""},
		{"Delivered", email.Event{Status: email.StatusDelivered}, "", ""},
		{"Delayed", email.Event{Status: email.StatusDelayed}, "", ""},
		{"Failed", email.Event{Status: email.StatusFailed}, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			reason, detail, suppresses := email.Suppression(&tt.event)
			require.Equal(t, tt.reason != "", suppresses)
			require.Equal(t, tt.reason, reason)
			require.Equal(t, tt.wantDetail, detail)
		})
	}
}
