package argon2id

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"golang.org/x/crypto/argon2"
)

// TestIDKey_MatchesXCrypto checks the copy against the original on random inputs and parameters,
// with one Buffer reused across calls of different sizes (so leftovers of a previous call would
// show), and on the RFC 9106 parameters postguard uses.
func TestIDKey_MatchesXCrypto(t *testing.T) {
	t.Parallel()

	rng := rand.New(rand.NewPCG(1, 2))
	randomBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}

	var buf Buffer
	for i := range 40 {
		password, salt := randomBytes(rng.IntN(64)), randomBytes(8+rng.IntN(24))
		time := 1 + rng.Uint32N(3)
		memory := 8 + rng.Uint32N(2048)
		threads := uint8(1 + rng.UintN(4))
		keyLen := 4 + rng.Uint32N(60)

		want := argon2.IDKey(password, salt, time, memory, threads, keyLen)
		got := buf.IDKey(password, salt, time, memory, threads, keyLen)
		if !bytes.Equal(want, got) {
			t.Fatalf("case %d (t=%d m=%d p=%d len=%d): got %x, want %x", i, time, memory, threads, keyLen, got, want)
		}
	}

	// postguard's parameters, twice on the same buffer.
	for range 2 {
		want := argon2.IDKey([]byte("correct horse battery"), []byte("0123456789abcdef"), 2, 19456, 1, 32)
		got := buf.IDKey([]byte("correct horse battery"), []byte("0123456789abcdef"), 2, 19456, 1, 32)
		if !bytes.Equal(want, got) {
			t.Fatalf("postguard parameters: got %x, want %x", got, want)
		}
	}
}

// TestIDKey_Reuse checks that a buffer's previous contents never leak into a result.
func TestIDKey_Reuse(t *testing.T) {
	t.Parallel()

	var buf Buffer
	first := buf.IDKey([]byte("password"), []byte("somesalt"), 1, 64, 1, 32)
	buf.IDKey([]byte("other"), []byte("othersalt"), 3, 128, 2, 32)
	again := buf.IDKey([]byte("password"), []byte("somesalt"), 1, 64, 1, 32)
	if !bytes.Equal(first, again) {
		t.Fatalf("a reused buffer changed the result: %x then %x", first, again)
	}
}

func BenchmarkIDKey(b *testing.B) {
	password, salt := []byte("correct horse battery"), []byte("0123456789abcdef")
	b.Run("XCrypto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			argon2.IDKey(password, salt, 2, 19456, 1, 32)
		}
	})
	b.Run("ReusedBuffer", func(b *testing.B) {
		var buf Buffer
		b.ReportAllocs()
		for b.Loop() {
			buf.IDKey(password, salt, 2, 19456, 1, 32)
		}
	})
}
