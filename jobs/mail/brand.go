package mail

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
)

// DefaultBrandColor is the colour of the buttons and links of the built-in mail and pages when
// APP_BRAND_COLOR is unset: a blue whose links reach 5.17:1 on white.
const DefaultBrandColor = "#2563eb"

// MinTextContrast is WCAG 2's level AA contrast for text of normal size (success criterion
// 1.4.3): the least contrast of the brand colour's links against white, and of a button's text
// against the brand colour.
const MinTextContrast = 4.5

// maxLogoURLLen bounds APP_LOGO_URL: it goes into every mail and page.
const maxLogoURLLen = 2048

// rgb is a colour of the sRGB space.
type rgb struct{ r, g, b uint8 }

var (
	white = rgb{0xff, 0xff, 0xff}
	black = rgb{0, 0, 0}
)

// parseHexColor reads #rrggbb (either case).
func parseHexColor(s string) (rgb, bool) {
	if len(s) != 7 || s[0] != '#' {
		return rgb{}, false
	}
	var channels [3]uint8
	for i := range channels {
		high, ok1 := hexDigit(s[1+2*i])
		low, ok2 := hexDigit(s[2+2*i])
		if !ok1 || !ok2 {
			return rgb{}, false
		}
		channels[i] = high<<4 | low
	}
	return rgb{channels[0], channels[1], channels[2]}, true
}

func hexDigit(c byte) (uint8, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// String is the colour as #rrggbb, in lower case.
func (c rgb) String() string { return fmt.Sprintf("#%02x%02x%02x", c.r, c.g, c.b) }

// luminance is WCAG 2's relative luminance of c: 0 for black, 1 for white.
func (c rgb) luminance() float64 {
	linear := func(v uint8) float64 {
		s := float64(v) / 255
		if s <= 0.04045 {
			return s / 12.92
		}
		return math.Pow((s+0.055)/1.055, 2.4)
	}
	return 0.2126*linear(c.r) + 0.7152*linear(c.g) + 0.0722*linear(c.b)
}

// contrast is WCAG 2's contrast ratio of two colours, from 1 (the same) to 21 (black on white).
func contrast(a, b rgb) float64 {
	la, lb := a.luminance(), b.luminance()
	if la < lb {
		la, lb = lb, la
	}
	return (la + 0.05) / (lb + 0.05)
}

// textColorOn is the colour of text on a background of bg: white or black, whichever contrasts
// more. The two contrasts multiply to 21, so the better one is always at least √21 ≈ 4.58:1,
// above MinTextContrast, whatever the brand colour.
func textColorOn(bg rgb) rgb {
	if contrast(white, bg) >= contrast(black, bg) {
		return white
	}
	return black
}

// darkenFor is the lightest shade of c (each channel scaled by one factor, so the hue stays)
// whose contrast against white reaches minimum: a suggestion for a brand colour too light for
// links.
func darkenFor(c rgb, minimum float64) rgb {
	scale := func(f float64) rgb {
		return rgb{uint8(float64(c.r) * f), uint8(float64(c.g) * f), uint8(float64(c.b) * f)}
	}
	for f := 1.0; f > 0; f -= 0.01 {
		if shade := scale(f); contrast(shade, white) >= minimum {
			return shade
		}
	}
	return black
}

// CheckBrandColor says why color cannot be APP_BRAND_COLOR: it must be #rrggbb, and dark enough
// for links in it to reach MinTextContrast against white (the background of the pages and of a
// mail's body); a button's text is white or black, whichever suits it, so any colour works
// there. A colour too light is refused rather than changed, with a darker shade of it that
// passes: links people cannot read are worse than a start-up error.
func CheckBrandColor(color string) error {
	c, ok := parseHexColor(color)
	if !ok {
		return fmt.Errorf("%q is not a colour of the form #rrggbb (such as %s)", color, DefaultBrandColor)
	}
	if ratio := contrast(c, white); ratio < MinTextContrast {
		return fmt.Errorf("%s gives links a contrast of %s:1 on white, under the %.1f:1 that WCAG AA asks of text; a darker shade such as %s reaches it",
			color, formatRatio(ratio), MinTextContrast, darkenFor(c, MinTextContrast))
	}
	return nil
}

// formatRatio prints a contrast ratio rounded down to two decimals, so that a refused ratio never
// prints as the minimum.
func formatRatio(ratio float64) string {
	return fmt.Sprintf("%.2f", math.Floor(ratio*100)/100)
}

// CheckLogoURL says why raw cannot be APP_LOGO_URL: it must be an absolute http or https URL
// whose host is a domain name or an IPv4 address (a Content-Security-Policy names its origin,
// and CSP has no syntax for IPv6 literals or non-ASCII names), of at most 2048 bytes.
func CheckLogoURL(raw string) error {
	_, err := logoOrigin(raw)
	return err
}

// logoOrigin is the origin of a logo URL, as a CSP source (scheme://host[:port]).
func logoOrigin(raw string) (string, error) {
	u, err := url.Parse(raw)
	switch {
	case len(raw) > maxLogoURLLen:
		return "", fmt.Errorf("is %d bytes; at most %d", len(raw), maxLogoURLLen)
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("%q is not an absolute http or https URL (such as https://acme.example/logo.png)", raw)
	case u.User != nil:
		return "", fmt.Errorf("%q carries credentials; a logo must load without them", raw)
	case strings.Trim(u.Hostname(), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != "":
		return "", fmt.Errorf("%q: the host must be an ASCII domain name or an IPv4 address (Punycode for an international name)", raw)
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}

// checkLinkURL says why raw cannot be a link of the pages (APP_LOGIN_URL): it must be an
// absolute http or https URL.
func checkLinkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Opaque != "" {
		return errors.New("is not an absolute http or https URL")
	}
	return nil
}
