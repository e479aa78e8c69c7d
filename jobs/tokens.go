package jobs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
)

// Token purposes are prefixes of the HMAC input, so that a token minted for one purpose can never
// stand in for another (a verify token is not a reset token for the same job id, and neither is
// an unsubscribe token). Bump the version to invalidate every outstanding token of a purpose.
const (
	verifyTokenPrefix      = "verify:v1:"
	resetTokenPrefix       = "reset:v1:"
	unsubscribeTokenPrefix = "unsubscribe:v1:" //nolint:gosec // G101: an HMAC domain-separation label, not a credential
)

// VerifyToken is the raw email-verification token mailed by the verification job jobID:
// base64url (no padding) of HMAC-SHA-256(secret, "verify:v1:"+jobID). Derived, not random, so
// every attempt of a job mails the same link and the provider's idempotency key sees the same
// payload. Only its HashToken is stored.
func VerifyToken(secret []byte, jobID int64) string {
	return macString(secret, verifyTokenPrefix+strconv.FormatInt(jobID, 10))
}

// ResetToken is the raw password-reset token mailed by the password reset job jobID:
// base64url (no padding) of HMAC-SHA-256(secret, "reset:v1:"+jobID).
func ResetToken(secret []byte, jobID int64) string {
	return macString(secret, resetTokenPrefix+strconv.FormatInt(jobID, 10))
}

// UnsubscribeToken is the token of a user's one-click unsubscribe link: the user id, a dot, and
// base64url (no padding) of HMAC-SHA-256(secret, "unsubscribe:v1:"+userID). It is stateless (not
// stored) and does not expire: unsubscribing is harmless and repeatable, and the link must keep
// working in an old mail.
func UnsubscribeToken(secret []byte, userID int64) string {
	id := strconv.FormatInt(userID, 10)
	return id + "." + macString(secret, unsubscribeTokenPrefix+id)
}

// ParseUnsubscribeToken checks a token made by UnsubscribeToken in constant time and returns its
// user id; ok is false for anything malformed or forged.
func ParseUnsubscribeToken(secret []byte, tok string) (userID int64, ok bool) {
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
	if !hmac.Equal(got, mac(secret, unsubscribeTokenPrefix+idPart)) {
		return 0, false
	}
	return userID, true
}

// HashToken is the SHA-256 of a raw token, the form in which email tokens are stored and looked
// up. A plain hash suffices: raw tokens are 256-bit HMAC outputs, not guessable secrets.
func HashToken(raw string) []byte {
	sum := sha256.Sum256([]byte(raw))
	return sum[:]
}

func mac(secret []byte, message string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(message))
	return h.Sum(nil)
}

func macString(secret []byte, message string) string {
	return base64.RawURLEncoding.EncodeToString(mac(secret, message))
}
