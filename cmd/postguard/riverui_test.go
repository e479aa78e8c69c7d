package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

	"github.com/postguard/postguard/db/dbtest"
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
		server := startServer(t, roleServe, env)

		const email = "grace.hopper@example.com"
		status, body := opsRegister(t, server.URL, email)
		require.Equal(t, http.StatusCreated, status, body)
		var registered struct {
			ID int64 `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &registered))

		t.Run("RefusesWithoutCredentials", func(t *testing.T) {
			for _, path := range []string{"/riverui/", "/riverui/jobs", "/riverui/api/jobs?state=available", "/riverui/api/states"} {
				for _, creds := range [][2]string{
					{"", ""},                                 // none
					{opsRiverUIUser, "wrong password"},       // wrong password
					{"someone", opsRiverUIPassword},          // wrong user
					{opsRiverUIUser, opsRiverUIPassword[1:]}, // a prefix of the password is not it
				} {
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
			// DESIGN.md: raw emails and tokens never appear in job args, metadata or River UI.
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

		require.NoError(t, server.stop(t))
	})

	t.Run("NotMountedWhenUnset", func(t *testing.T) {
		t.Parallel()

		server := startServer(t, roleServe, map[string]string{
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
		server := startServer(t, roleServe, opsWithRiverUI(map[string]string{
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
		server := startServer(t, roleServe, env)

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

	chromium := opsChromium(t)
	userDataDir := t.TempDir() // before the browser's Cleanup, so removed after the browser exits

	env := opsWithRiverUI(map[string]string{
		"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":       "none", // email jobs stay `available`
	})
	server := startServer(t, roleServe, env)
	status, body := opsRegister(t, server.URL, "katherine.johnson@example.com")
	require.Equal(t, http.StatusCreated, status, body)

	// Every wait of the test is bounded: by this deadline overall, and by a shorter one per step.
	testCtx, cancelTest := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancelTest)

	browserLog := &syncBuffer{}
	logf := func(format string, args ...any) { fmt.Fprintf(browserLog, format+"\n", args...) }
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(testCtx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // root in a container has no user namespace sandbox
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), // small /dev/shm in containers
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(browserLog),
	)
	t.Cleanup(cancelAlloc) // waits for the browser process to exit
	ctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(logf), chromedp.WithErrorf(logf))
	t.Cleanup(cancelBrowser)

	defer func() {
		if !t.Failed() {
			return
		}
		opsBrowserFailure(t, ctx, browserLog, server)
	}()

	// The first call starts the browser; it must not carry a deadline of its own (chromedp ends the
	// browser with it), testCtx bounds it.
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err, "error starting chromium")

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
