package tokens

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var testSecret = []byte("a test secret of at least 32 bytes")

func TestNew(t *testing.T) {
	t.Parallel()

	seen := make(map[string]bool)
	for range 1000 {
		raw := New()
		require.Len(t, raw, Len)
		require.True(t, Plausible(raw), raw)
		decoded, err := base64.RawURLEncoding.DecodeString(raw)
		require.NoError(t, err)
		require.Len(t, decoded, 32, "256 random bits")
		require.False(t, seen[raw], "a token repeated")
		seen[raw] = true
	}
}

func TestHash(t *testing.T) {
	t.Parallel()

	raw := New()
	sum := sha256.Sum256([]byte(raw))
	require.Equal(t, sum[:], Hash(raw))
	require.NotEqual(t, Hash(raw), Hash(New()))
}

func TestPlausible(t *testing.T) {
	t.Parallel()

	for name, tt := range map[string]struct {
		token string
		want  bool
	}{
		"Mailed":      {New(), true},
		"Empty":       {"", false},
		"Short":       {strings.Repeat("a", Len-1), false},
		"Long":        {strings.Repeat("a", Len+1), false},
		"Padded":      {strings.Repeat("a", Len-1) + "=", false},
		"StdAlphabet": {strings.Repeat("a", Len-1) + "+", false},
		"Space":       {strings.Repeat("a", Len-1) + " ", false},
		"NonASCII":    {strings.Repeat("a", Len-2) + "é", false},
	} {
		require.Equal(t, tt.want, Plausible(tt.token), name)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()

	key := IdempotencyKey("verification_email", 42)
	require.Regexp(t, regexp.MustCompile(`^verification_email:42:[0-9a-f]{32}$`), key)
	require.NotEqual(t, key, IdempotencyKey("verification_email", 42), "the random part makes every key new")
}

func TestSealer(t *testing.T) {
	t.Parallel()

	sealer, err := NewSealer(testSecret)
	require.NoError(t, err)

	t.Run("SecretOfAtLeast32Bytes", func(t *testing.T) {
		t.Parallel()

		for _, secret := range [][]byte{nil, []byte("abc"), testSecret[:MinSecretLen-1]} {
			_, err := NewSealer(secret)
			require.ErrorIs(t, err, ErrWeakSecret)
		}
		_, err := NewSealer(testSecret[:MinSecretLen])
		require.NoError(t, err)
	})

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()

		raw := New()
		sealed := sealer.Seal(raw, 7, "reset")
		require.NotContains(t, string(sealed), raw)
		got, err := sealer.Open(sealed, 7, "reset")
		require.NoError(t, err)
		require.Equal(t, raw, got)

		// A fresh nonce per seal: sealing twice gives two different copies of one token.
		require.NotEqual(t, sealed, sealer.Seal(raw, 7, "reset"))
	})

	t.Run("OpensOnlyForItsJobPurposeAndSecret", func(t *testing.T) {
		t.Parallel()

		sealed := sealer.Seal(New(), 7, "reset")
		other, err := NewSealer([]byte("another secret of at least 32 bytes"))
		require.NoError(t, err)

		for name, open := range map[string]func() (string, error){
			"OtherJob":     func() (string, error) { return sealer.Open(sealed, 8, "reset") },
			"OtherPurpose": func() (string, error) { return sealer.Open(sealed, 7, "verify") },
			"OtherSecret":  func() (string, error) { return other.Open(sealed, 7, "reset") },
			"Tampered": func() (string, error) {
				tampered := append([]byte(nil), sealed...)
				tampered[len(tampered)-1] ^= 1
				return sealer.Open(tampered, 7, "reset")
			},
			"Truncated": func() (string, error) { return sealer.Open(sealed[:10], 7, "reset") },
			"Empty":     func() (string, error) { return sealer.Open(nil, 7, "reset") },
		} {
			raw, err := open()
			require.ErrorIs(t, err, ErrUnseal, name)
			require.Empty(t, raw, name)
		}
	})

	t.Run("EmptySecret", func(t *testing.T) {
		t.Parallel()

		_, err := NewSealer(nil)
		require.Error(t, err)
	})
}

func TestUnsubscribe(t *testing.T) {
	t.Parallel()

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()

		tok := Unsubscribe(testSecret, 1234)
		require.True(t, strings.HasPrefix(tok, "1234."))
		userID, ok := ParseUnsubscribe(testSecret, tok)
		require.True(t, ok)
		require.Equal(t, int64(1234), userID)
		require.Equal(t, tok, Unsubscribe(testSecret, 1234), "stateless: the same link for years")
	})

	t.Run("Rejects", func(t *testing.T) {
		t.Parallel()

		valid := Unsubscribe(testSecret, 1234)
		_, mac, _ := strings.Cut(valid, ".")
		for name, tok := range map[string]string{
			"Empty":          "",
			"NoDot":          "1234",
			"NoMAC":          "1234.",
			"NoID":           "." + mac,
			"OtherUser":      "1235." + mac,
			"NonCanonicalID": "01234." + mac,
			"PlusID":         "+1234." + mac,
			"NegativeID":     "-1." + Unsubscribe(testSecret, -1)[3:],
			"BadBase64":      "1234.!!!",
			"Truncated":      valid[:len(valid)-2],
			"OtherSecret":    Unsubscribe([]byte("another secret of at least 32 bytes"), 1234),
			"LinkToken":      "1234." + New(),
		} {
			_, ok := ParseUnsubscribe(testSecret, tok)
			require.False(t, ok, name)
		}
	})
}

func TestSecretCheck(t *testing.T) {
	t.Parallel()

	secret := []byte("0123456789abcdef0123456789abcdef")
	check := SecretCheck(secret)
	require.Len(t, check, 32)
	require.Equal(t, check, SecretCheck([]byte("0123456789abcdef0123456789abcdef")), "the same secret, the same value")
	require.NotEqual(t, check, SecretCheck([]byte("0123456789abcdef0123456789abcdeF")))
	require.NotContains(t, string(check), string(secret))

	// Its own key: not the secret's HMAC of the label, nor any other use's value.
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(secretCheckLabel))
	require.NotEqual(t, mac.Sum(nil), check)
	unsubscribe := hmac.New(sha256.New, secret)
	unsubscribe.Write([]byte(unsubscribePrefix + secretCheckLabel))
	require.NotEqual(t, unsubscribe.Sum(nil), check)
}
