package abuse

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// keyPrefix versions the key format: changing the format (or the secret) starts every counter
// afresh, which is harmless for windows of an hour.
const keyPrefix = "ratelimit:v1:"

// keyHash is a counter's key: HMAC-SHA-256 under the secret of
// "ratelimit:v1:<action>:<scope>:<value>". The database only ever sees this hash, never the raw
// IP or email, and without the secret it cannot be reversed even by enumerating all IPv4
// addresses.
type keyHash [sha256.Size]byte

// keyer computes keys. hmac.New costs two SHA-256 compressions of the padded secret plus
// allocations; a pooled HMAC restores its precomputed inner and outer states on Reset instead
// (crypto/hmac keeps them marshaled after the first Reset), which BenchmarkKey measures.
type keyer struct {
	pool sync.Pool // of *keyState
}

// keyState is one pooled HMAC with scratch space, so that hashing allocates nothing: a []byte
// passed through the hash.Hash interface would otherwise escape to the heap on every call.
type keyState struct {
	mac hash.Hash
	buf []byte
	sum []byte
}

func newKeyer(secret []byte) *keyer {
	secret = append([]byte(nil), secret...) // the caller may reuse its slice
	k := &keyer{}
	k.pool.New = func() any {
		return &keyState{
			mac: hmac.New(sha256.New, secret),
			buf: make([]byte, 0, 128),
			sum: make([]byte, 0, sha256.Size),
		}
	}
	return k
}

// key returns the key of value under a rule's action and scope.
func (k *keyer) key(action Action, scope Scope, value string) keyHash {
	st := k.pool.Get().(*keyState) //nolint:forcetypeassert // the pool only holds *keyState
	st.mac.Reset()

	b := append(st.buf[:0], keyPrefix...)
	b = append(b, action...)
	b = append(b, ':')
	b = append(b, scope...)
	b = append(b, ':')
	b = append(b, value...)
	st.mac.Write(b)
	st.sum = st.mac.Sum(st.sum[:0])

	var out keyHash
	copy(out[:], st.sum)
	if cap(b) <= 1024 { // don't keep a buffer grown by an absurd value
		st.buf = b
	}
	k.pool.Put(st)
	return out
}
