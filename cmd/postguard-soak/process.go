package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long a process may take to serve /healthz after it was started. A
// start during a fault (the database refusing connections) fails and is tried again until then.
const startTimeout = 90 * time.Second

// process is one postguard process of the soak, on a fixed address, restarted on that address
// after each fault.
type process struct {
	name    string // "api-1", "worker-2"
	command string // "api" or "worker"
	addr    string // HTTP_ADDR, 127.0.0.1:port
	binary  string
	env     []string
	logPath string
	logger  *slog.Logger

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exited; then exitErr is its exit
	exit error
}

// URL is the process's base URL.
func (p *process) URL() string { return "http://" + p.addr }

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(ctx context.Context) (string, error) {
	listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("error finding a free port: %w", err)
	}
	defer listener.Close()
	return listener.Addr().String(), nil
}

// start runs the process and waits until it serves /healthz. A process that exits before that
// (it may not start while the database refuses connections: it checks the schema first) is
// started again, until startTimeout.
func (p *process) start(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	for attempt := 1; ; attempt++ {
		err := p.startOnce(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("error starting %s (attempt %d): %w", p.name, attempt, err)
		}
		p.logger.InfoContext(ctx, "process did not start; trying again", slog.String("process", p.name), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (p *process) startOnce(ctx context.Context) error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("error opening log file: %w", err)
	}
	// ctx ends the process too (an interrupted soak leaves nothing running).
	cmd := exec.CommandContext(ctx, p.binary, p.command) //nolint:gosec // the operator names the binary; that is the point
	cmd.Env = append(append([]string(nil), p.env...), "HTTP_ADDR="+p.addr)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("error running %s: %w", p.binary, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.exit = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.exit = err
		p.mu.Unlock()
		close(done)
	}()

	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-done:
			return fmt.Errorf("exited before serving: %w", p.exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/healthz", nil) //nolint:gosec // a loopback address the soak chose
		if err != nil {
			return fmt.Errorf("error building health check: %w", err)
		}
		resp, err := client.Do(req) //nolint:gosec // a loopback address the soak chose
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

func (p *process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// signal sends sig to the running process and waits, up to within, for it to exit; it returns
// how it exited.
func (p *process) signal(sig syscall.Signal, within time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return errors.New("not running")
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("error sending %s: %w", sig, err)
	}
	select {
	case <-done:
		return p.exitErr()
	case <-time.After(within):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within %s of %s; killed", within, sig)
	}
}

// kill ends the process with SIGKILL, if it runs (cleanup).
func (p *process) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
	default:
		_ = cmd.Process.Kill()
		<-done
	}
}

// newProcess describes a process; start runs it.
func newProcess(ctx context.Context, name, command, binary, logDir string, env []string, logger *slog.Logger) (*process, error) {
	addr, err := freeAddr(ctx)
	if err != nil {
		return nil, err
	}
	return &process{
		name:    name,
		command: command,
		addr:    addr,
		binary:  binary,
		env:     env,
		logPath: filepath.Join(logDir, name+".log"),
		logger:  logger,
	}, nil
}
