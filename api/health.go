package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// readyTimeout bounds the database ping of /readyz: a probe must answer quickly, and a database
// that takes longer is not ready for traffic.
const readyTimeout = 2 * time.Second

// openAPIDocument is the contract of this router, served at /openapi.yaml; the tests check
// every answer against it.
//
//go:embed openapi.yaml
var openAPIDocument []byte

// healthz is liveness: the process answers, whatever the database does.
func (s *server) healthz(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	c.Data(http.StatusOK, mediaJSON, []byte(`{"status":"ok"}`))
}

// readyz is readiness: 200 while the database takes a small write (its heartbeat) within
// readyTimeout, else 503. A ping would pass on a database that answers but cannot be written (a
// read-only PostgreSQL after a failover, a full or failing SQLite file), where every request
// that writes would fail.
func (s *server) readyz(c *gin.Context) error {
	c.Header("Cache-Control", "no-store")
	ctx, cancel := context.WithTimeout(c.Request.Context(), readyTimeout)
	defer cancel()
	if err := s.store.Ready(ctx); err != nil {
		return newError(http.StatusServiceUnavailable, "The database is unreachable or cannot be written.").withCause(err)
	}
	c.Data(http.StatusOK, mediaJSON, []byte(`{"status":"ready"}`))
	return nil
}

// serveOpenAPI serves the embedded OpenAPI document.
func serveOpenAPI(c *gin.Context) {
	c.Data(http.StatusOK, "application/yaml", openAPIDocument)
}

// mountRiverUI mounts River UI's handler at /riverui/ behind HTTP basic auth, and redirects
// /riverui there. The handler gets the whole path (it was created with the prefix /riverui).
func (s *server) mountRiverUI(engine *gin.Engine, handler http.Handler, username, password string) {
	engine.GET("/riverui", func(c *gin.Context) {
		c.Redirect(http.StatusMovedPermanently, "/riverui/")
	})
	engine.Any("/riverui/*path", s.handle(basicAuth(username, password)), gin.WrapH(handler))
}

// basicAuth checks HTTP basic credentials in constant time: it compares SHA-256 digests (equal
// lengths whatever was sent), user and password both, without short-circuiting. A failure is a
// 401 problem with a Basic challenge.
func basicAuth(username, password string) handlerFunc {
	wantUser, wantPass := sha256.Sum256([]byte(username)), sha256.Sum256([]byte(password))
	return func(c *gin.Context) error {
		user, pass, ok := c.Request.BasicAuth()
		gotUser, gotPass := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pass))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:])
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:])
		if ok && userOK&passOK == 1 {
			return nil
		}
		c.Header("WWW-Authenticate", `Basic realm="River UI"`)
		return errUnauthorized
	}
}
