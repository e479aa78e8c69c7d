package email

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Suppression reasons: what put an address on the suppression list (db.EmailSuppression).
const (
	ReasonBounced    = "bounced"    // a permanent bounce
	ReasonComplained = "complained" // the recipient marked a mail as spam
	ReasonSuppressed = "suppressed" // the provider refused to send to it (its own list)
)

// suppressionPrefix separates the suppression list's HMACs from every other use of APP_SECRET
// (rate-limit keys, unsubscribe links).
const suppressionPrefix = "suppression:v1:"

// SuppressionKey is the key of an address on the suppression list: HMAC-SHA-256(secret,
// "suppression:v1:"+address), address in its normal form (Normalize: postguard's users'
// addresses are stored so, and the workers normalise a host app's). The list never holds an
// address, and without the secret its keys cannot be matched even against a list of known
// addresses. Changing APP_SECRET empties the list in effect: every address may be mailed again,
// and the provider's events suppress it anew.
func SuppressionKey(secret []byte, address string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(suppressionPrefix + address))
	return h.Sum(nil)
}

// Suppression is the suppression policy: whether event puts its mail's recipients on the
// suppression list, for which reason, and with which detail (the provider's classification, a
// plain word or ""). A permanent bounce does, a transient one says nothing of the address; a
// complaint does (its owner asked not to get our mail); so does the provider's own suppression.
// Nothing else does. Every kind of mail is then held back for the address, verification and
// reset mail included.
func Suppression(event *Event) (reason, detail string, suppresses bool) {
	switch {
	case event.Status == StatusBounced && event.Bounce != nil && event.Bounce.Permanent:
		return ReasonBounced, Classification(event.Bounce.SubType), true
	case event.Status == StatusComplained:
		return ReasonComplained, "", true
	case event.Status == StatusSuppressed:
		return ReasonSuppressed, Classification(event.SuppressedType), true
	}
	return "", "", false
}
