package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserOpts configure startBrowser.
type browserOpts struct {
	// width and height are the window's size, in CSS pixels.
	width, height int
	// language is the Accept-Language the browser sends; "" leaves Chromium's own.
	language string
}

// startBrowser starts a headless Chromium (skipping the test without one, failing it under
// CI=true), ended with the test, and returns the context its actions run in. Every wait of a
// browser test is bounded by four minutes overall, and by a shorter one per step that the test
// derives from the context. On failure the test's log gets the browser's page, screenshot and
// log, and the server's log.
func startBrowser(t *testing.T, server *runningServer, opts *browserOpts) context.Context {
	t.Helper()

	chromium := opsChromium(t)
	userDataDir := t.TempDir() // before the browser's Cleanup, so removed after the browser exits

	testCtx, cancelTest := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancelTest)
	browserLog := &syncBuffer{}
	logf := func(format string, args ...any) { fmt.Fprintf(browserLog, format+"\n", args...) }
	flags := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // root in a container has no user namespace sandbox
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), // small /dev/shm in containers
		chromedp.Flag("hide-scrollbars", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(opts.width, opts.height),
		chromedp.CombinedOutput(browserLog),
	}
	if opts.language != "" {
		flags = append(flags,
			chromedp.Flag("lang", opts.language),
			chromedp.Flag("accept-lang", opts.language), // headless Chromium reads this one for Accept-Language
		)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(testCtx, flags...)
	t.Cleanup(cancelAlloc) // waits for the browser process to exit
	ctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(logf), chromedp.WithErrorf(logf))
	t.Cleanup(cancelBrowser)
	t.Cleanup(func() {
		if t.Failed() {
			opsBrowserFailure(t, ctx, browserLog, server)
		}
	})

	// The first call starts the browser; it must not carry a deadline of its own (chromedp ends
	// the browser with it), testCtx bounds it.
	_, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err, "error starting chromium")
	return ctx
}
