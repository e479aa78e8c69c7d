package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// River UI credentials of the tests' servers.
const (
	opsRiverUIUser     = "ops-admin"
	opsRiverUIPassword = "correct horse battery staple"
)

// opsEngines runs fn as parallel subtests SQLite and Postgres, each given the environment of a
// `postguard serve` on a fresh database of that engine (PostgreSQL: a migrated schema of its own
// and an APP_SECRET; it skips when PostgreSQL is unreachable, and fails under CI=true).
func opsEngines(t *testing.T, fn func(t *testing.T, env map[string]string)) {
	t.Helper()

	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, map[string]string{"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db")})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, map[string]string{"DATABASE_URL": dbtest.PostgresURL(t), "APP_SECRET": strings.Repeat("s", 32)})
	})
}

// opsWithRiverUI adds the River UI credentials and a fast job fetch to env.
func opsWithRiverUI(env map[string]string) map[string]string {
	env["RIVERUI_USERNAME"] = opsRiverUIUser
	env["RIVERUI_PASSWORD"] = opsRiverUIPassword
	env["JOB_FETCH_COOLDOWN"] = "10ms"
	env["JOB_FETCH_POLL_INTERVAL"] = "50ms"
	return env
}

// opsRegister registers email and returns the answer's status and body.
func opsRegister(t *testing.T, baseURL, email string) (int, string) {
	t.Helper()

	body := fmt.Sprintf(`{"email":%q,"password":"a long enough password","name":"Ops Test"}`, email)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, baseURL+"/v1/auth/register", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// opsGet sends a GET, with basic auth when user is not empty, and returns the answer with its
// body read.
func opsGet(t *testing.T, url, user, password string, header http.Header) (*http.Response, string) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	for name, values := range header {
		req.Header[name] = values
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	// No redirects followed: /riverui redirects, and a redirect answer is what is checked.
	client := &http.Client{
		Timeout:       15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// opsRiverUIJob is what River UI's JSON API says of a job (GET /api/jobs and /api/jobs/{id}).
type opsRiverUIJob struct {
	ID       int64           `json:"id"`
	Args     string          `json:"args"` // the job's encoded args, as a JSON string
	Kind     string          `json:"kind"`
	Queue    string          `json:"queue"`
	State    string          `json:"state"`
	Metadata json.RawMessage `json:"metadata"` // only from /api/jobs/{id}
}

// opsRiverUIJobs lists the jobs in state through River UI's JSON API, as the UI's job list does.
func opsRiverUIJobs(t *testing.T, baseURL, state string) []opsRiverUIJob {
	t.Helper()

	resp, body := opsGet(t, baseURL+"/riverui/api/jobs?state="+state+"&limit=100", opsRiverUIUser, opsRiverUIPassword,
		http.Header{"Accept": {"application/json"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	var list struct {
		Data []opsRiverUIJob `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list), body)
	return list.Data
}

// opsRiverUIJobRaw returns River UI's whole JSON answer about one job (args, metadata with the
// job's riverlog lines, errors).
func opsRiverUIJobRaw(t *testing.T, baseURL string, id int64) string {
	t.Helper()

	resp, body := opsGet(t, baseURL+"/riverui/api/jobs/"+strconv.FormatInt(id, 10), opsRiverUIUser, opsRiverUIPassword,
		http.Header{"Accept": {"application/json"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	return body
}

// opsRequireArgsOnlyUserID checks that a job's args are exactly {"user_id": N}: no email, no
// token, nothing River UI would show that a reader of it should not see.
func opsRequireArgsOnlyUserID(t *testing.T, job opsRiverUIJob, userID int64) {
	t.Helper()

	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(job.Args), &args), job.Args)
	require.Equal(t, map[string]any{"user_id": float64(userID)}, args, "job %d (%s) args", job.ID, job.Kind)
}

func TestServe_RiverUI(t *testing.T) {
	t.Parallel()

	opsEngines(t, func(t *testing.T, env map[string]string) {
		// MAILER=none holds email jobs `available`, where the UI's list finds them.
		env = opsWithRiverUI(env)
		env["MAILER"] = "none"
		server := startServer(t, service.RoleServe, env)

		const email = "grace.hopper@example.com"
		status, body := opsRegister(t, server.URL, email)
		require.Equal(t, http.StatusCreated, status, body)
		var registered struct {
			ID int64 `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &registered))

		t.Run("RefusesWithoutCredentials", func(t *testing.T) {
			wrong := [][2]string{
				{opsRiverUIUser, "wrong password"},       // wrong password
				{"someone", opsRiverUIPassword},          // wrong user
				{opsRiverUIUser, opsRiverUIPassword[1:]}, // a prefix of the password is not it
			}
			for i, path := range []string{"/riverui/", "/riverui/jobs", "/riverui/api/jobs?state=available", "/riverui/api/states"} {
				// Every path without credentials, and each kind of wrong ones on two paths:
				// eight failed logins, under the limit of ten (LocksOutAfterTenFailures).
				for _, creds := range [][2]string{{"", ""}, wrong[i%3], wrong[(i+1)%3]} {
					resp, body := opsGet(t, server.URL+path, creds[0], creds[1], nil)
					require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s with %q: %s", path, creds[0], body)
					require.Equal(t, `Basic realm="River UI"`, resp.Header.Get("WWW-Authenticate"), path)
					require.NotContains(t, body, "welcome_email", "a refused request shows nothing of River UI")
				}
			}
		})

		t.Run("ServesUI", func(t *testing.T) {
			resp, body := opsGet(t, server.URL+"/riverui/", opsRiverUIUser, opsRiverUIPassword, http.Header{"Accept": {"text/html"}})
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			require.Contains(t, resp.Header.Get("Content-Type"), "text/html")
			// No other page may frame it (and have its buttons clicked through an overlay).
			require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
			require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
			require.Contains(t, body, "<title>River</title>")
			// The UI is told where its API lives, under the prefix.
			require.Contains(t, body, `"apiUrl":"/riverui/api"`)

			// The SPA's assets are served under the prefix, behind the same auth.
			script := regexp.MustCompile(`src="(/riverui/assets/[^"]+\.js)"`).FindStringSubmatch(body)
			require.NotNil(t, script, "no script in River UI's index:\n%s", body)
			resp, asset := opsGet(t, server.URL+script[1], opsRiverUIUser, opsRiverUIPassword, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Greater(t, len(asset), 10_000)
			resp, _ = opsGet(t, server.URL+script[1], "", "", nil)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

			// A deep link of the SPA gets its index too (the browser reloads on /riverui/jobs).
			resp, body = opsGet(t, server.URL+"/riverui/jobs?state=available", opsRiverUIUser, opsRiverUIPassword, http.Header{"Accept": {"text/html"}})
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			require.Contains(t, body, "<title>River</title>")

			// /riverui without its slash leads to the UI.
			resp, _ = opsGet(t, server.URL+"/riverui", "", "", nil)
			require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
			require.Equal(t, "/riverui/", resp.Header.Get("Location"))
		})

		t.Run("APIListsInsertedJobs", func(t *testing.T) {
			// prune, run on start on the maintenance queue, may be available for a moment too.
			var kinds []string
			for _, job := range opsRiverUIJobs(t, server.URL, "available") {
				require.Equal(t, "available", job.State)
				if job.Queue == "email" {
					kinds = append(kinds, job.Kind)
				}
			}
			require.ElementsMatch(t, []string{"welcome_email", "verification_email"}, kinds)

			states := opsGetJSON(t, server.URL+"/riverui/api/states")
			count, ok := states["available"].(map[string]any)["count"].(float64)
			require.True(t, ok, "state counts: %v", states)
			require.GreaterOrEqual(t, count, float64(2), "state counts: %v", states)
		})

		t.Run("JobsHoldNoSecrets", func(t *testing.T) {
			// Raw emails and tokens never appear in job args, metadata or River UI.
			for _, job := range opsRiverUIJobs(t, server.URL, "available") {
				if job.Queue != "email" {
					continue // prune, for a moment after the start
				}
				opsRequireArgsOnlyUserID(t, job, registered.ID)
				raw := opsRiverUIJobRaw(t, server.URL, job.ID)
				require.NotContains(t, raw, email)
				require.NotContains(t, raw, "example.com")
				require.NotContains(t, strings.ToLower(raw), "token")
			}
		})

		t.Run("LocksOutAfterTenFailures", func(t *testing.T) {
			// RefusesWithoutCredentials failed eight logins from this IP (127.0.0.1).
			for range 2 {
				resp, body := opsGet(t, server.URL+"/riverui/", opsRiverUIUser, "guess", nil)
				require.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
			}
			for _, password := range []string{"guess", opsRiverUIPassword} {
				resp, body := opsGet(t, server.URL+"/riverui/api/states", opsRiverUIUser, password, nil)
				require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
				require.NotEmpty(t, resp.Header.Get("Retry-After"))
				require.NotContains(t, body, "available")
			}
		})

		require.NoError(t, server.stop(t))
	})

	t.Run("NotMountedWhenUnset", func(t *testing.T) {
		t.Parallel()

		server := startServer(t, service.RoleServe, map[string]string{
			"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"MAILER":       "none",
		})
		for _, path := range []string{"/riverui/", "/riverui/api/jobs?state=available", "/riverui"} {
			// With or without credentials: nothing is there.
			for _, user := range []string{"", opsRiverUIUser} {
				resp, body := opsGet(t, server.URL+path, user, opsRiverUIPassword, nil)
				require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s: %s", path, body)
				require.Empty(t, resp.Header.Get("WWW-Authenticate"))
			}
		}
		require.NoError(t, server.stop(t))
	})

	t.Run("BackgroundStopsWithServer", func(t *testing.T) {
		t.Parallel()

		// River UI refreshes its job counts in the background, every 10s ± 1s. Once `serve`
		// returned and closed its database, nothing of it may still run (it used to, logging
		// "Error running query: sql: database is closed" forever).
		server := startServer(t, service.RoleServe, opsWithRiverUI(map[string]string{
			"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"MAILER":       "none",
		}))
		require.NoError(t, server.stop(t))
		stoppedAt := len(server.Logs.String())
		require.Never(t, func() bool { return strings.Contains(server.Logs.String()[stoppedAt:], "QueryCacher") },
			12*time.Second, 250*time.Millisecond, "River UI still runs after serve returned")
	})

	t.Run("DeliveredJobsHoldNoSecrets", func(t *testing.T) {
		t.Parallel()

		// Once delivered, a job carries its worker's riverlog lines in its metadata, which River
		// UI shows: they must hold neither the recipient nor any token of the mail.
		fake := resendfake.New(t, nil)
		env := opsWithRiverUI(map[string]string{
			"DATABASE_URL":      "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"MAILER":            "resend",
			"RESEND_API_KEY":    "re_test_key",
			"RESEND_FROM_EMAIL": "postguard@example.org",
			"RESEND_BASE_URL":   fake.URL(),
			"RESEND_MAX_RPS":    "0",
		})
		server := startServer(t, service.RoleServe, env)

		const email = "ada.lovelace@example.com"
		status, body := opsRegister(t, server.URL, email)
		require.Equal(t, http.StatusCreated, status, body)
		var registered struct {
			ID int64 `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &registered))

		// The two mails' jobs: prune, run on start, completes too, before or after them.
		completedMail := func() []opsRiverUIJob {
			var mail []opsRiverUIJob
			for _, job := range opsRiverUIJobs(t, server.URL, "completed") {
				if job.Queue == "email" {
					mail = append(mail, job)
				}
			}
			return mail
		}
		require.Eventually(t, func() bool { return len(completedMail()) == 2 },
			20*time.Second, 50*time.Millisecond, "mail jobs not completed")

		deliveries := fake.Deliveries()
		require.Len(t, deliveries, 2)
		var tokens []string
		for _, delivery := range deliveries {
			require.Equal(t, []string{email}, delivery.To)
			for _, m := range regexp.MustCompile(`token=([A-Za-z0-9_-]{16,})`).FindAllStringSubmatch(delivery.Text+delivery.HTML, -1) {
				tokens = append(tokens, m[1])
			}
		}
		require.NotEmpty(t, tokens, "the mail carries links with tokens")

		for _, job := range completedMail() {
			opsRequireArgsOnlyUserID(t, job, registered.ID)
			raw := opsRiverUIJobRaw(t, server.URL, job.ID)
			require.Contains(t, raw, "river:log", "the job shows its worker's log lines (riverlog)")
			require.NotContains(t, raw, email)
			require.NotContains(t, raw, "example.com")
			for _, token := range tokens {
				require.NotContains(t, raw, token, "a raw token shows in River UI")
			}
		}
		require.NoError(t, server.stop(t))
	})
}

// opsGetJSON GETs a River UI API path with the credentials and decodes its JSON object.
func opsGetJSON(t *testing.T, url string) map[string]any {
	t.Helper()

	resp, body := opsGet(t, url, opsRiverUIUser, opsRiverUIPassword, http.Header{"Accept": {"application/json"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	return v
}

// opsChromium finds a Chromium or Chrome binary. When there is none, the test skips, except under
// CI=true (where .ci/run installs Debian's chromium), where it fails.
func opsChromium(t *testing.T) string {
	t.Helper()

	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	msg := "no chromium on PATH: install it (Debian: apt-get install chromium) to run the River UI browser test; under CI=true this fails"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestServe_RiverUIBrowser loads River UI in a real headless Chromium, through the real wiring
// and basic auth, and waits until its job list shows the jobs a registration inserted.
func TestServe_RiverUIBrowser(t *testing.T) {
	t.Parallel()

	env := opsWithRiverUI(map[string]string{
		"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":       "none", // email jobs stay `available`
	})
	server := startServer(t, service.RoleServe, env)
	status, body := opsRegister(t, server.URL, "katherine.johnson@example.com")
	require.Equal(t, http.StatusCreated, status, body)

	ctx := startBrowser(t, server, &browserOpts{width: 1280, height: 900})
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)

	// Without credentials the browser gets the challenge, not the UI: headless Chromium, with no
	// one to answer the prompt, fails the load (older versions showed the 401 page).
	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.Run(stepCtx, chromedp.NavigateResponse(server.URL+"/riverui/"))
	if err != nil {
		require.ErrorContains(t, err, "ERR_INVALID_AUTH_CREDENTIALS")
	} else {
		require.EqualValues(t, http.StatusUnauthorized, resp.Status)
	}

	// The browser sends the credentials with every request (the page, its assets and the UI's
	// calls to its JSON API), as it would after a person answered the basic auth prompt.
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(opsRiverUIUser+":"+opsRiverUIPassword))
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": auth},
	})
	require.NoError(t, err)

	resp, err = chromedp.Run(stepCtx, chromedp.NavigateResponse(server.URL+"/riverui/"))
	require.NoError(t, err, "error loading River UI")
	require.EqualValues(t, http.StatusOK, resp.Status)

	// The SPA rendered; a person picks the state the jobs are in from its Job State menu.
	available := chromedp.CSS(`a[href*="/riverui/jobs"][href*="state=available"]`)
	err = chromedp.Do(stepCtx, chromedp.WaitVisible(available), chromedp.Click(available))
	require.NoError(t, err, "River UI did not render its Job State menu")

	stepCtx, cancel = context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = chromedp.Run(stepCtx, chromedp.Poll[bool](
		`location.search.includes('state=available') && document.body.innerText.includes('welcome_email') && document.body.innerText.includes('verification_email')`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(25*time.Second)))
	require.NoError(t, err, "River UI's job list did not show the jobs")

	// What the page shows of the jobs' args is their user id, nothing more.
	text, err := chromedp.Run(stepCtx, chromedp.Evaluate[string](`document.body.innerText`))
	require.NoError(t, err)
	require.Contains(t, text, `{"user_id":1}`)
	require.NotContains(t, text, "example.com")
}

// opsBrowserFailure saves a screenshot and the page's text of a failed browser test, and logs
// them with the browser's and the server's logs.
func opsBrowserFailure(t *testing.T, ctx context.Context, browserLog *syncBuffer, server *runningServer) {
	t.Helper()

	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	location, _ := chromedp.Run(ctx, chromedp.Location())
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
	t.Logf("browser at %s, page text:\n%s", location, text)
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		// Not t.TempDir(): the screenshot must outlive the test to be looked at.
		if dir, err := os.MkdirTemp("", "postguard-riverui-"); err == nil {
			path := filepath.Join(dir, "screenshot.png")
			if err := os.WriteFile(path, png, 0o600); err == nil {
				t.Logf("screenshot: %s", path)
			}
		}
	} else {
		t.Logf("no screenshot: %v", err)
	}
	t.Logf("browser log:\n%s", browserLog.String())
	t.Logf("server log:\n%s", server.Logs.String())
}

// opsRiverUIPost POSTs body to a River UI path with the credentials and the given headers, as a
// browser would, and returns the answer with its body read.
func opsRiverUIPost(t *testing.T, url, body string, header http.Header) (*http.Response, string) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	for name, values := range header {
		req.Header[name] = values
	}
	req.SetBasicAuth(opsRiverUIUser, opsRiverUIPassword)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestServe_RiverUICrossSiteRetry is what another site's page can make a browser that holds River
// UI's basic-auth credentials send (a <form enctype="text/plain"> posting to River UI's API):
// refused, the completed job untouched. The same request from River UI's own origin works.
func TestServe_RiverUICrossSiteRetry(t *testing.T) {
	t.Parallel()

	opsEngines(t, func(t *testing.T, env map[string]string) {
		env = opsWithRiverUI(env)
		env["MAILER"] = "log"
		server := startServer(t, service.RoleServe, env)

		status, body := opsRegister(t, server.URL, "alan.turing@example.com")
		require.Equal(t, http.StatusCreated, status, body)
		var welcome opsRiverUIJob
		require.Eventually(t, func() bool {
			for _, job := range opsRiverUIJobs(t, server.URL, "completed") {
				if job.Kind == "welcome_email" {
					welcome = job
					return true
				}
			}
			return false
		}, 20*time.Second, 50*time.Millisecond, "welcome mail not sent; logs:\n%s", server.Logs.String())
		job := func() (state string, attempt int) {
			var got struct {
				State   string `json:"state"`
				Attempt int    `json:"attempt"`
			}
			require.NoError(t, json.Unmarshal([]byte(opsRiverUIJobRaw(t, server.URL, welcome.ID)), &got))
			return got.State, got.Attempt
		}
		state, attempt := job()
		require.Equal(t, "completed", state)
		require.Equal(t, 1, attempt)
		welcomes := func() int { return strings.Count(server.Logs.String(), "kind=welcome_email to=") }
		sent := welcomes()
		require.Positive(t, sent, "the log mailer prints the welcome mail; logs:\n%s", server.Logs.String())

		retry := fmt.Sprintf(`{"ids":["%d"]}`, welcome.ID)
		resp, body := opsRiverUIPost(t, server.URL+"/riverui/api/jobs/retry", retry, http.Header{
			"Content-Type":   {"text/plain"},
			"Origin":         {"https://evil.example"},
			"Sec-Fetch-Site": {"cross-site"},
			"Sec-Fetch-Mode": {"navigate"},
			"Sec-Fetch-Dest": {"document"},
		})
		require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		state, attempt = job()
		require.Equal(t, "completed", state, "a cross-site request retried the job")
		require.Equal(t, 1, attempt)

		// River UI's own page sends the same request from its origin: the job is retried and
		// worked again. (It sends nothing the second time: its mail was accepted already.)
		resp, body = opsRiverUIPost(t, server.URL+"/riverui/api/jobs/retry", retry, http.Header{
			"Content-Type":   {"text/plain"},
			"Origin":         {server.URL},
			"Sec-Fetch-Site": {"same-origin"},
		})
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Eventually(t, func() bool {
			state, attempt := job()
			return state == "completed" && attempt == 2
		}, 20*time.Second, 50*time.Millisecond, "the job was not retried; logs:\n%s", server.Logs.String())
		require.Equal(t, sent, welcomes(), "one welcome, however often its job runs")
		require.Contains(t, server.Logs.String(), "not sending again")

		require.NoError(t, server.stop(t))
	})
}

// TestServe_RiverUIBrowserCrossSite is the cross-site retry in a real headless Chromium holding
// River UI's credentials: a page of another origin auto-submits a <form enctype="text/plain">
// to River UI's retry API. The browser sends it with the credentials, as it would with cached
// basic auth; the service refuses it, and the completed job stays completed.
func TestServe_RiverUIBrowserCrossSite(t *testing.T) {
	t.Parallel()

	chromium := opsChromium(t)
	userDataDir := t.TempDir()

	server := startServer(t, service.RoleServe, opsWithRiverUI(map[string]string{
		"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":       "log",
	}))
	status, body := opsRegister(t, server.URL, "grace.hopper@example.com")
	require.Equal(t, http.StatusCreated, status, body)
	var welcome opsRiverUIJob
	require.Eventually(t, func() bool {
		for _, job := range opsRiverUIJobs(t, server.URL, "completed") {
			if job.Kind == "welcome_email" {
				welcome = job
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "welcome mail not sent; logs:\n%s", server.Logs.String())

	// The other site: another origin (another port), whose page posts to River UI at once. The
	// text/plain body of name={"ids":["N"],"x":" and value="} is JSON River UI reads.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" enctype="text/plain" action="%s/riverui/api/jobs/retry">`+
			`<input type="hidden" name='{"ids":["%d"],"x":"' value='"}'></form><script>document.getElementById("f").submit()</script>`,
			server.URL, welcome.ID)
	}))
	t.Cleanup(evil.Close)

	testCtx, cancelTest := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancelTest)
	browserLog := &syncBuffer{}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(testCtx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(userDataDir),
		chromedp.CombinedOutput(browserLog),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	defer func() {
		if t.Failed() {
			opsBrowserFailure(t, ctx, browserLog, server)
		}
	}()

	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err, "error starting chromium")
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(opsRiverUIUser+":"+opsRiverUIPassword))
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": auth},
	})
	require.NoError(t, err)

	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = chromedp.Run(stepCtx, chromedp.NavigateResponse(evil.URL))
	require.NoError(t, err)
	_, err = chromedp.Run(stepCtx, chromedp.Poll[bool](
		`location.href.includes('/riverui/api/jobs/retry') && document.body !== null && document.body.innerText.length > 0`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(25*time.Second)))
	require.NoError(t, err, "the form was not submitted")
	text, err := chromedp.Run(stepCtx, chromedp.Evaluate[string](`document.body.innerText`))
	require.NoError(t, err)
	require.Contains(t, text, `"status":403`, "the browser's cross-site post was not refused")

	raw := opsRiverUIJobRaw(t, server.URL, welcome.ID)
	var job struct {
		State   string `json:"state"`
		Attempt int    `json:"attempt"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &job))
	require.Equal(t, "completed", job.State, "the cross-site post retried the job")
	require.Equal(t, 1, job.Attempt)
	require.NoError(t, server.stop(t))
}
