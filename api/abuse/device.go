package abuse

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"time"
)

// DefaultDeviceTokenTTL is how long a trusted-device token stands when
// LimiterConfig.DeviceTokenTTL is 0 (DEVICE_TOKEN_TTL's default): 90 days.
const DefaultDeviceTokenTTL = 90 * 24 * time.Hour

// deviceTokenInfo is HKDF's info for the key device tokens are authenticated under: a key of its
// own, so that no other HMAC made with APP_SECRET (a rate-limit key, an unsubscribe link) is ever
// a valid token, nor the other way round.
const deviceTokenInfo = "postguard rate-limit device token v1" //nolint:gosec // a label, not a credential

const (
	deviceTokenVersion = 1
	deviceIDLen        = 16 // random bits of a device: 128
	// deviceBodyLen is a token's authenticated body: version, device id, issue time (Unix
	// seconds), the account's revocation time it was issued under (Unix microseconds).
	deviceBodyLen  = 1 + deviceIDLen + 8 + 8
	deviceTokenLen = deviceBodyLen + sha256.Size
)

// deviceTokenTextLen is the length of a token as the client holds it (base64url, unpadded).
var deviceTokenTextLen = base64.RawURLEncoding.EncodedLen(deviceTokenLen) //nolint:gochecknoglobals // a constant computed once

// deviceToken is what a trusted-device token says, once its MAC is checked.
type deviceToken struct {
	id       [deviceIDLen]byte
	issuedAt time.Time // whole seconds
	// since is the account's last revocation of devices when the token was issued (the Unix
	// epoch when there was none): the token stands while no later one is recorded.
	since time.Time
}

// deviceOutcome is what a request's device token turned out to be, the label of
// postguard_rate_limit_device_tokens_total.
type deviceOutcome string

const (
	deviceTrusted   deviceOutcome = "trusted"   // it stood: the key rule counted in its bucket
	deviceRevoked   deviceOutcome = "revoked"   // authentic and unexpired, but revoked since
	deviceExpired   deviceOutcome = "expired"   // authentic, older than the TTL
	deviceForged    deviceOutcome = "forged"    // its MAC fails: made up, altered, or another key's or action's
	deviceMalformed deviceOutcome = "malformed" // not a token at all
)

// deviceOutcomes are every outcome, for the metric's series to exist from the start.
var deviceOutcomes = [...]deviceOutcome{deviceTrusted, deviceRevoked, deviceExpired, deviceForged, deviceMalformed} //nolint:gochecknoglobals // a constant list

// deviceSigner makes and checks trusted-device tokens under a key derived from the secret.
//
// A token is base64url of: a version byte, a random device id, its issue time, the account's
// revocation time it was issued under, and an HMAC-SHA-256 of all that, the action and the key.
// The action and key are not in the token (it names no account to whoever reads the cookie) but
// bound by the MAC: a token shown for another key or action fails it, like a forged one.
type deviceSigner struct {
	key []byte
}

func newDeviceSigner(secret []byte) *deviceSigner {
	key, err := hkdf.Key(sha256.New, secret, nil, deviceTokenInfo, sha256.Size)
	if err != nil { // only for a length HKDF cannot give, and 32 bytes it always can
		panic("abuse: error deriving the device token key: " + err.Error())
	}
	return &deviceSigner{key: key}
}

// sign returns the token of t for action and key.
func (s *deviceSigner) sign(action Action, key string, t deviceToken) string {
	var buf [deviceTokenLen]byte
	buf[0] = deviceTokenVersion
	copy(buf[1:], t.id[:])
	binary.BigEndian.PutUint64(buf[1+deviceIDLen:], uint64(t.issuedAt.Unix()))   //nolint:gosec // a time after the epoch
	binary.BigEndian.PutUint64(buf[9+deviceIDLen:], uint64(t.since.UnixMicro())) //nolint:gosec // a time after the epoch
	copy(buf[deviceBodyLen:], s.mac(buf[:deviceBodyLen], action, key, nil))
	return base64.RawURLEncoding.EncodeToString(buf[:])
}

// verify reads token as a device of action and key, and says what it is: deviceTrusted (so far:
// the database has the last word on revocations) for an authentic token issued less than ttl
// before now. Every check runs whatever the token is, short of a malformed one, so that its
// time says no more than its answer.
func (s *deviceSigner) verify(action Action, key, token string, now time.Time, ttl time.Duration) (deviceToken, deviceOutcome) {
	var buf [deviceTokenLen]byte
	if len(token) != deviceTokenTextLen {
		return deviceToken{}, deviceMalformed
	}
	if n, err := base64.RawURLEncoding.Decode(buf[:], []byte(token)); err != nil || n != deviceTokenLen || buf[0] != deviceTokenVersion {
		return deviceToken{}, deviceMalformed
	}
	want := s.mac(buf[:deviceBodyLen], action, key, nil)
	var t deviceToken
	copy(t.id[:], buf[1:])
	t.issuedAt = time.Unix(int64(binary.BigEndian.Uint64(buf[1+deviceIDLen:])), 0)      //nolint:gosec // authenticated below
	t.since = time.UnixMicro(int64(binary.BigEndian.Uint64(buf[9+deviceIDLen:]))).UTC() //nolint:gosec // authenticated below
	switch {
	case !hmac.Equal(want, buf[deviceBodyLen:]):
		return deviceToken{}, deviceForged
	case !now.Before(t.issuedAt.Add(ttl)):
		return deviceToken{}, deviceExpired
	}
	return t, deviceTrusted
}

// mac appends to out the MAC of a token's body for action and key. The action cannot hold a NUL
// and the body has a fixed length, so the key, last, cannot shift into either.
func (s *deviceSigner) mac(body []byte, action Action, key string, out []byte) []byte {
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(action))
	mac.Write([]byte{0})
	mac.Write(body)
	mac.Write([]byte(key))
	return mac.Sum(out)
}
