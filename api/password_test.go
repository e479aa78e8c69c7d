package api

import (
	"context"
	"regexp"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPasswordHasher_Hash(t *testing.T) {
	t.Parallel()

	hasher := newPasswordHasher(1)
	phc, err := hasher.Hash(t.Context(), "correct horse battery")
	require.NoError(t, err)
	// 16-byte salt (22 base64 characters) and 32-byte key (43), unpadded standard base64.
	require.Regexp(t, regexp.MustCompile(`^\$argon2id\$v=19\$m=19456,t=2,p=1\$[A-Za-z0-9+/]{22}\$[A-Za-z0-9+/]{43}$`), phc)

	ok, err := verifyPassword(phc, "correct horse battery")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = verifyPassword(phc, "correct horse batter")
	require.NoError(t, err)
	require.False(t, ok)

	// A fresh salt every time.
	again, err := hasher.Hash(t.Context(), "correct horse battery")
	require.NoError(t, err)
	require.NotEqual(t, phc, again)
}

func TestPasswordHasher_Bounded(t *testing.T) {
	t.Parallel()

	// In a synctest bubble, synctest.Wait returns once every goroutine of the bubble is blocked:
	// "the third hash waits for a slot" is then a fact, not a guess from a 50 ms silence.
	synctest.Test(t, func(t *testing.T) {
		hasher := newPasswordHasher(2)
		// Hold both slots, as two hashes in progress would.
		hasher.sem <- struct{}{}
		hasher.sem <- struct{}{}

		// A third waits, and gives up when its request ends (the bubble's clock moves to the
		// deadline as soon as nothing else can run).
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := hasher.Hash(ctx, "correct horse battery")
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// It proceeds as soon as a slot frees.
		done := make(chan error, 1)
		go func() {
			_, err := hasher.Hash(t.Context(), "correct horse battery")
			done <- err
		}()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("hash ran while every slot was taken (err: %v)", err)
		default:
		}
		<-hasher.sem
		require.NoError(t, <-done)
		require.Len(t, hasher.sem, 1, "the finished hash released its slot")
	})
}
