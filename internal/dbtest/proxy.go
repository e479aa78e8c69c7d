package dbtest

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Proxy is a TCP proxy to PostgreSQL that a test can cut, restore and make late, to play a
// database that becomes unreachable or whose connections die unseen: Cut closes every live
// connection and then, depending on the mode, holds new connections without an answer (a network
// that drops packets: the hard case, where only deadlines end a wait) or refuses them (a database
// that is down); HoldCloses keeps the client side of the connections open now from seeing
// anything the server sends, its close included, until the client sends again.
type Proxy struct {
	t      testing.TB
	target string

	mu       sync.Mutex
	listener net.Listener
	addr     string
	mode     ProxyMode
	conns    map[net.Conn]struct{}   // every open connection, both sides
	held     []net.Conn              // connections accepted while blackholed
	pairs    map[*proxyPair]struct{} // forwarded connections, for HoldCloses

	// lateCloses counts held connections whose client wrote to them, and so met their close.
	lateCloses int
}

// ProxyMode is what a Proxy does with new connections.
type ProxyMode int

// Proxy modes.
const (
	ProxyOpen      ProxyMode = iota // forward
	ProxyBlackhole                  // accept, and hold unanswered until Restore
	ProxyRefuse                     // listener closed: connection refused
)

// proxyPair is one forwarded connection. Once held (HoldCloses), what the server sends is kept
// from the client, and the server's close does not reach it: the client's next message gets
// what was kept, then the close, as if the server had only just closed.
type proxyPair struct {
	client, server net.Conn

	mu         sync.Mutex
	held       bool
	kept       []byte
	serverGone chan struct{} // closed once the server side ended
}

// NewProxy listens on a free local port and forwards to target (host:port), until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	listener, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{
		t: t, target: target, listener: listener, addr: listener.Addr().String(),
		conns: make(map[net.Conn]struct{}), pairs: make(map[*proxyPair]struct{}),
	}
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
func (p *Proxy) Addr() string { return p.addr }

// URL is databaseURL (a URL of this package) with its host replaced by the proxy's.
func (p *Proxy) URL(t testing.TB, databaseURL string) string {
	t.Helper()
	config, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	host := config.Host + ":" + strconv.Itoa(int(config.Port))
	require.Contains(t, databaseURL, "@"+host, "expected a URL with host:port, got %s", databaseURL)
	return strings.Replace(databaseURL, "@"+host, "@"+p.addr, 1)
}

// PostgresTarget is host:port of the test database.
func PostgresTarget(t testing.TB) string {
	t.Helper()
	config, err := pgx.ParseConfig(DatabaseURL(t))
	require.NoError(t, err)
	return net.JoinHostPort(config.Host, strconv.Itoa(int(config.Port)))
}

func (p *Proxy) serve(listener net.Listener) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return // closed: cut in ProxyRefuse mode, or the test ended
		}
		p.mu.Lock()
		mode := p.mode
		p.conns[conn] = struct{}{}
		if mode == ProxyOpen {
			go p.forward(conn)
		} else {
			// ProxyBlackhole: the connection is held, unread, until Restore forwards it.
			p.held = append(p.held, conn)
		}
		p.mu.Unlock()
	}
}

func (p *Proxy) forward(client net.Conn) {
	server, err := (&net.Dialer{}).DialContext(p.t.Context(), "tcp", p.target)
	if err != nil {
		p.drop(client)
		return
	}
	pair := &proxyPair{client: client, server: server, serverGone: make(chan struct{})}
	p.mu.Lock()
	if p.mode != ProxyOpen { // cut while dialling
		p.mu.Unlock()
		_ = server.Close()
		p.drop(client)
		return
	}
	p.conns[server] = struct{}{}
	p.pairs[pair] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { p.clientToServer(pair) })
	wg.Go(func() { p.serverToClient(pair) })
	wg.Wait()
	p.mu.Lock()
	delete(p.pairs, pair)
	p.mu.Unlock()
}

// clientToServer forwards what the client sends; once the pair is held, the client's message
// gets what the server sent meanwhile, then the server's close.
func (p *Proxy) clientToServer(pair *proxyPair) {
	defer p.dropPair(pair)
	buf := make([]byte, 32<<10)
	for {
		n, err := pair.client.Read(buf)
		if n > 0 {
			pair.mu.Lock()
			held := pair.held
			pair.mu.Unlock()
			if held {
				<-pair.serverGone // the server is going: its last words first
				pair.mu.Lock()
				kept := pair.kept
				pair.mu.Unlock()
				_, _ = pair.client.Write(kept)
				p.mu.Lock()
				p.lateCloses++
				p.mu.Unlock()
				return
			}
			if _, err := pair.server.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// serverToClient forwards what the server sends, or keeps it once the pair is held; the server's
// close ends the pair, unless it is held.
func (p *Proxy) serverToClient(pair *proxyPair) {
	defer close(pair.serverGone)
	buf := make([]byte, 32<<10)
	for {
		n, err := pair.server.Read(buf)
		pair.mu.Lock()
		held := pair.held
		if held && n > 0 {
			pair.kept = append(pair.kept, buf[:n]...)
		}
		pair.mu.Unlock()
		if n > 0 && !held {
			if _, werr := pair.client.Write(buf[:n]); werr != nil {
				p.dropPair(pair)
				return
			}
		}
		if err != nil {
			if !held {
				p.dropPair(pair)
			}
			return
		}
	}
}

func (p *Proxy) dropPair(pair *proxyPair) {
	p.drop(pair.client)
	p.drop(pair.server)
}

func (p *Proxy) drop(conn net.Conn) {
	p.mu.Lock()
	delete(p.conns, conn)
	p.mu.Unlock()
	_ = conn.Close()
}

func (p *Proxy) closeConnsLocked() {
	for conn := range p.conns {
		_ = conn.Close()
		delete(p.conns, conn)
	}
	p.held = nil
}

// HoldCloses makes every connection forwarded now keep from its client what the server sends
// from here on, its close included, until the client sends again: then the client gets it all
// and the close. Terminating the backends after it leaves the client with connections that look
// alive, whatever their idle time, and fail their next statement, as connections do whose server
// has just closed them and whose close has not arrived yet. Connections made later are forwarded
// as usual.
func (p *Proxy) HoldCloses() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pair := range p.pairs {
		pair.mu.Lock()
		pair.held = true
		pair.mu.Unlock()
	}
}

// LateCloses is how many held connections (HoldCloses) were written to, and so met their close:
// each a statement, or a ping, that found its connection dead.
func (p *Proxy) LateCloses() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lateCloses
}

// Cut makes the database unreachable through the proxy: live connections are closed, new ones
// blackholed or refused.
func (p *Proxy) Cut(mode ProxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	p.closeConnsLocked()
	if mode == ProxyRefuse && p.listener != nil {
		_ = p.listener.Close()
		p.listener = nil
	}
}

// Restore forwards again, on the same address.
func (p *Proxy) Restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = ProxyOpen
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
			if listener, err = (&net.ListenConfig{}).Listen(p.t.Context(), "tcp", p.addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.NoError(p.t, err, "error listening again on %s", p.addr)
		p.listener = listener
		go p.serve(listener)
	}
}
