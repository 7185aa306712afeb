package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Listen opens a TCP listener on addr. While the address is in use it retries
// every 200 ms for up to wait: after a host crash the previous gateway process
// may still be exiting and holding the port. Other errors return at once.
func Listen(ctx context.Context, addr string, wait time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("listen on %s: %w", addr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
