package api

import (
	"context"
	"math"
	"regexp"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPasswordHasher_Hash(t *testing.T) {
	t.Parallel()

	hasher := newPasswordHasher(1)
	phc, err := hasher.hash(t.Context(), "correct horse battery")
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
	again, err := hasher.hash(t.Context(), "correct horse battery")
	require.NoError(t, err)
	require.NotEqual(t, phc, again)
}

func TestPasswordHasher_Bounded(t *testing.T) {
	t.Parallel()

	hasher := newPasswordHasher(2)
	// Hold both slots, as two hashes in progress would.
	hasher.sem <- struct{}{}
	hasher.sem <- struct{}{}

	// A third waits, and gives up when its request ends.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := hasher.hash(ctx, "correct horse battery")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// It proceeds as soon as a slot frees.
	done := make(chan error, 1)
	go func() {
		_, err := hasher.hash(t.Context(), "correct horse battery")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("hash ran while every slot was taken (err: %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	<-hasher.sem
	require.NoError(t, <-done)
	require.Len(t, hasher.sem, 1, "the finished hash released its slot")
}

func TestTuneGC(t *testing.T) { //nolint:paralleltest // changes the process's collector settings
	oldPercent := debug.SetGCPercent(100)
	oldLimit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(oldPercent)
		debug.SetMemoryLimit(oldLimit)
	})
	noEnv := func(string) string { return "" }

	t.Run("Defaults", func(t *testing.T) {
		percent, limit := TuneGC(noEnv, 2)
		require.Equal(t, 200, percent)
		require.Equal(t, int64(200<<20), limit, "the floor, above 3 × 2 × 19 MiB + 64 MiB")
	})

	t.Run("LimitGrowsWithConcurrency", func(t *testing.T) {
		_, limit := TuneGC(noEnv, 16)
		require.Equal(t, int64(3*16*19<<20+64<<20), limit, "never below the hasher's blocks")
	})

	t.Run("EnvironmentWins", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		env := map[string]string{"GOGC": "100", "GOMEMLIMIT": "off"}
		percent, limit := TuneGC(func(k string) string { return env[k] }, 2)
		require.Equal(t, 100, percent)
		require.Equal(t, int64(math.MaxInt64), limit)
	})
}
