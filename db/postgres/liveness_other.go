//go:build !unix

package postgres

import "net"

// closedByServer cannot look at a socket without reading it on this platform: it says no, and
// a connection the server closed fails its next statement instead (see retryOnce).
func closedByServer(net.Conn) bool { return false }
