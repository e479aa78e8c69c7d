package api

import (
	"net/http"

	"golang.org/x/text/language"
)

// maxLocaleLen bounds register's locale: BCP 47 asks implementations to handle tags of at least
// 35 characters; a longer one is extensions nobody's mail needs.
const maxLocaleLen = 64

// checkLocale validates register's optional locale, a BCP 47 language tag, and returns its
// canonical form ("fr-ca" → "fr-CA"); "" when absent.
func checkLocale(raw string, fieldErrs *[]fieldError) string {
	if raw == "" {
		return ""
	}
	tag, err := language.Parse(raw)
	if err != nil || len(raw) > maxLocaleLen {
		*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/locale", Detail: "Locale must be a BCP 47 language tag, such as fr or pt-BR."})
		return ""
	}
	return tag.String()
}

// acceptLanguageLocale returns the first language of the request's Accept-Language (the one of
// highest q), in canonical form; "" when the header is absent, malformed or names none (`*`).
// Best effort: a header the client sent carelessly never fails a request.
func acceptLanguageLocale(r *http.Request) string {
	header := r.Header.Get("Accept-Language")
	if header == "" || len(header) > 1024 {
		return ""
	}
	tags, _, err := language.ParseAcceptLanguage(header)
	if err != nil {
		return ""
	}
	for _, tag := range tags {
		if s := tag.String(); s != "und" && s != "mul" && len(s) <= maxLocaleLen {
			return s
		}
	}
	return ""
}
