package main

import (
	"bytes"
	"context"
	"flag"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "rewrite docs/dev-mail.png from TestServe_DevMailBrowser's screenshot")

// devMailScreenshot is the screenshot of /dev/mail that README.md shows.
const devMailScreenshot = "../../docs/dev-mail.png"

// TestServe_DevMailBrowser opens /dev/mail in a real headless Chromium after a registration,
// through the real wiring (serve, the log mailer, a MAIL_TEMPLATES_DIR with a French welcome),
// follows the welcome from the list, and finds its rendered HTML in the page's sandboxed frame.
// With -update-screenshot it writes the page's screenshot to docs/dev-mail.png, which README.md
// shows; without, the committed file is left as it is.
func TestServe_DevMailBrowser(t *testing.T) {
	t.Parallel()

	server := startServer(t, service.RoleServe, map[string]string{
		"DATABASE_URL":            "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":                  "log",
		"APP_NAME":                "Acme",
		"MAIL_TEMPLATES_DIR":      frenchMailTemplates,
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "50ms",
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL+"/v1/auth/register",
		strings.NewReader(`{"email":"amelie@example.fr","password":"correct horse battery","name":"Amélie","locale":"fr"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Both mails are kept once their jobs ran: the log mailer's lines say so.
	require.Eventually(t, func() bool {
		return strings.Count(server.Logs.String(), "email kept by the log mailer") == 2
	}, 30*time.Second, 50*time.Millisecond, "mail not kept; logs:\n%s", server.Logs.String())

	ctx := startBrowser(t, server, &browserOpts{width: 1100, height: 900})

	// The list shows both mails; a person clicks the welcome.
	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	listed, err := chromedp.Run(stepCtx, chromedp.NavigateResponse(server.URL+"/dev/mail"))
	require.NoError(t, err, "error loading /dev/mail")
	require.EqualValues(t, http.StatusOK, listed.Status)
	list, err := chromedp.Run(stepCtx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, list, "Bienvenue sur Acme")
	require.Contains(t, list, "Verify your email address for Acme")

	welcome := chromedp.Search(`//a[contains(., "Bienvenue sur Acme")]`)
	require.NoError(t, chromedp.Do(stepCtx,
		chromedp.Click(welcome, chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("iframe")),
	), "the welcome's page did not open")
	location, err := chromedp.Run(stepCtx, chromedp.Location())
	require.NoError(t, err)
	require.Contains(t, location, server.URL+"/dev/mail/log_")

	// Its text part and headers are on the page itself.
	page, err := chromedp.Run(stepCtx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, page, "amelie@example.fr")
	require.Contains(t, page, "List-Unsubscribe-Post")
	require.Contains(t, page, "Bienvenue sur Acme ! Votre compte est prêt.")

	// Its HTML part is rendered in the sandboxed frame: the text a person reads there. A sandboxed
	// frame has an origin of its own, so Chromium runs it as a target of its own, which the test
	// attaches to (site isolation stays on, as a person's browser has it).
	targets, err := chromedp.Targets(stepCtx)
	require.NoError(t, err)
	var frame *target.Info
	for _, info := range targets {
		if info.Type == "iframe" && info.URL == "about:srcdoc" {
			require.Nil(t, frame, "one frame")
			frame = info
		}
	}
	require.NotNil(t, frame, "no frame target among %v", targets)
	frameCtx, cancelFrame := chromedp.NewContext(stepCtx, chromedp.WithTargetID(frame.TargetID), chromedp.WithDetachOnCancel())
	defer cancelFrame()
	rendered, err := chromedp.Run(frameCtx, chromedp.Text(chromedp.CSS("body")))
	require.NoError(t, err, "no rendered HTML in the frame")
	require.Contains(t, rendered, "Hi Amélie,")
	require.Contains(t, rendered, "Bienvenue sur Acme ! Votre compte est prêt.")
	require.Contains(t, rendered, "Commencer")
	require.Contains(t, rendered, "— The Acme team")

	shot, err := chromedp.Run(stepCtx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(shot))
	require.NoError(t, err, "a PNG")
	require.Greater(t, img.Bounds().Dy(), 600)
	if *updateScreenshot {
		require.NoError(t, os.WriteFile(devMailScreenshot, shot, 0o600))
		t.Logf("wrote %s", devMailScreenshot)
	}
	committed, err := os.Open(devMailScreenshot)
	require.NoError(t, err, "README shows %s: run this test with -update-screenshot to write it", devMailScreenshot)
	defer committed.Close()
	_, err = png.DecodeConfig(io.Reader(committed))
	require.NoError(t, err, "%s is a PNG", devMailScreenshot)
}
