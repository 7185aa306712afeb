package ui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// stream serves a page's live region as Server-Sent Events (text/event-stream): the region
// re-rendered through the API on every wake-up ([Config.Wake], or every StreamInterval without
// one) and sent as one unnamed message only when it changed; the htmx SSE extension swaps it
// into the page. The stream ends with the request, after StreamMaxAge (the browser
// reconnects and is authenticated again), or when the API stops accepting the session.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, v *viewer) {
	name := r.PathValue("page")
	if _, ok := h.pages[name]; !ok || !live(name) {
		http.NotFound(w, r)
		return
	}
	q := map[string]string{}
	for _, k := range append([]string{"project", "name", "id", "state"}, changelogQueryKeys...) {
		q[k] = r.URL.Query().Get(k)
	}
	ctx, flusher, done, ok := h.openStream(w, r, "berth dashboard stream")
	if !ok {
		return
	}
	defer done()

	var wake <-chan struct{}
	if h.cfg.Wake != nil {
		wake = h.cfg.Wake(ctx)
	}
	tick := time.NewTicker(h.cfg.StreamInterval)
	defer tick.Stop()
	var last [32]byte
	for {
		c, cctx := h.client(r.WithContext(ctx), v.Bearer)
		data, err := h.loadLive(cctx, c, v, name, q)
		if err != nil {
			if client.IsCode(err, "unauthenticated") {
				// The session was revoked or expired while the page was open: say so in the
				// page instead of leaving it frozen.
				_, _ = w.Write(sseMessage([]byte(sessionEnded)))
				flusher.Flush()
				return
			}
			if ctx.Err() == nil {
				h.log.Info("dashboard stream ended: the API refused a read", "page", name, "err", err)
			}
			return // the browser reconnects
		}
		body, err := h.renderLive(name, &pageData{Viewer: v, Data: data, Query: q, Nav: name})
		if err != nil {
			h.log.Error("render a live region", "page", name, "err", err)
			return
		}
		if sum := sha256.Sum256(body); sum != last {
			last = sum
			if _, err := w.Write(sseMessage(body)); err != nil {
				return
			}
			flusher.Flush()
		}
		if !h.waitStream(ctx, w, flusher, tick.C, &wake, polled(name)) {
			return
		}
	}
}

// openStream starts a Server-Sent Events answer on w: no write deadline (the server's write
// timeout must not cut a live stream), the event-stream headers, a first comment naming the
// stream, and one more in the streams gauge until done is called. ctx ends with the request or
// after StreamMaxAge, whichever comes first. ok is false, and w answered 500, when the
// connection cannot stream.
func (h *Handler) openStream(w http.ResponseWriter, r *http.Request, comment string) (ctx context.Context, flusher http.Flusher, done func(), ok bool) {
	flusher, ok = w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported on this connection", http.StatusInternalServerError)
		return nil, nil, nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.StreamMaxAge)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(": " + comment + "\n\n"))
	flusher.Flush()
	h.m.streams.Inc()
	return ctx, flusher, func() { h.m.streams.Dec(); cancel() }, true
}

// polled reports whether page shows what the store does not hold and its feed cannot announce
// (a node's newest sample, read from the node): its stream re-renders on every tick as well.
// A workload's output is not polled: it streams ([Handler.logStream]).
func polled(page string) bool { return page == "node" }

// waitStream waits for the next re-render of a stream: a tick without a change feed or when
// every tick re-renders (tickAlways), a wake-up with a feed (ticks then send a keep-alive
// comment). It reports false when the stream ends.
func (h *Handler) waitStream(ctx context.Context, w http.ResponseWriter, f http.Flusher, tick <-chan time.Time, wake *<-chan struct{}, tickAlways bool) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			if *wake == nil || tickAlways {
				return true
			}
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return false
			}
			f.Flush()
		case _, ok := <-*wake:
			if !ok {
				*wake = nil // the feed ended: fall back to the ticker
			}
			return true
		}
	}
}

// sessionEnded replaces a live region whose session the API stopped accepting.
const sessionEnded = `<p class="notice bad" role="alert" id="session-ended">Your session ended. <a href="/ui/login">Log in again</a>.</p>`

// sseMessage frames body as one unnamed SSE message: each line of it a "data:" line.
func sseMessage(body []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(strings.TrimRight(string(body), "\n"), "\n") {
		b.WriteString("data: ")
		b.WriteString(strings.TrimRight(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// live reports whether page has a live region a stream renders: every page but the forms,
// the answers to actions and the login and error pages.
func live(page string) bool {
	switch page {
	case "login", "error", "undo", "deploy", "restore", "promote", "token", "newtoken", "newuser", "confirm":
		return false
	}
	return true
}
