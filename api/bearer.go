package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// bearerAuth checks the request's bearer token against token in constant time: it compares
// SHA-256 digests (equal lengths whatever was sent). Without the header, or with another token,
// the answer is unauthorized (a 401) with a WWW-Authenticate Bearer challenge of realm (RFC
// 6750). Cookies are never read: a browser cannot lend its credentials to another site's page.
// Every answer of the routes behind it is no-store. The admin API and the limits API use it.
func bearerAuth(token, realm string, unauthorized *Error) handlerFunc {
	want := sha256.Sum256([]byte(token))
	return func(c *gin.Context) error {
		c.Header("Cache-Control", "no-store")
		presented, ok := bearerToken(c.Request)
		got := sha256.Sum256([]byte(presented))
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 && ok {
			return nil
		}
		challenge := `Bearer realm="` + realm + `"`
		if ok {
			challenge += `, error="invalid_token"`
		}
		c.Header("WWW-Authenticate", challenge)
		return unauthorized
	}
}

// bearerToken is the token of an "Authorization: Bearer <token>" header (the scheme in any
// case); ok is false without one.
func bearerToken(r *http.Request) (token string, ok bool) {
	scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
