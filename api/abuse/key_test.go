package abuse

import (
	"crypto/hmac"
	"crypto/sha256"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeyer_Key(t *testing.T) {
	t.Parallel()

	secret := []byte("0123456789abcdef0123456789abcdef")
	k := newKeyer(secret)

	t.Run("IsHMACOfVersionedInput", func(t *testing.T) {
		t.Parallel()

		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte("ratelimit:v1:register:ip:192.0.2.7"))
		want := mac.Sum(nil)

		got := k.key(ActionRegister, ScopeIP, "192.0.2.7")
		require.Equal(t, want, got[:])
	})

	t.Run("NoRawValue", func(t *testing.T) {
		t.Parallel()

		for _, value := range []string{"192.0.2.7", "alice@example.com", "2001:db8:1:2::/64"} {
			got := k.key(ActionRegister, ScopeEmail, value)
			require.NotContains(t, string(got[:]), value)
			require.False(t, strings.Contains(strings.ToLower(string(got[:])), "alice"))
		}
	})

	t.Run("DiffersPerActionScopeValueSecret", func(t *testing.T) {
		t.Parallel()

		base := k.key(ActionRegister, ScopeIP, "192.0.2.7")
		seen := map[keyHash]string{base: "base"}
		for name, other := range map[string]keyHash{
			"Action": k.key(ActionForgotPassword, ScopeIP, "192.0.2.7"),
			"Scope":  k.key(ActionRegister, ScopeEmail, "192.0.2.7"),
			"Value":  k.key(ActionRegister, ScopeIP, "192.0.2.8"),
			"Secret": newKeyer([]byte("another secret of thirty-two bytes")).key(ActionRegister, ScopeIP, "192.0.2.7"),
		} {
			_, dup := seen[other]
			require.False(t, dup, name)
			seen[other] = name
		}
		require.Equal(t, base, k.key(ActionRegister, ScopeIP, "192.0.2.7"), "deterministic")
	})

	t.Run("SecretCopied", func(t *testing.T) {
		t.Parallel()

		s := []byte("a secret the caller will overwrite")
		kk := newKeyer(s)
		before := kk.key(ActionRegister, ScopeIP, "x")
		for i := range s {
			s[i] = 0
		}
		require.Equal(t, before, newKeyer([]byte("a secret the caller will overwrite")).key(ActionRegister, ScopeIP, "x"))
		require.Equal(t, before, kk.key(ActionRegister, ScopeIP, "x"))
	})

	t.Run("LongValueAndConcurrency", func(t *testing.T) {
		t.Parallel()

		long := strings.Repeat("a", 5000) + "@example.com"
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte("ratelimit:v1:register:email:" + long))
		want := mac.Sum(nil)

		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 200 {
					got := k.key(ActionRegister, ScopeEmail, long)
					if !hmac.Equal(want, got[:]) {
						t.Error("wrong key under concurrency")
						return
					}
				}
			})
		}
		wg.Wait()
	})
}
