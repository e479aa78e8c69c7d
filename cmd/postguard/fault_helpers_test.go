package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
)

// faultSecret is APP_SECRET in the fault tests.
const faultSecret = "fault-test-secret-0123456789abcdef"

// process is the postguard binary running as a child process (kill -9 and SIGTERM tests).
type process struct {
	cmd  *exec.Cmd
	URL  string        // http://HTTP_ADDR once it serves
	Logs *syncBuffer   // its stderr: JSON log lines
	done chan struct{} // closed once it exited; then err is its exit
	err  error
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
	require.NoError(t, cmd.Start())

	p := &process{cmd: cmd, Logs: &syncBuffer{}, done: make(chan struct{})}
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

// pgProxy is a TCP proxy to PostgreSQL that a test can cut and restore, to play a database
// that becomes unreachable: cut closes every live connection and then, depending on the mode,
// holds new connections without an answer (a network that drops packets: the hard case, where
// only deadlines end a wait) or refuses them (a database that is down).
type pgProxy struct {
	t      *testing.T
	target string

	mu       sync.Mutex
	listener net.Listener
	addr     string
	mode     proxyMode
	conns    map[net.Conn]struct{} // every open connection, both sides
	held     []net.Conn            // connections accepted while blackholed
}

type proxyMode int

const (
	proxyOpen      proxyMode = iota // forward
	proxyBlackhole                  // accept, and hold unanswered until restore
	proxyRefuse                     // listener closed: connection refused
)

// newPGProxy listens on a free local port and forwards to target (host:port).
func newPGProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pgProxy{t: t, target: target, listener: listener, addr: listener.Addr().String(), conns: make(map[net.Conn]struct{})}
	go p.serve(listener)
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.listener != nil {
			_ = p.listener.Close()
		}
		p.closeConnsLocked()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *pgProxy) Addr() string { return p.addr }

func (p *pgProxy) serve(listener net.Listener) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return // closed: cut in proxyRefuse mode, or the test ended
		}
		p.mu.Lock()
		mode := p.mode
		p.conns[conn] = struct{}{}
		if mode == proxyOpen {
			go p.forward(conn)
		} else {
			// proxyBlackhole: the connection is held, unread, until restore forwards it.
			p.held = append(p.held, conn)
		}
		p.mu.Unlock()
	}
}

func (p *pgProxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(client)
		return
	}
	p.mu.Lock()
	if p.mode != proxyOpen { // cut while dialling
		p.mu.Unlock()
		_ = server.Close()
		p.drop(client)
		return
	}
	p.conns[server] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		// One side ended: end both, as a TCP proxy would.
		p.drop(dst)
		p.drop(src)
	}
	go pipe(server, client)
	go pipe(client, server)
	wg.Wait()
}

func (p *pgProxy) drop(conn net.Conn) {
	p.mu.Lock()
	delete(p.conns, conn)
	p.mu.Unlock()
	_ = conn.Close()
}

func (p *pgProxy) closeConnsLocked() {
	for conn := range p.conns {
		_ = conn.Close()
		delete(p.conns, conn)
	}
	p.held = nil
}

// cut makes the database unreachable through the proxy: live connections are closed, new ones
// blackholed or refused.
func (p *pgProxy) cut(mode proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	p.closeConnsLocked()
	if mode == proxyRefuse && p.listener != nil {
		_ = p.listener.Close()
		p.listener = nil
	}
}

// restore forwards again, on the same address.
func (p *pgProxy) restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = proxyOpen
	// Held connections are forwarded now, with what their clients sent meanwhile, as a healed
	// network delivers what it held back.
	for _, conn := range p.held {
		go p.forward(conn)
	}
	p.held = nil
	if p.listener == nil {
		var listener net.Listener
		var err error
		// The port was just released; rebinding it can fail for a moment.
		for range 50 {
			if listener, err = net.Listen("tcp", p.addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.NoError(p.t, err, "error listening again on %s", p.addr)
		p.listener = listener
		go p.serve(listener)
	}
}

// proxiedURL is databaseURL (a dbtest schema URL) with its host replaced by addr.
func proxiedURL(t *testing.T, databaseURL, addr string) string {
	t.Helper()
	config, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	host := config.Host + ":" + strconv.Itoa(int(config.Port))
	require.Contains(t, databaseURL, "@"+host, "expected a URL with host:port, got %s", databaseURL)
	return strings.Replace(databaseURL, "@"+host, "@"+addr, 1)
}

// postgresTarget is host:port of the test database.
func postgresTarget(t *testing.T) string {
	t.Helper()
	config, err := pgx.ParseConfig(dbtest.DatabaseURL(t))
	require.NoError(t, err)
	return net.JoinHostPort(config.Host, strconv.Itoa(int(config.Port)))
}
