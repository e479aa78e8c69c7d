package abuse

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// keyPrefix versions the key format: changing the format (or the secret) starts every counter
// afresh, which is harmless for windows of an hour.
const keyPrefix = "ratelimit:v1:"

// keyHash is a counter's key: HMAC-SHA-256 under the secret of
// "ratelimit:v1:<action>:<scope>:<value>". The database only ever sees this hash, never the raw
// IP or email, and without the secret it cannot be reversed even by enumerating all IPv4
// addresses.
type keyHash [sha256.Size]byte

// keyer computes keys under one secret.
type keyer struct {
	secret []byte
}

func newKeyer(secret []byte) *keyer {
	return &keyer{secret: append([]byte(nil), secret...)} // the caller may reuse its slice
}

// key returns the key of value under a rule's action and scope.
func (k *keyer) key(action Action, scope Scope, value string) keyHash {
	mac := hmac.New(sha256.New, k.secret)
	mac.Write([]byte(keyPrefix + string(action) + ":" + string(scope) + ":" + value))
	var out keyHash
	mac.Sum(out[:0])
	return out
}

// Key scopes of a trusted device: no rule has them, so neither kind of key can be a counter's of
// a rule.
const (
	// deviceScope keys a device's own bucket of an action's key rule.
	deviceScope Scope = "device"
	// revocationScope keys the revocations of an account's devices.
	revocationScope Scope = "devices"
)

// deviceKey returns the key of a device's own bucket of action's key rule for key: the device's
// id, of a fixed length, then the key, so no two (id, key) pairs share one.
func (k *keyer) deviceKey(action Action, key string, id [deviceIDLen]byte) keyHash {
	return k.key(action, deviceScope, hex.EncodeToString(id[:])+":"+key)
}

// revocationKey returns the key the revocations of key's devices of action are recorded under.
func (k *keyer) revocationKey(action Action, key string) keyHash {
	return k.key(action, revocationScope, key)
}
