package abuse

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzClientIP feeds random peers and forwarding headers to a resolver trusting private and
// documentation ranges (so header parsing runs too). The result is always the peer, or a valid,
// normalised address taken from the headers; an untrusted peer is always the answer. With
// CLIENT_IP_HEADER=X-Real-IP the result is the peer or X-Real-IP's address, never one that only
// X-Forwarded-For holds.
func FuzzClientIP(f *testing.F) {
	for _, seed := range [][4]string{
		{"203.0.113.9:1234", "198.51.100.1", "", ""},
		{"10.0.0.1:1234", "1.1.1.1, 198.51.100.1, 10.0.0.2", "", ""},
		{"10.0.0.1:1234", "6.6.6.6, unknown", "", "7.7.7.7"},
		{"[::ffff:10.0.0.1]:80", "[2001:db8::1]:443", "198.51.100.1:5678", ""},
		{"[fe80::1%eth0]:80", "fe80::2%lo", "", "[::1]"},
		{"@", "198.51.100.1", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}

	trusted, err := ParseTrustedProxies("10.0.0.0/8, ::1, fe80::/10, 2001:db8::/33")
	require.NoError(f, err)
	resolver := NewIPResolver(trusted)
	realIPOnly := resolver.WithHeader(HeaderXRealIP)

	f.Fuzz(func(t *testing.T, remoteAddr, xff1, xff2, realIP string) {
		h := http.Header{}
		for _, v := range []string{xff1, xff2} {
			if v != "" {
				h.Add("X-Forwarded-For", v)
			}
		}
		if realIP != "" {
			h.Set("X-Real-Ip", realIP)
		}

		got := resolver.ClientIP(remoteAddr, h)
		key := BucketKey(got)

		peer, ok := parseHostAddr(remoteAddr)
		if byRealIP := realIPOnly.ClientIP(remoteAddr, h); ok && byRealIP != peer {
			want, parsed := parseHostAddr(h.Get("X-Real-Ip"))
			require.True(t, parsed && resolver.isTrusted(peer), "X-Real-IP believed from an untrusted peer")
			require.Equal(t, want, byRealIP, "X-Real-IP mode read another header")
		}
		if !ok {
			require.False(t, got.IsValid(), "unparsable peer, no header believed")
			require.Equal(t, "invalid", key)
			return
		}
		require.True(t, got.IsValid())
		require.Equal(t, got, got.Unmap(), "unmapped")
		require.Empty(t, got.Zone(), "no zone")
		if got.Is6() {
			require.True(t, strings.HasSuffix(key, "/64"), key)
		}
		if !resolver.isTrusted(peer) {
			require.Equal(t, peer, got, "an untrusted peer's headers are never believed")
			return
		}
		if got == peer {
			return
		}

		// Anything else came from the headers: an entry of X-Forwarded-For's lists, or
		// X-Real-IP, which is one address (a comma in it is not a separator: "[fe80::4%,0]").
		var candidates []netip.Addr
		for _, line := range h.Values("X-Forwarded-For") {
			for entry := range strings.SplitSeq(line, ",") {
				if addr, ok := parseHostAddr(entry); ok {
					candidates = append(candidates, addr)
				}
			}
		}
		if addr, ok := parseHostAddr(realIP); ok {
			candidates = append(candidates, addr)
		}
		require.Contains(t, candidates, got)
	})
}

// FuzzParseLimit checks ParseLimit never panics, every accepted value is enforceable, and the
// value round-trips.
func FuzzParseLimit(f *testing.F) {
	for _, seed := range []string{"5/15m", "3/1h", "0/1m", "5/999ms", "1/1s", " 6 / 30m ", "x/y", "5/1h30m", "-1/-1s"} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, s string) {
		limit, window, err := ParseLimit(s)
		if err != nil {
			require.Contains(t, err.Error(), "want N/DURATION")
			require.Zero(t, limit)
			require.Zero(t, window)
			return
		}
		require.GreaterOrEqual(t, limit, int64(1))
		require.GreaterOrEqual(t, window, time.Second)
		require.Zero(t, window%time.Second)

		limit2, window2, err := ParseLimit(strconv.FormatInt(limit, 10) + "/" + window.String())
		require.NoError(t, err)
		require.Equal(t, limit, limit2)
		require.Equal(t, window, window2)
	})
}
