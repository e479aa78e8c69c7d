package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"

	"golang.org/x/crypto/argon2"
)

// argon2id parameters: OWASP's first recommended set (m=19 MiB, t=2, p=1), DESIGN.md's floor.
const (
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonSaltLen   = 16
	argonKeyLen    = 32
)

// Garbage collector settings of a process that hashes passwords (see TuneGC).
const (
	hashGCPercent = 200
	// hashMemoryLimitFloor and hashMemoryLimitBase size the soft memory limit: the base covers
	// what the process holds besides the hasher (pools, connections, goroutine stacks, caches).
	hashMemoryLimitFloor = 200 << 20
	hashMemoryLimitBase  = 64 << 20
)

// TuneGC sets the garbage collector for the password hasher's allocation pattern, unless the
// operator chose through GOGC or GOMEMLIMIT (getenv reads the environment). Measured with
// cmd/postguard-load's register scenario (2 CPUs, 200 concurrent registrations):
//
// Each hash allocates and drops a 19 MiB block, while the heap the service keeps between hashes
// is small, so with the default GOGC=100 the runtime collects every 2 to 3 hashes, and in the
// API process each cycle marks the stacks and buffers of every connection and request in
// flight: 15-20 ms of CPU per cycle, 5-8 ms per registration (a collection in a process that
// only hashes costs 1 ms per hash). GOGC=200 halves the cycles. Alone it lets the heap reach 3x
// its live size, peaks included (peak RSS up to 237 MiB seen), so a soft memory limit caps it:
// the larger of 200 MiB and room for the hasher's blocks (concurrency x 19 MiB, three times
// over, the GOGC=200 goal) plus 64 MiB; the limit never sits below the live heap the hasher
// bounds, so it cannot make the collector thrash. hashConcurrency <= 0 is api.Config's default
// (runtime.GOMAXPROCS(0)). It returns the settings in force.
func TuneGC(getenv func(string) string, hashConcurrency int) (gcPercent int, memoryLimit int64) {
	if hashConcurrency <= 0 {
		hashConcurrency = runtime.GOMAXPROCS(0)
	}
	if getenv("GOGC") == "" {
		debug.SetGCPercent(hashGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		hashes := int64(hashConcurrency) * argonMemoryKiB << 10
		limit := int64(hashMemoryLimitFloor)
		if hashes < (math.MaxInt64-hashMemoryLimitBase)/3 {
			limit = max(limit, 3*hashes+hashMemoryLimitBase)
		}
		debug.SetMemoryLimit(limit)
	}
	samples := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(samples)
	return int(samples[0].Value.Uint64()), int64(samples[1].Value.Uint64()) //nolint:gosec // G115: runtime values
}

// passwordHasher hashes passwords with argon2id, at most n at a time: each hash holds 19 MiB
// for tens of milliseconds, so an unbounded burst of registrations could exhaust memory.
// Waiters queue on the semaphore (a request whose client leaves stops waiting).
type passwordHasher struct {
	sem chan struct{}
}

func newPasswordHasher(n int) *passwordHasher {
	return &passwordHasher{sem: make(chan struct{}, max(n, 1))}
}

// hash returns the PHC string of password under a fresh random salt:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash> (unpadded standard base64). The whole password
// is hashed; nothing is truncated.
func (h *passwordHasher) hash(ctx context.Context, password string) (string, error) {
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
