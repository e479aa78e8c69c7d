package email

import (
	"errors"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/text/unicode/norm"
)

// MaxBytes is the longest address accepted (RFC 5321's path limit less the angle brackets).
const MaxBytes = 254

// ErrInvalid is returned by Normalize for anything that is not a plain address.
var ErrInvalid = errors.New("invalid email address")

// emailDomains maps a domain to the ASCII form mail is routed by, as UTS #46 says for lookup:
// width and compatibility forms folded, case mapped, U-labels to A-labels (non-transitional: ß
// stays ß), A-labels checked, STD3 rules (letters, digits, hyphens), Bidi and joiner rules, and
// DNS lengths (no empty label, none over 63 bytes).
var emailDomains = idna.New(
	idna.MapForLookup(),
	idna.Transitional(false),
	idna.BidiRule(),
	idna.CheckHyphens(true),
	idna.CheckJoiners(true),
	idna.VerifyDNSLength(true),
)

// Normalize returns an address's normal form: the form in which it is stored, looked up,
// counted by the rate limiter, keyed on the suppression list and mailed to, whoever gave it (a
// request, a provider's event, a host app's Recipients): trimmed of surrounding white space, in
// Unicode NFC, lower-cased, and its domain mapped to its ASCII form with IDNA (UTS #46, see
// emailDomains), so that ada@bücher.de, ada@xn--bcher-kva.de and ada@ｅxample.com's twin
// ada@example.com are one address. It then checks that the result is one plain address: valid UTF-8 of visible
// characters only (no spaces, format or control characters, no U+FFFD), at most 254 bytes,
// exactly one "@" with a non-empty local part, a domain name of at least two labels (no address
// literal such as [127.0.0.1], no dotless name such as example or localhost), and an addr-spec
// that net/mail.ParseAddress reads back unchanged (so no display name, angle brackets, comments
// or quoting). It returns ErrInvalid otherwise.
//
// Lower-casing the local part is a deliberate simplification (docs/api.md): two spellings of one
// mailbox must not make two accounts, two rate-limit buckets or two entries of the suppression
// list.
func Normalize(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", ErrInvalid
	}
	s = strings.ToLower(norm.NFC.String(strings.TrimSpace(s)))
	// Lower-casing can change a string's normal form ("İ" becomes "i" + U+0307); normalise again
	// so the result is a fixed point.
	s = norm.NFC.String(s)
	if s == "" || len(s) > MaxBytes {
		return "", ErrInvalid
	}
	// net/mail takes any non-ASCII rune as atom text, including invisible and spacing ones
	// (U+200B, U+202E, U+00A0) that would let two different-looking addresses collide or one
	// spoof another, and U+FFFD, which is what invalid input decodes to.
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) || unicode.IsSpace(r) {
			return "", ErrInvalid
		}
	}
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || domain == "" || strings.Contains(domain, "@") {
		return "", ErrInvalid
	}
	// An address literal names a host, not a domain anyone registered; mail to one goes
	// wherever the literal points (a loopback or internal address included).
	if strings.HasPrefix(domain, "[") {
		return "", ErrInvalid
	}
	domain, err := emailDomains.ToASCII(domain)
	if err != nil || !strings.Contains(domain, ".") || strings.HasSuffix(domain, ".") {
		return "", ErrInvalid
	}
	// No top-level domain is all digits: such a domain is an IPv4 address without brackets.
	if tld := domain[strings.LastIndexByte(domain, '.')+1:]; strings.Trim(tld, "0123456789") == "" {
		return "", ErrInvalid
	}
	s = local + "@" + domain
	if len(s) > MaxBytes {
		return "", ErrInvalid
	}
	addr, err := mail.ParseAddress(s)
	if err != nil || addr.Name != "" || addr.Address != s {
		return "", ErrInvalid
	}
	return s, nil
}
