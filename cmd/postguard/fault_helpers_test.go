package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// faultSecret is APP_SECRET in the fault tests.
const faultSecret = "fault-test-secret-0123456789abcdef"

// process is the postguard binary running as a child process (kill -9 and SIGTERM tests).
type process struct {
	cmd  *exec.Cmd
	URL  string      // http://HTTP_ADDR once it serves
	Logs *syncBuffer // its stderr: JSON log lines
	// Stdout is its standard output: nothing, unless OTEL_TRACES_EXPORTER=console writes spans.
	Stdout *syncBuffer
	done   chan struct{} // closed once it exited; then err is its exit
	err    error
}

// startProcess runs `postguard <command>` with exactly env (plus JSON logs on a free port) and
// waits until it serves HTTP. The process is killed, if still running, when t ends.
func startProcess(t *testing.T, command string, env map[string]string) *process {
	t.Helper()

	env["HTTP_ADDR"] = "127.0.0.1:0"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	env["LOG_FORMAT"] = "json"
	cmd := exec.Command(buildPostguard(t), command)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	p := &process{cmd: cmd, Logs: &syncBuffer{}, Stdout: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.Stdout
	require.NoError(t, cmd.Start())

	ready := make(chan string, 1)
	go func() {
		// Copy the log, watching for the line that says the process serves.
		scanner := bufio.NewScanner(stderr)
		scanner.Buffer(make([]byte, 64<<10), 1<<20)
		for scanner.Scan() {
			line := scanner.Bytes()
			_, _ = p.Logs.Write(line)
			_, _ = p.Logs.Write([]byte{'\n'})
			var entry struct{ Msg, Addr string }
			if json.Unmarshal(line, &entry) == nil && entry.Msg == "postguard started" {
				select {
				case ready <- entry.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(p.Logs, stderr)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})

	select {
	case addr := <-ready:
		p.URL = "http://" + addr
		return p
	case <-p.done:
		t.Fatalf("postguard %s exited before serving: %v\nlogs:\n%s", command, p.err, p.Logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("postguard %s did not serve within 30s\nlogs:\n%s", command, p.Logs)
	}
	return nil
}

// signal sends sig to the process.
func (p *process) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// wait waits for the process to exit and returns how it exited.
func (p *process) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("postguard did not exit within %s\nlogs:\n%s", timeout, p.Logs)
		return nil
	}
}

// directConn connects to databaseURL (a dbtest schema URL) without going through anything the
// test breaks, to check what was written.
func directConn(t *testing.T, databaseURL string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// jobRow is what the fault tests read of a River job.
type jobRow struct {
	ID      int64
	Kind    string
	State   string
	Attempt int
	UserID  int64
	Errors  []string
}

// jobsByUser reads every job of the schema, by user id (args.user_id).
func jobsByUser(t *testing.T, conn *pgx.Conn) map[int64][]jobRow {
	t.Helper()
	rows, err := conn.Query(t.Context(), `
		SELECT id, kind, state::text, attempt, coalesce((args->>'user_id')::bigint, 0),
			coalesce(array(SELECT e->>'error' FROM unnest(errors) e), '{}')
		FROM river_job
		ORDER BY id`)
	require.NoError(t, err)
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (jobRow, error) {
		var j jobRow
		err := row.Scan(&j.ID, &j.Kind, &j.State, &j.Attempt, &j.UserID, &j.Errors)
		return j, err
	})
	require.NoError(t, err)
	byUser := make(map[int64][]jobRow)
	for _, j := range jobs {
		byUser[j.UserID] = append(byUser[j.UserID], j)
	}
	return byUser
}

// requireRegistrationsStored checks that every registration answered 201 (users: id → email) has
// its user row and its welcome and verification jobs, read over conn.
func requireRegistrationsStored(t *testing.T, conn *pgx.Conn, users map[int64]string) {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT id, email FROM users`)
	require.NoError(t, err)
	stored := make(map[int64]string)
	for rows.Next() {
		var id int64
		var email string
		require.NoError(t, rows.Scan(&id, &email))
		stored[id] = email
	}
	require.NoError(t, rows.Err())

	jobs := jobsByUser(t, conn)
	for id, email := range users {
		require.Equal(t, email, stored[id], "user %d answered 201 but is not stored", id)
		var kinds []string
		for _, j := range jobs[id] {
			kinds = append(kinds, j.Kind)
		}
		require.ElementsMatch(t, []string{"welcome_email", "verification_email"}, kinds, "jobs of user %d", id)
	}
}
