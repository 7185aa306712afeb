package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

// TestCancelledRequestIsNoInternalError: a request whose client went away is recorded as 499
// at debug level, not logged as an internal error; the same error while the client still waits
// remains one.
func TestCancelledRequestIsNoInternalError(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	e := echo.New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/api/v1/services", nil).WithContext(ctx)
	s.handleError(fmt.Errorf("list services: %w", context.Canceled), e.NewContext(req, rec))
	if rec.Code != statusClientClosed || strings.Contains(logs.String(), "internal error") {
		t.Fatalf("cancelled request: status %d, log %q", rec.Code, logs.String())
	}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest(http.MethodGet, "/api/v1/services", nil)
	s.handleError(errors.Join(errors.New("store"), context.Canceled), e.NewContext(req, rec))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(logs.String(), "internal error") {
		t.Fatalf("a cancellation the client did not ask for: status %d, log %q", rec.Code, logs.String())
	}
}
