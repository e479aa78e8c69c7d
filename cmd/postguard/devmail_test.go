package main

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
)

// otherAddrs are this machine's addresses on interfaces other than loopback (its LAN and IPv6
// addresses, fd00::2 say): a client that connects to one of them is, to the server, a peer
// that is not a loopback address, as a client on another machine would be.
func otherAddrs(t *testing.T) []net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	var ips []net.IP
	for _, addr := range addrs {
		ipNet, ok := addr.(*net.IPNet)
		if ok && ipNet.IP.IsGlobalUnicast() {
			ips = append(ips, ipNet.IP)
		}
	}
	return ips
}

// TestServe_DevMailOnlyFromThisMachine replays the third review's attack on `serve` with make
// run's defaults (MAILER=log, a loopback APP_URL) listening on every interface: a
// forgot-password for a victim, then /dev/mail and the reset mail's own page (its live link)
// from a client that is not on this machine, through a trusted proxy that says the client is
// 127.0.0.1, and from this machine with the Host of a DNS-rebinding page. Each gets 404; a
// request from this machine to localhost still reads the mail.
func TestServe_DevMailOnlyFromThisMachine(t *testing.T) {
	t.Parallel()

	others := otherAddrs(t)
	var trusted []string
	for _, ip := range others {
		trusted = append(trusted, ip.String())
	}
	server := startServer(t, service.RoleServe, map[string]string{
		"DATABASE_URL":            "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":                  "log",
		"HTTP_ADDR":               ":0",
		"TRUSTED_PROXIES":         strings.Join(trusted, ","),
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "50ms",
	})
	_, port, err := net.SplitHostPort(strings.TrimPrefix(server.URL, "http://"))
	require.NoError(t, err)
	loopback := "http://127.0.0.1:" + port

	status, body := opsRegister(t, loopback, "victim@example.com")
	require.Equal(t, http.StatusCreated, status, body)
	status, body = opsPost(t, loopback+"/v1/auth/forgot-password", `{"email":"victim@example.com"}`)
	require.Equal(t, http.StatusAccepted, status, body)
	resetMail := regexp.MustCompile(`kind=password_reset_email .*url=\S+(/dev/mail/log_\w+)`)
	require.Eventually(t, func() bool { return resetMail.MatchString(server.Logs.String()) },
		30*time.Second, 50*time.Millisecond, "reset mail not kept; logs:\n%s", server.Logs.String())
	paths := []string{"/dev/mail", resetMail.FindStringSubmatch(server.Logs.String())[1]}

	get := func(t *testing.T, base, path, host, forwardedFor string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Host = host
		if forwardedFor != "" {
			req.Header.Set("X-Forwarded-For", forwardedFor)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	// This machine, asking for localhost: the mail, with its live link.
	status, body = get(t, loopback, paths[1], "localhost:"+port, "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "/v1/auth/reset-password?token=")
	status, _ = get(t, "http://[::1]:"+port, paths[0], "[::1]:"+port, "")
	require.Equal(t, http.StatusOK, status)

	for _, path := range paths {
		// This machine's browser, driven by a page whose name now resolves to 127.0.0.1.
		status, body = get(t, loopback, path, "evil.example:"+port, "")
		require.Equal(t, http.StatusNotFound, status, "%s with Host evil.example", path)
		require.NotContains(t, body, "token=")

		for _, ip := range others {
			base := "http://" + net.JoinHostPort(ip.String(), port)
			status, body = get(t, base, path, "localhost:"+port, "")
			require.Equal(t, http.StatusNotFound, status, "%s from %s", path, ip)
			require.NotContains(t, body, "token=")
			status, _ = get(t, base, path, "localhost:"+port, "127.0.0.1")
			require.Equal(t, http.StatusNotFound, status, "%s from %s, forwarded for 127.0.0.1", path, ip)
		}
	}
	if len(others) == 0 {
		t.Log("this machine has no address but loopback ones: only the DNS-rebinding request was tried (api's TestServer_DevMail tries other peers)")
	}
	require.NoError(t, server.stop(t))
}
