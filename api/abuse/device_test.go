package abuse

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDeviceSigner(t *testing.T) {
	t.Parallel()

	signer := newDeviceSigner(testSecret)
	issued := windowBase
	since := time.UnixMicro(1_700_000_000_123_456).UTC()
	token := signer.sign("login", "account-42", deviceToken{id: [deviceIDLen]byte{1, 2, 3}, issuedAt: issued, since: since})
	const ttl = 24 * time.Hour

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()

		require.Len(t, token, deviceTokenTextLen)
		got, outcome := signer.verify("login", "account-42", token, issued.Add(ttl-time.Second), ttl)
		require.Equal(t, deviceTrusted, outcome)
		require.Equal(t, [deviceIDLen]byte{1, 2, 3}, got.id)
		require.True(t, got.issuedAt.Equal(issued))
		require.True(t, got.since.Equal(since), "the revocation time to the microsecond")
	})

	t.Run("BoundToActionAndKey", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct{ action, key string }{
			{"login", "account-43"},
			{"login", "account-42 "},
			{"login", ""},
			{"signup", "account-42"},
			{"logi", "naccount-42"}, // the same bytes, cut elsewhere
		} {
			_, outcome := signer.verify(Action(tt.action), tt.key, token, issued, ttl)
			require.Equal(t, deviceForged, outcome, "%+v", tt)
		}
	})

	t.Run("Forged", func(t *testing.T) {
		t.Parallel()

		raw, err := base64.RawURLEncoding.DecodeString(token)
		require.NoError(t, err)
		for i := range raw {
			altered := append([]byte(nil), raw...)
			altered[i] ^= 0x01
			_, outcome := signer.verify("login", "account-42", base64.RawURLEncoding.EncodeToString(altered), issued, ttl)
			if i == 0 {
				require.Equal(t, deviceMalformed, outcome, "another version")
				continue
			}
			require.Equal(t, deviceForged, outcome, "byte %d altered", i)
		}

		// Under another secret, or under APP_SECRET itself rather than its derived key.
		other := newDeviceSigner([]byte("another secret of 32 bytes or more"))
		_, outcome := other.verify("login", "account-42", token, issued, ttl)
		require.Equal(t, deviceForged, outcome)
		plain := hmac.New(sha256.New, testSecret)
		plain.Write([]byte("login\x00"))
		plain.Write(raw[:deviceBodyLen])
		plain.Write([]byte("account-42"))
		underived := append(append([]byte(nil), raw[:deviceBodyLen]...), plain.Sum(nil)...)
		_, outcome = signer.verify("login", "account-42", base64.RawURLEncoding.EncodeToString(underived), issued, ttl)
		require.Equal(t, deviceForged, outcome, "the MAC key is derived, not APP_SECRET")
	})

	t.Run("Expired", func(t *testing.T) {
		t.Parallel()

		_, outcome := signer.verify("login", "account-42", token, issued.Add(ttl), ttl)
		require.Equal(t, deviceExpired, outcome)
		_, outcome = signer.verify("login", "account-42", token, issued.Add(ttl), 2*ttl)
		require.Equal(t, deviceTrusted, outcome, "the current TTL judges")
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()

		for _, bad := range []string{
			"",
			"x",
			token[:len(token)-1],
			token + "A",
			"!" + token[1:],
			token[:len(token)-2] + "==",
		} {
			_, outcome := signer.verify("login", "account-42", bad, issued, ttl)
			require.Equal(t, deviceMalformed, outcome, "%q", bad)
		}
	})

	t.Run("EachDeviceItsOwn", func(t *testing.T) {
		t.Parallel()

		other := signer.sign("login", "account-42", deviceToken{id: [deviceIDLen]byte{9}, issuedAt: issued, since: since})
		require.NotEqual(t, token, other)
		keys := newKeyer(testSecret)
		require.NotEqual(t, keys.deviceKey("login", "account-42", [deviceIDLen]byte{1, 2, 3}), keys.deviceKey("login", "account-42", [deviceIDLen]byte{9}))
		require.NotEqual(t, keys.deviceKey("login", "account-42", [deviceIDLen]byte{1}), keys.key("login", ScopeKey, "account-42"), "not the account's bucket")
		require.NotEqual(t, keys.revocationKey("login", "account-42"), keys.key("login", ScopeKey, "account-42"))
	})
}
