package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
)

// opsMigrateScript is scripts/migrate.sh, from this package's directory.
var opsMigrateScript = filepath.Join("..", "..", "scripts", "migrate.sh")

// opsPathWithoutRiver is $PATH without the directories holding a `river` executable, so that
// migrate.sh takes its no-CLI path even where an operator installed the River CLI.
func opsPathWithoutRiver() string {
	var dirs []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if info, err := os.Stat(filepath.Join(dir, "river")); err == nil && !info.IsDir() {
			continue
		}
		dirs = append(dirs, dir)
	}
	return strings.Join(dirs, string(filepath.ListSeparator))
}

// opsRunMigrateScript runs `sh scripts/migrate.sh` from the repository's root with env added to
// a minimal environment, and returns its combined output.
func opsRunMigrateScript(t *testing.T, env map[string]string) (string, error) {
	t.Helper()

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	script, err := filepath.Abs(opsMigrateScript)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, "sh", script)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = []string{"HOME=" + t.TempDir(), "LOG_LEVEL=warn"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// opsFakeRiver writes a `river` executable into a new directory, which appends its arguments,
// one per line after a "river" line, to log and exits with code; it returns the directory.
func opsFakeRiver(t *testing.T, log string, code int) string {
	t.Helper()

	dir := t.TempDir()
	script := "#!/bin/sh\n" +
		"{ echo river; printf '%s\\n' \"$@\"; } >> '" + log + "'\n" +
		"exit " + strconv.Itoa(code) + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "river"), []byte(script), 0o755)) //nolint:gosec // an executable for the test
	return dir
}

// opsLoggingPostguard writes a wrapper of the postguard binary that appends a "postguard <args>"
// line to log before running it, so the order of the script's steps can be read from log.
func opsLoggingPostguard(t *testing.T, binary, log string) string {
	t.Helper()

	path := filepath.Join(t.TempDir(), "postguard")
	script := "#!/bin/sh\n" +
		"echo \"postguard $*\" >> '" + log + "'\n" +
		"exec '" + binary + "' \"$@\"\n"
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755)) //nolint:gosec // an executable for the test
	return path
}

func TestMigrateScript_Run(t *testing.T) {
	t.Parallel()

	binary := buildPostguard(t)
	secret := strings.Repeat("m", 32)

	t.Run("TwiceThenServe", func(t *testing.T) {
		t.Parallel()

		databaseURL := dbtest.PostgresEmptyURL(t)
		// As README's deploy step: DATABASE_URL only (no APP_SECRET, no mailer settings).
		env := map[string]string{"DATABASE_URL": databaseURL, "POSTGUARD": binary, "PATH": opsPathWithoutRiver()}

		// Without the River CLI the script says so, and `postguard migrate` applies River's
		// migrations and the app's; a second run finds nothing to do and succeeds too.
		for run := range 2 {
			out, err := opsRunMigrateScript(t, env)
			require.NoError(t, err, "run %d:\n%s", run+1, out)
			require.Contains(t, out, "River CLI not installed")
			require.Contains(t, out, "migrate.sh: "+binary+" migrate")
			require.Contains(t, out, "schema is up to date")
		}

		// The deploy's next step: the service starts on the migrated database and is ready.
		server := startServer(t, service.RoleServe, map[string]string{"DATABASE_URL": databaseURL, "APP_SECRET": secret})
		resp, body := opsGet(t, server.URL+"/readyz", "", "", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.NoError(t, server.stop(t))
	})

	t.Run("RiverCLIFirst", func(t *testing.T) {
		t.Parallel()

		databaseURL := dbtest.PostgresEmptyURL(t)
		log := filepath.Join(t.TempDir(), "calls.log")
		env := map[string]string{
			"DATABASE_URL": databaseURL,
			"POSTGUARD":    opsLoggingPostguard(t, binary, log),
			"PATH":         opsFakeRiver(t, log, 0) + string(filepath.ListSeparator) + opsPathWithoutRiver(),
		}

		for run := range 2 {
			out, err := opsRunMigrateScript(t, env)
			require.NoError(t, err, "run %d:\n%s", run+1, out)
			require.Contains(t, out, "migrate.sh: river migrate-up")
			require.NotContains(t, out, "River CLI not installed")
		}

		// Each run calls `river migrate-up --database-url URL`, then `postguard migrate`. (The fake
		// CLI migrates nothing, so the first `postguard migrate` applied River's migrations too:
		// either order works.)
		calls, err := os.ReadFile(log)
		require.NoError(t, err)
		once := "river\nmigrate-up\n--database-url\n" + databaseURL + "\npostguard migrate\n"
		require.Equal(t, once+once, string(calls))

		server := startServer(t, service.RoleServe, map[string]string{"DATABASE_URL": databaseURL, "APP_SECRET": secret})
		resp, body := opsGet(t, server.URL+"/readyz", "", "", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.NoError(t, server.stop(t))
	})

	t.Run("StopsWhenRiverCLIFails", func(t *testing.T) {
		t.Parallel()

		databaseURL := dbtest.PostgresEmptyURL(t)
		log := filepath.Join(t.TempDir(), "calls.log")
		out, err := opsRunMigrateScript(t, map[string]string{
			"DATABASE_URL": databaseURL,
			"POSTGUARD":    opsLoggingPostguard(t, binary, log),
			"PATH":         opsFakeRiver(t, log, 3) + string(filepath.ListSeparator) + opsPathWithoutRiver(),
		})
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, out)
		require.Equal(t, 3, exitErr.ExitCode(), out)

		// A deploy stops at the failed step: postguard migrate did not run.
		calls, err := os.ReadFile(log)
		require.NoError(t, err)
		require.NotContains(t, string(calls), "postguard")
	})

	t.Run("NeedsDatabaseURL", func(t *testing.T) {
		t.Parallel()

		out, err := opsRunMigrateScript(t, map[string]string{"POSTGUARD": binary, "PATH": opsPathWithoutRiver()})
		require.Error(t, err)
		require.Contains(t, out, "DATABASE_URL must name the database to migrate")
	})
}
