//go:build unix

package postgres

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// closedByServer says whether the server has already closed netConn, an idle connection: its
// socket holds an end of file, a reset, or bytes nobody asked for (a backend sends its FATAL
// error, say 57P01 after pg_terminate_backend or a restart, before it closes). It looks without
// blocking and without sending anything, so it costs no round trip.
func closedByServer(netConn net.Conn) bool {
	if tlsConn, ok := netConn.(*tls.Conn); ok {
		netConn = tlsConn.NetConn()
	}
	sysConn, ok := netConn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sysConn.SyscallConn()
	if err != nil {
		return true
	}

	// Control, not Read: Read would wait for the descriptor's read lock, which pgx's background
	// reader may hold, blocked in a read of its own, on a connection left idle. If that reader
	// takes the server's last bytes first, they are not seen here, and the next statement fails
	// as it would have without this check.
	var closed bool
	err = raw.Control(func(fd uintptr) {
		var buf [1]byte
		_, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		// EAGAIN: nothing waiting, the connection is as it was left. Anything else (a byte, an
		// end of file, an error) means it is not.
		closed = !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR)
	})
	return closed || err != nil
}
