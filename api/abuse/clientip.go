package abuse

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// ParseTrustedProxies parses TRUSTED_PROXIES: IP addresses or CIDR prefixes separated by commas
// and/or spaces ("10.0.0.0/8, 192.168.1.7 fd00::/8"). An empty string trusts nobody (nil, nil).
// A single IP becomes a /32 or /128; IPv4-mapped IPv6 entries are unmapped (clients are unmapped
// before they are compared) and zones are dropped.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
	})
	prefixes := make([]netip.Prefix, 0, len(fields))
	for _, field := range fields {
		var prefix netip.Prefix
		if strings.Contains(field, "/") {
			p, err := netip.ParsePrefix(field)
			if err != nil {
				return nil, fmt.Errorf("invalid trusted proxy %q: want an IP (10.0.0.7) or a CIDR prefix (10.0.0.0/8): %w", field, err)
			}
			prefix = p
		} else {
			addr, err := netip.ParseAddr(field)
			if err != nil {
				return nil, fmt.Errorf("invalid trusted proxy %q: want an IP (10.0.0.7) or a CIDR prefix (10.0.0.0/8): %w", field, err)
			}
			addr = addr.WithZone("")
			prefix = netip.PrefixFrom(addr, addr.BitLen())
		}
		prefixes = append(prefixes, normalizePrefix(prefix))
	}
	if len(prefixes) == 0 {
		return nil, nil
	}
	return prefixes, nil
}

// normalizePrefix masks a prefix and turns an IPv4-mapped IPv6 prefix of at least /96 into its
// IPv4 prefix, since addresses are unmapped before they are compared.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// ClientIPHeader names the header a trusted proxy's client address is read from
// (CLIENT_IP_HEADER).
type ClientIPHeader string

const (
	// HeaderXForwardedFor reads X-Forwarded-For, the default: the right-most entry of all its
	// lines that is not a trusted proxy, and X-Real-IP only when X-Forwarded-For names no such
	// entry (see IPResolver.ClientIP). For proxies that append the client's address to it.
	HeaderXForwardedFor ClientIPHeader = "X-Forwarded-For"
	// HeaderXRealIP reads X-Real-IP only, for a proxy that sets it to the client's address and
	// passes the client's own X-Forwarded-For through untouched (a common nginx setup, where
	// the client would otherwise write the entry that wins).
	HeaderXRealIP ClientIPHeader = "X-Real-IP"
)

// ParseClientIPHeader parses CLIENT_IP_HEADER: X-Forwarded-For or X-Real-IP, in any case (header
// names are case-insensitive); "" is X-Forwarded-For.
func ParseClientIPHeader(s string) (ClientIPHeader, error) {
	switch {
	case s == "", strings.EqualFold(s, string(HeaderXForwardedFor)):
		return HeaderXForwardedFor, nil
	case strings.EqualFold(s, string(HeaderXRealIP)):
		return HeaderXRealIP, nil
	}
	return "", fmt.Errorf("invalid client IP header %q: want %s or %s", s, HeaderXForwardedFor, HeaderXRealIP)
}

// IPResolver finds the client IP of a request from its TCP peer and, when the peer is a trusted
// proxy, the header that proxy sets. A nil *IPResolver trusts nobody.
type IPResolver struct {
	trusted []netip.Prefix
	header  ClientIPHeader // "" is HeaderXForwardedFor
}

// NewIPResolver returns a resolver that believes X-Forwarded-For and X-Real-IP only from peers
// inside trusted (see ParseTrustedProxies). nil or empty trusts nobody: the client is the peer.
func NewIPResolver(trusted []netip.Prefix) *IPResolver {
	r := &IPResolver{trusted: make([]netip.Prefix, 0, len(trusted))}
	for _, p := range trusted {
		if p.IsValid() {
			r.trusted = append(r.trusted, normalizePrefix(p))
		}
	}
	return r
}

// WithHeader returns a copy of r that reads a trusted proxy's client address from header
// (HeaderXForwardedFor when "").
func (r *IPResolver) WithHeader(header ClientIPHeader) *IPResolver {
	out := &IPResolver{header: header}
	if r != nil {
		out.trusted = r.trusted
	}
	return out
}

// Trusted returns a copy of the trusted prefixes, normalised.
func (r *IPResolver) Trusted() []netip.Prefix {
	if r == nil {
		return nil
	}
	return slices.Clone(r.trusted)
}

// TrustsPeer reports whether the TCP peer of a request (its RemoteAddr) is a trusted proxy,
// whose other forwarding headers (X-Forwarded-Proto) may then be believed too.
func (r *IPResolver) TrustsPeer(remoteAddr string) bool {
	peer, ok := parseHostAddr(remoteAddr)
	return ok && r.isTrusted(peer)
}

// isTrusted reports whether addr (already normalised) is a trusted proxy.
func (r *IPResolver) isTrusted(addr netip.Addr) bool {
	if r == nil {
		return false
	}
	for _, p := range r.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// ClientIP returns the client address of a request, from its RemoteAddr ("host:port", as
// net/http sets it; a bare IP is accepted) and headers:
//
//   - When the peer is not a trusted proxy, the peer, whatever the headers say.
//   - With HeaderXRealIP, the last X-Real-IP line if it parses, else the peer; X-Forwarded-For
//     is not read at all.
//   - Otherwise X-Forwarded-For, all its header lines in order, their comma-separated entries
//     walked from the right: trusted entries are skipped, and the first untrusted one is the
//     client. Entries may carry a port ("1.2.3.4:5678", "[2001:db8::1]:443") and spaces; empty
//     entries are skipped.
//   - An unparsable entry ("unknown", an obfuscated id, junk) ends the walk: the result is then
//     the last trusted hop walked past, or the peer. The walk never goes left of garbage, because
//     everything left of the first entry a trusted proxy did not vouch for may have been written
//     by the client; skipping it would let a spoofed left-side value win.
//   - When X-Forwarded-For holds no untrusted entry (absent, empty, or trusted hops only), the last
//     X-Real-IP line if it parses, else the left-most trusted hop of X-Forwarded-For, else the
//     peer.
//
// Every address is normalised: IPv4-mapped IPv6 is unmapped and zones are dropped. The result is
// invalid (the zero netip.Addr) only when RemoteAddr itself does not parse (e.g. a Unix socket);
// headers are never believed then, and BucketKey puts all such requests in one bucket.
func (r *IPResolver) ClientIP(remoteAddr string, h http.Header) netip.Addr {
	peer, ok := parseHostAddr(remoteAddr)
	if !ok {
		return netip.Addr{}
	}
	if !r.isTrusted(peer) {
		return peer
	}
	if r.header == HeaderXRealIP {
		if lines := h.Values("X-Real-Ip"); len(lines) > 0 {
			if addr, ok := parseHostAddr(lines[len(lines)-1]); ok {
				return addr
			}
		}
		return peer
	}

	var lastTrusted netip.Addr
	lines := h.Values("X-Forwarded-For")
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for rest != "" {
			var entry string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				entry, rest = rest[j+1:], rest[:j]
			} else {
				entry, rest = rest, ""
			}
			if strings.Trim(entry, " \t") == "" {
				continue
			}
			addr, ok := parseHostAddr(entry)
			if !ok {
				if lastTrusted.IsValid() {
					return lastTrusted
				}
				return peer
			}
			if !r.isTrusted(addr) {
				return addr
			}
			lastTrusted = addr
		}
	}

	if lines := h.Values("X-Real-Ip"); len(lines) > 0 {
		if addr, ok := parseHostAddr(lines[len(lines)-1]); ok {
			return addr
		}
	}
	if lastTrusted.IsValid() {
		return lastTrusted
	}
	return peer
}

// parseHostAddr parses an address as found in RemoteAddr or a forwarding header: a bare IP, an
// IP with a port ("1.2.3.4:80", "[::1]:80") or a bracketed IPv6 without port, surrounded by
// optional spaces or tabs. The result is unmapped and has no zone.
func parseHostAddr(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	if s == "" {
		return netip.Addr{}, false
	}
	// Pick the one parser that can succeed, so that the common shapes never pay for a failed
	// parse (its error allocates): a bare IPv4 has no colon, IPv4:port exactly one, a bare IPv6
	// at least two, and a bracketed IPv6 starts with '['.
	switch {
	case s[0] == '[':
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return normalizeAddr(ap.Addr()), true
		}
		if s[len(s)-1] == ']' {
			if addr, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && addr.Is6() {
				return normalizeAddr(addr), true
			}
		}
	case strings.Count(s, ":") == 1:
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return normalizeAddr(ap.Addr()), true
		}
	default:
		if addr, err := netip.ParseAddr(s); err == nil {
			return normalizeAddr(addr), true
		}
	}
	return netip.Addr{}, false
}

func normalizeAddr(addr netip.Addr) netip.Addr {
	return addr.Unmap().WithZone("")
}

// BucketKey is the value an IP is counted under: the IPv4 address ("192.0.2.7"), or the /64 of
// an IPv6 address ("2001:db8:1:2::/64"), because one IPv6 subscriber usually holds a whole /64
// and could otherwise rotate through it. IPv4-mapped IPv6 counts as IPv4; zones are ignored. An
// invalid address (unknown peer) yields "invalid", one shared bucket.
func BucketKey(addr netip.Addr) string {
	if !addr.IsValid() {
		return "invalid"
	}
	addr = normalizeAddr(addr)
	if addr.Is4() {
		return addr.String()
	}
	prefix, err := addr.Prefix(64)
	if err != nil { // unreachable: 64 is within an IPv6 address
		return "invalid"
	}
	return prefix.String()
}
