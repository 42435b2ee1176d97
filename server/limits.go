package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Defaults of the Options that bound what one client can hold.
const (
	// DefaultMaxBodyBytes caps a request body: 8 MiB holds a prompt of
	// about two million characters or a batch of prompts as large.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultReadHeaderTimeout bounds the reading of a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultBodyReadTimeout bounds the reading of a request's body, from
	// the end of its headers.
	DefaultBodyReadTimeout = 30 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection idle this long.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConns caps the connections served at once; more wait to
	// be accepted.
	DefaultMaxConns = 2048
)

// orDefault returns v when positive, def when zero, and 0 (none) when
// negative.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	switch {
	case v > 0:
		return v
	case v == 0:
		return def
	}
	return 0
}

// limitBody enforces the body size cap and the body read timeout on a
// POST before its handler decodes the body: a declared Content-Length over
// the cap is answered 413 at once (a body without one is cut at the cap by
// the handler's reader), and the connection's read deadline is set to the
// body read timeout, so a client that stalls mid-body gets 408 (see
// bodyTimeoutError) and its connection closed. The body is not buffered:
// the handler's JSON decoder reads it as it arrives. A generation is never
// cut by the deadline: net/http clears it once the body has been read to
// its end (before it watches the connection for a disconnect), and sets
// its own deadlines for the connection's next request. The deadline also
// bounds net/http's discarding of a body the handler left unread. It
// reports false after answering 413. Cost: a deadline set on the
// connection.
func (s *Server) limitBody(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength > s.maxBody {
		w.Header().Set("Connection", "close")
		writeError(w, tooLarge(s.maxBody))
		return false
	}
	if s.bodyTimeout <= 0 {
		return true
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(s.bodyTimeout)); err != nil {
		return true // a ResponseWriter without deadlines (a test recorder)
	}
	r.Body = &timedBody{ReadCloser: r.Body, timeout: s.bodyTimeout}
	return true
}

// timedBody turns a read that ran past the body read deadline into a
// *bodyTimeoutError, which decodeBody answers with 408.
type timedBody struct {
	io.ReadCloser
	timeout time.Duration
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var ne net.Error
	if err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		err = &bodyTimeoutError{timeout: b.timeout, err: err}
	}
	return n, err
}

// bodyTimeoutError is a request body that did not arrive within the body
// read timeout.
type bodyTimeoutError struct {
	timeout time.Duration
	err     error
}

func (e *bodyTimeoutError) Error() string {
	return fmt.Sprintf("request body not received within %s: %v", e.timeout, e.err)
}

func (e *bodyTimeoutError) Unwrap() error { return e.err }

func tooLarge(limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

// limitListener accepts at most cap(sem) connections at once: Accept
// waits for one to close before it takes the next from the kernel's
// backlog, so clients past the cap wait (their connect succeeds, their
// request is read once a slot frees). Close ends a waiting Accept.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// newLimitListener caps ln at n connections; n <= 0 returns ln.
func newLimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its listener's slot back on its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection when the underlying one can
// (net/http uses it to let the client read a final answer).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
