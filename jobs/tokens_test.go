package jobs

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef") //nolint:gochecknoglobals // a test constant

func TestVerifyToken(t *testing.T) {
	t.Parallel()

	t.Run("DeterministicPerJob", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, VerifyToken(testSecret, 42), VerifyToken(testSecret, 42))
		require.NotEqual(t, VerifyToken(testSecret, 42), VerifyToken(testSecret, 43))
		require.NotEqual(t, VerifyToken(testSecret, 42), VerifyToken([]byte("another secret of at least 32 bytes"), 42))
	})

	t.Run("Base64URLWithoutPadding", func(t *testing.T) {
		t.Parallel()

		raw := VerifyToken(testSecret, 42)
		require.Len(t, raw, 43) // 32 bytes
		require.NotContains(t, raw, "=")
		decoded, err := base64.RawURLEncoding.DecodeString(raw)
		require.NoError(t, err)
		require.Len(t, decoded, sha256.Size)
	})

	t.Run("PurposesDiffer", func(t *testing.T) {
		t.Parallel()

		require.NotEqual(t, VerifyToken(testSecret, 42), ResetToken(testSecret, 42))
	})
}

func TestUnsubscribeToken(t *testing.T) {
	t.Parallel()

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()

		tok := UnsubscribeToken(testSecret, 1234)
		require.True(t, strings.HasPrefix(tok, "1234."))
		userID, ok := ParseUnsubscribeToken(testSecret, tok)
		require.True(t, ok)
		require.Equal(t, int64(1234), userID)
	})

	t.Run("Rejects", func(t *testing.T) {
		t.Parallel()

		valid := UnsubscribeToken(testSecret, 1234)
		_, mac, _ := strings.Cut(valid, ".")
		for name, tok := range map[string]string{
			"Empty":            "",
			"NoDot":            "1234",
			"NoMAC":            "1234.",
			"NoID":             "." + mac,
			"OtherUser":        "1235." + mac,
			"NonCanonicalID":   "01234." + mac,
			"PlusID":           "+1234." + mac,
			"NegativeID":       "-1." + UnsubscribeToken(testSecret, -1)[3:],
			"BadBase64":        "1234.!!!",
			"Truncated":        valid[:len(valid)-2],
			"OtherSecret":      UnsubscribeToken([]byte("another secret of at least 32 bytes"), 1234),
			"VerifyTokenAsMAC": "1234." + VerifyToken(testSecret, 1234),
		} {
			_, ok := ParseUnsubscribeToken(testSecret, tok)
			require.False(t, ok, name)
		}
	})

	t.Run("PurposesDiffer", func(t *testing.T) {
		t.Parallel()

		_, mac, _ := strings.Cut(UnsubscribeToken(testSecret, 7), ".")
		require.NotEqual(t, VerifyToken(testSecret, 7), mac)
		require.NotEqual(t, ResetToken(testSecret, 7), mac)
	})
}

func TestHashToken(t *testing.T) {
	t.Parallel()

	raw := VerifyToken(testSecret, 1)
	sum := sha256.Sum256([]byte(raw))
	require.Equal(t, sum[:], HashToken(raw))
	require.NotEqual(t, HashToken(raw), HashToken(VerifyToken(testSecret, 2)))
	require.NotContains(t, string(HashToken(raw)), raw)
}
