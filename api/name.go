package api

import (
	"net/netip"
	"strings"
	"unicode"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
	"golang.org/x/text/unicode/norm"
)

// A name is shown in mail sent to an address nobody has verified yet, so it must not carry a
// message a stranger wants delivered: a link, an address to write to, a domain to visit, or
// characters that hide or reorder text (U+202E turns "moc.evil" into "live.com" on screen).

// invisibleInName reports the characters a name may not hold: control (Cc), format (Cf, the
// bidirectional overrides and zero-width characters among them), line and paragraph separators
// (Zl, Zp).
func invisibleInName(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

// urlSchemes start a token that a mail client would turn into a link even without "//".
var urlSchemes = []string{"http:", "https:", "ftp:", "mailto:", "javascript:", "data:", "file:", "tel:", "sms:"}

// reservedTLDs are top-level names the public suffix list does not hold but that read as
// domains all the same (RFC 2606, RFC 6761, RFC 7686 and common internal ones).
var reservedTLDs = map[string]bool{
	"example": true, "test": true, "invalid": true, "localhost": true,
	"local": true, "onion": true, "internal": true,
}

// nameCarriesLink reports whether name holds a URL, an email address or a domain name. It looks
// at name the way a reader and a mail client would: compatibility forms folded (fullwidth
// "ｅｖｉｌ．ｃｏｍ" is evil.com), ideographic full stops read as dots, case ignored. A domain
// name is a word of letters, digits and hyphens with dots inside it (not only at its end, as in
// "Dr." or "J. R. R.") whose last label is a top-level domain, or which starts with "www."; a
// dotted IPv4 address counts too. "Dr. Ada" and "J. R. R. Tolkien" are names; "paypal.com" is
// not.
func nameCarriesLink(name string) bool {
	folded := strings.ToLower(strings.Map(func(r rune) rune {
		if r == '\u3002' { // ideographic full stop, which IDNA reads as a dot
			return '.'
		}
		return r
	}, norm.NFKC.String(name)))

	if strings.Contains(folded, "@") || strings.Contains(folded, "://") {
		return true
	}
	for _, word := range strings.Fields(folded) {
		for _, scheme := range urlSchemes {
			if strings.HasPrefix(strings.TrimLeft(word, "<(\"'[{"), scheme) {
				return true
			}
		}
	}

	hostChar := func(r rune) bool {
		return r == '.' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r)
	}
	for _, word := range strings.FieldsFunc(folded, func(r rune) bool { return !hostChar(r) }) {
		word = strings.Trim(word, ".-")
		if strings.HasPrefix(word, "www.") {
			return true
		}
		if !strings.Contains(word, ".") {
			continue
		}
		if addr, err := netip.ParseAddr(word); err == nil && addr.Is4() {
			return true
		}
		labels := strings.Split(word, ".")
		tld, err := idna.Lookup.ToASCII(labels[len(labels)-1])
		if err != nil || tld == "" {
			continue
		}
		if reservedTLDs[tld] {
			return true
		}
		if suffix, icann := publicsuffix.PublicSuffix(tld); icann && suffix == tld {
			return true
		}
	}
	return false
}
