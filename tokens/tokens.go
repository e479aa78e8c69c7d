// Package tokens owns the secrets that postguard mails and checks: the random tokens of
// verification and reset links (and their stored forms: a SHA-256 for lookup, a sealed copy while
// a job may still resend them), the provider's idempotency keys, and the stateless unsubscribe
// tokens. The jobs mint them; the api checks them. It also says what a valid APP_SECRET is
// (CheckSecret).
//
// Link tokens are random, never derived: nothing an attacker can read (a database copy, the
// APP_SECRET, a job id) lets them compute one. The sealed copy exists so that every attempt of a
// job mails the same bytes under the same idempotency key; it is encrypted under a key derived
// from APP_SECRET, so neither a database copy alone nor the secret alone yields a working link.
package tokens

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MinSecretLen is the least length of APP_SECRET, in bytes: a key with less entropy than
// SHA-256's 32 bytes weakens every token, seal and rate-limit key derived from it.
const MinSecretLen = 32

// ErrWeakSecret says a secret is empty or shorter than MinSecretLen. Every constructor that takes
// APP_SECRET (tokens.NewSealer, abuse.NewLimiter, jobs.NewWorkers, api.New) returns it wrapped.
var ErrWeakSecret = errors.New("secret too short")

// CheckSecret returns an error wrapping ErrWeakSecret unless secret has at least MinSecretLen
// bytes (`openssl rand -hex 32` makes one).
func CheckSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w: %d bytes, it must be at least %d (e.g. `openssl rand -hex 32`)", ErrWeakSecret, len(secret), MinSecretLen)
	}
	return nil
}

const (
	// tokenBytes is the randomness of a link token: 256 bits.
	tokenBytes = 32
	// Len is the length of a link token as mailed: base64url without padding of tokenBytes.
	Len = 43

	// idempotencyRandomBytes is the random part of an idempotency key: 128 bits, so that no key
	// repeats across databases restored, recreated or run side by side with the same ids.
	idempotencyRandomBytes = 16

	// sealInfo is the HKDF info of the sealing key: it separates this key from every other use
	// of APP_SECRET (the HMACs of rate-limit keys and unsubscribe links). Bump the version to
	// make every sealed copy unreadable.
	sealInfo = "postguard token seal v1"

	// secretCheckInfo is the HKDF info of the key of SecretCheck, another use of APP_SECRET kept
	// apart from the others; secretCheckLabel is what that key authenticates.
	secretCheckInfo  = "postguard secret check v1"
	secretCheckLabel = "postguard: the secret this database was made with"

	unsubscribePrefix = "unsubscribe:v1:"
)

// ErrUnseal is returned by Sealer.Open for a sealed copy that does not open: tampered with,
// sealed under another secret, or for another job or purpose.
var ErrUnseal = errors.New("sealed token does not open")

// New returns a new link token: 256 bits from crypto/rand, base64url without padding (Len
// characters).
func New() string {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Hash is the SHA-256 of a link token, the form in which it is stored and looked up. A plain
// hash suffices: a token carries 256 random bits, there is nothing to guess.
func Hash(raw string) []byte {
	sum := sha256.Sum256([]byte(raw))
	return sum[:]
}

// Plausible cheaply says whether s can be a link token (Len characters of base64url), so that
// junk costs no database round trip, let alone a password hash.
func Plausible(s string) bool {
	if len(s) != Len {
		return false
	}
	for i := range len(s) {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '-', b == '_':
		default:
			return false
		}
	}
	return true
}

// IdempotencyKey returns a new provider idempotency key for one job's mail:
// <kind>:<user_id>:<128 random bits, hex>. It is chosen at a job's first attempt and kept for
// every later one.
func IdempotencyKey(kind string, userID int64) string {
	b := make([]byte, idempotencyRandomBytes)
	_, _ = rand.Read(b)
	return kind + ":" + strconv.FormatInt(userID, 10) + ":" + hex.EncodeToString(b)
}

// Sealer encrypts link tokens for the time a job may still resend them: AES-256-GCM under a key
// derived from APP_SECRET with HKDF-SHA-256, a random nonce per seal, and the job id and purpose
// as associated data, so a sealed copy moved to another job or purpose does not open. It is
// safe for concurrent use.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer derives the sealing key from secret (APP_SECRET, at least MinSecretLen bytes).
func NewSealer(secret []byte) (*Sealer, error) {
	if err := CheckSecret(secret); err != nil {
		return nil, fmt.Errorf("tokens.NewSealer: %w", err)
	}
	key, err := hkdf.Key(sha256.New, secret, nil, sealInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("error deriving the token sealing key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("error creating the token cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("error creating the token cipher: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// Seal returns the sealed copy of raw for one job and purpose (db.TokenPurpose's value): nonce,
// then ciphertext and tag.
func (s *Sealer) Seal(raw string, jobID int64, purpose string) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(raw)+s.aead.Overhead())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, []byte(raw), sealAD(jobID, purpose))
}

// Open returns the token that Seal sealed for the same job and purpose, or ErrUnseal.
func (s *Sealer) Open(sealed []byte, jobID int64, purpose string) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return "", ErrUnseal
	}
	raw, err := s.aead.Open(nil, sealed[:n], sealed[n:], sealAD(jobID, purpose))
	if err != nil {
		return "", ErrUnseal
	}
	return string(raw), nil
}

func sealAD(jobID int64, purpose string) []byte {
	return []byte("postguard:token:v1:" + purpose + ":" + strconv.FormatInt(jobID, 10))
}

// SecretCheck is the check value of secret (APP_SECRET) that a database records, so that a
// process with another secret is noticed before it silently breaks what the first one made: an
// HMAC-SHA-256 of a fixed label under a key derived from secret with HKDF-SHA-256 (its own info
// label). It tells nothing of the secret and opens nothing; equal secrets give equal values
// (compare them with hmac.Equal).
func SecretCheck(secret []byte) []byte {
	key, err := hkdf.Key(sha256.New, secret, nil, secretCheckInfo, sha256.Size)
	if err != nil {
		panic("tokens: HKDF refused a 32-byte key: " + err.Error()) // only for keys over 255*32 bytes
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(secretCheckLabel))
	return mac.Sum(nil)
}

// Unsubscribe is the token of a user's one-click unsubscribe link: the user id, a dot, and
// base64url (no padding) of HMAC-SHA-256(secret, "unsubscribe:v1:"+userID). It is stateless and
// does not expire: it only ever opts a user out of welcome mail, harmless and repeatable, and the
// link must keep working in a years-old mail.
func Unsubscribe(secret []byte, userID int64) string {
	id := strconv.FormatInt(userID, 10)
	return id + "." + base64.RawURLEncoding.EncodeToString(unsubscribeMAC(secret, id))
}

// ParseUnsubscribe checks a token made by Unsubscribe in constant time and returns its user id;
// ok is false for anything malformed or forged.
func ParseUnsubscribe(secret []byte, tok string) (userID int64, ok bool) {
	idPart, macPart, found := strings.Cut(tok, ".")
	if !found || idPart == "" || macPart == "" {
		return 0, false
	}
	userID, err := strconv.ParseInt(idPart, 10, 64)
	// Reject non-canonical spellings ("+1", "01") so one user has exactly one valid token.
	if err != nil || userID <= 0 || strconv.FormatInt(userID, 10) != idPart {
		return 0, false
	}
	got, err := base64.RawURLEncoding.DecodeString(macPart)
	if err != nil {
		return 0, false
	}
	if !hmac.Equal(got, unsubscribeMAC(secret, idPart)) {
		return 0, false
	}
	return userID, true
}

func unsubscribeMAC(secret []byte, id string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(unsubscribePrefix + id))
	return h.Sum(nil)
}
