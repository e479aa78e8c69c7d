package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// argon2id parameters: OWASP's first recommended set (m=19 MiB, t=2, p=1), postguard's floor.
const (
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonSaltLen   = 16
	argonKeyLen    = 32
)

// PasswordHasher turns a password into what the users table stores as its hash. The service's
// own is argon2id (m=19 MiB, t=2, p=1) as a PHC string, at most Config.HashConcurrency at once;
// Config.PasswordHasher replaces it (tests gate it to see who reaches it). Hash must honour ctx:
// a request whose deadline passes while it waits is answered 503.
type PasswordHasher interface {
	Hash(ctx context.Context, password string) (string, error)
}

// passwordHasher hashes passwords with argon2id (golang.org/x/crypto/argon2), at most n at a
// time: each hash holds 19 MiB for tens of milliseconds, so an unbounded burst of registrations
// could exhaust memory. Waiters queue on the semaphore (a request whose client leaves stops
// waiting).
type passwordHasher struct {
	sem chan struct{}
}

func newPasswordHasher(n int) *passwordHasher {
	return &passwordHasher{sem: make(chan struct{}, max(n, 1))}
}

// Hash returns the PHC string of password under a fresh random salt:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash> (unpadded standard base64). The whole password
// is hashed; nothing is truncated.
func (h *passwordHasher) Hash(ctx context.Context, password string) (string, error) {
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("error waiting to hash a password: %w", context.Cause(ctx))
	}
	defer func() { <-h.sem }()

	salt := make([]byte, argonSaltLen)
	_, _ = rand.Read(salt) // crypto/rand.Read never fails (Go 1.24+)
	key := argon2.IDKey([]byte(password), salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemoryKiB, argonTime, argonThreads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
}

// verifyPassword reports whether password matches a PHC argon2id string made by hash (with any
// m, t and p). The service itself never checks passwords (the web app does); tests use this.
func verifyPassword(phc, password string) (bool, error) {
	parts := strings.Split(phc, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != fmt.Sprintf("v=%d", argon2.Version) {
		return false, errors.New("not an argon2id PHC string")
	}
	var memory, iterations uint32
	var threads uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &memory, &iterations, &threads); err != nil {
		return false, fmt.Errorf("error reading argon2id parameters: %w", err)
	}
	salt, err := base64.RawStdEncoding.DecodeString(parts[4])
	if err != nil {
		return false, fmt.Errorf("error decoding salt: %w", err)
	}
	want, err := base64.RawStdEncoding.DecodeString(parts[5])
	if err != nil {
		return false, fmt.Errorf("error decoding hash: %w", err)
	}
	got := argon2.IDKey([]byte(password), salt, iterations, memory, threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}
