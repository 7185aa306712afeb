package api

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// listEvents serves GET /api/v1/events?after_seq=N&type=T&limit=L: stored
// events with seq above N, oldest first, at most L (default 100, at most
// 1000), as {"items": [{"seq", "received_at", "event"}]}
// (docs/node-protocol.md section 5.4).
func (s *Server) listEvents(c echo.Context) error {
	after, err := queryInt(c, "after_seq", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(c, "limit", 100)
	if err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		return problem(abierrors.ValidationFailed, "limit must be between 1 and 1000")
	}
	recs, err := s.cfg.Events.List(c.Request().Context(), after, c.QueryParam("type"), int(limit))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": recs})
}

// queryInt parses a non-negative integer query parameter, def when absent.
func queryInt(c echo.Context, name string, def int64) (int64, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, problem(abierrors.ValidationFailed, name+" must be a non-negative integer")
	}
	return n, nil
}
