package abuse

import (
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseTrustedProxies(t *testing.T) {
	t.Parallel()

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()

		got, err := ParseTrustedProxies(" 10.0.0.0/8, 192.168.1.7  fd00::/8,\t2001:db8::1 , ::ffff:172.16.0.0/108,fe80::1%eth0,10.1.2.3/8")
		require.NoError(t, err)
		require.Equal(t, []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("192.168.1.7/32"),
			netip.MustParsePrefix("fd00::/8"),
			netip.MustParsePrefix("2001:db8::1/128"),
			netip.MustParsePrefix("172.16.0.0/12"), // unmapped
			netip.MustParsePrefix("fe80::1/128"),   // zone dropped
			netip.MustParsePrefix("10.0.0.0/8"),    // masked
		}, got)
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()

		for _, s := range []string{"", " ", " , ,"} {
			got, err := ParseTrustedProxies(s)
			require.NoError(t, err)
			require.Nil(t, got)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()

		for _, s := range []string{"10.0.0.0/33", "localhost", "10.0.0", "10.0.0.0/8,nope", "1.2.3.4:80", "10.0.0.0/"} {
			_, err := ParseTrustedProxies(s)
			require.ErrorContains(t, err, "invalid trusted proxy", s)
			require.ErrorContains(t, err, "want an IP", s)
		}
	})
}

func TestIPResolver_ClientIP(t *testing.T) {
	t.Parallel()

	trusted, err := ParseTrustedProxies("10.0.0.0/8, 2001:db8:ffff::/48")
	require.NoError(t, err)
	resolver := NewIPResolver(trusted)
	realIP := func() *IPResolver { return resolver.WithHeader(HeaderXRealIP) }

	type headers = map[string][]string
	tests := []struct {
		name       string
		resolver   func() *IPResolver // nil: trusted 10.0.0.0/8 and 2001:db8:ffff::/48
		remoteAddr string
		header     headers
		want       string // "" = invalid
	}{
		// The peer alone.
		{name: "PeerIPv4", remoteAddr: "203.0.113.9:51000", want: "203.0.113.9"},
		{name: "PeerIPv6", remoteAddr: "[2001:db8::9]:51000", want: "2001:db8::9"},
		{name: "PeerIPv6Zone", remoteAddr: "[fe80::1%eth0]:51000", want: "fe80::1"},
		{name: "PeerIPv4Mapped", remoteAddr: "[::ffff:203.0.113.9]:51000", want: "203.0.113.9"},
		{name: "PeerWithoutPort", remoteAddr: "203.0.113.9", want: "203.0.113.9"},
		{name: "PeerUnparsable", remoteAddr: "@", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: ""},
		{name: "PeerEmpty", remoteAddr: "", want: ""},

		// An untrusted peer's headers are ignored.
		{name: "UntrustedPeerXFF", remoteAddr: "203.0.113.9:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "203.0.113.9"},
		{name: "UntrustedPeerXRealIP", remoteAddr: "203.0.113.9:1", header: headers{"X-Real-Ip": {"198.51.100.1"}}, want: "203.0.113.9"},
		{name: "NilResolverTrustsNobody", resolver: func() *IPResolver { return nil }, remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "10.0.0.1"},
		{name: "EmptyResolverTrustsNobody", resolver: func() *IPResolver { return NewIPResolver(nil) }, remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "10.0.0.1"},

		// A trusted peer.
		{name: "TrustedPeerNoHeaders", remoteAddr: "10.0.0.1:1", want: "10.0.0.1"},
		{name: "XFFOne", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XFFRightMostUntrusted", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"1.1.1.1, 198.51.100.1, 10.0.0.2, 10.0.0.3"}}, want: "198.51.100.1"},
		{name: "XFFSpoofedLeftIgnored", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"10.9.9.9, 198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XFFMultipleLines", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"1.1.1.1, 2.2.2.2", "198.51.100.1, 10.0.0.2", "10.0.0.3"}}, want: "198.51.100.1"},
		{name: "XFFMultipleLinesLastWins", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"1.1.1.1", "198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XFFPorts", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"1.1.1.1, 198.51.100.1:5678, 10.0.0.2:443"}}, want: "198.51.100.1"},
		{name: "XFFIPv6Port", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"[2001:db8::1]:443"}}, want: "2001:db8::1"},
		{name: "XFFIPv6Bracketed", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"[2001:db8::1]"}}, want: "2001:db8::1"},
		{name: "XFFIPv6TrustedSkipped", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"2001:db8::1, 2001:db8:ffff::7"}}, want: "2001:db8::1"},
		{name: "XFFSpacesAndTabs", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {" \t198.51.100.1 \t,\t 10.0.0.2 "}}, want: "198.51.100.1"},
		{name: "XFFEmptyEntriesSkipped", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1,, ,10.0.0.2,", ""}}, want: "198.51.100.1"},
		{name: "XFFIPv4Mapped", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"::ffff:198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XFFIPv4MappedTrustedSkipped", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1, ::ffff:10.0.0.2"}}, want: "198.51.100.1"},
		{name: "XFFZoneDropped", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"fe80::7%eth0"}}, want: "fe80::7"},
		{name: "TrustedIPv4MappedPeer", remoteAddr: "[::ffff:10.0.0.1]:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "198.51.100.1"},
		{name: "TrustedIPv6Peer", remoteAddr: "[2001:db8:ffff::1]:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}}, want: "198.51.100.1"},

		// Garbage ends the walk; nothing left of it wins.
		{name: "GarbageRightMostFallsBackToPeer", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6, unknown"}}, want: "10.0.0.1"},
		{name: "GarbageFallsBackToLastTrustedHop", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6, _hidden, 10.0.0.2"}}, want: "10.0.0.2"},
		{name: "GarbageAcrossLines", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6", "1.2.3.4:99999"}}, want: "10.0.0.1"},
		{name: "GarbageIgnoresXRealIP", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6, garbage"}, "X-Real-Ip": {"7.7.7.7"}}, want: "10.0.0.1"},
		{name: "GarbageLeftOfClientIrrelevant", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"garbage, 198.51.100.1"}}, want: "198.51.100.1"},
		{name: "GarbageBracketedIPv4", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6, [1.2.3.4]"}}, want: "10.0.0.1"},

		// X-Real-IP when X-Forwarded-For names no untrusted hop.
		{name: "XRealIP", remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XRealIPPortAndMapped", remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {" [::ffff:198.51.100.1]:80 "}}, want: "198.51.100.1"},
		{name: "XRealIPLastLine", remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"6.6.6.6", "198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XRealIPLosesToXFF", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"198.51.100.1"}, "X-Real-Ip": {"7.7.7.7"}}, want: "198.51.100.1"},
		{name: "XRealIPWhenXFFAllTrusted", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"10.0.0.3, 10.0.0.2"}, "X-Real-Ip": {"198.51.100.1"}}, want: "198.51.100.1"},
		{name: "XFFAllTrustedLeftMost", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"10.0.0.3, 10.0.0.2"}}, want: "10.0.0.3"},
		{name: "XRealIPGarbage", remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"unknown"}}, want: "10.0.0.1"},
		{name: "XRealIPList", remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"198.51.100.1, 6.6.6.6"}}, want: "10.0.0.1"},
		{name: "XRealIPGarbageXFFAllTrusted", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"10.0.0.2"}, "X-Real-Ip": {"nope"}}, want: "10.0.0.2"},

		// CLIENT_IP_HEADER=X-Real-IP: that header only. The nginx case: the proxy sets X-Real-IP
		// to the client's address and passes the client's own X-Forwarded-For through.
		{name: "NginxDefaultLetsClientXFFWin", remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6"}, "X-Real-Ip": {"198.51.100.1"}}, want: "6.6.6.6"},
		{name: "NginxRealIPHeader", resolver: realIP, remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6"}, "X-Real-Ip": {"198.51.100.1"}}, want: "198.51.100.1"},
		{name: "RealIPHeaderLastLine", resolver: realIP, remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"6.6.6.6", "198.51.100.1"}}, want: "198.51.100.1"},
		{name: "RealIPHeaderPort", resolver: realIP, remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"[2001:db8::1]:443"}}, want: "2001:db8::1"},
		{name: "RealIPHeaderAbsentIgnoresXFF", resolver: realIP, remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6"}}, want: "10.0.0.1"},
		{name: "RealIPHeaderGarbage", resolver: realIP, remoteAddr: "10.0.0.1:1", header: headers{"X-Real-Ip": {"unknown"}, "X-Forwarded-For": {"6.6.6.6"}}, want: "10.0.0.1"},
		{name: "RealIPHeaderUntrustedPeer", resolver: realIP, remoteAddr: "203.0.113.9:1", header: headers{"X-Real-Ip": {"198.51.100.1"}}, want: "203.0.113.9"},
		{name: "ForwardedForHeaderExplicit", resolver: func() *IPResolver { return resolver.WithHeader(HeaderXForwardedFor) }, remoteAddr: "10.0.0.1:1", header: headers{"X-Forwarded-For": {"6.6.6.6"}, "X-Real-Ip": {"198.51.100.1"}}, want: "6.6.6.6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			r := resolver
			if tt.resolver != nil {
				r = tt.resolver()
			}
			got := r.ClientIP(tt.remoteAddr, http.Header(tt.header))
			if tt.want == "" {
				require.False(t, got.IsValid(), "got %s", got)
				return
			}
			require.Equal(t, netip.MustParseAddr(tt.want), got)
		})
	}
}

// An untrusted peer is the client whatever its headers say: the property behind every limit.
func TestIPResolver_ClientIP_UntrustedPeerIgnoresHeaders(t *testing.T) {
	t.Parallel()

	forwardedFor := NewIPResolver([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	realIP := forwardedFor.WithHeader(HeaderXRealIP)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)

	for range 2000 {
		peer := randomAddr(rng)
		if forwardedFor.isTrusted(peer) {
			continue
		}
		h := http.Header{}
		for range rng.IntN(4) {
			h.Add("X-Forwarded-For", randomHeaderValue(rng))
		}
		for range rng.IntN(3) {
			h.Add("X-Real-Ip", randomHeaderValue(rng))
		}
		remoteAddr := netip.AddrPortFrom(peer, uint16(rng.IntN(65536))).String()
		for _, resolver := range []*IPResolver{forwardedFor, realIP} {
			require.Equal(t, peer, resolver.ClientIP(remoteAddr, h), "peer %s headers %v", remoteAddr, h)
		}
	}
}

func TestParseClientIPHeader(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]ClientIPHeader{
		"":                HeaderXForwardedFor,
		"X-Forwarded-For": HeaderXForwardedFor,
		"x-forwarded-for": HeaderXForwardedFor,
		"X-Real-IP":       HeaderXRealIP,
		"x-real-ip":       HeaderXRealIP,
		"X-Real-Ip":       HeaderXRealIP,
	} {
		got, err := ParseClientIPHeader(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"Forwarded", "X-Client-IP", "CF-Connecting-IP", " X-Real-IP", "X-Real-IP,X-Forwarded-For"} {
		_, err := ParseClientIPHeader(in)
		require.ErrorContains(t, err, "want X-Forwarded-For or X-Real-IP", in)
	}
}

func TestIPResolver_TrustsPeer(t *testing.T) {
	t.Parallel()

	resolver := NewIPResolver([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")})
	for remoteAddr, want := range map[string]bool{
		"10.1.2.3:443":          true,
		"[::ffff:10.1.2.3]:443": true,
		"[fd00::1]:443":         true,
		"10.1.2.3":              true,
		"192.0.2.1:443":         false,
		"@":                     false,
		"":                      false,
	} {
		require.Equal(t, want, resolver.TrustsPeer(remoteAddr), remoteAddr)
	}
	require.False(t, NewIPResolver(nil).TrustsPeer("10.1.2.3:443"))
	require.False(t, (*IPResolver)(nil).TrustsPeer("10.1.2.3:443"))
}

func randomAddr(rng *rand.Rand) netip.Addr {
	switch rng.IntN(4) {
	case 0:
		return netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
	case 1, 2:
		var b [4]byte
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return netip.AddrFrom4(b)
	default:
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return netip.AddrFrom16(b).Unmap()
	}
}

func randomHeaderValue(rng *rand.Rand) string {
	parts := make([]string, rng.IntN(5))
	for i := range parts {
		switch rng.IntN(5) {
		case 0:
			parts[i] = randomAddr(rng).String()
		case 1:
			parts[i] = netip.AddrPortFrom(randomAddr(rng), uint16(rng.IntN(65536))).String()
		case 2:
			parts[i] = "10.0.0." + strconv.Itoa(rng.IntN(256))
		case 3:
			parts[i] = " unknown "
		default:
			b := make([]byte, rng.IntN(12))
			for j := range b {
				b[j] = byte(rng.IntN(256))
			}
			parts[i] = string(b)
		}
	}
	return strings.Join(parts, ",")
}

func TestBucketKey(t *testing.T) {
	t.Parallel()

	key := func(s string) string { return BucketKey(netip.MustParseAddr(s)) }

	t.Run("IPv4", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, "192.0.2.7", key("192.0.2.7"))
		require.Equal(t, "192.0.2.7", key("::ffff:192.0.2.7"), "IPv4-mapped counts as IPv4")
		require.NotEqual(t, key("192.0.2.7"), key("192.0.2.8"))
	})

	t.Run("IPv6SameSlash64", func(t *testing.T) {
		t.Parallel()

		a, b := key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:ffff:ffff:ffff")
		require.Equal(t, a, b)
		require.Equal(t, "2001:db8:1:2::/64", a)
		require.Equal(t, a, key("2001:db8:1:2::3%eth0"), "zone ignored")
	})

	t.Run("IPv6OtherSlash64", func(t *testing.T) {
		t.Parallel()

		require.NotEqual(t, key("2001:db8:1:2::1"), key("2001:db8:1:3::1"))
		require.NotEqual(t, key("2001:db8:1:2::1"), key("2001:db9:1:2::1"))
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, "invalid", BucketKey(netip.Addr{}))
	})
}
